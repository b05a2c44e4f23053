package herd

// Cross-process tests of freshness: stale-while-revalidate under a steady
// load and stale-if-error with the cluster-wide refresh backoff. Every
// test re-runs the test binary as several worker processes sharing one
// real redis-server. Loader calls are counted in Redis (INCR on a
// bookkeeping key), the processes start together at a Redis barrier that
// the parent opens, parameters travel in environment variables, and every
// worker stops by itself: each wait has a deadline, and an unexpected
// error ends the worker with a non-zero status and a message the parent
// reports.
//
// Bookkeeping keys live under a per-run prefix "fresh-<run>:" that herd
// never writes (herd's keys are "herd:{<hash>}:...").

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Environment of a freshness worker process.
const (
	freshEnvAddr    = "HERD_FRESH_ADDR"    // redis-server address
	freshEnvPrefix  = "HERD_FRESH_PREFIX"  // bookkeeping prefix; the user key is <prefix>:hot
	freshEnvG       = "HERD_FRESH_G"       // goroutines per process
	freshEnvTTL     = "HERD_FRESH_TTL"     // the ttl passed to Get
	freshEnvStale   = "HERD_FRESH_STALE"   // Options.StaleFor
	freshEnvBackoff = "HERD_FRESH_BACKOFF" // Options.RefreshBackoff and RefreshBackoffMax ("0": defaults)
	freshEnvSleep   = "HERD_FRESH_SLEEP"   // how long the loader works before returning a value
	freshEnvThink   = "HERD_FRESH_THINK"   // freshsteady: pause between a goroutine's Gets
)

const (
	// freshBarrierTimeout bounds a worker's wait for the parent's "go".
	freshBarrierTimeout = time.Minute
	// freshLease is the fixed lease of every Cache in these tests: far
	// above the loader's time, so a second refresh could only come from a
	// broken lease, never from a lapsed one.
	freshLease = time.Second
)

func init() {
	workerRoles["freshsteady"] = freshSteadyWorker
	workerRoles["freshfail"] = freshFailWorker
}

// ---------------------------------------------------------------------------
// Parent side.

// freshSetup starts a redis-server, a fresh bookkeeping prefix and the
// environment common to every worker.
func freshSetup(t *testing.T) (rdb *redis.Client, prefix string, env []string) {
	t.Helper()
	srv := redistest.Start(t)
	rdb = srv.Client(t)
	prefix = "fresh-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	return rdb, prefix, []string{freshEnvAddr + "=" + srv.Addr(), freshEnvPrefix + "=" + prefix}
}

// freshWaitReady waits until procs workers have arrived at the barrier.
func freshWaitReady(t *testing.T, rdb *redis.Client, prefix string, procs int) {
	t.Helper()
	waitFor(t, freshBarrierTimeout, "workers to be ready", func() bool {
		n, _ := rdb.Get(context.Background(), prefix+":ready").Int()
		return n == procs
	})
}

// freshReports reads the report of every worker.
func freshReports(t *testing.T, rdb *redis.Client, prefix string, procs int) []freshReport {
	t.Helper()
	var reps []freshReport
	for i := range procs {
		b, err := rdb.Get(context.Background(), prefix+":report:"+strconv.Itoa(i)).Bytes()
		if err != nil {
			t.Fatalf("report of worker %d: %v", i, err)
		}
		var r freshReport
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("report of worker %d: %v", i, err)
		}
		reps = append(reps, r)
	}
	return reps
}

// freshOptions is the Options of every Cache in these tests.
func freshOptions(staleFor, backoff time.Duration) *Options {
	return &Options{
		StaleFor:          staleFor,
		RefreshBackoff:    backoff,
		RefreshBackoffMax: backoff,
		MinLease:          freshLease,
		MaxLease:          freshLease,
		DefaultLease:      freshLease,
	}
}

// ---------------------------------------------------------------------------
// Worker side.

// freshReport is what a worker hands the parent.
type freshReport struct {
	Inst, Pid  int
	Calls      int            // Gets made
	Errors     int            // Gets that returned an error
	Outcomes   map[string]int // calls by Outcome
	MaxLatency time.Duration  // the slowest Get
	P99Latency time.Duration
	Slow       []string // the first calls at or above the latency limit
	FirstNew   int64    // freshfail: Unix ns when a value other than the warm one was first served (0: never)
	Values     []string // distinct values served
	Stats      Stats    // the Cache's counters, after Close
}

