package herd

// Attacks on the near cache (near.go): claims of its header,
// docs/guarantees.md (guarantee 7), the README and docs/design.md, tried on a real
// redis-server.

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// MaxAge caps every near copy "whatever the invalidations", and a copy is
// never served past its value's fresh period: both are durations on this
// process's clock. A step of the wall clock (NTP, a VM resumed) must not
// stretch them. The near copy's expiry was the value's fresh end, a
// wall-clock instant decoded from the envelope, compared with the wall
// clock: a step back of an hour kept serving the copy for an hour, long
// past MaxAge, whatever was written outside herd meanwhile.
func TestNearMaxAgeWallClockStep(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const maxAge = 900 * time.Millisecond
	c := newNearCache(t, srv.Client(t), NearOptions{MaxAge: maxAge}, func(o *Options) { o.StaleFor = time.Hour })
	// The wall clock as this process reads it, held at t0 (so the value
	// stays fresh while a loaded machine warms the copy) until it steps
	// back an hour, as NTP may step it. The near copy's MaxAge runs on the
	// monotonic clock, which does not step: the sleep below is real.
	var step atomic.Int64
	t0 := time.Now()
	c.now = func() time.Time { return t0.Add(-time.Duration(step.Load())) }

	const key = "atk-near-clock"
	// Fresh for 300ms (less than MaxAge, so the fresh end is the copy's
	// expiry), then stale for an hour.
	rawSetEnv(t, rdb, key, c.newEnvelope(0, []byte("v1"), 300*time.Millisecond, time.Hour, 0))
	warm(t, c, key, "v1")
	step.Store(int64(time.Hour)) // the wall clock steps back an hour
	// Written outside herd: only MaxAge bounds the copy now.
	rawSetEnv(t, rdb, key, c.newEnvelope(0, []byte("v2"), time.Hour, 0, 0))
	time.Sleep(3 * maxAge) // well past MaxAge on any clock that does not step
	before := c.Stats()
	got := getString(t, c, key)
	if d := statsDelta(before, c.Stats()); d.NearHits != 0 || got != "v1" && got != "v2" {
		t.Fatalf("%v after the copy was read (MaxAge %v), after a wall clock step back: Get = %q with %d near hits; want no near hit", 3*maxAge, maxAge, got, d.NearHits)
	}
	if got != "v2" {
		t.Fatalf("Get = %q, want v2 from Redis", got)
	}
}

// Guarantee 7 with the near cache: a Get "keeps this promise for the
// writes of its own process" (docs/guarantees.md), and "this process's own writes
// drop its near copy before they return". A process may hold two Caches
// on the same Redis and prefix (one with the near cache, one without, as
// a library and its user may): a Set by the one returned, and a Get by
// the other, started after it, answered from the near copy of the value
// the Set replaced. Only the pub/sub message dropped it, Staleness later.
func TestNearOtherCacheSameProcess(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()
	a := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	a.joinNearPeers()                                                        // as New leaves it (newNearCache makes it a process of its own)
	b := newTestCache(t, srv.Client(t), &Options{DefaultLease: time.Second}) // near cache off
	const key = "atk-near-two-caches"
	if err := b.Set(ctx, key, []byte("v1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	warm(t, a, key, "v1")
	// a's subscriber is slow (blocked here): the message of b's write is
	// not handled yet.
	g := newGate()
	setHooks(a, &nearHooks{receive: func(string, uint64, any, error) { g.pass() }})
	g.close()
	defer g.release()
	if err := b.Set(ctx, key, []byte("v2"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := getString(t, a, key); got != "v2" {
		t.Fatalf("Get by a Cache of this process after a Set by another returned: %q, want v2", got)
	}
	// A near miss joining a fill whose GET was sent before the write is
	// no better.
	if err := b.Set(ctx, key, []byte("v3"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := getString(t, a, key); got != "v3" {
		t.Fatalf("Get after the second Set: %q, want v3", got)
	}
}
