package herd

import (
	"context"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

func TestBreakerTransitions(t *testing.T) {
	t.Parallel()
	b := &breaker{threshold: 2, cooldown: time.Hour}
	passCooldown := func() { b.mu.Lock(); b.openUntil = time.Now().Add(-time.Millisecond); b.mu.Unlock() }
	if !b.allow() || b.success() {
		t.Fatal("a fresh breaker must allow, and a success must not report a close")
	}
	if b.failure() {
		t.Fatal("the first failure opened the breaker (threshold 2)")
	}
	if !b.allow() {
		t.Fatal("one failure below the threshold must still allow")
	}
	if !b.failure() {
		t.Fatal("the second consecutive failure did not open the breaker")
	}
	if b.allow() {
		t.Fatal("an open breaker allowed a call before its cooldown")
	}
	passCooldown()
	if !b.allow() {
		t.Fatal("no probe after the cooldown")
	}
	if b.allow() {
		t.Fatal("a second probe while one runs")
	}
	if b.failure() {
		t.Fatal("a failed probe reported opening again as a new open")
	}
	if b.allow() {
		t.Fatal("a failed probe did not reopen the breaker")
	}
	passCooldown()
	if !b.allow() || !b.success() {
		t.Fatal("a successful probe did not close the breaker")
	}
	if !b.allow() || b.troubled.Load() {
		t.Fatal("a closed breaker is still marked troubled")
	}
	// A success between failures resets the count: not consecutive.
	b.failure()
	b.success()
	if b.failure() {
		t.Fatal("failures separated by a success opened the breaker")
	}
}

// TestBreakerProbeLostIsReplaced: a probe that never reports (a path
// that forgot to) is presumed lost after a cooldown, and the next call
// probes: the breaker cannot stay shut for good.
func TestBreakerProbeLostIsReplaced(t *testing.T) {
	t.Parallel()
	b := &breaker{threshold: 1, cooldown: time.Hour}
	b.failure()
	b.mu.Lock()
	b.openUntil = time.Now().Add(-time.Millisecond)
	b.mu.Unlock()
	if !b.allow() {
		t.Fatal("no probe after the cooldown")
	}
	if b.allow() {
		t.Fatal("a second probe while the first is within its cooldown")
	}
	b.mu.Lock()
	b.probeUntil = time.Now().Add(-time.Millisecond) // a cooldown passed without a report
	b.mu.Unlock()
	if !b.allow() {
		t.Fatal("a probe that never reported blocked every later call")
	}
	b.probeDone()
	if !b.allow() {
		t.Fatal("after probeDone (no verdict), the next call past the cooldown must probe")
	}
}

// TestBreakerClosesAfterRefreshProbeErrorReply: when a background
// refresh was the breaker's probe and Redis answered it with an error
// reply (not an infrastructure error), the probe reported nothing and the
// breaker stayed in probing: every later call loaded locally, for good.
func TestBreakerClosesAfterRefreshProbeErrorReply(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	closed := make(chan struct{}, 1)
	c := newTestCache(t, rdb, &Options{BreakerThreshold: 1, BreakerCooldown: time.Hour,
		Observer: &Observer{Circuit: func(open bool) {
			if !open {
				select {
				case closed <- struct{}{}:
				default:
				}
			}
		}}})
	if err := c.Set(ctx, "hit", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	keys := mustKeys(t, "refreshed")
	// A foreign value of another type at the lease key: ACQUIRE's GET of it
	// is a WRONGTYPE error reply, an answer from a healthy Redis.
	if err := rdb.HSet(ctx, keys.Lease, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}

	// Open the breaker and let its cooldown pass.
	c.brk.failure()
	c.brk.mu.Lock()
	c.brk.openUntil = time.Now().Add(-time.Millisecond)
	c.brk.mu.Unlock()

	// The refresh is the first call after the cooldown: the probe.
	load := func(context.Context) ([]byte, error) { return []byte("new"), nil }
	c.refresh(&flight{key: "refreshed", keys: keys, ttl: time.Hour, load: load, refresh: load}, make([]byte, 8))

	v, err := c.Get(ctx, "hit", time.Hour, load)
	if err != nil || string(v) != "v" {
		t.Fatalf("Get = (%q, %v), want the stored v", v, err)
	}
	if st := c.Stats(); st.FailOpen != 0 || st.Hits != 1 {
		t.Errorf("after the refresh probe got an answer: fail-open %d, hits %d; want 0, 1 (the breaker stayed shut)", st.FailOpen, st.Hits)
	}
	select {
	case <-closed:
	default:
		t.Error("the Observer never saw the breaker close")
	}
}
