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
	if err := rdb.Set(ctx, "raw", (&envelope{Payload: payload}).Encode(), time.Hour).Err(); err != nil {
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
	b.Run("CacheGetCancellable", func(b *testing.B) {
		// A ctx that can end: the GET runs in a goroutine of its own so
		// that the caller can leave at once.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
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
	b.Run("CacheGetCancellableParallel", func(b *testing.B) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
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

	// The near cache (Options.Near): the same hit from process memory (a
	// copy of the 512 bytes each time), with its heartbeat running.
	near := newNearCache(b, srv.Client(b), NearOptions{MaxAge: time.Hour}, nil)
	warmNear := func(b *testing.B) {
		for !nearHas(near, "hit") {
			if _, err := near.Get(ctx, "hit", time.Hour, fail); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("NearGet", func(b *testing.B) {
		warmNear(b)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := near.Get(ctx, "hit", time.Hour, fail); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("NearGetParallel", func(b *testing.B) {
		warmNear(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := near.Get(ctx, "hit", time.Hour, fail); err != nil {
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

// BenchmarkHitRatio times a raw go-redis GET and a Cache hit alternately,
// op by op, so that the load of a shared machine weighs on both alike.
// ratio is herd's hit throughput over the raw GET's (1 is parity);
// raw-ns/op and herd-ns/op are the two means. "Cancellable" uses a ctx
// that can end (the hit's GET then runs in a goroutine of its own).
func BenchmarkHitRatio(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	c := newTestCache(b, rdb, nil)
	bg := context.Background()
	payload := make([]byte, 512)
	if err := c.Set(bg, "hit", payload, time.Hour); err != nil {
		b.Fatal(err)
	}
	if err := rdb.Set(bg, "raw", (&envelope{Payload: payload}).Encode(), time.Hour).Err(); err != nil {
		b.Fatal(err)
	}
	fail := func(context.Context) ([]byte, error) { panic("a hit called the loader") }
	cctx, cancel := context.WithCancel(bg)
	defer cancel()
	inline := newTestCache(b, rdb, &Options{InlineHits: true})
	near := newNearCache(b, srv.Client(b), NearOptions{MaxAge: time.Hour}, nil)
	for !nearHas(near, "hit") {
		if _, err := near.Get(bg, "hit", time.Hour, fail); err != nil {
			b.Fatal(err)
		}
	}
	pair := func(ctx context.Context, c *Cache, raw, hit *atomic.Int64) error {
		t0 := time.Now()
		if _, err := rdb.Get(ctx, "raw").Bytes(); err != nil {
			return err
		}
		t1 := time.Now()
		if _, err := c.Get(ctx, "hit", time.Hour, fail); err != nil {
			return err
		}
		raw.Add(int64(t1.Sub(t0)))
		hit.Add(int64(time.Since(t1)))
		return nil
	}
	report := func(b *testing.B, raw, hit *atomic.Int64) {
		n := float64(b.N)
		b.ReportMetric(float64(raw.Load())/n, "raw-ns/op")
		b.ReportMetric(float64(hit.Load())/n, "herd-ns/op")
		b.ReportMetric(float64(raw.Load())/float64(hit.Load()), "ratio")
	}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		c    *Cache
	}{{"Background", bg, c}, {"Cancellable", cctx, c}, {"CancellableInline", cctx, inline}, {"Near", bg, near}} {
		b.Run(tc.name, func(b *testing.B) {
			var raw, hit atomic.Int64
			for b.Loop() {
				if err := pair(tc.ctx, tc.c, &raw, &hit); err != nil {
					b.Fatal(err)
				}
			}
			report(b, &raw, &hit)
		})
		b.Run(tc.name+"Parallel", func(b *testing.B) {
			var raw, hit atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := pair(tc.ctx, tc.c, &raw, &hit); err != nil {
						b.Error(err)
						return
					}
				}
			})
			report(b, &raw, &hit)
		})
	}
}
