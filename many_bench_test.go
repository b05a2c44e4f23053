package herd

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// BenchmarkGetMany compares, on a real redis-server and in the same run,
// reading 100 hits with one GetMany, with 100 Gets one after another, and
// with one raw go-redis MGET of the same 100 envelopes; and rebuilding
// 100 cold keys with one GetMany (one loader call) against 100 Gets (100
// loader calls). Each op is the whole set of 100 keys; ns/key is per key.
// Hits/Interleaved runs the three reads of hits in turn within each op.
func BenchmarkGetMany(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	c := newTestCache(b, rdb, nil)
	ctx := context.Background()
	const n = 100
	payload := make([]byte, 512)
	keys := make([]string, n)
	raw := make([]string, n)
	for i := range keys {
		keys[i] = "many-hit-" + strconv.Itoa(i)
		raw[i] = "many-raw-" + strconv.Itoa(i)
		if err := c.Set(ctx, keys[i], payload, time.Hour); err != nil {
			b.Fatal(err)
		}
		if err := rdb.Set(ctx, raw[i], (&envelope{Payload: payload}).Encode(), time.Hour).Err(); err != nil {
			b.Fatal(err)
		}
	}
	failMany := func(context.Context, []string) (map[string][]byte, error) { panic("a hit called the loader") }
	fail := func(context.Context) ([]byte, error) { panic("a hit called the loader") }
	perKey := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/key")
	}

	b.Run("Hits/RawMGET", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			vals, err := rdb.MGet(ctx, raw...).Result()
			if err != nil || len(vals) != n {
				b.Fatal(len(vals), err)
			}
		}
		perKey(b)
	})
	b.Run("Hits/GetMany", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			vals, err := c.GetMany(ctx, keys, time.Hour, failMany)
			if err != nil || len(vals) != n {
				b.Fatal(len(vals), err)
			}
		}
		perKey(b)
	})
	b.Run("Hits/Get×100", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, k := range keys {
				if _, err := c.Get(ctx, k, time.Hour, fail); err != nil {
					b.Fatal(err)
				}
			}
		}
		perKey(b)
	})
	// The three in turn, op by op, so that the load of a shared machine
	// weighs on all alike: the means per op of each, and GetMany's cost
	// relative to the raw MGET and to the 100 Gets.
	b.Run("Hits/Interleaved", func(b *testing.B) {
		b.ReportAllocs()
		var mget, many, gets time.Duration
		for b.Loop() {
			t0 := time.Now()
			if vals, err := rdb.MGet(ctx, raw...).Result(); err != nil || len(vals) != n {
				b.Fatal(len(vals), err)
			}
			t1 := time.Now()
			if vals, err := c.GetMany(ctx, keys, time.Hour, failMany); err != nil || len(vals) != n {
				b.Fatal(len(vals), err)
			}
			t2 := time.Now()
			for _, k := range keys {
				if _, err := c.Get(ctx, k, time.Hour, fail); err != nil {
					b.Fatal(err)
				}
			}
			mget, many, gets = mget+t1.Sub(t0), many+t2.Sub(t1), gets+time.Since(t2)
		}
		ops := float64(b.N)
		b.ReportMetric(float64(mget)/ops, "mget-ns/op")
		b.ReportMetric(float64(many)/ops, "getmany-ns/op")
		b.ReportMetric(float64(gets)/ops, "gets-ns/op")
		b.ReportMetric(float64(many)/float64(mget), "getmany/mget")
		b.ReportMetric(float64(gets)/float64(many), "gets/getmany")
	})

	var round int
	cold := func() []string {
		round++
		ks := make([]string, n)
		for i := range ks {
			ks[i] = fmt.Sprintf("many-cold-%d-%d", round, i)
		}
		return ks
	}
	value := func(k string) []byte { return []byte("v-" + k) }
	b.Run("Misses/GetMany", func(b *testing.B) {
		b.ReportAllocs()
		calls := 0
		for b.Loop() {
			vals, err := c.GetMany(ctx, cold(), time.Hour, func(_ context.Context, ks []string) (map[string][]byte, error) {
				calls++
				out := make(map[string][]byte, len(ks))
				for _, k := range ks {
					out[k] = value(k)
				}
				return out, nil
			})
			if err != nil || len(vals) != n {
				b.Fatal(len(vals), err)
			}
		}
		perKey(b)
		b.ReportMetric(float64(calls)/float64(b.N), "loads/op")
	})
	b.Run("Misses/Get×100", func(b *testing.B) {
		b.ReportAllocs()
		calls := 0
		for b.Loop() {
			for _, k := range cold() {
				if _, err := c.Get(ctx, k, time.Hour, func(context.Context) ([]byte, error) {
					calls++
					return value(k), nil
				}); err != nil {
					b.Fatal(err)
				}
			}
		}
		perKey(b)
		b.ReportMetric(float64(calls)/float64(b.N), "loads/op")
	})
}
