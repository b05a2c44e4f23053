package herd

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// BenchmarkAcquireWakeup measures how long a waiter in Acquire takes to
// get the lease after the holder releases it, on a real redis-server.
// Polling is set to 5 s, so a wake-up in microseconds can only come from
// the release notification. It reports the median and the worst wake-up.
func BenchmarkAcquireWakeup(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	l := NewLocker(rdb, &LockerOptions{PollMin: 5 * time.Second, PollMax: 5 * time.Second, MaxWait: time.Minute})
	defer l.Close()
	ctx := context.Background()
	const key = "bench-wakeup"
	keys, _ := makeKeys(DefaultPrefix, key)
	be := backend{name: "redis", rdb: rdb}
	var wakes []time.Duration
	for b.Loop() {
		holder, err := l.TryAcquire(ctx, key, 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			le, err := l.Acquire(ctx, key, 30*time.Second)
			at := time.Now()
			if err == nil {
				le.Release(ctx)
			}
			got <- at
		}()
		waitSubscribedTB(b, be, keys.Channel, 1)
		released := time.Now()
		if err := holder.Release(ctx); err != nil {
			b.Fatal(err)
		}
		wakes = append(wakes, (<-got).Sub(released))
	}
	slices.Sort(wakes)
	b.ReportMetric(float64(wakes[len(wakes)/2].Microseconds()), "p50-wake-µs")
	b.ReportMetric(float64(wakes[len(wakes)-1].Microseconds()), "max-wake-µs")
}
