package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd"
)

// TestCancelWithServerStalled: herd.Lock's contract says a wait cut
// short by ctx returns at once. With the etcd server stopped (SIGSTOP),
// an Acquire queued behind a holder must return promptly when its ctx is
// cancelled, not after a request timeout spent on cleanup. The bound is
// 500ms (the Locker's own request timeout is 5s, its cleanup's 1s).
func TestCancelWithServerStalled(t *testing.T) {
	ctx := context.Background()
	s := startServer(t)
	name := testName(t)
	const ttl = 5 * time.Second
	a := newTestLocker(t, s.Endpoints(), nil)
	b := newTestLocker(t, s.Endpoints(), nil)
	held, err := a.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := acquireAsync(t, wctx, b, name, ttl)
	waitQueue(t, b.cli, b, name, 2)
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := s.Resume(); err != nil {
				t.Error(err)
			}
		}
	}
	defer resume()
	cancel()
	cancelled := time.Now()
	r := await(t, ch, 10*time.Second, "Acquire after cancel")
	took := time.Since(cancelled)
	resume()
	if !errors.Is(r.err, herd.ErrLeaseHeld) || !errors.Is(r.err, context.Canceled) {
		t.Errorf("Acquire: %v, want ErrLeaseHeld and context.Canceled", r.err)
	}
	if took > 500*time.Millisecond {
		t.Errorf("Acquire returned %v after its context was cancelled, want at once (< 500ms)", took)
	}
	_ = held.Release(ctx)
}

// TestKeepAliveCapBeforeFirstRenewal: KeepAlive's maxHold is an
// absolute cap on the holding, counted from the acquire. A cap shorter
// than the first renewal's wait (a third to a half of the lease) must
// still end the lease at the cap, not at the lease's own end.
func TestKeepAliveCapBeforeFirstRenewal(t *testing.T) {
	l := newTestLocker(t, nil, nil)
	ctx := context.Background()
	const ttl, maxHold = 6 * time.Second, 300 * time.Millisecond
	lease, err := l.TryAcquire(ctx, testName(t), ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	capAt := time.Now().Add(maxHold)
	lease.KeepAlive(maxHold)
	if d := lease.Deadline(); d.After(capAt) {
		t.Errorf("Deadline %v after KeepAlive(%v), past the cap by %v", d, maxHold, d.Sub(capAt))
	}
	select {
	case <-lease.Lost():
	case <-time.After(ttl / 2):
		t.Errorf("Lost still open %v after the acquire, with KeepAlive(%v)", ttl/2, maxHold)
	}
}

// TestMaxWaitOverflow: MaxWait's default is three times the lease
// length. For the longest leases the Locker accepts (up to
// clientv3.MaxLeaseTTL seconds), three times that overflows a
// time.Duration: an Acquire of a held lock must still wait (here until
// its context ends), not fail at once with ErrWaitTimeout.
func TestMaxWaitOverflow(t *testing.T) {
	ctx := context.Background()
	l := newTestLocker(t, nil, nil)
	name := testName(t)
	held, err := l.TryAcquire(ctx, name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	const ttl = 4_000_000_000 * time.Second // three times it wraps to a negative Duration
	lease, err := l.Acquire(wctx, name, ttl)
	if err == nil {
		lease.Release(ctx)
		t.Fatal("Acquire of a held lock succeeded")
	}
	if errors.Is(err, herd.ErrWaitTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire with a %v lease: %v; want its context's end, not ErrWaitTimeout", ttl, err)
	}
}
