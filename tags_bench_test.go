package herd

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkMissTags measures a leader's miss (GET, ACQUIRE, a loader that
// returns at once, COMMIT), one key per op, in four variants alternated
// in one loop, so that all see the same machine: "untagged" on a Cache
// that never saw a tag (the path before tags existed), "tags-on" on one
// that did (each ACQUIRE also reads the purge generation: in its pipeline
// on one master, beside it on a Cluster), and values with 1 and 8 tags
// (their TAGADDs, pipelined, are one round trip before the COMMIT). It
// reports each variant's time per miss and its ratio to "untagged", on a
// redis-server and on a 3-master Cluster.
func BenchmarkMissTags(b *testing.B) {
	for _, topo := range []string{"redis", "cluster"} {
		b.Run(topo, func(b *testing.B) {
			var rdb func() redis.UniversalClient
			if topo == "redis" {
				srv := redistest.Start(b)
				rdb = func() redis.UniversalClient { return srv.Client(b) }
			} else {
				cl := redistest.StartCluster(b, 3)
				rdb = func() redis.UniversalClient { return cl.Client(b) }
			}
			benchMissTags(b, rdb)
		})
	}
}

func benchMissTags(b *testing.B, client func() redis.UniversalClient) {
	ctx := context.Background()
	tags8 := []string{"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"}
	type variant struct {
		name string
		c    *Cache
		load LoadFunc
		took time.Duration
	}
	var vs []*variant
	for _, bc := range []struct {
		name   string
		tagsOn bool
		tags   []string
	}{
		{"untagged", false, nil},
		{"tags-on", true, nil},
		{"tagged-1", true, tags8[:1]},
		{"tagged-8", true, tags8},
	} {
		c := newTestCache(b, client(), nil)
		if bc.tagsOn {
			c.useTags()
		}
		tags := bc.tags
		vs = append(vs, &variant{name: bc.name, c: c, load: func(ctx context.Context) ([]byte, error) {
			if tags != nil {
				if err := SetTags(ctx, tags...); err != nil {
					return nil, err
				}
			}
			return []byte("v"), nil
		}})
	}
	run := newOwner() // keys unique to this run: every op is a miss
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		n++
		for _, v := range vs {
			start := time.Now()
			if _, err := v.c.Get(ctx, run+v.name+strconv.Itoa(n), time.Hour, v.load); err != nil {
				b.Fatal(err)
			}
			v.took += time.Since(start)
		}
	}
	for _, v := range vs {
		if s := v.c.Stats(); s.Fenced+s.CommitErrors > 0 {
			b.Fatalf("%s: values not stored: %+v", v.name, s)
		}
		b.ReportMetric(float64(v.took.Microseconds())/float64(n), v.name+"-µs/miss")
		if v != vs[0] {
			b.ReportMetric(float64(v.took)/float64(vs[0].took), v.name+"/untagged")
		}
	}
}
