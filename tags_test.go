package herd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// tagRig is one scenario's Redis and key prefix: every Cache it makes
// shares them, as the processes of one service do.
type tagRig struct {
	t       *testing.T
	rdb     redis.UniversalClient
	prefix  string
	cluster bool
}

// cache returns a Cache of the rig; opt may be nil.
func (r *tagRig) cache(opt *Options) *Cache {
	o := Options{}
	if opt != nil {
		o = *opt
	}
	o.Prefix = r.prefix
	c := newTestCache(r.t, r.rdb, &o)
	// On a Cluster the purge generation's read is waited for 50 ms after
	// the ACQUIRE; later (a loaded machine), the rebuild of a value whose
	// tag was purged in the last two minutes is not stored, as documented.
	// These tests are not about that wait.
	c.genWait = time.Minute
	return c
}

// stored reports whether key has a value in Redis.
func (r *tagRig) stored(key string) bool {
	r.t.Helper()
	keys, err := makeKeys(r.prefix, key)
	if err != nil {
		r.t.Fatal(err)
	}
	n, err := r.rdb.Exists(context.Background(), keys.Value).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	return n == 1
}

// get runs c.Get and fails the test on an error.
func (r *tagRig) get(c *Cache, key string, load LoadFunc) string {
	r.t.Helper()
	v, err := c.Get(context.Background(), key, time.Hour, load)
	if err != nil {
		r.t.Fatalf("Get %q: %v", key, err)
	}
	return string(v)
}

// purge runs c.InvalidateTag and fails the test on an error.
func (r *tagRig) purge(c *Cache, tags ...string) {
	r.t.Helper()
	if err := c.InvalidateTag(context.Background(), tags...); err != nil {
		r.t.Fatalf("InvalidateTag %q: %v", tags, err)
	}
}

// taggedLoader counts its calls and returns val tagged with tags.
func taggedLoader(calls *atomic.Int64, val string, tags ...string) LoadFunc {
	return func(ctx context.Context) ([]byte, error) {
		calls.Add(1)
		if err := SetTags(ctx, tags...); err != nil {
			return nil, err
		}
		return []byte(val), nil
	}
}

// gatedTagged is a gated loader whose value carries tags.
func gatedTagged(g *gatedLoader, tags ...string) LoadFunc {
	return func(ctx context.Context) ([]byte, error) {
		if err := SetTags(ctx, tags...); err != nil {
			return nil, err
		}
		return g.load(ctx)
	}
}

// async runs fn in a goroutine; the returned channel gets its error.
func async(fn func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	return ch
}

func wait(t *testing.T, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not return", what)
	}
}

func recv(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestTags runs the tag purge suite on a real redis-server and a real
// 3-master Redis Cluster.
func TestTags(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	scenarios := []struct {
		name string
		fn   func(*testing.T, *tagRig)
	}{
		{"PurgeRemovesEveryTaggedValue", testPurgeRemovesEveryTaggedValue},
		{"PurgeDuringFirstBuild", testPurgeDuringFirstBuild},
		{"AddThenPurgeThenCommit", testAddThenPurgeThenCommit},
		{"AddCommitThenInvalidate", testAddCommitThenInvalidate},
		{"PurgeThenAdd", testPurgeThenAdd},
		{"RebuildAfterPurgeBeganIsStored", testRebuildAfterPurgeBeganIsStored},
		{"RefreshDuringPurge", testRefreshDuringPurge},
		{"RefreshAfterPurgeIsStored", testRefreshAfterPurgeIsStored},
		{"FillTags", testFillTags},
		{"FullIndexRefuses", testFullIndexRefuses},
		{"MintedKeysTakeHalfAnIndex", testMintedKeysTakeHalfAnIndex},
		{"IndexExpiresWithEntries", testIndexExpiresWithEntries},
		{"HostileTags", testHostileTags},
		{"ForeignValues", testTagForeignValues},
		{"LongRebuild", testTagLongRebuild},
	}
	for _, b := range []struct {
		name    string
		rdb     redis.UniversalClient
		cluster bool
	}{{"redis", srv.Client(t), false}, {"cluster", cl.Client(t), true}} {
		t.Run(b.name, func(t *testing.T) {
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					sc.fn(t, &tagRig{t: t, rdb: b.rdb, prefix: "t" + newOwner()[:12], cluster: b.cluster})
				})
			}
		})
	}
}

