package herd

import (
	"context"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// Options.WaitTimeout: "When set, it is a hard bound." A Begin that
// waits for this process's Fill, sees it handed over late in its budget,
// and then follows the caller that took the lease next, must still give
// up at one WaitTimeout from its start, not at a fresh budget per wait.
func TestBeginWaitTimeoutBoundsEveryWaitOfOneCall(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const budget = 2 * time.Second
	c := newTestCache(t, srv.Client(t), &Options{WaitTimeout: budget})
	ctx := context.Background()
	key := testKey(t)
	_, first, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || first == nil {
		t.Fatalf("first Begin = (%v, %v), want a Fill", first, err)
	}
	type result struct {
		fill *Fill
		hit  *Hit
		err  error
		took time.Duration
	}
	out := make(chan result, 2)
	start := time.Now()
	for range 2 {
		go func() {
			t0 := time.Now()
			hit, fl, err := c.Begin(ctx, key, time.Minute, nil)
			out <- result{fl, hit, err, time.Since(t0)}
		}()
	}
	waitFor(t, 5*time.Second, "both Begins waiting on the first Fill", func() bool {
		c.fillMu.Lock()
		defer c.fillMu.Unlock()
		lf := c.fills[key]
		return lf != nil && lf.waiters == 2
	})
	// Late in the waiters' budget, the first Fill's caller leaves: one
	// waiter takes the lease, and holds it; the other follows it.
	time.Sleep(time.Until(start.Add(9 * budget / 10)))
	first.Handover()
	a := <-out
	if a.fill == nil || !a.fill.Leased() {
		t.Fatalf("the first Begin to return after the hand-over: fill %v, hit %v, err %v; want the lease", a.fill, a.hit, a.err)
	}
	defer a.fill.Abort(nil)
	b := <-out
	if b.fill != nil {
		defer b.fill.Abort(nil)
	}
	// Fallback LoadLocally: an unleased Fill once the budget is spent.
	if b.fill == nil || b.fill.Leased() {
		t.Fatalf("the follower: fill %v, hit %v, err %v; want an unleased Fill (Fallback LoadLocally)", b.fill, b.hit, b.err)
	}
	// Wait by wait, it would take 1.9 budgets; a loaded machine gets 0.4.
	if b.took > budget+2*budget/5 {
		t.Errorf("the follower's Begin took %v with WaitTimeout %v: each wait had a budget of its own", b.took.Round(time.Millisecond), budget)
	}
}
