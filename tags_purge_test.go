package herd

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

// fakeTagged writes n keys straight into Redis as if a tagged Set had stored
// them with tag: a value key each (INVALIDATE deletes whatever is there)
// and a live member each in the tag's index, with scores rising by one
// every three keys (so pages end inside runs of equal scores). It returns
// their hash tags.
func fakeTagged(t *testing.T, rdb redis.UniversalClient, prefix, tag string, n int) []string {
	t.Helper()
	ctx := context.Background()
	tk := makeTagKeys(prefix, tag)
	base := time.Now().Add(time.Hour).UnixMilli()
	hashes := make([]string, n)
	pipe := rdb.Pipeline()
	for i := range n {
		h := mustHash(t, fmt.Sprintf("key-%d", i))
		hashes[i] = h
		pipe.Set(ctx, wire.FamilyOf(prefix, h).Value, "v", time.Hour)
		pipe.ZAdd(ctx, tk.Index, redis.Z{Score: float64(base + int64(i/3)), Member: h})
	}
	pipe.PExpire(ctx, tk.Index, 2*time.Hour)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	return hashes
}

// TestTagPurgeAcrossFailover: a purge of a tag whose index needs
// more than one page, when the master fails over (to a replica that has
// every write: nothing acknowledged is lost) between two pages. The
// replica is another process, with its own hash seed: a ZSCAN cursor of
// the old master means nothing to it, and the purge used to go on with
// it, skipping members, and return nil with their values still stored.
func TestTagPurgeAcrossFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := startReplicated(t)
	ac, target := switchable(t, p.master.Addr())
	const prefix = "atk"
	// failoverReplicaTimeout: on a loaded machine the new master's replica
	// has missed the default 250ms for one page of deletes.
	c := New(ac, &Options{Prefix: prefix, ReplicaAcks: 1, ReplicaTimeout: failoverReplicaTimeout})
	defer c.Close()
	hashes := fakeTagged(t, p.m, prefix, "big", 5000)
	p.sync(t)
	c.tagHooks = &tagHooks{paged: func(page int) {
		if page != 0 {
			return
		}
		p.sync(t)
		p.cut(t)
		p.promote(t)
		s := p.replica.Addr()
		target.Store(&s)
		p.master.Kill(t)
	}}
	pages := 0
	hook := c.tagHooks.paged
	c.tagHooks.paged = func(page int) { pages = page + 1; hook(page) }
	if err := c.InvalidateTag(ctx, "big"); err != nil {
		t.Fatalf("InvalidateTag: %v", err)
	}
	if pages < 3 {
		t.Errorf("the purge read %d pages before its last, want at least 3", pages)
	}
	left := 0
	for _, h := range hashes {
		n, err := p.r.Exists(ctx, wire.FamilyOf(prefix, h).Value).Result()
		if err != nil {
			t.Fatal(err)
		}
		left += int(n)
	}
	if left > 0 {
		t.Errorf("InvalidateTag returned nil, but %d of %d tagged values are still stored on the new master", left, len(hashes))
	}
}

// TestTagPurgePagesTies: pages in score order must not lose members
// in a run of equal scores longer than a page, nor members whose score a
// TAGADD raises between two pages.
func TestTagPurgePagesTies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const prefix = "atk"
	c := New(rdb, &Options{Prefix: prefix})
	defer c.Close()
	tk := makeTagKeys(prefix, "ties")
	base := time.Now().Add(time.Hour).UnixMilli()
	var hashes []string
	pipe := rdb.Pipeline()
	for i := range 2*purgePage + 500 {
		h := mustHash(t, fmt.Sprintf("k%d", i))
		hashes = append(hashes, h)
		score := base // a run of 2.5 pages of one score...
		if i >= purgePage+purgePage/2 {
			score = base + int64(i) // ...then distinct ones
		}
		pipe.Set(ctx, wire.FamilyOf(prefix, h).Value, "v", time.Hour)
		pipe.ZAdd(ctx, tk.Index, redis.Z{Score: float64(score), Member: h})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	c.tagHooks = &tagHooks{paged: func(int) {
		// Raise the lowest member far ahead, as a rebuild's TAGADD may.
		z, err := rdb.ZRangeWithScores(ctx, tk.Index, 0, 0).Result()
		if err != nil || len(z) == 0 {
			t.Errorf("ZRANGE: %v", err)
			return
		}
		rdb.ZAdd(ctx, tk.Index, redis.Z{Score: float64(base + 1e6), Member: z[0].Member})
	}}
	if err := c.InvalidateTag(ctx, "ties"); err != nil {
		t.Fatalf("InvalidateTag: %v", err)
	}
	left := 0
	for _, h := range hashes {
		left += int(rdb.Exists(ctx, wire.FamilyOf(prefix, h).Value).Val())
	}
	if left > 0 {
		t.Errorf("%d of %d tagged values left after InvalidateTag", left, len(hashes))
	}
}
