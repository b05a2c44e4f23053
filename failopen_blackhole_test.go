package herd

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/faultproxy"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestFailOpenBlackholeAfterBreakerOpens: the README says a Redis that
// hangs rather than refuses "costs a ReadTimeout per call until the
// breaker opens", and the brief's claim is "at most a few ms per call
// once the breaker has seen it". The README's own test makes 400 calls
// in well under the breaker's 1 s cooldown, so it never sees a probe.
// Here Redis is blackholed (the network vanishes, nothing is refused)
// under the recommended client, and Gets and GetManys run one after
// another for 3.5 s: after the breaker opened the calls stay under 20 ms
// at p99, and only the probe the breaker lets through once per
// BreakerCooldown waits on the blackhole (its ReadTimeout).
func TestFailOpenBlackholeAfterBreakerOpens(t *testing.T) {
	for _, many := range []bool{false, true} {
		t.Run(fmt.Sprintf("GetMany=%v", many), func(t *testing.T) {
			srv := redistest.Start(t)
			p, err := faultproxy.Start(srv.Addr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			rdb := srv.Client(t, recommendedClient, func(o *redis.Options) { o.Addr = p.Addr() })
			c := newTestCache(t, rdb, nil)
			ctx := context.Background()
			load := func(context.Context) ([]byte, error) { return []byte("v"), nil }
			loadMany := func(_ context.Context, keys []string) (map[string][]byte, error) {
				out := map[string][]byte{}
				for _, k := range keys {
					out[k] = []byte("v")
				}
				return out, nil
			}
			call := func(i int) error {
				if many {
					_, err := c.GetMany(ctx, []string{fmt.Sprintf("a-%d", i), fmt.Sprintf("b-%d", i)}, time.Minute, loadMany)
					return err
				}
				_, err := c.Get(ctx, fmt.Sprintf("k-%d", i), time.Minute, load)
				return err
			}
			for i := range 3 {
				if err := call(-1 - i); err != nil {
					t.Fatalf("warm call: %v", err)
				}
			}
			p.SetBlackhole(true)
			var first, after []time.Duration
			var openedAt time.Time
			end := time.Now().Add(3500 * time.Millisecond)
			for i := 0; time.Now().Before(end); i++ {
				opened := c.Stats().BreakerOpens > 0
				if opened && openedAt.IsZero() {
					openedAt = time.Now()
				}
				start := time.Now()
				if err := call(i); err != nil {
					t.Fatalf("call %d with Redis blackholed: %v, want the loader's value", i, err)
				}
				d := time.Since(start)
				if opened {
					after = append(after, d)
				} else {
					first = append(first, d)
				}
			}
			p.SetBlackhole(false)
			if len(after) == 0 {
				t.Fatalf("the breaker never opened: %+v", c.Stats())
			}
			slices.Sort(after)
			p99, worst := after[len(after)*99/100], after[len(after)-1]
			t.Logf("first calls %v; after the breaker opened: %d calls, p50 %v, p99 %v, max %v", first,
				len(after), after[len(after)/2], p99, worst)
			// A few milliseconds at most, as the README says; a call that
			// waited on the blackhole would take the 500ms ReadTimeout (a
			// scheduler's pause on a loaded machine takes tens of ms).
			if p99 > 20*time.Millisecond {
				t.Errorf("after the breaker opened the p99 was %v, want under 20ms", p99)
			}
			// One probe per BreakerCooldown (1s by default) may wait on the
			// blackhole; any other call that did waited on Redis with the
			// breaker open.
			waited := 0
			for _, d := range after {
				if d > 250*time.Millisecond {
					waited++
				}
			}
			if probes := int(time.Since(openedAt)/time.Second) + 1; waited > probes {
				t.Errorf("%d calls after the breaker opened waited on the blackholed Redis (worst %v), want at most the %d probes of its cooldowns", waited, worst, probes)
			}
		})
	}
}
