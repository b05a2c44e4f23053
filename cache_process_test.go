package herd

// Cross-process tests of the Cache. Every test re-runs the test binary as
// several worker processes (see startWorkers) that share a real redis-server or
// a real 3-master Redis Cluster. Loader calls are counted in a shared
// place (a Redis INCR on a bookkeeping key, or per-process result files
// when Redis itself is killed), the goroutines of all processes start each
// wave together at a Redis barrier, and workers stop by themselves: every
// wait has a deadline, and any unexpected error ends the worker with a
// non-zero status and a message the parent reports.
//
// Bookkeeping keys live under a per-run prefix "cp-<run>:" that herd never
// uses (herd's keys are "herd:{<hash>}:..."), so counting never disturbs
// the cache.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Environment of a cache worker process.
const (
	cpEnvMode   = "HERD_CP_MODE"   // "redis" or "cluster"
	cpEnvAddrs  = "HERD_CP_ADDRS"  // comma-separated Redis addresses
	cpEnvPrefix = "HERD_CP_PREFIX" // prefix of the bookkeeping keys and user keys
	cpEnvProcs  = "HERD_CP_PROCS"  // number of worker processes
	cpEnvG      = "HERD_CP_G"      // goroutines per process
	cpEnvWaves  = "HERD_CP_WAVES"  // number of waves
	cpEnvDir    = "HERD_CP_DIR"    // directory for result files (Redis-independent)
	// cpEnvBook, when set, is the address of a separate redis-server that
	// holds the bookkeeping keys (barriers, entry sets), so that a test
	// that kills the Redis under test cannot lose its own bookkeeping.
	cpEnvBook = "HERD_CP_BOOK"
)

const (
	// cpBarrierTimeout bounds a worker's wait at a barrier or hook.
	cpBarrierTimeout = 30 * time.Second
	// cpGetTimeout bounds one Get in a worker.
	cpGetTimeout = 15 * time.Second
	// cpValueTTL is the TTL of every value the tests store.
	cpValueTTL = time.Minute
)

func init() {
	workerRoles["cachewaves"] = cacheWavesWorker
	workerRoles["cacheerrors"] = cacheErrorsWorker
	workerRoles["cachestall"] = cacheStallWorker
	workerRoles["cachekill"] = cacheKillWorker
}

// ---------------------------------------------------------------------------
// Parent side: spawning and reaping worker processes.

// cpEnvFor returns the worker environment.
func cpEnvFor(mode string, addrs []string, prefix, dir string, procs, g, waves int) []string {
	return []string{
		cpEnvMode + "=" + mode,
		cpEnvAddrs + "=" + strings.Join(addrs, ","),
		cpEnvPrefix + "=" + prefix,
		cpEnvDir + "=" + dir,
		cpEnvProcs + "=" + strconv.Itoa(procs),
		cpEnvG + "=" + strconv.Itoa(g),
		cpEnvWaves + "=" + strconv.Itoa(waves),
	}
}

// cpNewPrefix returns a fresh bookkeeping prefix.
func cpNewPrefix() string {
	return "cp-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// cpKey joins a bookkeeping key.
func cpKey(prefix string, parts ...string) string {
	return prefix + ":" + strings.Join(parts, ":")
}

// cpReport is what a worker reports about itself when it is done.
type cpReport struct {
	Inst  int
	Pid   int
	Stats Stats
	// Per wave: loader runs in this process, callers served, the largest
	// latency of a Get, the errors and the distinct values callers got.
	Waves []cpWaveReport
	// Log holds what the Cache logged (Options.Logger), for diagnosis.
	Log []string
}

// cpLog collects a Cache's log lines.
type cpLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *cpLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (l *cpLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

type cpWaveReport struct {
	Loads      int64
	Served     int64
	MaxLatency time.Duration
	Errors     []string
	Values     []string
	// What this process's Cache counted during the wave.
	Stats Stats
}

// statsDelta returns b - a, counter by counter.
func statsDelta(a, b Stats) Stats {
	var d Stats
	va, vb, vd := reflect.ValueOf(a), reflect.ValueOf(b), reflect.ValueOf(&d).Elem()
	for i := range vd.NumField() {
		vd.Field(i).SetUint(vb.Field(i).Uint() - va.Field(i).Uint())
	}
	return d
}

// cpReports reads the workers' reports from Redis.
func cpReports(t *testing.T, rdb redis.UniversalClient, prefix string, procs int) []cpReport {
	t.Helper()
	reps := make([]cpReport, procs)
	for i := range procs {
		b, err := rdb.Get(context.Background(), cpKey(prefix, "report", strconv.Itoa(i))).Bytes()
		if err != nil {
			t.Fatalf("report of worker %d: %v", i, err)
		}
		if err := json.Unmarshal(b, &reps[i]); err != nil {
			t.Fatalf("report of worker %d: %v", i, err)
		}
	}
	return reps
}

// cpStatsLine formats the counters the tests talk about.
func cpStatsLine(s Stats) string {
	return fmt.Sprintf("hits=%d misses=%d leads=%d loads=%d follows=%d notified=%d polled=%d takeovers=%d fenced=%d loadErrors=%d localLoads=%d failOpen=%d waitTimeouts=%d commitErrors=%d breakerOpens=%d",
		s.Hits, s.Misses, s.Leads, s.Loads, s.Waits, s.Notified, s.Polled, s.Takeovers, s.Fenced,
		s.LoadErrors, s.LocalLoads, s.FailOpen, s.WaitTimeouts, s.CommitErrors, s.BreakerOpens)
}

// ---------------------------------------------------------------------------
// Worker side.

// cpWorker is the environment and Redis client of one worker process.
type cpWorker struct {
	inst, procs, g, waves int
	mode, prefix, dir     string
	addrs                 []string
	pid                   int
	rdb                   redis.UniversalClient
	subsTimedOut          atomic.Bool // see waitFollowers

	mu   sync.Mutex
	errs []error
}

// cpNewWorker reads the environment and connects the bookkeeping client
// (w.rdb, go-redis defaults).
func cpNewWorker() (*cpWorker, error) {
	w := &cpWorker{
		mode:   os.Getenv(cpEnvMode),
		prefix: os.Getenv(cpEnvPrefix),
		dir:    os.Getenv(cpEnvDir),
		addrs:  strings.Split(os.Getenv(cpEnvAddrs), ","),
		pid:    os.Getpid(),
	}
	if w.prefix == "" || w.addrs[0] == "" {
		return nil, errors.New("missing " + cpEnvPrefix + " or " + cpEnvAddrs)
	}
	for _, v := range []struct {
		name string
		p    *int
	}{{envInstance, &w.inst}, {cpEnvProcs, &w.procs}, {cpEnvG, &w.g}, {cpEnvWaves, &w.waves}} {
		n, err := strconv.Atoi(os.Getenv(v.name))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v.name, err)
		}
		*v.p = n
	}
	if book := os.Getenv(cpEnvBook); book != "" {
		w.rdb = redis.NewClient(&redis.Options{Addr: book, PoolSize: w.g + 20})
		return w, nil
	}
	var err error
	if w.rdb, err = w.newClient(nil); err != nil {
		return nil, err
	}
	return w, nil
}

