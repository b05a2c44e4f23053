package zookeeper

import (
	"context"
	"testing"
	"time"
)

// BenchmarkAcquireRelease measures an uncontended TryAcquire and Release
// on one Locker: with the idle session reused from one holding to the next
// (create, children, exists; then delete), and with a new session each
// time (its connect and close on top). It reports each half in ms.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, bc := range []struct {
		name  string
		fresh bool
	}{
		{"idle session", false},
		{"new session", true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := newTestLocker(b, nil, nil)
			ctx := context.Background()
			name := testName(b)
			var acq, rel time.Duration
			b.ReportAllocs()
			for b.Loop() {
				start := time.Now()
				lease, err := l.TryAcquire(ctx, name, 10*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				mid := time.Now()
				if err := lease.Release(ctx); err != nil {
					b.Fatal(err)
				}
				if bc.fresh { // the session's close is part of the cost
					l.idleMu.Lock()
					idle := l.idle
					l.idle = nil
					l.idleMu.Unlock()
					for _, s := range idle {
						s.close()
					}
				}
				acq += mid.Sub(start)
				rel += time.Since(mid)
			}
			b.ReportMetric(float64(acq.Microseconds())/1000/float64(b.N), "acquire-ms/op")
			b.ReportMetric(float64(rel.Microseconds())/1000/float64(b.N), "release-ms/op")
		})
	}
}

// BenchmarkHandoff measures the hand-over of a held lock to an Acquire
// waiting in another Locker: from the start of the holder's Release to
// the waiter's return, woken by its watch (the re-check is a minute).
func BenchmarkHandoff(b *testing.B) {
	holder := newTestLocker(b, nil, nil)
	waiter := newTestLocker(b, nil, &Options{Recheck: time.Minute})
	ctx := context.Background()
	name := testName(b)
	var total time.Duration
	for b.Loop() {
		held, err := holder.TryAcquire(ctx, name, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan *Lease, 1)
		go func() {
			l, err := waiter.Acquire(ctx, name, 10*time.Second)
			if err != nil {
				b.Error(err)
			}
			got <- l
		}()
		// Wait until the waiter's node is queued behind the holder's.
		for {
			children, _, err := held.s.conn.Children(holder.parent(name))
			if err != nil {
				b.Fatal(err)
			}
			if len(children) == 2 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(5 * time.Millisecond) // let it set its watch
		start := time.Now()
		if err := held.Release(ctx); err != nil {
			b.Fatal(err)
		}
		next := <-got
		total += time.Since(start)
		if next == nil {
			b.FailNow()
		}
		if err := next.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "handoff-ms/op")
}
