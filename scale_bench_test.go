package herd

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// redisCPU returns the server's CPU time so far (user + system), in
// seconds, from INFO cpu.
func redisCPU(tb testing.TB, rdb *redis.Client) float64 {
	tb.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\r\n") {
		name, v, ok := strings.Cut(line, ":")
		if ok && (name == "used_cpu_user" || name == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatal(err)
			}
			sum += f
		}
	}
	return sum
}

// BenchmarkRedisCost measures what a command costs the Redis server
// itself (its CPU time, from INFO cpu, per command), the figures
// docs/scale.md does its arithmetic with: a GET of a 512-byte value, and
// a PUBLISH of a near-cache invalidation (about 60 bytes) to 1, 10 and
// 100 subscribers, each on its own connection as each instance's would
// be. Commands are pipelined 64 at a time so that the client's own
// round trips do not limit the server. redis-µs/op is the figure; the
// ns/op is the client's view.
func BenchmarkRedisCost(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	ctx := context.Background()
	if err := rdb.Set(ctx, "v", make([]byte, 512), 0).Err(); err != nil {
		b.Fatal(err)
	}
	run := func(b *testing.B, send func(p redis.Pipeliner)) {
		start := redisCPU(b, rdb)
		n := 0
		for b.Loop() {
			if n%64 == 0 {
				p := rdb.Pipeline()
				for range 64 {
					send(p)
				}
				if _, err := p.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
			n++
		}
		b.ReportMetric((redisCPU(b, rdb)-start)*1e6/float64(max(n, 1)), "redis-µs/op")
	}
	b.Run("GET", func(b *testing.B) {
		run(b, func(p redis.Pipeliner) { p.Get(ctx, "v") })
	})
	b.Run("GET/unpipelined", func(b *testing.B) {
		// As most clients send it: one GET per round trip, from 32
		// goroutines at once.
		start := redisCPU(b, rdb)
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := rdb.Get(ctx, "v").Err(); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric((redisCPU(b, rdb)-start)*1e6/float64(b.N), "redis-µs/op")
	})
	msg := strings.Repeat("x", 60)
	for _, subs := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("PUBLISH/subscribers=%d", subs), func(b *testing.B) {
			var wg sync.WaitGroup
			var pss []*redis.PubSub
			for range subs {
				c := srv.Client(b)
				ps := c.Subscribe(ctx, "near")
				if _, err := ps.Receive(ctx); err != nil {
					b.Fatal(err)
				}
				pss = append(pss, ps)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range ps.Channel() {
					}
				}()
			}
			run(b, func(p redis.Pipeliner) { p.Publish(ctx, "near", msg) })
			for _, ps := range pss {
				ps.Close()
			}
			wg.Wait()
		})
	}
}
