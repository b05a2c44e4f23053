package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/locktest"
)

// TestCancelWithServerStalled: with the etcd server stopped (SIGSTOP),
// an Acquire queued behind a holder returns at once when its ctx is
// cancelled, not after a request timeout spent on cleanup (the Locker's
// own request timeout is 5s, its cleanup's 1s)
// (locktest.CancelWithServerStalled).
func TestCancelWithServerStalled(t *testing.T) {
	s := startServer(t)
	b := newTestLocker(t, s.Endpoints(), nil)
	locktest.CancelWithServerStalled(t, locktest.StalledServer[*Lease]{
		Holder: newTestLocker(t, s.Endpoints(), nil),
		Waiter: b,
		Queued: func(t *testing.T, name string) { waitQueue(t, b.cli, b, name, 2) },
		Pause: func(t *testing.T) func() {
			if err := s.Pause(); err != nil {
				t.Fatal(err)
			}
			resumed := false
			return func() {
				if !resumed {
					resumed = true
					if err := s.Resume(); err != nil {
						t.Error(err)
					}
				}
			}
		},
		TTL: 5 * time.Second,
	})
}

// TestKeepAliveCapBeforeFirstRenewal: KeepAlive's cap ends the lease
// even when it comes before the first renewal
// (locktest.KeepAliveCapBeforeFirstRenewal).
func TestKeepAliveCapBeforeFirstRenewal(t *testing.T) {
	locktest.KeepAliveCapBeforeFirstRenewal(t, newTestLocker(t, nil, nil))
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
