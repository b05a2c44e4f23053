package herd

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkNearInvalidation measures how long a write takes to reach
// another Cache's near cache on loopback: from the call of a's Set to
// b's subscriber dropping b's copy (p50, p99, max), and how far after
// Set returned that happened (p99 of the lag, 0 when the message came
// first). Each op is one Set; b's copy is restored between ops.
func BenchmarkNearInvalidation(b *testing.B) {
	for _, mode := range []string{"redis", "cluster"} {
		b.Run(mode, func(b *testing.B) {
			var rdb func() redis.UniversalClient
			if mode == "redis" {
				srv := redistest.Start(b)
				rdb = func() redis.UniversalClient { return srv.Client(b) }
			} else {
				cl := redistest.StartCluster(b, 3)
				rdb = func() redis.UniversalClient { return cl.Client(b) }
			}
			a := newTestCache(b, rdb(), nil)
			near := newNearCache(b, rdb(), NearOptions{}, nil)
			ctx := context.Background()
			const key = "near-bench-inval"
			id := nearIDOf(key)
			// The first delivery of each write: on a Cluster every master
			// delivers each message, and fences only grow.
			applied := make(chan time.Time, 1)
			var newest atomic.Uint64
			setHooks(near, &nearHooks{applied: func(got nearID, fence uint64) {
				if got == id && fence > newest.Load() {
					newest.Store(fence)
					select {
					case applied <- time.Now():
					default:
					}
				}
			}})
			fail := func(context.Context) ([]byte, error) { panic("the loader ran") }
			if err := a.Set(ctx, key, []byte("v"), time.Minute); err != nil {
				b.Fatal(err)
			}
			<-applied
			var fromCall, afterReturn []time.Duration
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				for !nearHas(near, key) {
					if _, err := near.Get(ctx, key, time.Minute, fail); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				start := time.Now()
				if err := a.Set(ctx, key, []byte("v"+strconv.Itoa(i)), time.Minute); err != nil {
					b.Fatal(err)
				}
				returned := time.Now()
				at := <-applied
				fromCall = append(fromCall, at.Sub(start))
				afterReturn = append(afterReturn, max(at.Sub(returned), 0))
			}
			slices.Sort(fromCall)
			slices.Sort(afterReturn)
			q := func(d []time.Duration, p float64) float64 {
				return float64(d[min(int(p*float64(len(d))), len(d)-1)]) / 1e6
			}
			b.ReportMetric(q(fromCall, 0.50), "p50-ms")
			b.ReportMetric(q(fromCall, 0.99), "p99-ms")
			b.ReportMetric(q(fromCall, 1), "max-ms")
			b.ReportMetric(q(afterReturn, 0.99), "p99-after-return-ms")
		})
	}
}

// BenchmarkNearHotKey: one hot key read by 4 Caches (as 4 processes
// would be) × 64 goroutines, while a fifth Cache writes it at a fixed
// rate. It counts the Redis commands that name the key (GETs and
// scripts; not the heartbeats, which do not grow with the reads) sent by
// the readers, per Get and per write (per reading Cache). With the near
// cache they follow the write rate; without, the read rate.
func BenchmarkNearHotKey(b *testing.B) {
	srv := redistest.Start(b)
	for _, near := range []bool{false, true} {
		for _, rate := range []int{10, 100} {
			name := "Redis"
			if near {
				name = "Near"
			}
			b.Run(name+"/writes="+strconv.Itoa(rate)+"/s", func(b *testing.B) {
				nearHotKey(b, srv, near, rate)
			})
		}
	}
}