// freshWorker is the environment, Redis client and Cache of one worker.
type freshWorker struct {
	inst, g, pid   int
	prefix, key    string
	ttl, staleFor  time.Duration
	backoff, sleep time.Duration
	rdb            *redis.Client
	cache          *Cache

	mu   sync.Mutex
	errs []error
}

func freshNewWorker() (*freshWorker, error) {
	w := &freshWorker{prefix: os.Getenv(freshEnvPrefix), pid: os.Getpid()}
	addr := os.Getenv(freshEnvAddr)
	if w.prefix == "" || addr == "" {
		return nil, errors.New("missing " + freshEnvPrefix + " or " + freshEnvAddr)
	}
	w.key = w.prefix + ":hot"
	var err error
	for name, p := range map[string]*int{envInstance: &w.inst, freshEnvG: &w.g} {
		if *p, err = strconv.Atoi(os.Getenv(name)); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	for name, p := range map[string]*time.Duration{
		freshEnvTTL: &w.ttl, freshEnvStale: &w.staleFor, freshEnvBackoff: &w.backoff, freshEnvSleep: &w.sleep,
	} {
		if *p, err = time.ParseDuration(os.Getenv(name)); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	w.rdb = redis.NewClient(&redis.Options{Addr: addr, PoolSize: w.g + 20})
	w.cache = New(w.rdb, freshOptions(w.staleFor, w.backoff))
	return w, nil
}

// fail records an unexpected event; the worker exits non-zero with the
// first few of them.
func (w *freshWorker) fail(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, fmt.Errorf("worker %d (pid %d): "+format, append([]any{w.inst, w.pid}, args...)...))
}

func (w *freshWorker) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	errs := w.errs
	if len(errs) > 10 {
		errs = append(errs[:10:10], fmt.Errorf("... and %d more", len(w.errs)-10))
	}
	return errors.Join(errs...)
}

