package herd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// TestFillHandover: a Fill handed over (its caller gave up, the value can
// still be built) fails nobody. A waiter in this process and one in
// another process both look again; exactly one of them leads, the other
// gets its value, and no load error is counted anywhere.
func TestFillHandover(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), nil)
	other := newTestCache(t, srv.Client(t), nil)
	ctx := context.Background()
	key := testKey(t)
	_, fill, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill == nil || !fill.Leased() {
		t.Fatalf("Begin on a cold key = (%v, %v), want a leased Fill", fill, err)
	}
	type res struct {
		who  string
		hit  *Hit
		fill *Fill
		err  error
	}
	out := make(chan res, 2)
	go func() {
		h, f, err := c.Begin(ctx, key, time.Minute, nil)
		out <- res{"local", h, f, err}
	}()
	go func() {
		h, f, err := other.Begin(ctx, key, time.Minute, nil)
		out <- res{"remote", h, f, err}
	}()
	waitLocalWaiters(t, c, key, 1)
	waitFor(t, 5*time.Second, "the remote waiter to follow", func() bool { return other.Stats().Waits == 1 })

	fill.Handover()
	fill.Abort(errors.New("too late")) // after Handover: no effect

	limit := time.NewTimer(10 * time.Second)
	defer limit.Stop()
	var first res
	select {
	case first = <-out:
	case <-limit.C:
		t.Fatal("no waiter took the rebuild over after Handover")
	}
	if first.err != nil || first.fill == nil || !first.fill.Leased() {
		t.Fatalf("%s waiter after Handover: (%v, %v, %v), want a leased Fill", first.who, first.hit, first.fill, first.err)
	}
	if err := first.fill.Commit([]byte("rebuilt"), time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	var second res
	select {
	case second = <-out:
	case <-limit.C:
		t.Fatal("the other waiter got nothing after the new leader's Commit")
	}
	if second.err != nil || second.hit == nil || string(second.hit.Value) != "rebuilt" {
		t.Fatalf("%s waiter: (%v, %v, %v), want the new leader's value", second.who, second.hit, second.fill, second.err)
	}
	for name, cc := range map[string]*Cache{"this": c, "other": other} {
		if n := cc.Stats().LoadErrors; n != 0 {
			t.Errorf("%s cache counted %d load errors, want 0 (a handover is not a failure)", name, n)
		}
	}
}
