package main

import (
	"context"
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

	got, errOut, code := herdCmd(t, nil, "inspect", "-redis", srv.Addr(), "user:42", "user:43", "nobody")
	if code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, errOut)
	}
	for _, want := range []string{`key:      "user:42"`, "14 bytes, fence", "lease:    free", `key:      "user:43"`, "lease:    held by", `key:      "nobody"`, "value:    none"} {
		if !strings.Contains(got, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, got)
		}
	}
	if out, errOut, code := herdCmd(t, nil, "inspect", "-redis", srv.Addr(), "-json", "user:42"); code != 0 || !strings.Contains(out, `"Bytes": 14`) {
		t.Errorf("inspect -json: exit %d: %s\n%s", code, errOut, out)
	}

	out, errOut, code := herdCmd(t, nil, "stats", "-redis", srv.Addr())
	if code != 0 {
		t.Fatalf("stats: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"values               1", "leases               1", "fence counters       2"} {
		if !strings.Contains(out, want) {
			t.Errorf("stats output lacks %q:\n%s", want, out)
		}
	}

	for _, args := range [][]string{nil, {"inspect", "-redis", srv.Addr()}, {"frobnicate"}, {"stats", "-redis", srv.Addr(), "x"}, {"inspect", "-bogus"}} {
		if _, errOut, code := herdCmd(t, nil, args...); code != 2 || !strings.Contains(errOut, "usage: herd") {
			t.Errorf("herd %q: exit %d, want 2 with the usage on stderr:\n%s", args, code, errOut)
		}
	}
	if _, errOut, code := herdCmd(t, nil, "inspect", "-redis", srv.Addr(), ""); code != 1 || !strings.Contains(errOut, herd.ErrInvalidKey.Error()) {
		t.Errorf("inspect of an empty key: exit %d, want 1 with ErrInvalidKey: %s", code, errOut)
	}
}
