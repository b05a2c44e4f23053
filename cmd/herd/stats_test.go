package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
)

// TestStatsGlobPrefix: "stats counts herd's keys of the prefix by
// role". A prefix is any string without braces, so it may hold SCAN's glob
// characters: stats of prefix "app[1]" must count that cache's value, and
// stats of prefix "a*" must not count another cache's ("ab") keys.
func TestStatsGlobPrefix(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	for _, p := range []string{"app[1]", "a*", "ab", "app1"} {
		c := herd.New(rdb, &herd.Options{Prefix: p})
		if err := c.Set(ctx, "k-"+p, []byte("x"), time.Hour); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	for _, p := range []string{"app[1]", "a*"} {
		out, errOut, code := herdCmd(t, nil, "stats", "-redis", srv.Addr(), "-prefix", p, "-json")
		if code != 0 {
			t.Fatalf("stats: exit %d: %s", code, errOut)
		}
		var counts map[string]int64
		if err := json.Unmarshal([]byte(out), &counts); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if counts["values"] != 1 || counts["other"] != 0 {
			t.Errorf("stats -prefix %q: %v; want values 1, no other", p, counts)
		}
	}
}
