package redistest

import (
	"context"
	"strings"
	"testing"
)

// A server started with Without70Commands lacks every command of the
// list, also after a restart, and keeps the older ones.
func TestWithout70Commands(t *testing.T) {
	t.Parallel()
	s := Start(t, Without70Commands()...)
	check := func(when string) {
		t.Helper()
		ctx := context.Background()
		c := s.Client(t)
		args := []any{"COMMAND", "INFO", "PUBLISH"}
		for _, name := range commandsSince70 {
			args = append(args, name)
		}
		res, err := c.Do(ctx, args...).Slice()
		if err != nil || len(res) != 1+len(commandsSince70) {
			t.Fatalf("%s: COMMAND INFO = %d entries, %v", when, len(res), err)
		}
		if res[0] == nil {
			t.Errorf("%s: COMMAND INFO PUBLISH is nil, want its entry", when)
		}
		for i, name := range commandsSince70 {
			if res[1+i] != nil {
				t.Errorf("%s: COMMAND INFO %s = %v, want nil", when, name, res[1+i])
			}
		}
		err = c.Do(ctx, "SPUBLISH", "ch", "m").Err()
		if err == nil || !strings.Contains(err.Error(), "unknown command") {
			t.Errorf("%s: SPUBLISH: %v, want an unknown-command error", when, err)
		}
	}
	check("started")
	s.Restart(t)
	check("restarted")
}
