package herd

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// BenchmarkMissTags measures a leader's miss (GET, ACQUIRE, a loader that
// returns at once, COMMIT), one key per op, on a real redis-server:
// "untagged" on a Cache that never saw a tag (the path before tags
// existed), "untagged-tags-on" on one that did (every ACQUIRE carries the
// read of the purge generation in its pipeline), and values with 1 and 8
// tags (TAGADDs, pipelined, before the COMMIT). Compare the ratios of one
// run.
func BenchmarkMissTags(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	val := []byte("v")
	tags8 := []string{"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"}
	for _, bc := range []struct {
		name   string
		tagsOn bool
		tags   []string
	}{
		{"untagged", false, nil},
		{"untagged-tags-on", true, nil},
		{"tagged-1", true, tags8[:1]},
		{"tagged-8", true, tags8},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := newTestCache(b, srv.Client(b), &Options{Prefix: "bench-" + bc.name})
			if bc.tagsOn {
				c.useTags()
			}
			load := func(ctx context.Context) ([]byte, error) {
				if bc.tags != nil {
					if err := SetTags(ctx, bc.tags...); err != nil {
						return nil, err
					}
				}
				return val, nil
			}
			run := newOwner() // keys unique to this run: every op is a miss
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				n++
				if _, err := c.Get(ctx, run+strconv.Itoa(n), time.Hour, load); err != nil {
					b.Fatal(err)
				}
			}
			if s := c.Stats(); s.Fenced+s.CommitErrors > 0 {
				b.Fatalf("values not stored: %+v", s)
			}
		})
	}
}
