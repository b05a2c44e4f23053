package herd

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// Tests of the fixes made in redlock_fault_test.go.

// TestRedlockExtendNeverShortens: an Extend with a ttl below the lease's
// remaining time succeeds but leaves every master's lease and the local
// Deadline as they were (an extend only moves expiries later), and an
// Extend ttl outside 10ms..50y is ErrInvalidTTL without touching Redis.
func TestRedlockExtendNeverShortens(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r := g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	const ttl = 30 * time.Second
	a, err := r.TryAcquire(ctx, key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	before := a.Deadline()
	if err := a.Extend(ctx, 300*time.Millisecond); err != nil {
		t.Fatalf("Extend(300ms) of a 30s lease: %v", err)
	}
	if got := a.Deadline(); got.Before(before) {
		t.Errorf("Deadline moved back by %v after a shorter Extend", before.Sub(got))
	}
	keys, _ := makeKeys(DefaultPrefix, key)
	for i, c := range g.clients {
		if p := c.PTTL(ctx, keys.Lease).Val(); p < ttl/2 {
			t.Errorf("master %d: lease PTTL %v after Extend(300ms) of a 30s lease, want it left near 30s", i, p)
		}
	}
	for _, bad := range []time.Duration{0, time.Millisecond, redlockMinLease - 1, redlockMaxLease + 1} {
		err := a.Extend(ctx, bad)
		if !errors.Is(err, ErrInvalidTTL) || !strings.Contains(err.Error(), "between 10ms and") {
			t.Errorf("Extend(%v): %v, want ErrInvalidTTL naming the range", bad, err)
		}
	}
	if isClosed(a.Lost()) {
		t.Error("Lost closed by extends that were rejected or only shorter")
	}
	// A longer Extend moves the masters' expiry and the Deadline forward.
	if err := a.Extend(ctx, 2*ttl); err != nil {
		t.Fatal(err)
	}
	if !a.Deadline().After(before) {
		t.Errorf("Deadline %v not after %v following Extend(2×lease)", a.Deadline(), before)
	}
	for i, c := range g.clients {
		if p := c.PTTL(ctx, keys.Lease).Val(); p <= ttl {
			t.Errorf("master %d: lease PTTL %v after Extend(%v)", i, p, 2*ttl)
		}
	}
}

// TestRedlockContentionLeavesNoMarker: an attempt that fails because
// another owner holds the key got every round-one reply, so its release
// leaves no released marker (markers are only for masters whose reply did
// not come): contention does not grow the masters' key space.
func TestRedlockContentionLeavesNoMarker(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r1, r2 := g.redlock(nil), g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	a, err := r1.TryAcquire(ctx, key, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	for range 5 {
		if _, err := r2.TryAcquire(ctx, key, 5*time.Second); !errors.Is(err, ErrLeaseHeld) {
			t.Fatalf("TryAcquire of a held key: %v, want ErrLeaseHeld", err)
		}
	}
	keys, _ := makeKeys(DefaultPrefix, key)
	for i, c := range g.clients {
		if m := c.Keys(ctx, keys.Lease+":x:*").Val(); len(m) != 0 {
			t.Errorf("master %d: %d released markers left by contended attempts: %v", i, len(m), m)
		}
	}
}

// TestRedlockReleasedMarkerRefusesLateAcquire: the round-one script of an
// owner whose failed attempt was released on a master (marker set) takes
// nothing there, even with the key free, and the marker expires with the
// lease length.
func TestRedlockReleasedMarkerRefusesLateAcquire(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r := g.redlock(nil)
	ctx := context.Background()
	keys, _ := makeKeys(DefaultPrefix, testKey(t))
	const ttl = 5 * time.Second
	if rep := r.releaseMarked(ctx, 0, keys, "owner-late", ttl); rep.err != nil || rep.ok {
		t.Fatalf("release of an owner that never acquired: %+v", rep)
	}
	if p := g.clients[0].PTTL(ctx, releasedKey(keys, "owner-late")).Val(); p <= 0 || p > ttl {
		t.Errorf("marker PTTL %v, want in (0, %v]", p, ttl)
	}
	if rep := r.acquireNode(ctx, 0, keys, "owner-late", ttl); rep.ok || rep.held || rep.err != nil {
		t.Errorf("late round one of a released owner: %+v, want refused without another holder", rep)
	}
	if n := g.clients[0].Exists(ctx, keys.Lease).Val(); n != 0 {
		t.Error("the late round one took the lease")
	}
	if rep := r.acquireNode(ctx, 0, keys, "owner-new", ttl); !rep.ok {
		t.Errorf("another owner's round one: %+v, want granted", rep)
	}
}

// TestRedlockKeepAliveCapWithoutShortening: renewals never shorten, yet
// the capped watchdog still ends the lease at its cap: it is renewed past
// its first validity, never a full lease beyond the cap, Lost closes, and
// a second owner then gets the key with a higher token.
func TestRedlockKeepAliveCapWithoutShortening(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r1, r2 := g.redlock(nil), g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	// A second: a renewal, a round to three masters, must land within
	// the lease's last two thirds on a loaded machine (with 300ms, CI's
	// first renewal came too late and the lease ran out unrenewed).
	const ttl = time.Second
	// Connections and scripts first: a cold first round to three masters
	// outlasted the 1s validity on a loaded CI machine.
	for _, r := range []*Redlock{r1, r2} {
		warm, err := r.TryAcquire(ctx, key+"-warm", 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := warm.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	a, err := r1.TryAcquire(ctx, key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	const maxHold = 5 * ttl / 3
	a.KeepAlive(maxHold)
	select {
	case <-a.Lost():
	case <-time.After(20 * ttl):
		t.Fatal("Lost not closed 20 lease lengths after the acquire with a cap of 5/3 of it")
	}
	capAt := start.Add(maxHold)
	if d := a.Deadline(); !d.After(start.Add(ttl)) || !d.Before(capAt.Add(ttl)) {
		t.Errorf("final Deadline %v after the acquire, want past the first lease (%v) and less than a lease past the cap (%v)",
			d.Sub(start), ttl, maxHold)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*ttl)
	defer cancel()
	b, err := r2.Acquire(wctx, key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if b.Token() <= a.Token() {
		t.Errorf("token %d after %d", b.Token(), a.Token())
	}
}
