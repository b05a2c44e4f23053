package etcd

import (
	"context"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func withCount() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}
}

// BenchmarkTryAcquireRelease measures an uncontended holding on one key:
// TryAcquire (grant and transaction) then Release (transaction and
// revoke), on the run's etcd server. It reports the median of each half.
func BenchmarkTryAcquireRelease(b *testing.B) {
	ctx := context.Background()
	l := newTestLocker(b, nil, nil)
	name := testName(b)
	var acq, rel []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		t0 := time.Now()
		lease, err := l.TryAcquire(ctx, name, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
		acq, rel = append(acq, t1.Sub(t0)), append(rel, time.Since(t1))
	}
	b.ReportMetric(median(acq).Seconds()*1e3, "acquire-ms")
	b.ReportMetric(median(rel).Seconds()*1e3, "release-ms")
}

// BenchmarkHandoff measures the hand-off to a waiter in another Locker:
// from the holder's Release to the waiter's Acquire returning (the
// deletion's watch event, the waiter's re-check and its renewal).
func BenchmarkHandoff(b *testing.B) {
	ctx := context.Background()
	s := sharedServer(b)
	holder := newTestLocker(b, nil, nil)
	waiter := newTestLocker(b, nil, &Options{Recheck: time.Minute})
	cli := newClient(b, s.Endpoints())
	name := testName(b)
	var wake []time.Duration
	for b.Loop() {
		lease, err := holder.TryAcquire(ctx, name, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan *Lease, 1)
		go func() {
			next, _ := waiter.Acquire(ctx, name, 10*time.Second)
			got <- next
		}()
		for {
			resp, err := cli.Get(ctx, holder.prefix(name), withCount()...)
			if err != nil {
				b.Fatal(err)
			}
			if resp.Count == 2 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		t0 := time.Now()
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
		next := <-got
		wake = append(wake, time.Since(t0))
		if next == nil {
			b.Fatal("the waiter did not take the lock")
		}
		if err := next.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(median(wake).Seconds()*1e3, "handoff-ms")
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