// Values from Get, negative entries and tagged Sets all go with a purge of
// their tag, in every Cache; others stay. On a Cluster the keys sit on
// other masters than their tag's index.
func testPurgeRemovesEveryTaggedValue(t *testing.T, r *tagRig) {
	a, b := r.cache(nil), r.cache(nil)
	ctx := context.Background()
	var loads atomic.Int64
	const n = 24
	key := func(i int) string { return fmt.Sprintf("page:%d", i) }
	for i := range n {
		r.get(a, key(i), taggedLoader(&loads, "v", "all", "group:"+strconv.Itoa(i%3)))
	}
	if err := a.Set(ctx, "set:1", []byte("s"), time.Hour, "all"); err != nil {
		t.Fatal(err)
	}
	_, err := a.Get(ctx, "missing", time.Hour, func(ctx context.Context) ([]byte, error) {
		_ = SetTags(ctx, "all")
		return nil, ErrNotFound
	})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a missing value: %v, want ErrNotFound", err)
	}
	r.get(a, "untagged", constLoader(&loads, "u"))
	for _, k := range []string{key(0), "set:1", "missing", "untagged"} {
		if !r.stored(k) {
			t.Fatalf("%q not stored", k)
		}
	}
	if r.cluster {
		// The keys spread over the masters: most live on another master
		// than the tag's index.
		cc := r.rdb.(*redis.ClusterClient)
		tagNode, err := cc.MasterForKey(ctx, makeTagKeys(r.prefix, "all").Index)
		if err != nil {
			t.Fatal(err)
		}
		others := 0
		for i := range n {
			keys, _ := makeKeys(r.prefix, key(i))
			node, err := cc.MasterForKey(ctx, keys.Value)
			if err != nil {
				t.Fatal(err)
			}
			if node.Options().Addr != tagNode.Options().Addr {
				others++
			}
		}
		if others == 0 {
			t.Fatalf("every key on the tag's master: the test proves nothing")
		}
	}

	r.purge(b, "group:1")
	for i := range n {
		if got, want := r.stored(key(i)), i%3 != 1; got != want {
			t.Fatalf("after purging group:1, %q stored %v, want %v", key(i), got, want)
		}
	}
	r.purge(b, "all")
	for i := range n {
		if r.stored(key(i)) {
			t.Fatalf("after purging all, %q is still stored", key(i))
		}
	}
	for _, k := range []string{"set:1", "missing"} {
		if r.stored(k) {
			t.Fatalf("after purging all, %q is still stored", k)
		}
	}
	if !r.stored("untagged") {
		t.Fatal("a purge removed an untagged value")
	}
	before := loads.Load()
	r.get(b, key(0), taggedLoader(&loads, "v2", "all"))
	if got := loads.Load() - before; got != 1 {
		t.Fatalf("Get after the purge: %d loads, want 1", got)
	}
	if !r.stored(key(0)) {
		t.Fatal("the rebuild after the purge was not stored")
	}
}

// The guarantee for a key that is not in the tag's index yet: its first
// build is in flight in one Cache when another purges the tag. The
// rebuild's value reaches its caller but is not stored; the next Get
// loads again and stores. With and without the purge generation (a Cache
// that saw no tag before the rebuild began does not read it).
func testPurgeDuringFirstBuild(t *testing.T, r *tagRig) {
	for _, warm := range []bool{true, false} {
		t.Run(fmt.Sprintf("generation=%v", warm), func(t *testing.T) {
			a, b := r.cache(nil), r.cache(nil)
			if warm {
				a.useTags()
			}
			key := "first:" + strconv.FormatBool(warm)
			g := newGatedLoader("old")
			got := make(chan string, 1)
			done := async(func() error {
				v, err := a.Get(context.Background(), key, time.Hour, gatedTagged(g, "t"))
				got <- string(v)
				return err
			})
			g.waitEntered(t)
			r.purge(b, "t")
			close(g.gate)
			wait(t, done, "the rebuild's Get")
			if v := <-got; v != "old" {
				t.Fatalf("the rebuild's caller got %q, want its value", v)
			}
			if r.stored(key) {
				t.Fatal("a rebuild that began before the purge stored its value after it")
			}
			if s := a.Stats(); s.Fenced != 1 {
				t.Fatalf("Fenced %d, want 1", s.Fenced)
			}
			var loads atomic.Int64
			if v := r.get(b, key, taggedLoader(&loads, "new", "t")); v != "new" || loads.Load() != 1 {
				t.Fatalf("Get after: %q with %d loads, want a rebuild", v, loads.Load())
			}
			if !r.stored(key) {
				t.Fatal("the rebuild after the purge was not stored")
			}
		})
	}
}

