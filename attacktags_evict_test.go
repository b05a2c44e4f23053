//go:build herd_attack_open

// An open reproduction, not run by default (go test -tags herd_attack_open):
// the tag guarantee does not survive Redis evicting herd's tag keys.

package herd

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// TestAttackTagPurgeMemoryEvicted: a rebuild R reads G0 and begins; a
// purge of its tag returns nil; Redis, under maxmemory with a volatile-ttl
// policy, evicts the tag's purge memory (tp, two minutes, the shortest
// TTL there); R then records the tag and stores its value, from before
// the purge, after it.
func TestAttackTagPurgeMemoryEvicted(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := New(rdb, &Options{Prefix: "ev"})
	defer c.Close()
	c.useTags()
	_, fl, err := c.Begin(ctx, "k", time.Hour, nil)
	if err != nil || fl == nil || !fl.Leased() {
		t.Fatalf("Begin = %v, %v", fl, err)
	}
	if err := c.InvalidateTag(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	tp := makeTagKeys("ev", "x").purged
	rdb.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl")
	rdb.ConfigSet(ctx, "maxmemory-samples", "64")
	rdb.ConfigSet(ctx, "maxmemory", "4mb")
	filler := strings.Repeat("f", 4096)
	for i := 0; rdb.Exists(ctx, tp).Val() == 1 && i < 10000; i++ {
		rdb.Set(ctx, fmt.Sprintf("filler:%d", i), filler, time.Hour)
	}
	rdb.ConfigSet(ctx, "maxmemory", "0")
	if rdb.Exists(ctx, tp).Val() == 1 {
		t.Fatal("tp was not evicted")
	}
	if err := fl.SetTags("x"); err != nil {
		t.Fatal(err)
	}
	if err := fl.Commit([]byte("built before the purge"), time.Hour, 0); err != nil {
		t.Fatal(err)
	}
	keys, _ := makeKeys("ev", "k")
	if rdb.Exists(ctx, keys.value).Val() == 1 {
		t.Errorf("a rebuild that began before InvalidateTag(x) returned nil stored its value after it (tp evicted); stats %+v", c.Stats())
	}
}
