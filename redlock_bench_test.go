package herd

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkLockLatency measures, in one run against the same real
// redis-servers, the latency of an uncontended acquire and of its release
// for Locker (one server), Redlock over 3 masters and Redlock over 5
// masters. Each sub-benchmark reports p50 and p99 of both, in µs.
//
//	go test -run '^$' -bench LockLatency -benchtime 2000x .
func BenchmarkLockLatency(b *testing.B) {
	var clients []redis.UniversalClient
	for range 5 {
		clients = append(clients, redistest.Start(b).Client(b))
	}
	ctx := context.Background()
	const ttl = 10 * time.Second
	backends := []struct {
		name string
		new  func() (Lock[LeaseHandle], func())
	}{
		{"Locker", func() (Lock[LeaseHandle], func()) {
			l := NewLocker(clients[0], nil)
			return adapt[*Lease]{l}, func() { l.Close() }
		}},
		{"Redlock3", func() (Lock[LeaseHandle], func()) {
			r := NewRedlock(clients[:3], nil)
			return adapt[*RedlockLease]{r}, func() { r.Close() }
		}},
		{"Redlock5", func() (Lock[LeaseHandle], func()) {
			r := NewRedlock(clients, nil)
			return adapt[*RedlockLease]{r}, func() { r.Close() }
		}},
	}
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			l, done := be.new()
			defer done()
			var acq, rel []time.Duration
			for b.Loop() {
				t0 := time.Now()
				lease, err := l.TryAcquire(ctx, "bench-lock", ttl)
				t1 := time.Now()
				if err != nil {
					b.Fatal(err)
				}
				if err := lease.Release(ctx); err != nil {
					b.Fatal(err)
				}
				acq = append(acq, t1.Sub(t0))
				rel = append(rel, time.Since(t1))
			}
			reportQuantiles(b, "acquire", acq)
			reportQuantiles(b, "release", rel)
		})
	}
}

// adapt turns a Lock[L] into a Lock[LeaseHandle].
type adapt[L LeaseHandle] struct{ l Lock[L] }

func (a adapt[L]) TryAcquire(ctx context.Context, key string, ttl time.Duration) (LeaseHandle, error) {
	return a.l.TryAcquire(ctx, key, ttl)
}
func (a adapt[L]) Acquire(ctx context.Context, key string, ttl time.Duration) (LeaseHandle, error) {
	return a.l.Acquire(ctx, key, ttl)
}
func (a adapt[L]) Close() error { return a.l.Close() }

// reportQuantiles reports the p50 and p99 of ds in µs as name-p50-µs and
// name-p99-µs.
func reportQuantiles(b *testing.B, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	q := func(p float64) float64 {
		return float64(ds[min(int(p*float64(len(ds))), len(ds)-1)]) / float64(time.Microsecond)
	}
	b.ReportMetric(q(0.50), name+"-p50-µs")
	b.ReportMetric(q(0.99), name+"-p99-µs")
}
