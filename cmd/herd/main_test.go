package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
)

// TestInspectAndStats runs the command against a real redis-server after
// herd wrote a value, left a rebuild's lease and a negative entry.
func TestInspectAndStats(t *testing.T) {
	testInspectAndStats(t, redistest.Start(t))
}

// The same on a server without the commands Redis 7.0 added: the
// command needs none of them (Redis 6.2).
func TestInspectAndStatsWithout70Commands(t *testing.T) {
	testInspectAndStats(t, redistest.Start(t, redistest.Without70Commands()...))
}

func testInspectAndStats(t *testing.T, srv *redistest.Server) {
	t.Helper()
	rdb := srv.Client(t)
	c := herd.New(rdb, nil)
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "user:42", []byte(`{"name":"ada"}`), time.Hour); err != nil {
		t.Fatal(err)
	}
	_, fill, err := c.Begin(ctx, "user:43", time.Hour, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin: %v, %v", fill, err)
	}
	defer fill.Abort(nil)

	var out strings.Builder
	if err := run(ctx, []string{"inspect", "-redis", srv.Addr(), "user:42", "user:43", "nobody"}, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{`key:      "user:42"`, "14 bytes, fence", "lease:    free", `key:      "user:43"`, "lease:    held by", `key:      "nobody"`, "value:    none"} {
		if !strings.Contains(got, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, got)
		}
	}
	out.Reset()
	if err := run(ctx, []string{"inspect", "-redis", srv.Addr(), "-json", "user:42"}, &out); err != nil || !strings.Contains(out.String(), `"Bytes": 14`) {
		t.Errorf("inspect -json: %v\n%s", err, out.String())
	}

	out.Reset()
	if err := run(ctx, []string{"stats", "-redis", srv.Addr()}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"values               1", "leases               1", "fence counters       2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stats output lacks %q:\n%s", want, out.String())
		}
	}

	var u usageError
	for _, args := range [][]string{nil, {"inspect", "-redis", srv.Addr()}, {"frobnicate"}, {"stats", "x"}, {"inspect", "-bogus"}} {
		if err := run(ctx, args, &out); !errors.As(err, &u) {
			t.Errorf("run(%q) = %v, want a usage error", args, err)
		}
	}
	if err := run(ctx, []string{"inspect", "-redis", srv.Addr(), ""}, &out); !errors.Is(err, herd.ErrInvalidKey) {
		t.Errorf("inspect of an empty key: %v", err)
	}
}
