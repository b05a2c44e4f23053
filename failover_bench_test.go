package herd

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

var benchSeq atomic.Int64

// BenchmarkReplicaWait measures what the replica wait costs, on a real
// master with two replicas on this machine: the miss path (GET, ACQUIRE
// and COMMIT, each script followed by a pipelined WAIT), Set and
// Invalidate. Each iteration runs the operation once on a Cache with the
// default options (wait) and once on one with ReplicaAcks -1 (nowait),
// alternately, so both see the same machine load; the metrics are the
// mean latency of each and their ratio. One goroutine.
func BenchmarkReplicaWait(b *testing.B) {
	p := startReplicated(b)
	ctx := context.Background()
	payload := make([]byte, 512)
	load := func(context.Context) ([]byte, error) { return payload, nil }
	for _, op := range []string{"Miss", "Set", "Invalidate"} {
		b.Run(op, func(b *testing.B) {
			wait := New(p.m, nil)
			defer wait.Close()
			nowait := New(p.m, &Options{ReplicaAcks: -1})
			defer nowait.Close()
			run := func(c *Cache) time.Duration {
				key := "bench" + strconv.FormatInt(benchSeq.Add(1), 10)
				start := time.Now()
				var err error
				switch op {
				case "Miss":
					_, err = c.Get(ctx, key, time.Minute, load)
				case "Set":
					err = c.Set(ctx, key, payload, time.Minute)
				case "Invalidate":
					err = c.Invalidate(ctx, key)
				}
				if err != nil {
					b.Fatal(err)
				}
				return time.Since(start)
			}
			var tw, tn time.Duration
			n := 0
			for b.Loop() {
				tw += run(wait)
				tn += run(nowait)
				n++
			}
			if op == "Miss" && (wait.Stats().Loads != uint64(n) || nowait.Stats().Loads != uint64(n)) {
				b.Fatalf("loads %d and %d for %d misses each", wait.Stats().Loads, nowait.Stats().Loads, n)
			}
			b.ReportMetric(float64(tw.Nanoseconds())/float64(n), "ns/wait")
			b.ReportMetric(float64(tn.Nanoseconds())/float64(n), "ns/nowait")
			b.ReportMetric(float64(tw)/float64(tn), "ratio")
		})
	}
}
