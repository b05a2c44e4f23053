package herd

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// BenchmarkHit compares a cache hit (one GET, decode, freshness check,
// local single-flight) with a raw go-redis GET of the same bytes, on a
// real redis-server, in the same run. The Parallel variants use
// RunParallel (throughput); the others one goroutine (latency).
func BenchmarkHit(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	c := newTestCache(b, rdb, nil)
	ctx := context.Background()
	payload := make([]byte, 512)
	if err := c.Set(ctx, "hit", payload, time.Hour); err != nil {
		b.Fatal(err)
	}
	if err := rdb.Set(ctx, "raw", (&envelope{payload: payload}).encode(), time.Hour).Err(); err != nil {
		b.Fatal(err)
	}
	fail := func(context.Context) ([]byte, error) { panic("a hit called the loader") }

	b.Run("RawGET", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := rdb.Get(ctx, "raw").Bytes(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("CacheGet", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Get(ctx, "hit", time.Hour, fail); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("RawGETParallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := rdb.Get(ctx, "raw").Bytes(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("CacheGetParallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := c.Get(ctx, "hit", time.Hour, fail); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkMissStorm: each op is one cold wave of 4 caches (as 4
// processes would have) × 16 goroutines missing the same key at once,
// with a 1ms loader. loads/op is the stampede factor: 1 is ideal.
func BenchmarkMissStorm(b *testing.B) {
	srv := redistest.Start(b)
	const caches, per = 4, 16
	var cs []*Cache
	for range caches {
		cs = append(cs, newTestCache(b, srv.Client(b), nil))
	}
	ctx := context.Background()
	var loads atomic.Int64
	load := func(context.Context) ([]byte, error) {
		loads.Add(1)
		time.Sleep(time.Millisecond)
		return []byte("v"), nil
	}
	var wave int
	b.ReportAllocs()
	for b.Loop() {
		wave++
		key := "storm-" + strconv.Itoa(wave)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, c := range cs {
			for range per {
				wg.Go(func() {
					<-start
					if _, err := c.Get(ctx, key, time.Minute, load); err != nil {
						b.Error(err)
					}
				})
			}
		}
		close(start)
		wg.Wait()
	}
	b.ReportMetric(float64(loads.Load())/float64(wave), "loads/op")
}