// The proof's second case, COMMIT after the INVALIDATE: the rebuild's
// TAGADD runs before the purge reads the index, its COMMIT after the purge
// returned. The COMMIT is fenced by the key's counter.
func testAddThenPurgeThenCommit(t *testing.T, r *tagRig) {
	a, b := r.cache(nil), r.cache(nil)
	a.useTags()
	indexed, release := make(chan struct{}, 1), make(chan struct{})
	var sawPurged atomic.Bool
	a.tagHooks = &tagHooks{indexed: func(_ string, purged bool, _ error) {
		sawPurged.Store(purged)
		indexed <- struct{}{}
		<-release
	}}
	var loads atomic.Int64
	done := async(func() error {
		_, err := a.Get(context.Background(), "k", time.Hour, taggedLoader(&loads, "old", "t"))
		return err
	})
	recv(t, indexed, "the rebuild's TAGADD")
	r.purge(b, "t") // reads k from the index, invalidates it
	close(release)
	wait(t, done, "the rebuild's Get")
	if sawPurged.Load() {
		t.Fatal("TAGADD refused: the test did not reach the COMMIT")
	}
	if r.stored("k") {
		t.Fatal("a COMMIT after the purge's INVALIDATE stored its value")
	}
	if s := a.Stats(); s.Fenced != 1 {
		t.Fatalf("Fenced %d, want 1 (the COMMIT)", s.Fenced)
	}
}

// The proof's second case, COMMIT before the INVALIDATE: the rebuild's
// TAGADD runs before the purge reads the index, and its COMMIT after the
// purge read it but before the purge invalidates. The INVALIDATE deletes
// the value.
func testAddCommitThenInvalidate(t *testing.T, r *tagRig) {
	a, b := r.cache(nil), r.cache(nil)
	a.useTags()
	indexed, proceed := make(chan struct{}, 1), make(chan struct{})
	var sawPurged atomic.Bool
	a.tagHooks = &tagHooks{indexed: func(_ string, purged bool, _ error) {
		sawPurged.Store(purged)
		indexed <- struct{}{}
		<-proceed
	}}
	scanned, hold := make(chan struct{}, 1), make(chan struct{})
	b.tagHooks = &tagHooks{scanned: func(int) {
		scanned <- struct{}{}
		<-hold
	}}
	var loads atomic.Int64
	done := async(func() error {
		_, err := a.Get(context.Background(), "k", time.Hour, taggedLoader(&loads, "old", "t"))
		return err
	})
	recv(t, indexed, "the rebuild's TAGADD")
	purged := async(func() error { return b.InvalidateTag(context.Background(), "t") })
	recv(t, scanned, "the purge's read of the index")
	close(proceed)
	wait(t, done, "the rebuild's Get")
	if sawPurged.Load() || !r.stored("k") {
		t.Fatalf("the rebuild did not commit before the purge's INVALIDATE (refused %v, Stats %+v)", sawPurged.Load(), a.Stats())
	}
	close(hold)
	wait(t, purged, "InvalidateTag")
	if r.stored("k") {
		t.Fatal("the purge's INVALIDATE left a value committed before it")
	}
}

// The proof's first case: the rebuild's TAGADD runs after the purge's
// TAGPURGE (here while the purge is still running: before its
// invalidations). TAGADD refuses.
func testPurgeThenAdd(t *testing.T, r *tagRig) {
	a, b := r.cache(nil), r.cache(nil)
	a.useTags()
	g := newGatedLoader("old")
	var refused atomic.Bool
	a.tagHooks = &tagHooks{indexed: func(_ string, purged bool, _ error) { refused.Store(purged) }}
	done := async(func() error {
		_, err := a.Get(context.Background(), "k", time.Hour, gatedTagged(g, "t"))
		return err
	})
	g.waitEntered(t)
	hold := make(chan struct{})
	b.tagHooks = &tagHooks{scanned: func(int) {
		close(g.gate)
		<-hold // the rebuild commits (or not) now
	}}
	purged := async(func() error { return b.InvalidateTag(context.Background(), "t") })
	wait(t, done, "the rebuild's Get")
	if !refused.Load() || r.stored("k") {
		t.Fatalf("TAGADD after TAGPURGE: refused %v, stored %v; want refused, not stored", refused.Load(), r.stored("k"))
	}
	close(hold)
	wait(t, purged, "InvalidateTag")
}