// arrive announces this process at the barrier and waits for the parent
// to open it. It returns the value the parent stored at <prefix>:go.
func (w *freshWorker) arrive(ctx context.Context) (string, error) {
	if err := w.rdb.Incr(ctx, w.prefix+":ready").Err(); err != nil {
		return "", fmt.Errorf("barrier: %w", err)
	}
	deadline := time.Now().Add(freshBarrierTimeout)
	for {
		v, err := w.rdb.Get(ctx, w.prefix+":go").Result()
		switch {
		case err == nil:
			return v, nil
		case !errors.Is(err, redis.Nil):
			return "", fmt.Errorf("barrier: %w", err)
		case time.Now().After(deadline):
			return "", fmt.Errorf("barrier not opened within %v", freshBarrierTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// freshCaller is the tally of one goroutine's calls.
type freshCaller struct {
	calls, errors int
	outcomes      [8]int
	lat           []time.Duration
	slow          []string
	values        map[string]struct{}
	firstNew      int64
}

// observe records one call.
func (c *freshCaller) observe(start time.Time, lat time.Duration, o Outcome, val []byte, err error, slowAt time.Duration) {
	c.calls++
	if err != nil {
		c.errors++
	}
	if int(o) < len(c.outcomes) {
		c.outcomes[o]++
	}
	c.lat = append(c.lat, lat)
	if lat >= slowAt && len(c.slow) < 5 {
		c.slow = append(c.slow, fmt.Sprintf("%s %v (%v)", start.Format("15:04:05.000"), lat.Round(time.Millisecond), o))
	}
	if err == nil {
		if c.values == nil {
			c.values = map[string]struct{}{}
		}
		c.values[string(val)] = struct{}{}
	}
}

// report merges the tallies, closes the Cache and stores the report.
func (w *freshWorker) report(ctx context.Context, callers []*freshCaller) error {
	r := freshReport{Inst: w.inst, Pid: w.pid, Outcomes: map[string]int{}}
	var lat []time.Duration
	values := map[string]struct{}{}
	for _, c := range callers {
		r.Calls += c.calls
		r.Errors += c.errors
		for o, n := range c.outcomes {
			if n > 0 {
				r.Outcomes[Outcome(o).String()] += n
			}
		}
		lat = append(lat, c.lat...)
		r.Slow = append(r.Slow, c.slow...)
		for v := range c.values {
			values[v] = struct{}{}
		}
		if c.firstNew != 0 && (r.FirstNew == 0 || c.firstNew < r.FirstNew) {
			r.FirstNew = c.firstNew
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		r.MaxLatency = lat[len(lat)-1]
		r.P99Latency = lat[len(lat)*99/100]
	}
	r.Values = slices.Sorted(maps.Keys(values))
	if len(r.Slow) > 10 {
		r.Slow = r.Slow[:10]
	}
	if err := w.cache.Close(); err != nil {
		w.fail("close: %v", err)
	}
	r.Stats = w.cache.Stats()
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return w.rdb.Set(ctx, w.prefix+":report:"+strconv.Itoa(w.inst), b, 0).Err()
}

// ---------------------------------------------------------------------------
// 1. Steady load on one hot key: stale-while-revalidate, one refresh per
// expiry cluster-wide, nobody waits for the source.

// freshSteadyLoader counts its call in Redis, works for sleep (or until its
// context ends) and returns a value unique to the call.
func freshSteadyLoader(rdb *redis.Client, prefix string, sleep time.Duration) LoadFunc {
	return func(ctx context.Context) ([]byte, error) {
		n, err := rdb.Incr(ctx, prefix+":loads").Result()
		if err != nil {
			return nil, err
		}
		if err := rdb.RPush(ctx, prefix+":loadlog", strconv.FormatInt(time.Now().UnixNano(), 10)).Err(); err != nil {
			return nil, err
		}
		t := time.NewTimer(sleep)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
		return []byte("v-" + strconv.FormatInt(n, 10)), nil
	}
}

// TestFreshnessSteadyLoadAcrossProcesses: 4 OS processes × 20 goroutines
// run a closed loop of Get (1ms pause between a goroutine's calls) on one
// hot key for 4.5 s, about ten TTL periods (ttl 400ms, StaleFor 2s, a
// loader that works 150ms). Each call records its Outcome and latency.
//
// Warm-up: the parent makes the one cold Get (through its own Cache)
// before it opens the barrier, so the first value is committed before any
// worker call starts and no worker call belongs to the warm-up. (The
// value cannot hard-expire before the workers start: that would take
// ttl + StaleFor = 2.4 s between the parent's commit and its next
// command.) Then every worker call must be served from Redis at once:
//
//   - no call is a leader, follower or fallback (nor fails);
//   - no call takes as long as the loader's 150ms;
//   - the source is called about once per expiry: with D the time from the
//     warm commit to the end of the run, ≤ ceil(D/ttl) + 2 loads and
//     ≥ floor(D/(ttl + 150ms + 150ms slack)) − 1;
//   - no commit is fenced (no two refreshes of one expiry), and every load
//     but possibly the last (cut off at the end) is served: distinct
//     values served = loads, −1 at most.
func TestFreshnessSteadyLoadAcrossProcesses(t *testing.T) {
	t.Parallel()
	const (
		procs, g = 4, 20
		ttl      = 400 * time.Millisecond
		staleFor = 2 * time.Second
		work     = 150 * time.Millisecond
		run      = 4500 * time.Millisecond
		slack    = 150 * time.Millisecond
		// think is each goroutine's pause between two Gets. The loop stays
		// closed and hot (over ten thousand calls per TTL period), but
		// the 80 callers no longer saturate the two cores alone, which
		// keeps scheduling delays on a loaded machine well below the
		// loader's 150ms that (b) tells apart from waiting for the source.
		think = time.Millisecond
	)
	ctx := context.Background()
	rdb, prefix, env := freshSetup(t)
	env = append(env, freshEnvG+"="+strconv.Itoa(g), freshEnvTTL+"="+ttl.String(),
		freshEnvStale+"="+staleFor.String(), freshEnvBackoff+"=0s", freshEnvSleep+"="+work.String(),
		freshEnvThink+"="+think.String())
	p := startWorkers(t, procs, "freshsteady", env...)
	freshWaitReady(t, rdb, prefix, procs)

	c := New(rdb, freshOptions(staleFor, 0))
	defer c.Close()
	var o Outcome
	v, err := c.Get(WithOutcome(ctx, &o), prefix+":hot", ttl, freshSteadyLoader(rdb, prefix, work))
	if err != nil || o != OutcomeLeader || string(v) != "v-1" {
		t.Fatalf("warm-up Get: %q, %v, outcome %v; want v-1 from a leader", v, err, o)
	}
	warmed := time.Now()
	end := warmed.Add(run)
	if err := rdb.Set(ctx, prefix+":go", strconv.FormatInt(end.UnixNano(), 10), 0).Err(); err != nil {
		t.Fatal(err)
	}
	p.wait(run + time.Minute) // a failed worker still leaves its report

	reps := freshReports(t, rdb, prefix, procs)
	loads, err := rdb.Get(ctx, prefix+":loads").Int()
	if err != nil {
		t.Fatal(err)
	}
	distinct, err := rdb.SCard(ctx, prefix+":values").Result()
	if err != nil {
		t.Fatal(err)
	}
	total := c.Stats()
	t.Logf("parent: %s", freshStatsLine(total))
	var calls, errs int
	var maxLat, p99 time.Duration
	outcomes := map[string]int{}
	var slow []string
	for _, r := range reps {
		t.Logf("process %d (pid %d): %d calls, max latency %v, p99 %v, outcomes %v; %s",
			r.Inst, r.Pid, r.Calls, r.MaxLatency.Round(time.Microsecond), r.P99Latency.Round(time.Microsecond),
			r.Outcomes, freshStatsLine(r.Stats))
		calls += r.Calls
		errs += r.Errors
		maxLat, p99 = max(maxLat, r.MaxLatency), max(p99, r.P99Latency)
		for k, n := range r.Outcomes {
			outcomes[k] += n
		}
		slow = append(slow, r.Slow...)
		freshAddStats(&total, r.Stats)
	}
	d := end.Sub(warmed)
	refreshLoads := loads - 1 // the parent's warm-up load is not a refresh
	maxLoads := int(math.Ceil(float64(d)/float64(ttl))) + 2
	minLoads := int(float64(d)/float64(ttl+work+slack)) - 1
	t.Logf("D=%v: %d calls, outcomes %v; %d refresh loads (bounds [%d, %d]), %d distinct values served; max latency %v (p99 %v); load intervals %v",
		d.Round(time.Millisecond), calls, outcomes, refreshLoads, minLoads, maxLoads, distinct,
		maxLat.Round(time.Microsecond), p99.Round(time.Microsecond), freshIntervals(t, rdb, prefix+":loadlog"))
	t.Logf("all processes: %s", freshStatsLine(total))

	if calls < procs*g {
		t.Errorf("only %d calls in %v", calls, run)
	}
	if errs != 0 {
		t.Errorf("%d calls returned an error", errs)
	}
	for _, bad := range []Outcome{OutcomeUnknown, OutcomeLeader, OutcomeFollower, OutcomeFallback, OutcomeNegative} {
		if n := outcomes[bad.String()]; n > 0 {
			t.Errorf("%d calls after warm-up had outcome %v; want only hit or stale", n, bad)
		}
	}
	// No caller waited for the source: the outcomes above say so (a caller
	// that waited would be a leader or follower). The latency is only
	// logged: on a loaded machine a plain GET can take longer than the
	// loader.
	if maxLat >= work {
		t.Logf("max latency after warm-up %v ≥ the loader's %v (every outcome a hit or stale); slow calls: %v",
			maxLat, work, slow)
	}
	if refreshLoads > maxLoads || refreshLoads < minLoads {
		t.Errorf("%d refresh loads in %v, want between %d and %d (one per expiry, period ≈ ttl + loader time)",
			refreshLoads, d, minLoads, maxLoads)
	}
	if total.Fenced != 0 {
		t.Errorf("%d fenced commits: two refreshes ran for one expiry", total.Fenced)
	}
	// A refresh that won its lease right before Close may end before its
	// loader counted itself.
	if extra := int(total.Refreshes) - refreshLoads; extra < 0 || extra > 1 || total.RefreshErrors != 0 || total.LocalLoads != 0 {
		t.Errorf("Stats: %d refreshes (want %d, the refresh loads), %d refresh errors, %d local loads (want 0)",
			total.Refreshes, refreshLoads, total.RefreshErrors, total.LocalLoads)
	}
	if total.StaleServed == 0 {
		t.Errorf("no stale value was served: the test did not exercise stale-while-revalidate")
	}
	if int(distinct) != loads && int(distinct) != loads-1 {
		t.Errorf("%d distinct values served for %d loads, want %d (or one fewer: a value committed at the very end)",
			distinct, loads, loads)
	}
}

// freshSteadyWorker is one process of TestFreshnessSteadyLoadAcrossProcesses.
func freshSteadyWorker(ctx context.Context, _ string) error {
	w, err := freshNewWorker()
	if err != nil {
		return err
	}
	defer w.rdb.Close()
	defer w.cache.Close()
	goVal, err := w.arrive(ctx)
	if err != nil {
		return err
	}
	endNs, err := strconv.ParseInt(goVal, 10, 64)
	if err != nil {
		return fmt.Errorf("go: %w", err)
	}
	end := time.Unix(0, endNs)
	// A Get that hangs must not hang the worker: it fails after the run
	// plus a margin, and the caller reports it.
	runCtx, cancel := context.WithDeadline(ctx, end.Add(30*time.Second))
	defer cancel()
	load := freshSteadyLoader(w.rdb, w.prefix, w.sleep)
	think, err := time.ParseDuration(os.Getenv(freshEnvThink))
	if err != nil {
		return fmt.Errorf("%s: %w", freshEnvThink, err)
	}

	callers := make([]*freshCaller, w.g)
	var wg sync.WaitGroup
	for i := range callers {
		tally := &freshCaller{}
		callers[i] = tally
		wg.Go(func() {
			for {
				start := time.Now()
				if !start.Before(end) {
					return
				}
				var o Outcome
				val, err := w.cache.Get(WithOutcome(runCtx, &o), w.key, w.ttl, load)
				tally.observe(start, time.Since(start), o, val, err, w.sleep)
				if err != nil {
					w.fail("Get: %v", err)
				}
				if o != OutcomeHit && o != OutcomeStale {
					w.fail("Get at %s: outcome %v, want hit or stale", start.Format("15:04:05.000"), o)
				}
				if think > 0 {
					time.Sleep(think)
				}
			}
		})
	}
	wg.Wait()
	if err := w.report(ctx, callers); err != nil {
		return err
	}
	var values []any
	for _, c := range callers {
		for v := range c.values {
			values = append(values, v)
		}
	}
	if len(values) > 0 {
		if err := w.rdb.SAdd(ctx, w.prefix+":values", values...).Err(); err != nil {
			return err
		}
	}
	return w.err()
}

// ---------------------------------------------------------------------------
// 2. Refresh failures: stale-if-error and the cluster-wide backoff.

// freshFailLoader fails while <prefix>:fail exists (counting the failure
// and logging its time first) and otherwise returns "good-<n>".
func freshFailLoader(rdb *redis.Client, prefix string) LoadFunc {
	return func(ctx context.Context) ([]byte, error) {
		at := time.Now().UnixNano() // before the flag is read: inside the window if the call fails
		if err := rdb.Incr(ctx, prefix+":calls").Err(); err != nil {
			return nil, err
		}
		down, err := rdb.Exists(ctx, prefix+":fail").Result()
		if err != nil {
			return nil, err
		}
		if down == 1 {
			if err := rdb.RPush(ctx, prefix+":faillog", strconv.FormatInt(at, 10)+" "+strconv.Itoa(os.Getpid())).Err(); err != nil {
				return nil, err
			}
			return nil, errors.New("the source is down (test flag set)")
		}
		n, err := rdb.Incr(ctx, prefix+":good").Result()
		if err != nil {
			return nil, err
		}
		return []byte("good-" + strconv.FormatInt(n, 10)), nil
	}
}

// TestFreshnessRefreshFailureAcrossProcesses: 4 OS processes × 10
// goroutines read one key (ttl 300ms, StaleFor 10s, RefreshBackoff =
// RefreshBackoffMax = 400ms, so every backoff step is 400ms). The parent
// warms the key with a good value, then sets the failure flag and opens
// the barrier; ~2.4 s later it clears the flag. Asserted:
//
//   - every call, in and after the window, is served without error, with
//     outcome hit or stale, and in the window only the warm value;
//   - the loader fails at most once per backoff step across all
//     processes: ≤ ceil(window/400ms) + 1 failed calls (+1 for the call
//     in flight at the boundary), consecutive failures ≥ 400ms apart, and
//     ≥ 2 failures (refreshes were really attempted); every failure is
//     one Stats.RefreshErrors in some process;
//   - after the window the next refresh succeeds: a new value is served
//     before the hard TTL, within 3 backoff steps of the clear.
func TestFreshnessRefreshFailureAcrossProcesses(t *testing.T) {
	t.Parallel()
	const (
		procs, g = 4, 10
		ttl      = 300 * time.Millisecond
		staleFor = 10 * time.Second
		backoff  = 400 * time.Millisecond
		window   = 2400 * time.Millisecond
	)
	ctx := context.Background()
	rdb, prefix, env := freshSetup(t)
	env = append(env, freshEnvG+"="+strconv.Itoa(g), freshEnvTTL+"="+ttl.String(),
		freshEnvStale+"="+staleFor.String(), freshEnvBackoff+"="+backoff.String(), freshEnvSleep+"=0s")
	p := startWorkers(t, procs, "freshfail", env...)
	freshWaitReady(t, rdb, prefix, procs)

	c := New(rdb, freshOptions(staleFor, backoff))
	defer c.Close()
	var o Outcome
	warmStart := time.Now()
	v, err := c.Get(WithOutcome(ctx, &o), prefix+":hot", ttl, freshFailLoader(rdb, prefix))
	if err != nil || o != OutcomeLeader || string(v) != "good-1" {
		t.Fatalf("warm-up Get: %q, %v, outcome %v; want good-1 from a leader", v, err, o)
	}
	// The warm value was committed after warmStart, so it is servable at
	// least until hard.
	hard := warmStart.Add(ttl + staleFor)

	windowStart := time.Now() // no refresh can fail before the flag is set
	if err := rdb.Set(ctx, prefix+":fail", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, prefix+":go", strconv.FormatInt(hard.UnixNano(), 10)+" "+string(v), 0).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(window) // the length of the outage, not a synchronisation
	clearing := time.Now()
	if err := rdb.Del(ctx, prefix+":fail").Err(); err != nil {
		t.Fatal(err)
	}
	cleared := time.Now()
	p.wait(time.Until(hard) + time.Minute) // a failed worker still leaves its report

	reps := freshReports(t, rdb, prefix, procs)
	calls, _ := rdb.Get(ctx, prefix+":calls").Int()
	good, _ := rdb.Get(ctx, prefix+":good").Int()
	faillog, err := rdb.LRange(ctx, prefix+":faillog", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var fails []time.Time
	for _, ln := range faillog {
		ns, err := strconv.ParseInt(strings.Fields(ln)[0], 10, 64)
		if err != nil {
			t.Fatalf("bad fail log line %q", ln)
		}
		fails = append(fails, time.Unix(0, ns))
	}
	slices.SortFunc(fails, time.Time.Compare)

	total := c.Stats()
	var gets, errs int
	var maxLat time.Duration
	outcomes := map[string]int{}
	var firstNew time.Time
	values := map[string]bool{}
	for _, r := range reps {
		t.Logf("process %d (pid %d): %d calls, max latency %v, outcomes %v, values %v; %s",
			r.Inst, r.Pid, r.Calls, r.MaxLatency.Round(time.Microsecond), r.Outcomes, r.Values, freshStatsLine(r.Stats))
		gets += r.Calls
		errs += r.Errors
		maxLat = max(maxLat, r.MaxLatency)
		for k, n := range r.Outcomes {
			outcomes[k] += n
		}
		for _, v := range r.Values {
			values[v] = true
		}
		if r.FirstNew == 0 {
			t.Errorf("process %d never got a value other than the warm one", r.Inst)
		} else if fn := time.Unix(0, r.FirstNew); firstNew.IsZero() || fn.Before(firstNew) {
			firstNew = fn
		}
		freshAddStats(&total, r.Stats)
	}
	win := cleared.Sub(windowStart)
	maxFails := int(math.Ceil(float64(win)/float64(backoff))) + 1
	perStep := map[int]int{}
	var gaps []time.Duration
	for i, f := range fails {
		perStep[int(f.Sub(windowStart)/backoff)]++
		if i > 0 {
			gaps = append(gaps, f.Sub(fails[i-1]).Round(time.Millisecond))
		}
	}
	steps := make([]int, int(math.Ceil(float64(win)/float64(backoff))))
	for s, n := range perStep {
		if s >= 0 && s < len(steps) {
			steps[s] = n
		}
	}
	t.Logf("window %v: %d failed loader calls (max %d), per %v step %v, gaps %v; %d loader calls in all, %d good; %d Gets, outcomes %v, max latency %v",
		win.Round(time.Millisecond), len(fails), maxFails, backoff, steps, gaps, calls, good, gets, outcomes, maxLat.Round(time.Microsecond))
	if !firstNew.IsZero() {
		t.Logf("new value first served %v after the flag was cleared (hard TTL %v later)",
			firstNew.Sub(cleared).Round(time.Millisecond), hard.Sub(firstNew).Round(time.Millisecond))
	}
	t.Logf("all processes: %s", freshStatsLine(total))

	if errs != 0 {
		t.Errorf("%d calls returned an error; stale-if-error should have served the stale value", errs)
	}
	for k, n := range outcomes {
		if k != OutcomeHit.String() && k != OutcomeStale.String() {
			t.Errorf("%d calls had outcome %s; want only hit or stale", n, k)
		}
	}
	if outcomes[OutcomeStale.String()] == 0 {
		t.Errorf("no stale value was served")
	}
	if len(fails) < 2 {
		t.Errorf("%d failed refreshes in the %v window, want at least 2: refreshes were not retried after the backoff", len(fails), win)
	}
	if len(fails) > maxFails {
		t.Errorf("%d failed refreshes in the %v window, want at most %d: one per %v backoff step cluster-wide",
			len(fails), win, maxFails, backoff)
	}
	// A failure starts the backoff when it releases, after its loader
	// started: the next loader starts ≥ one step later (less a few ms for
	// the millisecond resolution of Redis expiry).
	var tooClose []string
	for i := 1; i < len(fails); i++ {
		if gap := fails[i].Sub(fails[i-1]); gap < backoff-5*time.Millisecond {
			tooClose = append(tooClose, fmt.Sprintf("%d and %d: %v", i-1, i, gap.Round(time.Millisecond)))
		}
	}
	if len(tooClose) > 0 {
		t.Errorf("%d pairs of consecutive failed refreshes within one %v backoff step, first ones: %v",
			len(tooClose), backoff, tooClose[:min(len(tooClose), 5)])
	}
	for _, f := range fails {
		if f.Before(windowStart) || !f.Before(cleared) {
			t.Errorf("a failed refresh at %s, outside the window [%s, %s]",
				f.Format("15:04:05.000"), windowStart.Format("15:04:05.000"), cleared.Format("15:04:05.000"))
		}
	}
	if total.RefreshErrors != uint64(len(fails)) {
		t.Errorf("Stats: %d refresh errors in all processes, want %d (the failed loader calls)", total.RefreshErrors, len(fails))
	}
	if total.LocalLoads != 0 || total.Fenced != 0 {
		t.Errorf("Stats: %d local loads, %d fenced commits; want 0", total.LocalLoads, total.Fenced)
	}
	if calls != len(fails)+good {
		t.Errorf("%d loader calls, %d failed and %d good", calls, len(fails), good)
	}
	if good < 2 || !values["good-2"] {
		t.Errorf("%d good loads, values served %v: the refresh after the window did not produce good-2", good, values)
	}
	for v := range values {
		if !strings.HasPrefix(v, "good-") {
			t.Errorf("value %q served", v)
		}
	}
	if !firstNew.IsZero() {
		if firstNew.Before(clearing) {
			t.Errorf("a new value was served at %s, before the flag was cleared at %s",
				firstNew.Format("15:04:05.000"), clearing.Format("15:04:05.000"))
		}
		if !firstNew.Before(hard) {
			t.Errorf("the new value came at %s, after the hard TTL %s", firstNew.Format("15:04:05.000"), hard.Format("15:04:05.000"))
		}
		if lag := firstNew.Sub(cleared); lag > 3*backoff {
			t.Errorf("the new value came %v after the flag was cleared, want within 3 backoff steps (%v)", lag, 3*backoff)
		}
	}
}

// freshFailWorker is one process of TestFreshnessRefreshFailureAcrossProcesses.
// Each goroutine reads the key until it is served a value other than the
// warm one, or until the warm value's hard TTL (a failure).
func freshFailWorker(ctx context.Context, _ string) error {
	w, err := freshNewWorker()
	if err != nil {
		return err
	}
	defer w.rdb.Close()
	defer w.cache.Close()
	goVal, err := w.arrive(ctx)
	if err != nil {
		return err
	}
	hardStr, warm, ok := strings.Cut(goVal, " ")
	hardNs, err := strconv.ParseInt(hardStr, 10, 64)
	if !ok || err != nil {
		return fmt.Errorf("go: bad value %q", goVal)
	}
	hard := time.Unix(0, hardNs)
	runCtx, cancel := context.WithDeadline(ctx, hard.Add(10*time.Second))
	defer cancel()
	load := freshFailLoader(w.rdb, w.prefix)

	callers := make([]*freshCaller, w.g)
	var wg sync.WaitGroup
	for i := range callers {
		tally := &freshCaller{}
		callers[i] = tally
		wg.Go(func() {
			for {
				start := time.Now()
				if !start.Before(hard) {
					w.fail("no value other than %q served before the hard TTL %s", warm, hard.Format("15:04:05.000"))
					return
				}
				var o Outcome
				val, err := w.cache.Get(WithOutcome(runCtx, &o), w.key, w.ttl, load)
				tally.observe(start, time.Since(start), o, val, err, time.Second)
				if err != nil {
					w.fail("Get at %s: %v", start.Format("15:04:05.000"), err)
				}
				if o != OutcomeHit && o != OutcomeStale {
					w.fail("Get at %s: outcome %v, want hit or stale", start.Format("15:04:05.000"), o)
				}
				if err == nil && string(val) != warm {
					tally.firstNew = time.Now().UnixNano()
					return
				}
			}
		})
	}
	wg.Wait()
	if err := w.report(ctx, callers); err != nil {
		return err
	}
	return w.err()
}

// ---------------------------------------------------------------------------
// Helpers.

// freshAddStats adds the counters the tests look at.
func freshAddStats(sum *Stats, s Stats) {
	sum.Hits += s.Hits
	sum.Misses += s.Misses
	sum.Loads += s.Loads
	sum.LocalLoads += s.LocalLoads
	sum.Leads += s.Leads
	sum.Waits += s.Waits
	sum.Fenced += s.Fenced
	sum.StaleServed += s.StaleServed
	sum.Refreshes += s.Refreshes
	sum.RefreshErrors += s.RefreshErrors
	sum.RefreshesDropped += s.RefreshesDropped
}

func freshStatsLine(s Stats) string {
	return fmt.Sprintf("hits=%d staleServed=%d refreshes=%d refreshErrors=%d dropped=%d loads=%d leads=%d follows=%d misses=%d fenced=%d localLoads=%d",
		s.Hits, s.StaleServed, s.Refreshes, s.RefreshErrors, s.RefreshesDropped, s.Loads, s.Leads, s.Waits, s.Misses, s.Fenced, s.LocalLoads)
}

// freshIntervals returns the times between consecutive loader starts
// logged (Unix ns) in list.
func freshIntervals(t *testing.T, rdb *redis.Client, list string) []time.Duration {
	t.Helper()
	lines, err := rdb.LRange(context.Background(), list, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var at []int64
	for _, ln := range lines {
		ns, err := strconv.ParseInt(ln, 10, 64)
		if err != nil {
			t.Fatalf("bad load log line %q", ln)
		}
		at = append(at, ns)
	}
	slices.Sort(at)
	var d []time.Duration
	for i := 1; i < len(at); i++ {
		d = append(d, time.Duration(at[i]-at[i-1]).Round(time.Millisecond))
	}
	return d
}
