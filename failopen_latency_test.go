package herd

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// recommendedClient sets the go-redis options the README recommends for
// a Cache: short dial, read and write timeouts, and no retries of go-redis's
// own (herd's scripts are safe to resend, but with Redis gone each retry
// and each extra dial is latency every caller pays before failing open).
// Keep it equal to the README's snippets.
func recommendedClient(o *redis.Options) {
	o.DialTimeout = 250 * time.Millisecond
	o.ReadTimeout = 500 * time.Millisecond
	o.WriteTimeout = 500 * time.Millisecond
	o.MaxRetries = -1
	o.DialerRetries = 1
}

// olderReadmeClient is what the README recommended before: only read and
// write timeouts, go-redis's retries and dial retries left at their
// defaults.
func olderReadmeClient(o *redis.Options) {
	o.ReadTimeout = 500 * time.Millisecond
	o.WriteTimeout = 500 * time.Millisecond
}

// outageFigures are the latencies of Gets made one after another while
// Redis is down: the first calls (before the breaker opens) and the rest.
type outageFigures struct {
	first         []time.Duration // the calls before the breaker opened
	p50, p99, max time.Duration   // of the calls after it opened
}

func (f outageFigures) String() string {
	firsts := make([]string, len(f.first))
	for i, d := range f.first {
		firsts[i] = d.Round(10 * time.Microsecond).String()
	}
	return fmt.Sprintf("first calls [%s]; then p50 %v, p99 %v, max %v", strings.Join(firsts, " "),
		f.p50.Round(time.Microsecond), f.p99.Round(time.Microsecond), f.max.Round(time.Microsecond))
}

// measureOutage kills a real redis-server under a warm Cache whose client
// has the options opts set, then times calls Gets, each for its own key
// with an instant loader, as the Cache fails open.
func measureOutage(t testing.TB, opts func(*redis.Options), calls int) outageFigures {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t, opts)
	c := newTestCache(t, rdb, nil) // the default breaker: 5 errors, 1s cooldown
	ctx := context.Background()
	load := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	for i := range 3 { // warm: the pool holds live connections
		if _, err := c.Get(ctx, fmt.Sprintf("warm-%d", i), time.Minute, load); err != nil {
			t.Fatalf("Get with Redis up: %v", err)
		}
	}
	srv.Kill(t)

	var f outageFigures
	var after []time.Duration
	for i := range calls {
		opens := c.Stats().BreakerOpens
		start := time.Now()
		v, err := c.Get(ctx, fmt.Sprintf("down-%d", i), time.Minute, load)
		d := time.Since(start)
		if err != nil || string(v) != "v" {
			t.Fatalf("Get %d with Redis killed = (%q, %v), want the loader's value (fail-open)", i, v, err)
		}
		if opens == 0 {
			f.first = append(f.first, d)
		} else {
			after = append(after, d)
		}
	}
	if len(after) == 0 {
		t.Fatalf("the breaker never opened in %d calls: %+v", calls, c.Stats())
	}
	// go-redis redials a dead server once a second until it answers:
	// bring it back, so that the goroutine ends.
	srv.Restart(t)
	waitFor(t, 10*time.Second, "go-redis to stop redialling the restarted server", func() bool {
		buf := make([]byte, 1<<20)
		return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*ConnPool).tryDial")
	})
	slices.Sort(after)
	f.p50 = after[len(after)/2]
	f.p99 = after[len(after)*99/100]
	f.max = after[len(after)-1]
	return f
}

// TestFailOpenLatencyWithRecommendedClient: with the client options the
// README recommends, a killed Redis costs each caller milliseconds, not
// seconds: the calls before the breaker opens each pay one refused
// connection, and once it is open the calls skip Redis. The bounds leave
// room for a loaded 2-core machine; the figures measured on one are in the
// README (run with -v to print them).
func TestFailOpenLatencyWithRecommendedClient(t *testing.T) {
	f := measureOutage(t, recommendedClient, 400)
	t.Logf("Redis killed, recommended client: %v", f)
	if len(f.first) > 6 {
		t.Errorf("%d calls before the breaker opened, want at most its threshold (5) and one more", len(f.first))
	}
	for i, d := range f.first {
		if d > 300*time.Millisecond {
			t.Errorf("call %d before the breaker opened took %v, want under 300ms", i, d)
		}
	}
	if f.p99 > 20*time.Millisecond {
		t.Errorf("p99 once the breaker is open = %v, want under 20ms", f.p99)
	}
}

// BenchmarkFailOpenLatency prints the figures of an outage for the
// recommended client and for the README's older one (go-redis's retries
// left on): go test -run '^$' -bench FailOpenLatency -benchtime 1x.
func BenchmarkFailOpenLatency(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts func(*redis.Options)
	}{{"recommended", recommendedClient}, {"older-readme", olderReadmeClient}} {
		b.Run(tc.name, func(b *testing.B) {
			var f outageFigures
			for range b.N {
				f = measureOutage(b, tc.opts, 200)
			}
			b.ReportMetric(float64(slices.Max(f.first))/1e6, "first-max-ms")
			b.ReportMetric(float64(f.p50)/1e6, "p50-ms")
			b.ReportMetric(float64(f.p99)/1e6, "p99-ms")
			b.Logf("%s: %v", tc.name, f)
		})
	}
}