// A rebuild that begins after the purge raised the generation is stored,
// although its tag's purge generation is newer than any before it: the
// purge is not a two-minute ban on the tag. A Cache without the
// generation (it saw no tag) is refused in the same place: that is what
// the generation is for.
func testRebuildAfterPurgeBeganIsStored(t *testing.T, r *tagRig) {
	a, b, cold := r.cache(nil), r.cache(nil), r.cache(nil)
	a.useTags()
	var loads atomic.Int64
	r.get(a, "old", taggedLoader(&loads, "v", "t"))
	hold := make(chan struct{})
	inside := make(chan error, 2)
	b.tagHooks = &tagHooks{scanned: func(int) {
		_, err := a.Get(context.Background(), "fresh", time.Hour, taggedLoader(&loads, "v", "t"))
		inside <- err
		_, err = cold.Get(context.Background(), "cold", time.Hour, taggedLoader(&loads, "v", "t"))
		inside <- err
		<-hold
	}}
	purged := async(func() error { return b.InvalidateTag(context.Background(), "t") })
	for range 2 {
		wait(t, inside, "Get during the purge")
	}
	close(hold)
	wait(t, purged, "InvalidateTag")
	if r.stored("old") {
		t.Fatal("the purge left a tagged value")
	}
	if !r.stored("fresh") {
		t.Fatalf("a rebuild that began after the purge began was not stored (Stats %+v)", a.Stats())
	}
	if r.stored("cold") {
		t.Fatal("a rebuild without the purge generation was stored right after a purge of its tag")
	}
	// Now the cold Cache has seen a tag: its next rebuild reads the
	// generation and is stored.
	r.get(cold, "cold", taggedLoader(&loads, "v", "t"))
	if !r.stored("cold") {
		t.Fatal("a rebuild with the generation, after the purge, was not stored")
	}
}

