package herd

import (
	"context"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// BenchmarkExpiryP99 measures read latency across TTL expiries on a real
// redis-server, with stale-while-revalidate and without it. 8 readers
// loop on one key with a 100ms TTL and a 20ms loader; each op is one read.
// Without StaleFor every expiry makes the readers wait for a rebuild;
// with it they get the stale value at once. It reports p50, p99, p999,
// max, and the reads per million that took 10ms or more (half the
// loader's time: a read that waited for a rebuild).
func BenchmarkExpiryP99(b *testing.B) {
	srv := redistest.Start(b)
	for _, mode := range []struct {
		name     string
		staleFor time.Duration
	}{{"NoStale", 0}, {"StaleFor", time.Second}} {
		b.Run(mode.name, func(b *testing.B) {
			c := newTestCache(b, srv.Client(b), &Options{StaleFor: mode.staleFor})
			ctx := context.Background()
			key := "expiry-" + mode.name + strconv.FormatInt(time.Now().UnixNano(), 36)
			load := func(context.Context) ([]byte, error) {
				time.Sleep(20 * time.Millisecond)
				return []byte("v"), nil
			}
			if _, err := c.Get(ctx, key, 100*time.Millisecond, load); err != nil {
				b.Fatal(err)
			}
			const readers = 8
			var mu sync.Mutex
			var lat []time.Duration
			b.SetParallelism(readers / 2) // 2 CPUs × 4 = 8 goroutines
			b.RunParallel(func(pb *testing.PB) {
				var mine []time.Duration
				for pb.Next() {
					start := time.Now()
					if _, err := c.Get(ctx, key, 100*time.Millisecond, load); err != nil {
						b.Error(err)
						return
					}
					mine = append(mine, time.Since(start))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
			slow := len(lat) - sort.Search(len(lat), func(i int) bool { return lat[i] >= 10*time.Millisecond })
			b.ReportMetric(q(0.5), "p50-µs")
			b.ReportMetric(q(0.99), "p99-µs")
			b.ReportMetric(q(0.999), "p999-µs")
			b.ReportMetric(q(1), "max-µs")
			b.ReportMetric(float64(slow)/float64(len(lat))*1e6, "waits≥10ms/Mreads")
		})
	}
}