// newClient returns a new client of the worker's Redis. tune, if not nil,
// adjusts the options of a single-server client.
func (w *cpWorker) newClient(tune func(*redis.Options)) (redis.UniversalClient, error) {
	pool := w.g + 20
	switch w.mode {
	case "cluster":
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: w.addrs, PoolSize: pool}), nil
	case "redis":
		opt := &redis.Options{Addr: w.addrs[0], PoolSize: pool}
		if tune != nil {
			tune(opt)
		}
		return redis.NewClient(opt), nil
	}
	return nil, fmt.Errorf("unknown %s %q", cpEnvMode, w.mode)
}

func (w *cpWorker) key(parts ...string) string { return cpKey(w.prefix, parts...) }

// fail records an unexpected error; the worker exits non-zero with the
// first few of them.
func (w *cpWorker) fail(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, fmt.Errorf("worker %d (pid %d): "+format, append([]any{w.inst, w.pid}, args...)...))
}

func (w *cpWorker) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	errs := w.errs
	if len(errs) > 10 {
		errs = append(errs[:10:10], fmt.Errorf("... and %d more errors", len(w.errs)-10))
	}
	return errors.Join(errs...)
}

// barrier is a cross-process barrier named name: this process arrives
// once its g goroutines are parked; the last process to arrive opens it.
// Arrivals are set members, so a retried command cannot count twice.
func (w *cpWorker) barrier(ctx context.Context, name string) error {
	if err := w.rdb.SAdd(ctx, w.key(name, "ready"), w.inst).Err(); err != nil {
		return fmt.Errorf("barrier %s: %w", name, err)
	}
	n, err := w.rdb.SCard(ctx, w.key(name, "ready")).Result()
	if err != nil {
		return fmt.Errorf("barrier %s: %w", name, err)
	}
	if n == int64(w.procs) {
		if err := w.rdb.Set(ctx, w.key(name, "go"), "1", 0).Err(); err != nil {
			return fmt.Errorf("barrier %s: %w", name, err)
		}
	}
	deadline := time.Now().Add(cpBarrierTimeout)
	for {
		n, err := w.rdb.Exists(ctx, w.key(name, "go")).Result()
		if err != nil {
			return fmt.Errorf("barrier %s: %w", name, err)
		}
		if n == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("barrier %s: not opened within %v", name, cpBarrierTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// runWave parks g goroutines, passes the barrier of wave name, then runs
// call in all of them at once and waits for them.
func (w *cpWorker) runWave(ctx context.Context, name string, call func(i int)) error {
	start := make(chan struct{})
	var parked, done sync.WaitGroup
	var ok atomic.Bool
	parked.Add(w.g)
	for i := range w.g {
		done.Go(func() {
			parked.Done()
			<-start
			if ok.Load() {
				call(i)
			}
		})
	}
	parked.Wait()
	err := w.barrier(ctx, name)
	ok.Store(err == nil)
	close(start)
	done.Wait()
	return err
}

// enter marks caller i of this process as entering Get in wave name.
func (w *cpWorker) enter(ctx context.Context, name string, i int) error {
	return w.rdb.SAdd(ctx, w.key(name, "entered"), strconv.Itoa(w.inst)+"/"+strconv.Itoa(i)).Err()
}

// waitEntered is the loader's hook: it waits until every caller of every
// process has entered Get for wave name (each calls enter right before
// Get), so that no caller can arrive after the flight has ended and start
// a second one.
func (w *cpWorker) waitEntered(ctx context.Context, name string) error {
	deadline := time.Now().Add(cpBarrierTimeout)
	for {
		n, err := w.rdb.SCard(ctx, w.key(name, "entered")).Result()
		if err != nil {
			return err
		}
		if n >= int64(w.procs*w.g) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d callers entered wave %s within %v", n, w.procs*w.g, name, cpBarrierTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// subscribers returns how many connections the server that owns herd
// key's wake-up channel counts as subscribed to it: sharded subscriptions
// on the owning master of a cluster, plain ones on a single server.
func (w *cpWorker) subscribers(ctx context.Context, key string) (int64, error) {
	keys, err := makeKeys(DefaultPrefix, key)
	if err != nil {
		return 0, err
	}
	var m map[string]int64
	if cc, ok := w.rdb.(*redis.ClusterClient); ok {
		master, err := cc.MasterForKey(ctx, keys.Channel)
		if err != nil {
			return 0, err
		}
		m, err = master.PubSubShardNumSub(ctx, keys.Channel).Result()
		if err != nil {
			return 0, err
		}
	} else {
		m, err = w.rdb.PubSubNumSub(ctx, keys.Channel).Result()
		if err != nil {
			return 0, err
		}
	}
	return m[keys.Channel], nil
}

// waitFollowers is a loader's hook: it waits until every other process
// follows the rebuild of herd key, that is, until the server that owns the
// key's wake-up channel counts procs-1 subscriptions to it, so that the
// leader's commit (or failure) message reaches all of them. It records
// the count it saw under name:subscribers for the parent. The wait is
// bounded by 2s, and by 250ms once a wait of this process has run out
// (the parent fails the test then anyway; this keeps a failing run short).
func (w *cpWorker) waitFollowers(ctx context.Context, name, key string) error {
	bound := 2 * time.Second
	if w.subsTimedOut.Load() {
		bound = 250 * time.Millisecond
	}
	var subs int64
	for deadline := time.Now().Add(bound); ; time.Sleep(time.Millisecond) {
		n, err := w.subscribers(ctx, key)
		if err != nil {
			return err
		}
		subs = n
		if n >= int64(w.procs-1) {
			break
		}
		if time.Now().After(deadline) {
			w.subsTimedOut.Store(true)
			break
		}
	}
	return w.rdb.Set(ctx, w.key(name, "subscribers"), subs, 0).Err()
}

// report stores r under prefix:report:<inst>.
func (w *cpWorker) report(ctx context.Context, r *cpReport) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return w.rdb.Set(ctx, w.key("report", strconv.Itoa(w.inst)), b, 0).Err()
}

// maxDuration keeps the largest duration stored in it.
type maxDuration struct{ v atomic.Int64 }

func (m *maxDuration) observe(d time.Duration) {
	for {
		cur := m.v.Load()
		if int64(d) <= cur || m.v.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

func (m *maxDuration) get() time.Duration { return time.Duration(m.v.Load()) }

// ---------------------------------------------------------------------------
// 1. Waves of cold keys: one load per wave in the whole cluster.

// TestCacheWavesAcrossProcesses: 4 OS processes × 50 goroutines, 20 waves,
// each on a fresh cold key; all 200 callers of a wave start together at a
// barrier. Per wave: exactly one loader run in the whole cluster, exactly
// one distinct value among all callers (the leader's, identified by wave
// and pid), every caller served without error, and every other process
// subscribed to the key's wake-up channel, on the server that owns it,
// before the commit (so the commit's message wakes them: the loader waits
// for that, bounded, before it returns). On a single redis-server and on
// a 3-master cluster (sharded pub/sub). Per-process Stats (follows,
// notified, polled) are logged; follows not ended by the message are
// logged per wave.
func TestCacheWavesAcrossProcesses(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		cpRunWaves(t, "redis", []string{srv.Addr()}, srv.Client(t))
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		cpRunWaves(t, "cluster", cl.Addrs(), cl.Client(t))
	})
}

func cpRunWaves(t *testing.T, mode string, addrs []string, rdb redis.UniversalClient) {
	const procs, g, waves = 4, 50, 20
	ctx := context.Background()
	prefix := cpNewPrefix()
	start := time.Now()
	p := startWorkers(t, procs, "cachewaves", cpEnvFor(mode, addrs, prefix, "", procs, g, waves)...)
	p.wait(60 * time.Second)
	elapsed := time.Since(start)
	if t.Failed() {
		t.FailNow()
	}

	if errs, _ := rdb.LRange(ctx, cpKey(prefix, "errors"), 0, 9).Result(); len(errs) > 0 {
		t.Errorf("callers got errors, first ones:\n%s", strings.Join(errs, "\n"))
	}
	reps := cpReports(t, rdb, prefix, procs)
	loadsPerWave := make([]int, waves)
	var maxLat time.Duration
	for w := range waves {
		name := "w" + strconv.Itoa(w)
		loads, _ := rdb.Get(ctx, cpKey(prefix, name, "loads")).Int()
		served, _ := rdb.Get(ctx, cpKey(prefix, name, "served")).Int()
		values, _ := rdb.SMembers(ctx, cpKey(prefix, name, "values")).Result()
		loadsPerWave[w] = loads
		if loads != 1 {
			t.Errorf("wave %d: %d loads, want exactly 1", w, loads)
		}
		if len(values) != 1 {
			t.Errorf("wave %d: callers got %d distinct values %q, want exactly 1", w, len(values), values)
		} else if want := "wave-" + strconv.Itoa(w) + "-pid-"; !strings.HasPrefix(values[0], want) {
			t.Errorf("wave %d: value %q is not this wave's", w, values[0])
		}
		if served != procs*g {
			t.Errorf("wave %d: %d callers served, want %d", w, served, procs*g)
		}
		// Every following process must be subscribed, on the server that
		// owns the key's channel, before the leader commits: otherwise the
		// commit's message cannot wake it and it falls back to polling
		// (the design's "notification, not polling"). The leader's loader
		// waits for this (bounded), so in a healthy library it holds.
		//
		// Regression check (cluster) for a bug this check found, fixed in
		// 1804c77: notifier.dial started go-redis's receive loop
		// (ps.ChannelWithSubscriptions) before the first SSUBSCRIBE; when
		// that loop connected first it had no channel to route by, so
		// go-redis's ClusterClient picked nodes.Random(), the SSUBSCRIBE
		// got MOVED, and the process never heard wake-ups for the keys of
		// that master (in 1 to 2 runs of 3: fewer subscribers than
		// followers here, and followers that ended their wait by polling).
		subs, _ := rdb.Get(ctx, cpKey(prefix, name, "subscribers")).Int()
		if subs != procs-1 {
			t.Errorf("%s wave %d: the server owning the key's channel counted %d subscribers before the commit, want %d (one per following process)",
				mode, w, subs, procs-1)
		}
		// A follow that did not end by the message is logged, not failed:
		// under a heavy load a subscribed follower may be descheduled past
		// the commit and find the value by its own GET.
		var lost []string
		for _, r := range reps {
			wr := r.Waves[w]
			maxLat = max(maxLat, wr.MaxLatency)
			if ws := wr.Stats; ws.Waits != ws.Notified {
				lost = append(lost, fmt.Sprintf("process %d: follows=%d notified=%d polled=%d hits=%d max latency %v",
					r.Inst, ws.Waits, ws.Notified, ws.Polled, ws.Hits, wr.MaxLatency.Round(time.Millisecond)))
			}
		}
		if len(lost) > 0 {
			t.Logf("%s wave %d: a follow did not end by the commit's message: %s", mode, w, strings.Join(lost, "; "))
		}
		if t.Failed() && loads != 1 {
			for _, r := range reps {
				t.Logf("%s wave %d, process %d: %s", mode, w, r.Inst, cpStatsLine(r.Waves[w].Stats))
			}
		}
	}
	var total Stats
	for _, r := range reps {
		t.Logf("process %d (pid %d): %s", r.Inst, r.Pid, cpStatsLine(r.Stats))
		for _, ln := range r.Log {
			t.Logf("process %d log: %s", r.Inst, ln)
		}
		total.Loads += r.Stats.Loads
		total.Waits += r.Stats.Waits
		total.Notified += r.Stats.Notified
		total.Polled += r.Stats.Polled
		total.Takeovers += r.Stats.Takeovers
		total.Fenced += r.Stats.Fenced
		total.LocalLoads += r.Stats.LocalLoads
	}
	t.Logf("%s: %d processes × %d goroutines, %d waves in %v; loads per wave %v; max Get latency %v",
		mode, procs, g, waves, elapsed.Round(time.Millisecond), loadsPerWave, maxLat.Round(time.Millisecond))
	t.Logf("%s: total follows=%d notified=%d polled=%d takeovers=%d fenced=%d localLoads=%d",
		mode, total.Waits, total.Notified, total.Polled, total.Takeovers, total.Fenced, total.LocalLoads)
	if total.Loads != waves || total.LocalLoads != 0 || total.Fenced != 0 {
		t.Errorf("stats: %d loads under a lease (want %d), %d local loads, %d fenced commits (want 0)",
			total.Loads, waves, total.LocalLoads, total.Fenced)
	}
	if total.Waits == 0 || total.Notified == 0 {
		t.Errorf("no process followed another's rebuild or none was woken by a message: follows=%d notified=%d",
			total.Waits, total.Notified)
	}
}

// cacheWavesWorker is one process of TestCacheWavesAcrossProcesses.
func cacheWavesWorker(ctx context.Context, _ string) error {
	w, err := cpNewWorker()
	if err != nil {
		return err
	}
	defer w.rdb.Close()
	// A fixed 3s lease, far above the 50ms rebuild and renewed by the
	// watchdog: a second load would need a process stalled for over a
	// second (this runs on loaded 2-core machines), not a slow loader.
	const lease = 3 * time.Second
	clog := &cpLog{}
	c := New(w.rdb, &Options{
		MinLease: lease, MaxLease: lease, DefaultLease: lease,
		Logger: slog.New(slog.NewTextHandler(clog, nil)),
	})
	defer c.Close()

	rep := &cpReport{Inst: w.inst, Pid: w.pid, Waves: make([]cpWaveReport, w.waves)}
	for wave := range w.waves {
		name := "w" + strconv.Itoa(wave)
		key := w.key("user", name) // a fresh, cold user key per wave
		load := func(ctx context.Context) ([]byte, error) {
			if err := w.rdb.Incr(ctx, w.key(name, "loads")).Err(); err != nil {
				return nil, err
			}
			if err := w.waitEntered(ctx, name); err != nil {
				return nil, err
			}
			if err := w.waitFollowers(ctx, name, key); err != nil {
				return nil, err
			}
			time.Sleep(50 * time.Millisecond)
			return []byte(fmt.Sprintf("wave-%d-pid-%d", wave, w.pid)), nil
		}
		var lat maxDuration
		before := c.Stats()
		err := w.runWave(ctx, name, func(i int) {
			if err := w.enter(ctx, name, i); err != nil {
				w.fail("wave %d: %v", wave, err)
				return
			}
			gctx, cancel := context.WithTimeout(ctx, cpGetTimeout)
			defer cancel()
			t0 := time.Now()
			v, err := c.Get(gctx, key, cpValueTTL, load)
			lat.observe(time.Since(t0))
			if err != nil {
				w.fail("wave %d goroutine %d: Get: %v", wave, i, err)
				w.rdb.RPush(ctx, w.key("errors"), fmt.Sprintf("process %d wave %d: %v", w.inst, wave, err))
				return
			}
			if err := w.rdb.SAdd(ctx, w.key(name, "values"), v).Err(); err != nil {
				w.fail("wave %d: %v", wave, err)
			}
			if err := w.rdb.Incr(ctx, w.key(name, "served")).Err(); err != nil {
				w.fail("wave %d: %v", wave, err)
			}
		})
		if err != nil {
			return err
		}
		rep.Waves[wave] = cpWaveReport{MaxLatency: lat.get(), Stats: statsDelta(before, c.Stats())}
	}
	rep.Stats, rep.Log = c.Stats(), clog.get()
	if err := w.report(ctx, rep); err != nil {
		return err
	}
	return w.err()
}

// ---------------------------------------------------------------------------
// 2. A failing loader: one call per wave, every caller gets the error at once.

// TestCacheLoaderErrorAcrossProcesses: 4 processes × 20 goroutines, 5
// waves, a loader that fails after 50ms. The lease is fixed at 2s and the
// wait budget is 10s, so a follower that waited for the lease to run out
// would take ≥ 2s. Per wave: one loader call in the whole cluster, every
// caller of every process gets an error wrapping ErrLoadFailed, and the
// slowest caller returns in under 1s: the failure message wakes the
// followers (Guarantee 4), they do not wait out the lease.
func TestCacheLoaderErrorAcrossProcesses(t *testing.T) {
	t.Parallel()
	const procs, g, waves = 4, 20, 5
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	prefix := cpNewPrefix()
	start := time.Now()
	p := startWorkers(t, procs, "cacheerrors", cpEnvFor("redis", []string{srv.Addr()}, prefix, "", procs, g, waves)...)
	p.wait(60 * time.Second)
	elapsed := time.Since(start)
	if t.Failed() {
		t.FailNow()
	}

	if bad, _ := rdb.LRange(ctx, cpKey(prefix, "bad"), 0, 9).Result(); len(bad) > 0 {
		t.Errorf("callers did not get ErrLoadFailed, first ones:\n%s", strings.Join(bad, "\n"))
	}
	reps := cpReports(t, rdb, prefix, procs)
	loadsPerWave := make([]int, waves)
	maxLatPerWave := make([]time.Duration, waves)
	for w := range waves {
		name := "w" + strconv.Itoa(w)
		loads, _ := rdb.Get(ctx, cpKey(prefix, name, "loads")).Int()
		failed, _ := rdb.Get(ctx, cpKey(prefix, name, "failed")).Int()
		if subs, _ := rdb.Get(ctx, cpKey(prefix, name, "subscribers")).Int(); subs != procs-1 {
			t.Errorf("wave %d: %d processes subscribed to the key's channel before the failure, want %d", w, subs, procs-1)
		}
		loadsPerWave[w] = loads
		if loads != 1 {
			t.Errorf("wave %d: %d loads, want exactly 1", w, loads)
		}
		if failed != procs*g {
			t.Errorf("wave %d: %d callers got ErrLoadFailed, want %d", w, failed, procs*g)
		}
		for _, r := range reps {
			maxLatPerWave[w] = max(maxLatPerWave[w], r.Waves[w].MaxLatency)
		}
		if maxLatPerWave[w] >= time.Second {
			t.Errorf("wave %d: the slowest caller took %v; with a 2s lease that means a follower waited for the lease instead of the failure message", w, maxLatPerWave[w])
		}
	}
	for _, r := range reps {
		t.Logf("process %d (pid %d): %s", r.Inst, r.Pid, cpStatsLine(r.Stats))
	}
	if sample, err := rdb.Get(ctx, cpKey(prefix, "sample")).Result(); err == nil {
		t.Logf("a follower's error: %s", sample)
	}
	t.Logf("%d processes × %d goroutines, %d waves in %v; loads per wave %v; max Get latency per wave %v",
		procs, g, waves, elapsed.Round(time.Millisecond), loadsPerWave, roundAll(maxLatPerWave))
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// cacheErrorsWorker is one process of TestCacheLoaderErrorAcrossProcesses.
func cacheErrorsWorker(ctx context.Context, _ string) error {
	w, err := cpNewWorker()
	if err != nil {
		return err
	}
	defer w.rdb.Close()
	const lease = 2 * time.Second
	c := New(w.rdb, &Options{MinLease: lease, MaxLease: lease, DefaultLease: lease, WaitTimeout: 10 * time.Second})
	defer c.Close()

	rep := &cpReport{Inst: w.inst, Pid: w.pid, Waves: make([]cpWaveReport, w.waves)}
	for wave := range w.waves {
		name := "w" + strconv.Itoa(wave)
		key := w.key("user", name)
		load := func(ctx context.Context) ([]byte, error) {
			if err := w.rdb.Incr(ctx, w.key(name, "loads")).Err(); err != nil {
				return nil, err
			}
			if err := w.waitEntered(ctx, name); err != nil {
				return nil, err
			}
			// Every other process follows before the failure is
			// announced, so none can start a second rebuild after it.
			if err := w.waitFollowers(ctx, name, key); err != nil {
				return nil, err
			}
			time.Sleep(50 * time.Millisecond)
			return nil, fmt.Errorf("source down (wave %d, pid %d)", wave, w.pid)
		}
		var lat maxDuration
		err := w.runWave(ctx, name, func(i int) {
			if err := w.enter(ctx, name, i); err != nil {
				w.fail("wave %d: %v", wave, err)
				return
			}
			gctx, cancel := context.WithTimeout(ctx, cpGetTimeout)
			defer cancel()
			t0 := time.Now()
			v, err := c.Get(gctx, key, cpValueTTL, load)
			lat.observe(time.Since(t0))
			if !errors.Is(err, ErrLoadFailed) {
				w.fail("wave %d goroutine %d: Get = %q, %v; want ErrLoadFailed", wave, i, v, err)
				w.rdb.RPush(ctx, w.key("bad"), fmt.Sprintf("process %d wave %d: %q, %v", w.inst, wave, v, err))
				return
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("source down (wave %d,", wave)) {
				w.fail("wave %d goroutine %d: the error does not carry the loader's text: %v", wave, i, err)
			}
			if le := (*LoadError)(nil); errors.As(err, &le) && le.Remote {
				w.rdb.SetNX(ctx, w.key("sample"), err.Error(), 0)
			}
			if err := w.rdb.Incr(ctx, w.key(name, "failed")).Err(); err != nil {
				w.fail("wave %d: %v", wave, err)
			}
		})
		if err != nil {
			return err
		}
		rep.Waves[wave].MaxLatency = lat.get()
	}
	rep.Stats = c.Stats()
	if err := w.report(ctx, rep); err != nil {
		return err
	}
	return w.err()
}

// ---------------------------------------------------------------------------
// 3. A leader stalls past its lease: takeover, and the stale commit is fenced.

// TestCacheLeaderStall: 2 worker processes and the parent, lease fixed at
// 400ms, load timeout, MaxHold and wait budget 10s. The first loader call
// (whichever process wins the lease) blocks until the parent allows it to
// return; the parent SIGSTOPs that process (a GC pause, a stalled VM) for
// at least 3 leases. Meanwhile the other process's callers must be served:
// their flight takes over when the stalled leader's lease lapses, loads
// again and commits. After SIGCONT the stalled leader's loader returns and
// its commit must be fenced (Stats.Fenced == 1 in that process); its own
// callers get its value or (those that joined after its load began) the
// newer one, and the cache keeps the second loader's.
func TestCacheLeaderStall(t *testing.T) {
	t.Parallel()
	const procs, g = 2, 10
	const lease = 400 * time.Millisecond
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	prefix := cpNewPrefix()
	p := startWorkers(t, procs, "cachestall", cpEnvFor("redis", []string{srv.Addr()}, prefix, "", procs, g, 1)...)
	stoppedPid := 0
	t.Cleanup(func() { // runs before startWorkers' cleanup kills the workers
		if stoppedPid != 0 {
			_ = syscall.Kill(stoppedPid, syscall.SIGCONT)
		}
	})

	var first string
	waitFor(t, 30*time.Second, "the first loader to start", func() bool {
		first, _ = rdb.Get(ctx, cpKey(prefix, "loader", "1")).Result()
		return first != ""
	})
	pid, err := strconv.Atoi(first)
	if err != nil {
		t.Fatalf("pid of the first loader: %v", err)
	}
	stalled := slices.Index(p.pids(), pid)
	if stalled < 0 {
		t.Fatalf("the first loader ran in pid %d, which is none of the workers %v", pid, p.pids())
	}
	other := 1 - stalled
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %d: %v", pid, err)
	}
	stoppedPid = pid
	stoppedAt := time.Now()
	cpWaitStopped(t, pid)

	// While the leader is frozen, the other process takes over after the
	// lease lapses and serves its callers.
	servedKey := func(i int) string { return cpKey(prefix, "served", strconv.Itoa(i)) }
	waitFor(t, 10*time.Second, "the other process's callers to be served while the leader is stopped", func() bool {
		n, _ := rdb.Get(ctx, servedKey(other)).Int()
		return n == g
	})
	servedAfter := time.Since(stoppedAt)
	if d := 3*lease - time.Since(stoppedAt); d > 0 {
		time.Sleep(d) // keep the stall at least 3 leases long
	}
	if n, _ := rdb.Get(ctx, cpKey(prefix, "loads")).Int(); n != 2 {
		t.Errorf("%d loads while the leader was stopped, want 2 (the stalled one and the takeover)", n)
	}
	second, _ := rdb.Get(ctx, cpKey(prefix, "loader", "2")).Result()
	if second != strconv.Itoa(p.pids()[other]) {
		t.Errorf("the second loader ran in pid %q, want the other worker %d", second, p.pids()[other])
	}
	if n, _ := rdb.Get(ctx, servedKey(stalled)).Int(); n != 0 {
		t.Errorf("%d callers of the stopped process were served while it was stopped", n)
	}
	stallFor := time.Since(stoppedAt)

	if err := rdb.Set(ctx, cpKey(prefix, "release"), "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT %d: %v", pid, err)
	}
	stoppedPid = 0
	p.wait(30 * time.Second)
	if t.Failed() {
		t.FailNow()
	}

	reps := cpReports(t, rdb, prefix, procs)
	for _, r := range reps {
		role := "taking over"
		if r.Inst == stalled {
			role = "stalled"
		}
		t.Logf("process %d (pid %d, %s): %s", r.Inst, r.Pid, role, cpStatsLine(r.Stats))
	}
	st, ot := reps[stalled].Stats, reps[other].Stats
	if st.Fenced != 1 || st.Loads != 1 || st.Takeovers != 0 {
		t.Errorf("stalled process: fenced=%d loads=%d takeovers=%d, want 1, 1, 0", st.Fenced, st.Loads, st.Takeovers)
	}
	if ot.Loads != 1 || ot.Fenced != 0 {
		t.Errorf("taking-over process: loads=%d fenced=%d, want 1, 0", ot.Loads, ot.Fenced)
	}
	// It normally followed the stalled leader and took over when the lease
	// lapsed. (Only if it was descheduled for a whole lease before its
	// first try could it have found the lease free and led at once.)
	if ot.Waits == 1 && ot.Takeovers != 1 {
		t.Errorf("taking-over process followed but did not take over: %s", cpStatsLine(ot))
	}
	firstVal := fmt.Sprintf("load-1-pid-%d", p.pids()[stalled])
	secondVal := fmt.Sprintf("load-2-pid-%d", p.pids()[other])
	// The stalled leader's callers that joined before its load began get
	// its value (fenced, not stored); those that joined later take the
	// next lookup (read-your-writes: the fenced value may predate a write
	// they saw) and get the newer stored value.
	for i, want := range map[int][]string{stalled: {firstVal, secondVal}, other: {secondVal}} {
		vals, _ := rdb.SMembers(ctx, cpKey(prefix, "values", strconv.Itoa(i))).Result()
		served, _ := rdb.Get(ctx, servedKey(i)).Int()
		ok := served == g && len(vals) > 0
		for _, v := range vals {
			ok = ok && slices.Contains(want, v)
		}
		if !ok {
			t.Errorf("process %d: %d callers served with values %q, want %d with values among %q", i, served, vals, g, want)
		}
	}
	if n, _ := rdb.Get(ctx, cpKey(prefix, "loads")).Int(); n != 2 {
		t.Errorf("%d loads in all, want 2", n)
	}

	// What the cache holds now: the taking-over loader's value, not the
	// stalled leader's.
	c := New(rdb, nil)
	defer c.Close()
	var called atomic.Bool
	got, err := c.Get(ctx, cpKey(prefix, "user", "stall"), cpValueTTL, func(context.Context) ([]byte, error) {
		called.Store(true)
		return []byte("loaded by the parent"), nil
	})
	if err != nil || string(got) != secondVal {
		t.Errorf("value in the cache after the stall: %q, %v; want %q", got, err, secondVal)
	}
	if called.Load() {
		t.Errorf("the parent's loader was called: no value was in the cache")
	}
	t.Logf("leader pid %d stopped for %v; the other process's %d callers were served %v after the stop; fenced commit of %q, cache holds %q",
		pid, stallFor.Round(time.Millisecond), g, servedAfter.Round(time.Millisecond), firstVal, got)
}

// cpWaitStopped waits until the kernel reports pid stopped (Linux; a no-op
// where /proc is missing).
func cpWaitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		// The state follows the parenthesised command name.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d not stopped 5s after SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// cacheStallWorker is one process of TestCacheLeaderStall.
func cacheStallWorker(ctx context.Context, _ string) error {
	w, err := cpNewWorker()
	if err != nil {
		return err
	}
	defer w.rdb.Close()
	const lease = 400 * time.Millisecond
	c := New(w.rdb, &Options{
		MinLease: lease, MaxLease: lease, DefaultLease: lease,
		LoadTimeout: 10 * time.Second, MaxHold: 10 * time.Second, WaitTimeout: 10 * time.Second,
	})
	defer c.Close()
	inst := strconv.Itoa(w.inst)
	if err := w.rdb.Set(ctx, w.key("pid", inst), w.pid, 0).Err(); err != nil {
		return err
	}

	load := func(ctx context.Context) ([]byte, error) {
		n, err := w.rdb.Incr(ctx, w.key("loads")).Result()
		if err != nil {
			return nil, err
		}
		if err := w.rdb.Set(ctx, w.key("loader", strconv.FormatInt(n, 10)), w.pid, 0).Err(); err != nil {
			return nil, err
		}
		if n == 1 {
			// The parent stops this process now; the loader returns once
			// the parent has let it go (and continued the process).
			deadline := time.Now().Add(8 * time.Second)
			for w.rdb.Exists(ctx, w.key("release")).Val() == 0 {
				if time.Now().After(deadline) {
					return nil, errors.New("the parent never released the first loader")
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		return []byte(fmt.Sprintf("load-%d-pid-%d", n, w.pid)), nil
	}
	err = w.runWave(ctx, "stall", func(i int) {
		gctx, cancel := context.WithTimeout(ctx, cpGetTimeout)
		defer cancel()
		v, err := c.Get(gctx, w.key("user", "stall"), cpValueTTL, load)
		if err != nil {
			w.fail("goroutine %d: Get: %v", i, err)
			return
		}
		if err := w.rdb.SAdd(ctx, w.key("values", inst), v).Err(); err != nil {
			w.fail("%v", err)
		}
		if err := w.rdb.Incr(ctx, w.key("served", inst)).Err(); err != nil {
			w.fail("%v", err)
		}
	})
	if err != nil {
		return err
	}
	if err := w.report(ctx, &cpReport{Inst: w.inst, Pid: w.pid, Stats: c.Stats()}); err != nil {
		return err
	}
	return w.err()
}

// ---------------------------------------------------------------------------
// 4. Redis dies during a wave: fail open; after it returns, one load again.

// TestCacheRedisKilledDuringWave: 3 processes × 20 goroutines on one
// redis-server; the Caches' clients have short timeouts (dial 200ms,
// read/write 500ms, one retry, one dial attempt). Wave 1: while the
// leader's loader runs, the parent kills Redis (SIGKILL). Every caller
// must still get a value (fail-open: the leader's callers get its
// uncommitted value, the followers load locally when their 2s wait budget
// runs out), with at most one load per process, and every process's
// circuit breaker (threshold 1, cooldown 100ms) opens. Then the parent
// restarts Redis (same port, empty) and the same processes, with the same
// Cache objects, run 3 more waves on fresh keys: each has exactly one load
// again (the circuit breaker probes and closes). Redis cannot count while
// it is dead, so each worker counts its own loads and writes its results
// to a file.
func TestCacheRedisKilledDuringWave(t *testing.T) {
	t.Parallel()
	const procs, g, waves = 3, 20, 4
	srv := redistest.Start(t)
	// The barriers and entry sets live on a second server that is never
	// killed: a bookkeeping command whose reply the kill cut off would
	// fail the wave for a reason that has nothing to do with herd.
	book := redistest.Start(t)
	rdb := book.Client(t)
	ctx := context.Background()
	prefix := cpNewPrefix()
	dir := t.TempDir()
	start := time.Now()
	env := append(cpEnvFor("redis", []string{srv.Addr()}, prefix, dir, procs, g, waves), cpEnvBook+"="+book.Addr())
	p := startWorkers(t, procs, "cachekill", env...)

	// Kill Redis once every caller has entered wave 1 and the leader's
	// loader runs (it holds until the kill).
	waitFor(t, 30*time.Second, "every caller to enter wave 1 and the leader to load", func() bool {
		n, _ := rdb.SCard(ctx, cpKey(prefix, "w0", "entered")).Result()
		files, _ := filepath.Glob(filepath.Join(dir, "loading-*"))
		return n == int64(procs*g) && len(files) > 0
	})
	srv.Kill(t)
	killedAt := time.Now()
	if err := os.WriteFile(filepath.Join(dir, "killed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "every worker to finish wave 1", func() bool {
		files, _ := filepath.Glob(filepath.Join(dir, "wave1-*.json"))
		return len(files) == procs
	})
	wave1Done := time.Since(killedAt)
	srv.Restart(t)
	p.wait(60 * time.Second)
	elapsed := time.Since(start)
	if t.Failed() {
		t.FailNow()
	}

	readReports := func(pattern string) []cpReport {
		reps := make([]cpReport, procs)
		for i := range procs {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf(pattern, i)))
			if err != nil {
				t.Fatalf("result of worker %d: %v", i, err)
			}
			if err := json.Unmarshal(b, &reps[i]); err != nil {
				t.Fatalf("result of worker %d: %v", i, err)
			}
		}
		return reps
	}
	reps := readReports("result-%d.json")
	for _, r := range readReports("wave1-%d.json") {
		t.Logf("process %d after wave 1: %s", r.Inst, cpStatsLine(r.Stats))
		if r.Stats.BreakerOpens == 0 {
			t.Errorf("process %d: the circuit breaker (threshold 1) did not open in wave 1", r.Inst)
		}
	}
	for w := range waves {
		var loads, served int64
		var maxLat time.Duration
		var errs []string
		values := map[string]bool{}
		var perProc []int64
		var latPerProc []time.Duration
		for _, r := range reps {
			wr := r.Waves[w]
			loads += wr.Loads
			served += wr.Served
			maxLat = max(maxLat, wr.MaxLatency)
			errs = append(errs, wr.Errors...)
			for _, v := range wr.Values {
				values[v] = true
			}
			perProc = append(perProc, wr.Loads)
			latPerProc = append(latPerProc, wr.MaxLatency)
		}
		if len(errs) > 0 {
			t.Errorf("wave %d: %d callers got errors, first: %s", w+1, len(errs), errs[0])
		}
		if served != procs*g {
			t.Errorf("wave %d: %d callers served, want %d", w+1, served, procs*g)
		}
		if w == 0 {
			if loads < 1 || loads > procs {
				t.Errorf("wave 1 (Redis killed): %d loads, want 1 to %d (at most one per process)", loads, procs)
			}
			if len(values) > procs {
				t.Errorf("wave 1 (Redis killed): %d distinct values, want at most %d", len(values), procs)
			}
			for _, r := range reps {
				if r.Waves[0].Loads > 1 {
					t.Errorf("wave 1: process %d loaded %d times, want at most once", r.Inst, r.Waves[0].Loads)
				}
			}
		} else {
			if loads != 1 {
				t.Errorf("wave %d (after the restart): %d loads (per process %v), want exactly 1", w+1, loads, perProc)
			}
			if len(values) != 1 {
				t.Errorf("wave %d (after the restart): %d distinct values %v, want 1", w+1, len(values), values)
			}
		}
		t.Logf("wave %d: %d loads (per process %v), %d callers served, %d distinct values, max Get latency %v (per process %v)",
			w+1, loads, perProc, served, len(values), maxLat.Round(time.Millisecond), roundAll(latPerProc))
	}
	for _, r := range reps {
		t.Logf("process %d (pid %d): %s", r.Inst, r.Pid, cpStatsLine(r.Stats))
		for _, ln := range r.Log {
			t.Logf("process %d log: %s", r.Inst, ln)
		}
	}
	t.Logf("Redis killed during wave 1; all workers done with it %v later; total %v", wave1Done.Round(time.Millisecond), elapsed.Round(time.Millisecond))
}

// cacheKillWorker is one process of TestCacheRedisKilledDuringWave.
func cacheKillWorker(ctx context.Context, _ string) error {
	w, err := cpNewWorker()
	if err != nil {
		return err
	}
	defer w.rdb.Close()
	// The Cache's own client has short timeouts, as the package doc asks.
	// (Bookkeeping goes through w.rdb, a client of a second redis-server
	// that the parent never kills, so the kill cannot fail the barriers.)
	rdb, err := w.newClient(func(o *redis.Options) {
		o.DialTimeout = 200 * time.Millisecond
		o.ReadTimeout = 500 * time.Millisecond
		o.WriteTimeout = 500 * time.Millisecond
		o.MaxRetries = 1 // one retry (0 would mean go-redis's default of 3)
		// One dial attempt per connection: go-redis's default of 5 attempts
		// 100ms apart makes every command on a dead Redis take 0.4s on top
		// of DialTimeout, whatever the timeouts above say.
		o.DialerRetries = 1
	})
	if err != nil {
		return err
	}
	defer rdb.Close()
	const lease = 2 * time.Second
	clog := &cpLog{}
	c := New(rdb, &Options{
		MinLease: lease, MaxLease: lease, DefaultLease: lease,
		// In wave 1 the followers wait this long, then load locally.
		WaitTimeout: 2 * time.Second,
		// The first Redis error opens the breaker (every process meets one
		// in wave 1: a failed commit or a failed poll), so waves 2-4 also
		// show that it probes and closes by itself.
		BreakerThreshold: 1,
		BreakerCooldown:  100 * time.Millisecond,
		Logger:           slog.New(slog.NewTextHandler(clog, nil)),
	})
	defer c.Close()

	rep := &cpReport{Inst: w.inst, Pid: w.pid, Waves: make([]cpWaveReport, w.waves)}
	writeJSON := func(name string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		tmp := filepath.Join(w.dir, name+".tmp")
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, filepath.Join(w.dir, name))
	}
	killed := filepath.Join(w.dir, "killed")

	for wave := range w.waves {
		name := "w" + strconv.Itoa(wave)
		key := w.key("user", name)
		var loads atomic.Int64
		load := func(ctx context.Context) ([]byte, error) {
			n := loads.Add(1)
			t0 := time.Now()
			if wave == 0 {
				// Tell the parent a loader runs, and hold until Redis is dead.
				f := filepath.Join(w.dir, fmt.Sprintf("loading-%d-%d", w.inst, n))
				if err := os.WriteFile(f, nil, 0o644); err != nil {
					return nil, err
				}
				deadline := time.Now().Add(cpBarrierTimeout)
				for {
					if _, err := os.Stat(killed); err == nil {
						break
					}
					if time.Now().After(deadline) {
						return nil, errors.New("the parent never killed Redis")
					}
					time.Sleep(2 * time.Millisecond)
				}
				time.Sleep(300*time.Millisecond - time.Since(t0))
			} else {
				time.Sleep(100 * time.Millisecond)
			}
			return []byte(fmt.Sprintf("wave-%d-pid-%d-load-%d", wave+1, w.pid, n)), nil
		}
		var (
			mu     sync.Mutex
			served int64
			errs   []string
			values = map[string]bool{}
			lat    maxDuration
		)
		err := w.runWave(ctx, name, func(i int) {
			if wave == 0 {
				if err := w.enter(ctx, name, i); err != nil {
					w.fail("wave 1: %v", err)
					return
				}
			}
			gctx, cancel := context.WithTimeout(ctx, cpGetTimeout)
			defer cancel()
			t0 := time.Now()
			v, err := c.Get(gctx, key, cpValueTTL, load)
			lat.observe(time.Since(t0))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Sprintf("process %d wave %d goroutine %d: %v", w.inst, wave+1, i, err))
				return
			}
			served++
			values[string(v)] = true
		})
		if err != nil {
			return err
		}
		wr := &rep.Waves[wave]
		wr.Loads, wr.Served, wr.Errors, wr.MaxLatency = loads.Load(), served, errs, lat.get()
		for v := range values {
			wr.Values = append(wr.Values, v)
		}
		if len(errs) > 0 {
			w.fail("wave %d: %d Get errors, first: %s", wave+1, len(errs), errs[0])
		}
		if wave == 0 {
			// Wave 1 is over; the parent restarts Redis once every worker
			// got here. Wait (bounded) until it answers again.
			snap := *rep
			snap.Stats, snap.Log = c.Stats(), clog.get()
			if err := writeJSON(fmt.Sprintf("wave1-%d.json", w.inst), &snap); err != nil {
				return err
			}
			deadline := time.Now().Add(cpBarrierTimeout)
			for rdb.Ping(ctx).Err() != nil || w.rdb.Ping(ctx).Err() != nil {
				if time.Now().After(deadline) {
					return fmt.Errorf("redis not back within %v of wave 1", cpBarrierTimeout)
				}
				time.Sleep(20 * time.Millisecond)
			}
			// Redis answers, but this process's breaker may still be open
			// from a failure late in wave 1 (a commit that met the kill),
			// and it closes only when a call probes Redis: wave 2 must not
			// start before, or its callers would load locally (a second
			// load of the wave, for a reason the test did not set up).
			// Probe with a key of this process's own until a Get goes
			// through Redis.
			probe := w.key("probe", strconv.Itoa(w.inst))
			for {
				var o Outcome
				_, err := c.Get(WithOutcome(ctx, &o), probe, cpValueTTL, func(context.Context) ([]byte, error) { return []byte("probe"), nil })
				if err == nil && o != OutcomeFallback {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("the Cache did not reach Redis within %v of wave 1 (last: %v, %v)", cpBarrierTimeout, o, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	rep.Stats, rep.Log = c.Stats(), clog.get()
	if err := writeJSON(fmt.Sprintf("result-%d.json", w.inst), rep); err != nil {
		return err
	}
	return w.err()
}