// A stale value's background refresh in flight during a purge: the purge
// deletes the stale value, and the refresh's commit is refused.
func testRefreshDuringPurge(t *testing.T, r *tagRig) {
	clk := newFakeClock()
	a := withClock(r.cache(&Options{StaleFor: time.Hour}), clk)
	b := r.cache(nil)
	a.useTags()
	var loads atomic.Int64
	r.get(a, "k", taggedLoader(&loads, "v0", "t"))
	clk.Advance(90 * time.Minute) // stale, within StaleFor
	g := newGatedLoader("v1")
	indexed := make(chan bool, 1)
	a.tagHooks = &tagHooks{indexed: func(_ string, purged bool, _ error) { indexed <- purged }}
	if v, err := a.Get(context.Background(), "k", time.Hour, gatedTagged(g, "t")); err != nil || string(v) != "v0" {
		t.Fatalf("stale Get: %q, %v", v, err)
	}
	g.waitEntered(t) // the refresh runs
	r.purge(b, "t")
	if r.stored("k") {
		t.Fatal("the purge left the stale value")
	}
	close(g.gate)
	select {
	case purged := <-indexed:
		if !purged {
			t.Fatal("the refresh's TAGADD was accepted after the purge")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the refresh did not commit")
	}
	waitFor(t, 10*time.Second, "the refresh to end", func() bool {
		a.refreshMu.Lock()
		defer a.refreshMu.Unlock()
		return len(a.refreshing) == 0
	})
	if r.stored("k") {
		t.Fatal("a refresh that began before the purge stored its value")
	}
}

// A refresh that begins after a purge of its tag is stored: it read the
// purge generation with its ACQUIRE.
func testRefreshAfterPurgeIsStored(t *testing.T, r *tagRig) {
	clk := newFakeClock()
	a := withClock(r.cache(&Options{StaleFor: time.Hour}), clk)
	a.useTags()
	var loads atomic.Int64
	r.get(a, "k0", taggedLoader(&loads, "v", "t"))
	r.purge(a, "t") // the tag remembers the purge
	r.get(a, "k", taggedLoader(&loads, "v0", "t"))
	clk.Advance(90 * time.Minute)
	indexed := make(chan bool, 1)
	a.tagHooks = &tagHooks{indexed: func(_ string, purged bool, _ error) { indexed <- purged }}
	if v := r.get(a, "k", taggedLoader(&loads, "v1", "t")); v != "v0" {
		t.Fatalf("stale Get: %q, want v0", v)
	}
	select {
	case purged := <-indexed:
		if purged {
			t.Fatal("a refresh that began after the purge was refused")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the refresh did not commit")
	}
	waitFor(t, 10*time.Second, "the refreshed value", func() bool {
		v, err := a.Get(context.Background(), "k", time.Hour, taggedLoader(&loads, "v2", "t"))
		return err == nil && string(v) == "v1"
	})
}

// Begin's Fill: SetTags before Commit tags the value; an invalid tag
// keeps it from being stored; a purge during the build refuses it.
func testFillTags(t *testing.T, r *tagRig) {
	a, b := r.cache(nil), r.cache(nil)
	a.useTags()
	ctx := context.Background()
	begin := func(key string) *Fill {
		t.Helper()
		hit, fl, err := a.Begin(ctx, key, time.Hour, nil)
		if err != nil || hit != nil || fl == nil || !fl.Leased() {
			t.Fatalf("Begin %q: %v, %v, %v; want a leased Fill", key, hit, fl, err)
		}
		return fl
	}
	fl := begin("f1")
	if err := fl.SetTags("t", "u"); err != nil {
		t.Fatal(err)
	}
	if err := fl.Commit([]byte("v"), time.Hour, 0); err != nil {
		t.Fatal(err)
	}
	if !r.stored("f1") {
		t.Fatal("a tagged Fill was not stored")
	}
	r.purge(b, "u")
	if r.stored("f1") {
		t.Fatal("the purge left the Fill's value")
	}

	fl = begin("f2")
	if err := fl.SetTags("ok", ""); !errors.Is(err, ErrInvalidTag) {
		t.Fatalf("SetTags with an empty tag: %v, want ErrInvalidTag", err)
	}
	if err := fl.Commit([]byte("v"), time.Hour, 0); err != nil {
		t.Fatal(err)
	}
	if r.stored("f2") {
		t.Fatal("a Fill with an invalid tag was stored: a purge could not find it")
	}

	fl = begin("f3")
	r.purge(b, "t") // while the caller builds
	_ = fl.SetTags("t")
	if err := fl.Commit([]byte("v"), time.Hour, 0); err != nil {
		t.Fatal(err)
	}
	if r.stored("f3") {
		t.Fatal("a Fill begun before a purge of its tag was stored after it")
	}
}

// Keys tagged with SetMintedTags (Fill's and a loader's) are recorded
// only while the index is below half its bound; the keys tagged with
// SetTags still fill the rest.
func testMintedKeysTakeHalfAnIndex(t *testing.T, r *tagRig) {
	c := r.cache(&Options{MaxTagEntries: 4})
	ctx := context.Background()
	minted := func(ctx context.Context) ([]byte, error) {
		if err := SetMintedTags(ctx, "t"); err != nil {
			return nil, err
		}
		return []byte("v"), nil
	}
	for i := range 3 {
		r.get(c, "q"+strconv.Itoa(i), minted)
	}
	_, fill, err := c.Begin(ctx, "q3", time.Hour, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin: %v, %v", fill, err)
	}
	if err := fill.SetMintedTags("t"); err != nil {
		t.Fatal(err)
	}
	_ = fill.Commit([]byte("v"), time.Hour, 0)
	for i, want := range []bool{true, true, false, false} {
		if got := r.stored("q" + strconv.Itoa(i)); got != want {
			t.Errorf("minted key q%d stored %v, want %v (half of MaxTagEntries 4)", i, got, want)
		}
	}
	var loads atomic.Int64
	for i := range 2 {
		r.get(c, "k"+strconv.Itoa(i), taggedLoader(&loads, "v", "t"))
		if !r.stored("k" + strconv.Itoa(i)) {
			t.Errorf("key k%d tagged with SetTags not stored beside the minted ones", i)
		}
	}
}

// A tag's index is bounded: one key too many is not stored (its callers
// get the value), a tagged Set fails with ErrTagFull, a key already in the
// index may be written again, and dead members make room.
func testFullIndexRefuses(t *testing.T, r *tagRig) {
	c := r.cache(&Options{MaxTagEntries: 3})
	ctx := context.Background()
	var loads atomic.Int64
	for i := range 3 {
		r.get(c, "k"+strconv.Itoa(i), taggedLoader(&loads, "v", "t"))
	}
	if v := r.get(c, "k3", taggedLoader(&loads, "v", "t")); v != "v" {
		t.Fatalf("Get of a key past the bound: %q, want the value", v)
	}
	if r.stored("k3") {
		t.Fatal("a key past MaxTagEntries was stored: a purge would not find it")
	}
	if s := c.Stats(); s.CommitErrors != 1 {
		t.Fatalf("CommitErrors %d, want 1", s.CommitErrors)
	}
	if err := c.Set(ctx, "k4", []byte("v"), time.Hour, "t"); !errors.Is(err, ErrTagFull) {
		t.Fatalf("tagged Set past the bound: %v, want ErrTagFull", err)
	}
	if r.stored("k4") {
		t.Fatal("a failed tagged Set wrote its value")
	}
	if err := c.Set(ctx, "k1", []byte("again"), time.Hour, "t"); err != nil {
		t.Fatalf("tagged Set of a key in the full index: %v", err)
	}
	// Members whose values are dead leave the index at the next TAGADD.
	idx := makeTagKeys(r.prefix, "t").Index
	if err := r.rdb.ZAdd(ctx, idx, redis.Z{Score: 1, Member: "dead"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.rdb.ZIncrBy(ctx, idx, -1e15, mustHash(t, "k0")).Err(); err != nil { // k0's value "expired"
		t.Fatal(err)
	}
	if err := c.Set(ctx, "k5", []byte("v"), time.Hour, "t"); err != nil {
		t.Fatalf("tagged Set after a member died: %v", err)
	}
	if n := r.rdb.ZCard(ctx, idx).Val(); n != 3 {
		t.Fatalf("index holds %d members, want 3", n)
	}
}

func mustHash(t *testing.T, key string) string {
	keys, err := makeKeys("x", key)
	if err != nil {
		t.Fatal(err)
	}
	return keys.Hash()
}

// The index lives as long as its longest-lived value plus the grace, and
// the memory of a purge purgedTTL.
func testIndexExpiresWithEntries(t *testing.T, r *tagRig) {
	c := r.cache(nil)
	ctx := context.Background()
	tk := makeTagKeys(r.prefix, "t")
	pttl := func(name string) time.Duration {
		t.Helper()
		d, err := r.rdb.PTTL(ctx, name).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	within := func(what string, got, lo, hi time.Duration) {
		t.Helper()
		if got < lo || got > hi {
			t.Fatalf("%s: PTTL %v, want within [%v, %v]", what, got, lo, hi)
		}
	}
	if err := c.Set(ctx, "a", []byte("v"), time.Hour, "t"); err != nil {
		t.Fatal(err)
	}
	within("index after a 1h value", pttl(tk.Index), time.Hour, time.Hour+tagGrace)
	if err := c.Set(ctx, "b", []byte("v"), 3*time.Hour, "t"); err != nil {
		t.Fatal(err)
	}
	within("index after a 3h value", pttl(tk.Index), 3*time.Hour, 3*time.Hour+tagGrace)
	if err := c.Set(ctx, "c", []byte("v"), time.Minute, "t"); err != nil {
		t.Fatal(err)
	}
	within("index after a shorter value", pttl(tk.Index), 3*time.Hour, 3*time.Hour+tagGrace)
	r.purge(c, "t")
	within("purge generation", pttl(tk.Purged), purgedTTL-time.Minute, purgedTTL)
	// The value's PX stays within its member's score.
	keys, _ := makeKeys(r.prefix, "b")
	if v := pttl(keys.Value); v > 3*time.Hour {
		t.Fatalf("value PTTL %v above its ttl", v)
	}
}

// Tags are hashed: braces, spaces, control bytes, binary and the longest
// tag land in one slot and never move a key's; the widest set of tags
// works; invalid ones are refused before any write.
func testHostileTags(t *testing.T, r *tagRig) {
	c := r.cache(nil)
	ctx := context.Background()
	long := strings.Repeat("x", MaxTagBytes)
	hostile := []string{"{", "}", "{a}", "}{", "a}{b", "{}", " ", "a b", "\r\n", "\x00", "\xff\xfe", "ключ", long, "P:{x}:tp"}
	many := make([]string, MaxTags)
	for i := range many {
		many[i] = "many:" + strconv.Itoa(i)
	}
	var loads atomic.Int64
	r.get(c, "hostile", taggedLoader(&loads, "v", hostile...))
	if err := c.Set(ctx, "many", []byte("v"), time.Hour, append(many, many[0])...); err != nil {
		t.Fatalf("Set with MaxTags tags (and a repeat): %v", err)
	}
	for _, tag := range hostile {
		if !r.stored("hostile") {
			t.Fatal("hostile: not stored")
		}
		r.purge(c, tag)
		if r.stored("hostile") {
			t.Fatalf("purging %q left the value", tag)
		}
		r.get(c, "hostile", taggedLoader(&loads, "v", hostile...))
	}
	r.purge(c, many[MaxTags-1])
	if r.stored("many") {
		t.Fatal("purging the last of MaxTags tags left the value")
	}

	for _, bad := range [][]string{{""}, {"ok", ""}, {long + "x"}, append(many, "one-more")} {
		if err := c.Set(ctx, "bad", []byte("v"), time.Hour, bad...); !errors.Is(err, ErrInvalidTag) {
			t.Fatalf("Set with %d tags (%d bytes at most): %v, want ErrInvalidTag", len(bad), len(bad[len(bad)-1]), err)
		}
		if err := c.InvalidateTag(ctx, bad...); !errors.Is(err, ErrInvalidTag) {
			t.Fatalf("InvalidateTag with an invalid tag: %v, want ErrInvalidTag", err)
		}
		v, err := c.Get(ctx, "bad", time.Hour, taggedLoader(&loads, "v", bad...))
		if !errors.Is(err, ErrLoadFailed) || !errors.Is(err, ErrInvalidTag) || v != nil {
			t.Fatalf("Get with a loader that sets invalid tags and fails: %q, %v", v, err)
		}
	}
	if r.stored("bad") {
		t.Fatal("a value with invalid tags was stored")
	}
	// A loader that ignores SetTags' error: the value is returned, not stored.
	v, err := c.Get(ctx, "ignored", time.Hour, func(ctx context.Context) ([]byte, error) {
		_ = SetTags(ctx, "")
		return []byte("v"), nil
	})
	if err != nil || string(v) != "v" || r.stored("ignored") {
		t.Fatalf("a loader ignoring an invalid tag: %q, %v, stored %v; want the value, not stored", v, err, r.stored("ignored"))
	}
	if err := SetTags(ctx, "t"); !errors.Is(err, ErrInvalidTag) {
		t.Fatalf("SetTags outside a loader: %v, want ErrInvalidTag", err)
	}
	if err := c.InvalidateTag(ctx); err != nil {
		t.Fatalf("InvalidateTag with no tags: %v", err)
	}
}

// Foreign values at herd's tag names: a foreign index refuses tagged
// writes and fails the purge with a clear error (its members may be
// lost: it is not dropped); a foreign purge generation or tag memory is
// replaced by the next purge.
func testTagForeignValues(t *testing.T, r *tagRig) {
	c := r.cache(nil)
	c.useTags()
	ctx := context.Background()
	var loads atomic.Int64
	tk := makeTagKeys(r.prefix, "t")
	if err := r.rdb.Set(ctx, tk.Index, "foreign", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v := r.get(c, "k", taggedLoader(&loads, "v", "t")); v != "v" || r.stored("k") {
		t.Fatalf("tagged Get over a foreign index: %q, stored %v; want the value, not stored", v, r.stored("k"))
	}
	if err := c.Set(ctx, "k", []byte("v"), time.Hour, "t"); err == nil || !strings.Contains(err.Error(), "not a sorted set") {
		t.Fatalf("tagged Set over a foreign index: %v", err)
	}
	if err := c.InvalidateTag(ctx, "t"); err == nil || !strings.Contains(err.Error(), "not a sorted set") {
		t.Fatalf("InvalidateTag over a foreign index: %v", err)
	}
	r.rdb.Del(ctx, tk.Index)

	if err := r.rdb.HSet(ctx, tk.Purged, "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	if v := r.get(c, "k2", taggedLoader(&loads, "v", "t")); v != "v" || r.stored("k2") {
		t.Fatal("a tagged Get over a foreign tag memory was stored")
	}
	r.rdb.Del(ctx, genKey(r.prefix))
	if err := r.rdb.HSet(ctx, genKey(r.prefix), "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	r.purge(c, "t") // replaces both
	r.get(c, "k3", taggedLoader(&loads, "v", "t"))
	if !r.stored("k3") {
		t.Fatalf("after the purge replaced the foreign values, a tagged Get was not stored (Stats %+v)", c.Stats())
	}
}

// The purge check of a long rebuild: past tagWindow/2 it reads the
// generation again and is refused if any purge ran since it began; one
// without a generation is refused.
func testTagLongRebuild(t *testing.T, r *tagRig) {
	c, other := r.cache(nil), r.cache(nil)
	ctx := context.Background()
	g0, err := parseGen(r.rdb.Get(ctx, genKey(r.prefix)))
	if err != nil {
		t.Fatal(err)
	}
	member := mustHash(t, "long")
	old := time.Now().Add(-tagWindow/2 - time.Second)
	record := func(gen generation) bool {
		t.Helper()
		purged, err := c.recordTags(ctx, member, []string{"never-purged"}, time.Hour, &gen, c.cfg.MaxTagEntries)
		if err != nil {
			t.Fatal(err)
		}
		return !purged
	}
	if !record(generation{val: g0, known: true, sent: time.Now()}) {
		t.Fatal("a short rebuild was refused")
	}
	if !record(generation{val: g0, known: true, sent: old}) {
		t.Fatal("a long rebuild was refused though no purge ran")
	}
	if record(generation{sent: old}) {
		t.Fatal("a long rebuild without a generation was accepted")
	}
	r.purge(other, "unrelated")
	if record(generation{val: g0, known: true, sent: old}) {
		t.Fatal("a long rebuild was accepted though a purge ran since it began")
	}
	if !record(generation{val: g0, known: true, sent: time.Now()}) {
		t.Fatal("a short rebuild was refused after a purge of another tag")
	}
}

// A purge while Redis is down fails with the Redis error; once Redis is
// back, the same call finishes the job. A tagged commit that cannot reach
// Redis is not stored.
func TestTagPurgeRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.MaxRetries = -1; o.DialTimeout = 300 * time.Millisecond })
	c := newTestCache(t, rdb, nil)
	ctx := context.Background()
	var loads atomic.Int64
	if _, err := c.Get(ctx, "k", time.Hour, taggedLoader(&loads, "v", "t")); err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	err := c.InvalidateTag(ctx, "t")
	if err == nil || !strings.Contains(err.Error(), "purge generation") {
		t.Fatalf("InvalidateTag with Redis down: %v, want an error about the purge generation", err)
	}
	srv.Restart(t)
	if err := c.InvalidateTag(ctx, "t"); err != nil {
		t.Fatalf("InvalidateTag after Redis came back: %v", err)
	}

	// Redis goes away while a tagged value is built: its callers get it.
	g := newGatedLoader("v")
	got := make(chan string, 1)
	done := async(func() error {
		v, err := c.Get(ctx, "k2", time.Hour, gatedTagged(g, "t"))
		got <- string(v)
		return err
	})
	g.waitEntered(t)
	srv.Stop(t)
	close(g.gate)
	wait(t, done, "Get")
	if v := <-got; v != "v" {
		t.Fatalf("Get while Redis went away: %q, want the value", v)
	}
	if s := c.Stats(); s.CommitErrors != 1 {
		t.Fatalf("CommitErrors %d, want 1", s.CommitErrors)
	}
	srv.Restart(t)
	keys, _ := makeKeys(DefaultPrefix, "k2")
	if n := rdb.Exists(ctx, keys.Value).Val(); n != 0 {
		t.Fatal("a tagged value whose tags were not recorded is stored")
	}
}
