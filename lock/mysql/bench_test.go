package mysql

import (
	"context"
	"testing"
	"time"
)

// BenchmarkTryAcquireRelease is one uncontended holding: TryAcquire
// (GET_LOCK, then wait_timeout and the token's committed INSERT) and
// Release (RELEASE_LOCK and wait_timeout back, the connection back to the
// pool). ns/op is the pair's latency.
func BenchmarkTryAcquireRelease(b *testing.B) {
	ctx := context.Background()
	l := newTestLocker(b, nil)
	key := testName(b)
	var acquire, release time.Duration
	for b.Loop() {
		start := time.Now()
		lease, err := l.TryAcquire(ctx, key, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
		acquire += mid.Sub(start)
		release += time.Since(mid)
	}
	b.ReportMetric(float64(acquire.Microseconds())/float64(b.N), "acquire-µs/op")
	b.ReportMetric(float64(release.Microseconds())/float64(b.N), "release-µs/op")
}

// BenchmarkTryAcquireHeld is a TryAcquire of a held key: one GET_LOCK on
// an idle connection of the Locker's.
func BenchmarkTryAcquireHeld(b *testing.B) {
	ctx := context.Background()
	l := newTestLocker(b, nil)
	key := testName(b)
	held, err := l.TryAcquire(ctx, key, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	defer held.Release(ctx)
	for b.Loop() {
		if _, err := l.TryAcquire(ctx, key, time.Minute); err == nil {
			b.Fatal("acquired a held key")
		}
	}
}

// BenchmarkHandover is the wake-up of a waiter: a holder releases while
// another Locker's Acquire waits in GET_LOCK; ns/op is from the Release's
// start to the waiter's lease.
func BenchmarkHandover(b *testing.B) {
	ctx := context.Background()
	a, w := newTestLocker(b, nil), newTestLocker(b, nil)
	key := testName(b)
	held, err := a.TryAcquire(ctx, key, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	db := testDB(b)
	var total time.Duration
	for b.Loop() {
		got := make(chan *Lease, 1)
		go func() {
			lease, err := w.Acquire(ctx, key, time.Minute)
			if err != nil {
				b.Error(err)
			}
			got <- lease
		}()
		waitForWaiter(b, db, key)
		start := time.Now()
		if err := held.Release(ctx); err != nil {
			b.Fatal(err)
		}
		next := <-got
		total += time.Since(start)
		if next == nil {
			b.Fatal("the waiter failed")
		}
		held = next
		a, w = w, a
	}
	held.Release(ctx)
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "handover-µs/op")
}