func nearHotKey(b *testing.B, srv *redistest.Server, near bool, rate int) {
	const caches, per = 4, 64
	key := "near-hot-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	k, _ := makeKeys(DefaultPrefix, key)
	var keyCmds, allCmds atomic.Int64
	var readers []*Cache
	for range caches {
		rdb := srv.Client(b, func(o *redis.Options) { o.PoolSize = per + 8 })
		// Count all commands, and those naming this key's hash tag.
		tag := "{" + k.Hash() + "}"
		rdb.AddHook(cmdHook{before: func(cmd redis.Cmder) {
			allCmds.Add(1)
			if slices.ContainsFunc(cmd.Args(), func(a any) bool { s, ok := a.(string); return ok && strings.Contains(s, tag) }) {
				keyCmds.Add(1)
			}
		}})
		if near {
			readers = append(readers, newNearCache(b, rdb, NearOptions{MaxAge: time.Second}, nil))
		} else {
			readers = append(readers, newTestCache(b, rdb, nil))
		}
	}
	writer := newTestCache(b, srv.Client(b), nil)
	ctx := context.Background()
	if err := writer.Set(ctx, key, []byte("v0"), time.Hour); err != nil {
		b.Fatal(err)
	}
	fail := func(context.Context) ([]byte, error) { panic("the loader ran") }
	for _, c := range readers {
		if _, err := c.Get(ctx, key, time.Hour, fail); err != nil {
			b.Fatal(err)
		}
	}
	keyCmds.Store(0)
	allCmds.Store(0)

	stop := make(chan struct{})
	var writes atomic.Int64
	var wwg sync.WaitGroup
	wwg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				n := writes.Add(1)
				if err := writer.Set(ctx, key, []byte("v"+strconv.FormatInt(n, 10)), time.Hour); err != nil {
					b.Error(err)
				}
			}
		}
	})
	var gets atomic.Int64
	start := time.Now()
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, c := range readers {
		for range per {
			wg.Go(func() {
				for gets.Add(1) <= int64(b.N) {
					if _, err := c.Get(ctx, key, time.Hour, fail); err != nil {
						b.Error(err)
						return
					}
					// A server's goroutines block on I/O between Gets;
					// these would not, and would starve the writer and
					// the subscribers for whole time slices.
					runtime.Gosched()
				}
			})
		}
	}
	wg.Wait()
	b.StopTimer()
	elapsed := time.Since(start)
	close(stop)
	wwg.Wait()
	var hits uint64
	for _, c := range readers {
		hits += c.Stats().NearHits
	}
	n := float64(b.N)
	b.ReportMetric(float64(keyCmds.Load())/n, "key-cmds/get")
	if w := writes.Load(); w > 0 {
		b.ReportMetric(float64(keyCmds.Load())/float64(w)/caches, "key-cmds/write/cache")
	}
	b.ReportMetric(float64(keyCmds.Load())/elapsed.Seconds(), "key-cmds/s")
	b.ReportMetric(float64(writes.Load())/elapsed.Seconds(), "writes/s")
	b.ReportMetric(n/elapsed.Seconds(), "gets/s")
	b.ReportMetric(float64(allCmds.Load())/elapsed.Seconds(), "all-cmds/s")
	b.ReportMetric(float64(hits)/n, "near-hit-ratio")
}

// BenchmarkNearSetPublish is the cost of the near-cache PUBLISH that every
// Set (and commit, Invalidate) carries, near cache or not: Set without it
// (the channel argument empty), with it and no subscriber, and with it and
// one subscribed near cache, on a server and on a 3-master Cluster (where
// a classic PUBLISH also goes to the cluster bus for every node). The
// server's own accounting (INFO commandstats, summed over the masters:
// Redis counts the commands a script calls) gives the script's time and
// the PUBLISH's within it, per Set; the client's ns/op is mostly the
// round trip.
func BenchmarkNearSetPublish(b *testing.B) {
	for _, mode := range []string{"redis", "cluster"} {
		b.Run(mode, func(b *testing.B) {
			var rdb func() redis.UniversalClient
			if mode == "redis" {
				srv := redistest.Start(b)
				rdb = func() redis.UniversalClient { return srv.Client(b) }
			} else {
				cl := redistest.StartCluster(b, 3)
				rdb = func() redis.UniversalClient { return cl.Client(b) }
			}
			admin := rdb()
			c := newTestCache(b, rdb(), nil)
			ctx := context.Background()
			val := make([]byte, 512)
			run := func(b *testing.B) {
				b.ReportAllocs()
				before := commandStats(b, admin)
				n := 0
				for i := 0; b.Loop(); i++ {
					if err := c.Set(ctx, "near-pub-"+strconv.Itoa(i%64), val, time.Minute); err != nil {
						b.Fatal(err)
					}
					n++
				}
				after := commandStats(b, admin)
				b.ReportMetric((after["evalsha"]-before["evalsha"])/float64(n), "script-µs/op")
				b.ReportMetric((after["publish"]-before["publish"])/float64(n), "publish-µs/op")
			}
			b.Run("NoPublish", func(b *testing.B) {
				c.nearChan = ""
				defer func() { c.nearChan = nearChannel(DefaultPrefix) }()
				run(b)
			})
			b.Run("Publish", run)
			b.Run("PublishSubscribed", func(b *testing.B) {
				newNearCache(b, rdb(), NearOptions{}, nil)
				run(b)
			})
		})
	}
}

// commandStats returns the microseconds every master behind rdb spent in
// each command (INFO commandstats usec), summed, by command name.
func commandStats(b *testing.B, rdb redis.UniversalClient) map[string]float64 {
	ctx := context.Background()
	var mu sync.Mutex
	total := make(map[string]float64)
	read := func(ctx context.Context, cl *redis.Client) error {
		info, err := cl.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(info, "\r\n") {
			name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
			if !ok || !strings.HasPrefix(line, "cmdstat_") {
				continue
			}
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					us, err := strconv.ParseFloat(v, 64)
					if err != nil {
						return err
					}
					mu.Lock()
					total[name] += us
					mu.Unlock()
				}
			}
		}
		return nil
	}
	var err error
	switch r := rdb.(type) {
	case *redis.ClusterClient:
		err = r.ForEachMaster(ctx, read)
	case *redis.Client:
		err = read(ctx, r)
	}
	if err != nil {
		b.Fatal(err)
	}
	return total
}
