package herd

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/wire"
)

// makeKeys's one error, for the empty key, is ErrInvalidKey; any other key
// maps to internal/wire's names.
func TestMakeKeysEmpty(t *testing.T) {
	t.Parallel()
	_, err := makeKeys(DefaultPrefix, "")
	if !errors.Is(err, ErrInvalidKey) || err.Error() != "herd: invalid key: empty key" {
		t.Fatalf("makeKeys(\"\") = %v, want ErrInvalidKey (\"herd: invalid key: empty key\")", err)
	}
	for _, k := range hostileKeys() {
		got, err := makeKeys(DefaultPrefix, k)
		want, _ := wire.MakeKeys(DefaultPrefix, k)
		if err != nil || got != want {
			t.Fatalf("makeKeys(%q) = %+v, %v; want %+v", k, got, err, want)
		}
	}
}

func TestOptionsPanic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opt  LockerOptions
	}{
		{"prefix with {", LockerOptions{Prefix: "a{b"}},
		{"prefix with }", LockerOptions{Prefix: "a}"}},
		{"long prefix", LockerOptions{Prefix: strings.Repeat("p", 65)}},
		{"negative MaxWait", LockerOptions{MaxWait: -time.Second}},
		{"negative PollMin", LockerOptions{PollMin: -time.Second}},
		{"PollMax below PollMin", LockerOptions{PollMin: time.Second, PollMax: time.Millisecond}},
		{"negative FenceTTL", LockerOptions{FenceTTL: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil {
					t.Fatal("no panic")
				}
				if msg, _ := r.(string); !strings.HasPrefix(msg, "herd: ") {
					t.Errorf("panic %v, want a message prefixed \"herd: \"", r)
				}
			}()
			tc.opt.resolve()
		})
	}
	var nilOpt *LockerOptions
	if c := nilOpt.resolve(); c.prefix != DefaultPrefix || c.pollMin <= 0 || c.fenceTTL <= 0 {
		t.Errorf("nil options resolved to %+v, want the defaults", c)
	}
}
