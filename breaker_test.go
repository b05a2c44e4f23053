package herd

import (
	"context"
	"fmt"
	"github.com/herdkit/herd/internal/faultproxy"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestBreakerTransitions(t *testing.T) {
	t.Parallel()
	b := &breaker{threshold: 2, cooldown: time.Hour}
	passCooldown := func() { b.mu.Lock(); b.openUntil = time.Now().Add(-time.Millisecond); b.mu.Unlock() }
	if !b.allow() || b.success() {
		t.Fatal("a fresh breaker must allow, and a success must not report a close")
	}
	if b.failure() {
		t.Fatal("the first failure opened the breaker (threshold 2)")
	}
	if !b.allow() {
		t.Fatal("one failure below the threshold must still allow")
	}
	if !b.failure() {
		t.Fatal("the second consecutive failure did not open the breaker")
	}
	if b.allow() {
		t.Fatal("an open breaker allowed a call before its cooldown")
	}
	passCooldown()
	if !b.allow() {
		t.Fatal("no probe after the cooldown")
	}
	if b.allow() {
		t.Fatal("a second probe while one runs")
	}
	if b.failure() {
		t.Fatal("a failed probe reported opening again as a new open")
	}
	if b.allow() {
		t.Fatal("a failed probe did not reopen the breaker")
	}
	passCooldown()
	if !b.allow() || !b.success() {
		t.Fatal("a successful probe did not close the breaker")
	}
	if !b.allow() || b.troubled.Load() {
		t.Fatal("a closed breaker is still marked troubled")
	}
	// A success between failures resets the count: not consecutive.
	b.failure()
	b.success()
	if b.failure() {
		t.Fatal("failures separated by a success opened the breaker")
	}
}

// TestBreakerProbeLostIsReplaced: a probe that never reports (a path
// that forgot to) is presumed lost after a cooldown, and the next call
// probes: the breaker cannot stay shut for good.
func TestBreakerProbeLostIsReplaced(t *testing.T) {
	t.Parallel()
	b := &breaker{threshold: 1, cooldown: time.Hour}
	b.failure()
	b.mu.Lock()
	b.openUntil = time.Now().Add(-time.Millisecond)
	b.mu.Unlock()
	if !b.allow() {
		t.Fatal("no probe after the cooldown")
	}
	if b.allow() {
		t.Fatal("a second probe while the first is within its cooldown")
	}
	b.mu.Lock()
	b.probeUntil = time.Now().Add(-time.Millisecond) // a cooldown passed without a report
	b.mu.Unlock()
	if !b.allow() {
		t.Fatal("a probe that never reported blocked every later call")
	}
	b.probeDone()
	if !b.allow() {
		t.Fatal("after probeDone (no verdict), the next call past the cooldown must probe")
	}
}

// TestBreakerClosesAfterRefreshProbeErrorReply: when a background
// refresh was the breaker's probe and Redis answered it with an error
// reply (not an infrastructure error), the probe reported nothing and the
// breaker stayed in probing: every later call loaded locally, for good.
func TestBreakerClosesAfterRefreshProbeErrorReply(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	closed := make(chan struct{}, 1)
	c := newTestCache(t, rdb, &Options{BreakerThreshold: 1, BreakerCooldown: time.Hour,
		Observer: &Observer{Circuit: func(open bool) {
			if !open {
				select {
				case closed <- struct{}{}:
				default:
				}
			}
		}}})
	if err := c.Set(ctx, "hit", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	keys := mustKeys(t, "refreshed")
	// A foreign value of another type at the lease key: ACQUIRE's GET of it
	// is a WRONGTYPE error reply, an answer from a healthy Redis.
	if err := rdb.HSet(ctx, keys.Lease, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}

	// Open the breaker and let its cooldown pass.
	c.brk.failure()
	c.brk.mu.Lock()
	c.brk.openUntil = time.Now().Add(-time.Millisecond)
	c.brk.mu.Unlock()

	// The refresh is the first call after the cooldown: the probe.
	load := func(context.Context) ([]byte, error) { return []byte("new"), nil }
	c.refresh(&flight{key: "refreshed", keys: keys, ttl: time.Hour, load: load, refresh: load}, make([]byte, 8))

	v, err := c.Get(ctx, "hit", time.Hour, load)
	if err != nil || string(v) != "v" {
		t.Fatalf("Get = (%q, %v), want the stored v", v, err)
	}
	if st := c.Stats(); st.FailOpen != 0 || st.Hits != 1 {
		t.Errorf("after the refresh probe got an answer: fail-open %d, hits %d; want 0, 1 (the breaker stayed shut)", st.FailOpen, st.Hits)
	}
	select {
	case <-closed:
	default:
		t.Error("the Observer never saw the breaker close")
	}
}

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
