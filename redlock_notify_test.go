package herd

import (
	"context"
	"errors"
	"testing"
	"time"
)

// redlockWake is the stated bound from a Release to the next attempt of a
// Redlock waiter on loopback: one pub/sub message. The tests allow ten
// times it, far below the one-minute fallback re-check they configure.
const redlockWake = 50 * time.Millisecond

// notifiedRedlock returns a Redlock whose fallback re-check is a minute
// (only a notification can wake its waiters within the tests' bounds) and
// a channel that receives once per contended wait.
func (g *redlockRig) notifiedRedlock() (*Redlock, <-chan struct{}) {
	contended := make(chan struct{}, 16)
	obs := &Observer{Lease: func(_ string, ev LeaseEvent) {
		if ev == LeaseContended {
			contended <- struct{}{}
		}
	}}
	return g.redlock(&RedlockOptions{NodeTimeout: testNodeTimeout, PollMin: time.Minute, PollMax: time.Minute,
		MaxWait: 5 * time.Minute, Observer: obs}), contended
}

// awaitSubscribers waits until channel has a subscriber on each of the
// rig's masters in up (the waiter is listening there), so that the
// release the test makes next reaches it as a message.
func (g *redlockRig) awaitSubscribers(channel string, up ...int) {
	g.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, i := range up {
		for {
			n, err := g.clients[i].PubSubNumSub(context.Background(), channel).Result()
			if err == nil && n[channel] > 0 {
				break
			}
			if time.Now().After(deadline) {
				g.t.Fatalf("master %d: no subscriber on %s after 10s (%v)", i, channel, err)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// acquireAsync runs r.Acquire(key) in a goroutine; the result arrives on
// the returned channel.
func acquireAsync(r *Redlock, key string, ttl time.Duration) <-chan acquired {
	done := make(chan acquired, 1)
	go func() {
		l, err := r.Acquire(context.Background(), key, ttl)
		done <- acquired{l, err}
	}()
	return done
}

type acquired struct {
	lease *RedlockLease
	err   error
}

// awaitContended waits for the waiter's first attempt to find the lease
// held (contended), and fails t if its Acquire returned instead or
// neither came within a minute.
func awaitContended(t *testing.T, contended <-chan struct{}, done <-chan acquired) {
	t.Helper()
	timer := time.NewTimer(time.Minute)
	defer timer.Stop()
	select {
	case <-contended:
	case got := <-done:
		t.Fatalf("Acquire returned (%v, %v) before it found the lease held", got.lease, got.err)
	case <-timer.C:
		t.Fatal("the waiter's Acquire neither found the lease held nor returned within a minute")
	}
}

// wokenWithin fails t unless done delivers a lease within bound.
func wokenWithin(t *testing.T, done <-chan acquired, bound time.Duration) *RedlockLease {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case got := <-done:
		if got.err != nil {
			t.Fatalf("Acquire: %v", got.err)
		}
		return got.lease
	case <-timer.C:
		t.Fatalf("the waiter did not take the lock within %v of the Release (fallback re-check: a minute): not woken by the release's notification", bound)
		return nil
	}
}

// TestRedlockAcquireWokenByRelease: a waiter on Redlock(3) takes the lock
// within ten times the stated wake bound of the holder's Release, while
// its fallback re-check is a minute and the holder's lease a minute too.
// In the first round the Release comes as soon as the waiter's first
// attempt failed, before its subscriptions may be confirmed: the attempt
// that each confirmation starts sees it. In the later rounds the waiter
// is known to be subscribed on every master first: the release's PUBLISH
// wakes it.
func TestRedlockAcquireWokenByRelease(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	holder := g.redlock(nil)
	waiter, contended := g.notifiedRedlock()
	ctx := context.Background()
	key := testKey(t)
	keys, _ := makeKeys(DefaultPrefix, key)
	for round := range 3 { // the same waiter's subscriptions, used again
		a, err := holder.TryAcquire(ctx, key, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		done := acquireAsync(waiter, key, time.Minute)
		awaitContended(t, contended, done)
		if round > 0 {
			g.awaitSubscribers(keys.Channel, 0, 1, 2)
		}
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		b := wokenWithin(t, done, 10*redlockWake)
		if b.Token() <= a.Token() {
			t.Errorf("round %d: token %d after %d", round, b.Token(), a.Token())
		}
		if err := b.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRedlockAcquireWokenWithDeadMaster: with one master of three down
// (the holder took its lease on the other two), the waiter's subscription
// there fails without holding it up, and the release published by the
// two live masters wakes it. Every attempt now lasts up to a round's
// timeout (the client dials the dead master again each time), and the
// release may land during one: the bound is two rounds more than the
// wake's.
func TestRedlockAcquireWokenWithDeadMaster(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	g.srvs[2].Stop(t)
	holder := g.redlock(nil)
	waiter, contended := g.notifiedRedlock()
	ctx := context.Background()
	key := testKey(t)
	keys, _ := makeKeys(DefaultPrefix, key)
	a, err := holder.TryAcquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(waiter, key, time.Minute)
	awaitContended(t, contended, done)
	g.awaitSubscribers(keys.Channel, 0, 1)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b := wokenWithin(t, done, 2*testNodeTimeout+10*redlockWake)
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedlockCloseEndsWaitWithPausedMaster: a waiter subscribed while one
// master is frozen (it accepts the connection, answers nothing) returns
// ErrClosed within ten times the wake bound of Close, and Close returns;
// goleak (TestMain) checks that no goroutine is left.
func TestRedlockCloseEndsWaitWithPausedMaster(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	holder := g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	keys, _ := makeKeys(DefaultPrefix, key)
	a, err := holder.TryAcquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	g.srvs[2].Pause(t)
	defer g.srvs[2].Resume(t)
	waiter, contended := g.notifiedRedlock()
	done := acquireAsync(waiter, key, time.Minute)
	awaitContended(t, contended, done)
	g.awaitSubscribers(keys.Channel, 0, 1)
	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- waiter.Close() }()
	select {
	case got := <-done:
		if !errors.Is(got.err, ErrClosed) {
			t.Errorf("Acquire: %v, want ErrClosed", got.err)
		}
	case <-time.After(10 * redlockWake):
		t.Fatalf("Acquire still waiting %v after Close", 10*redlockWake)
	}
	// Close itself waits for the calls still running against the frozen
	// master: they end at its round's timeout or the client's ReadTimeout.
	if err := <-closed; err != nil && !errors.Is(err, ErrClosed) {
		t.Errorf("Close: %v", err)
	}
	t.Logf("Close returned after %v", time.Since(start))
}

// TestRedlockFailedAttemptPublishes: a failed attempt gives back what it
// took and publishes that release on the masters where it took something,
// when no other owner held a quorum (it may be what kept another waiter
// from one); when another owner holds a quorum, it gives back without a
// message (no waiter could win: a message would only start another
// round). The check is on one subscriber connection to the master the
// attempt won: the test's own marker, published after the attempt,
// arrives first exactly when the attempt published nothing.
func TestRedlockFailedAttemptPublishes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		holders [2]string // the owners put on masters 0 and 1
		want    string    // the first message on master 2 after the attempt
	}{
		{"split, no quorum held", [2]string{"other-a", "other-b"}, msgReleased},
		{"another owner's quorum", [2]string{"other-a", "other-a"}, "marker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startRedlockRig(t, 3)
			r := g.redlock(nil)
			ctx := context.Background()
			key := testKey(t)
			keys, _ := makeKeys(DefaultPrefix, key)
			for i, owner := range tc.holders {
				if err := g.clients[i].Set(ctx, keys.Lease, owner, time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			}
			sub := g.clients[2].Subscribe(ctx, keys.Channel)
			defer sub.Close()
			if _, err := sub.Receive(ctx); err != nil { // the confirmation
				t.Fatal(err)
			}
			if _, err := r.TryAcquire(ctx, key, time.Minute); !errors.Is(err, ErrLeaseHeld) {
				t.Fatalf("TryAcquire: %v, want ErrLeaseHeld", err)
			}
			if n, _ := g.clients[2].Exists(ctx, keys.Lease).Result(); n != 0 {
				t.Fatal("the failed attempt left its lease on master 2")
			}
			if err := g.clients[2].Publish(ctx, keys.Channel, "marker").Err(); err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			msg, err := sub.ReceiveMessage(rctx)
			if err != nil {
				t.Fatal(err)
			}
			if msg.Payload != tc.want {
				t.Errorf("first message after the failed attempt: %q, want %q", msg.Payload, tc.want)
			}
		})
	}
}

// TestRedlockSplitVoteResolves: waiters on several Redlocks, woken
// together by one release, collide on the masters; the give-backs of
// their failed attempts wake the others, and the random delay after a
// split lets one of them win, so that every waiter gets the lock in turn
// without the minute-long fallback.
func TestRedlockSplitVoteResolves(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	holder := g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	keys, _ := makeKeys(DefaultPrefix, key)
	a, err := holder.TryAcquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 6
	results := make(chan acquired, waiters)
	for range waiters {
		w, contended := g.notifiedRedlock()
		go func() {
			l, err := w.Acquire(context.Background(), key, time.Minute)
			results <- acquired{l, err}
		}()
		awaitContended(t, contended, nil) // its result comes on results
	}
	g.awaitSubscribers(keys.Channel, 0, 1, 2)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Each new holder releases at once; every handoff is a notification.
	bound := 10 * redlockWake
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for n := range waiters {
		select {
		case got := <-results:
			if got.err != nil {
				t.Fatalf("Acquire: %v", got.err)
			}
			if err := got.lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			timer.Reset(bound)
		case <-timer.C:
			t.Fatalf("%d of %d waiters got the lock; none of the others within %v of the last release", n, waiters, bound)
		}
	}
}
