package herd

// The soak: a mixed workload across several worker processes (re-runs of
// the test binary) on one redis-server behind the fault proxy, which the
// parent drives through periodic faults, then a history check.
//
// Short mode (the default, in CI): 2 processes × 6 goroutines for 7s.
// Full mode (HERD_SOAK=1): 4 processes × 12 goroutines for 60s.
//
// Workload: 200 keys drawn by a Zipf law; Gets with a TTL of 2s (the
// loader reads the key's version from the source, sleeps 0-15ms, and
// fails 3% and panics 1% of the time); the process that owns a key (key
// mod processes) also writes it: 4% of its operations are a Set or an
// Invalidate, each after an INCR of the key's version in the source. The
// source is a version counter per key in Redis, on a client that bypasses
// the proxy. Writes of a key are serialised (one owner process, a mutex
// per key), so versions grow with completion time.
//
// Faults, every 0.5-1s until 2s before the end (a quiet period to
// recover): latency bursts (60ms on replies or requests for 400ms, below
// the 300ms client timeouts so that no request outlives its caller), all
// connections cut, a 400ms blackhole, and one-shot faults on the next
// ACQUIRE, COMMIT, RELEASE, Set or Invalidate (reply dropped, or the
// request cut before the server sees it).
//
// Every operation is recorded (kind, key, start, end, version, outcome,
// error class, load id) in a history file per process. The parent checks:
//
//  1. Errors only of documented kinds: Get errors wrap ErrLoadFailed or
//     ErrWaitTimeout; Set and Invalidate errors are herd's wrapped Redis
//     errors.
//  2. Every Get returns within its bound (wait budget + load timeout +
//     six Redis calls at the client timeouts and retries + 1s).
//  3. Read your writes: after a Set or Invalidate of version v completes,
//     no Get of that key, in any process, that starts later returns a
//     version below v. There is no exemption for a Get that joined a
//     flight begun before the write: such a caller takes the next flight.
//  4. One rebuild at a time: no two leased loads of a key overlap in time
//     (a leased load is one whose value a caller got with OutcomeLeader).
//  5. Loads per key per TTL window: leased loads of key k that start in
//     window w (of length TTL) are at most 1 + I(k,w) + F(k,w), where I
//     counts the Invalidates attempted and F the failed loads in w; the
//     sum of the excess over all keys and windows is at most the fenced
//     commits plus the commit errors of all processes (each is a rebuild
//     whose value was not stored).
//  6. No goroutine growth in any worker once its Cache and client are
//     closed, and the workers' Caches serve hits again after the faults.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/faultproxy"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Environment of a soak worker.
const (
	soakEnvProxy  = "HERD_SOAK_PROXY"  // the Cache's Redis address (the proxy)
	soakEnvDirect = "HERD_SOAK_DIRECT" // the source's and the barrier's Redis address
	soakEnvPrefix = "HERD_SOAK_PREFIX" // bookkeeping prefix
	soakEnvDir    = "HERD_SOAK_DIR"    // history files
	soakEnvProcs  = "HERD_SOAK_PROCS"
	soakEnvG      = "HERD_SOAK_G"
	soakEnvDur    = "HERD_SOAK_DUR"
)

// The soak's configuration, shared by the parent and the workers.
const (
	soakKeys     = 200
	soakTTL      = 2 * time.Second
	soakLease    = time.Second
	soakWait     = 2 * time.Second
	soakLoadTO   = time.Second
	soakQuiet    = 2 * time.Second
	soakGetLimit = 30 * time.Second // each Get's own context: far above its bound
)

// soakTimeouts are the workers' Cache client timeouts.
var soakTimeouts = timeouts{dial: 300 * time.Millisecond, read: 300 * time.Millisecond, write: 300 * time.Millisecond, retries: 1}

func init() {
	workerRoles["soak"] = soakWorker
}

// soakReport is what a worker reports at the end.
type soakReport struct {
	Inst            int
	Pid             int
	Stats           Stats
	Ops             int
	GoroutinesStart int
	GoroutinesEnd   int
	Recovered       []string // per checked key: the outcome of a Get after the faults
}

func TestSoak(t *testing.T) {
	t.Parallel()
	procs, g, dur := 2, 6, 7*time.Second
	full := os.Getenv("HERD_SOAK") == "1"
	if full {
		procs, g, dur = 4, 12, 60*time.Second
	}
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	for _, s := range []*script{acquireScript, extendScript, releaseScript, commitScript, setScript, invalidateScript} {
		if err := s.rs.Load(ctx, admin).Err(); err != nil {
			t.Fatal(err)
		}
	}
	proxy, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	dir := t.TempDir()
	prefix := "soak-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	p := startWorkers(t, procs, "soak",
		soakEnvProxy+"="+proxy.Addr(), soakEnvDirect+"="+srv.Addr(), soakEnvPrefix+"="+prefix, soakEnvDir+"="+dir,
		soakEnvProcs+"="+strconv.Itoa(procs), soakEnvG+"="+strconv.Itoa(g), soakEnvDur+"="+dur.String())
	waitFor(t, 60*time.Second, "the soak workers to be ready", func() bool {
		n, _ := admin.SCard(ctx, prefix+":ready").Result()
		return n == int64(procs)
	})
	t0 := time.Now()
	if err := admin.Set(ctx, prefix+":go", t0.UnixNano(), 0).Err(); err != nil {
		t.Fatal(err)
	}
	faults := soakFaults(proxy, t0.Add(dur-soakQuiet))
	p.wait(dur + 90*time.Second)
	elapsed := time.Since(t0)
	fl := <-faults
	if t.Failed() {
		t.FailNow()
	}

	var total Stats
	for i := range procs {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("report-%d.json", i)))
		if err != nil {
			t.Fatalf("report of worker %d: %v", i, err)
		}
		var r soakReport
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		total = sumStatsOf(total, r.Stats)
		if r.GoroutinesEnd > r.GoroutinesStart {
			t.Errorf("worker %d: %d goroutines after closing its Cache, %d before it", i, r.GoroutinesEnd, r.GoroutinesStart)
		}
		for _, o := range r.Recovered {
			if o != OutcomeHit.String() {
				t.Errorf("worker %d: after the faults a stored key was served as %q, want a hit: %v", i, o, r.Recovered)
				break
			}
		}
	}
	h, err := readSoakHistory(dir, procs)
	if err != nil {
		t.Fatal(err)
	}
	sum := checkSoak(t, h, total, t0)
	t.Logf("soak (%s): %d processes × %d goroutines for %v (ran %v); %d faults: %s",
		map[bool]string{true: "full", false: "short"}[full], procs, g, dur, elapsed.Round(time.Millisecond), len(fl), soakFaultSummary(fl))
	t.Logf("%s", sum)
	t.Logf("stats: %s", cpStatsLine(total))
}

// soakFault is one fault the parent injected.
type soakFault struct {
	At    time.Duration
	Kind  string
	Fired bool
}

func soakFaultSummary(fl []soakFault) string {
	count := map[string]int{}
	fired := map[string]int{}
	var kinds []string
	for _, f := range fl {
		if count[f.Kind] == 0 {
			kinds = append(kinds, f.Kind)
		}
		count[f.Kind]++
		if f.Fired {
			fired[f.Kind]++
		}
	}
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s ×%d (%d fired)", k, count[k], fired[k])
	}
	return strings.Join(parts, ", ")
}

// soakFaults injects faults until end, in its own goroutine, and sends the
// list of what it did when done.
func soakFaults(p *faultproxy.Proxy, end time.Time) <-chan []soakFault {
	out := make(chan []soakFault, 1)
	start := time.Now()
	go func() {
		var fl []soakFault
		rng := rand.New(rand.NewSource(time.Now().UnixNano()))
		shaOf := map[string][]byte{
			"acquire": []byte(acquireScript.rs.Hash()), "commit": []byte(commitScript.rs.Hash()),
			"release": []byte(releaseScript.rs.Hash()), "set": []byte(setScript.rs.Hash()),
			"invalidate": []byte(invalidateScript.rs.Hash()),
		}
		oneShot := func(kind string, arm func() *faultproxy.Fault) {
			f := arm()
			timer := time.NewTimer(400 * time.Millisecond)
			defer timer.Stop()
			fired := false
			select {
			case <-f.Fired():
				fired = true
			case <-timer.C:
				if !f.Disarm() {
					<-f.Fired() // matched just now; it resets its connection at once
					fired = true
				}
			}
			fl = append(fl, soakFault{At: time.Since(start), Kind: kind, Fired: fired})
		}
		for i := 0; time.Now().Before(end); i++ {
			time.Sleep(time.Duration(500+rng.Intn(500)) * time.Millisecond)
			if !time.Now().Before(end) {
				break
			}
			switch i % 9 {
			case 0:
				p.SetLatency(faultproxy.Downstream, 60*time.Millisecond)
				time.Sleep(400 * time.Millisecond)
				p.SetLatency(faultproxy.Downstream, 0)
				fl = append(fl, soakFault{At: time.Since(start), Kind: "latency-replies", Fired: true})
			case 1:
				n := p.Cut()
				fl = append(fl, soakFault{At: time.Since(start), Kind: "cut-all", Fired: n > 0})
			case 2:
				oneShot("lost-reply-commit", func() *faultproxy.Fault { return p.DropReply(shaOf["commit"]) })
			case 3:
				p.SetBlackhole(true)
				time.Sleep(400 * time.Millisecond)
				p.SetBlackhole(false)
				fl = append(fl, soakFault{At: time.Since(start), Kind: "blackhole", Fired: true})
			case 4:
				oneShot("cut-acquire", func() *faultproxy.Fault { return p.CutRequest(shaOf["acquire"], 0) })
			case 5:
				p.SetLatency(faultproxy.Upstream, 60*time.Millisecond)
				time.Sleep(400 * time.Millisecond)
				p.SetLatency(faultproxy.Upstream, 0)
				fl = append(fl, soakFault{At: time.Since(start), Kind: "latency-requests", Fired: true})
			case 6:
				oneShot("lost-reply-acquire", func() *faultproxy.Fault { return p.DropReply(shaOf["acquire"]) })
			case 7:
				oneShot("lost-reply-set", func() *faultproxy.Fault { return p.DropReply(shaOf["set"]) })
			case 8:
				kind := []string{"release", "invalidate", "commit"}[rng.Intn(3)]
				oneShot("cut-"+kind, func() *faultproxy.Fault { return p.CutRequest(shaOf[kind], 0) })
			}
		}
		out <- fl
	}()
	return out
}

// ---------------------------------------------------------------------------
// The worker.

// soakValue is the value of key k at version v, made by load id.
func soakValue(k int, v int64, id string) []byte {
	return []byte("k=" + strconv.Itoa(k) + ";v=" + strconv.FormatInt(v, 10) + ";id=" + id)
}

// parseSoakValue returns the version and load id of a soak value.
func parseSoakValue(b []byte) (int64, string) {
	var v int64 = -1
	id := ""
	for part := range strings.SplitSeq(string(b), ";") {
		name, val, _ := strings.Cut(part, "=")
		switch name {
		case "v":
			v, _ = strconv.ParseInt(val, 10, 64)
		case "id":
			id = val
		}
	}
	return v, id
}

// soakErrClass classifies an error for the history.
func soakErrClass(err error) string {
	switch {
	case err == nil:
		return "-"
	case errors.Is(err, ErrLoadFailed):
		return "loadfailed"
	case errors.Is(err, ErrWaitTimeout):
		return "waittimeout"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	case errors.Is(err, ErrNotFound):
		return "notfound"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case strings.HasPrefix(err.Error(), "herd: set ") || strings.HasPrefix(err.Error(), "herd: invalidate "):
		return "redis"
	}
	return "other"
}

// soakLog appends history lines to a file.
type soakLog struct {
	mu sync.Mutex
	w  *bufio.Writer
}

// add records one operation: op k start end version outcome errclass id.
func (l *soakLog) add(op string, k int, start, end time.Time, v int64, outcome, class, id string) {
	if id == "" {
		id = "-"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, "%s %d %d %d %d %s %s %s\n", op, k, start.UnixNano(), end.UnixNano(), v, outcome, class, id)
}

func soakWorker(ctx context.Context, _ string) error {
	procs, err1 := strconv.Atoi(os.Getenv(soakEnvProcs))
	g, err2 := strconv.Atoi(os.Getenv(soakEnvG))
	inst, err3 := strconv.Atoi(os.Getenv(envInstance))
	dur, err4 := time.ParseDuration(os.Getenv(soakEnvDur))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return err
	}
	prefix, dir := os.Getenv(soakEnvPrefix), os.Getenv(soakEnvDir)
	direct := redis.NewClient(&redis.Options{Addr: os.Getenv(soakEnvDirect), PoolSize: 2*g + 10})
	defer direct.Close()
	if err := direct.Ping(ctx).Err(); err != nil {
		return err
	}
	goroutinesStart := runtime.NumGoroutine()

	copt := &redis.Options{Addr: os.Getenv(soakEnvProxy), PoolSize: 2*g + 10}
	soakTimeouts.tune(copt)
	rdb := redis.NewClient(copt)
	c := New(rdb, &Options{
		MinLease: soakLease, MaxLease: soakLease, DefaultLease: soakLease,
		WaitTimeout: soakWait, LoadTimeout: soakLoadTO,
		BreakerThreshold: 5, BreakerCooldown: 200 * time.Millisecond,
	})

	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("hist-%d.txt", inst)))
	if err != nil {
		return err
	}
	defer f.Close()
	hist := &soakLog{w: bufio.NewWriterSize(f, 1<<20)}
	src := func(k int) string { return prefix + ":src:" + strconv.Itoa(k) }

	var loadSeq atomic.Int64
	pid := os.Getpid()
	load := func(k int, rng *rand.Rand, rngMu *sync.Mutex) LoadFunc {
		return func(context.Context) ([]byte, error) {
			id := fmt.Sprintf("%d-%d", pid, loadSeq.Add(1))
			start := time.Now()
			v, err := direct.Get(context.Background(), src(k)).Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				hist.add("L", k, start, time.Now(), -1, "-", "err", id)
				return nil, err
			}
			rngMu.Lock()
			sleep := time.Duration(rng.Intn(15)) * time.Millisecond
			dice := rng.Float64()
			rngMu.Unlock()
			time.Sleep(sleep)
			switch {
			case dice < 0.03:
				hist.add("L", k, start, time.Now(), v, "-", "err", id)
				return nil, errors.New("the source failed")
			case dice < 0.04:
				hist.add("L", k, start, time.Now(), v, "-", "panic", id)
				panic("the loader panicked")
			}
			hist.add("L", k, start, time.Now(), v, "-", "ok", id)
			return soakValue(k, v, id), nil
		}
	}

	// Barrier: every worker is ready, then the parent says go.
	if err := direct.SAdd(ctx, prefix+":ready", inst).Err(); err != nil {
		return err
	}
	var t0 int64
	for deadline := time.Now().Add(cpBarrierTimeout); ; time.Sleep(2 * time.Millisecond) {
		if v, err := direct.Get(ctx, prefix+":go").Int64(); err == nil {
			t0 = v
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the parent never said go")
		}
	}
	end := time.Unix(0, t0).Add(dur)

	var writeMu [soakKeys]sync.Mutex
	var ops atomic.Int64
	var failures []error
	var failMu sync.Mutex
	var wg sync.WaitGroup
	for gi := range g {
		wg.Go(func() {
			rng := rand.New(rand.NewSource(time.Now().UnixNano() + int64(gi*7919+inst)))
			var rngMu sync.Mutex
			zipf := rand.NewZipf(rng, 1.1, 1, soakKeys-1)
			for time.Now().Before(end) {
				rngMu.Lock()
				k := int(zipf.Uint64())
				p := rng.Float64()
				set := rng.Intn(2) == 0
				pause := time.Duration(rng.Intn(4000)) * time.Microsecond
				rngMu.Unlock()
				ops.Add(1)
				if p < 0.04 && k%procs == inst {
					writeMu[k].Lock()
					start := time.Now()
					v, err := direct.Incr(ctx, src(k)).Result()
					if err != nil {
						writeMu[k].Unlock()
						failMu.Lock()
						failures = append(failures, err)
						failMu.Unlock()
						continue
					}
					op := "I"
					if set {
						op = "S"
						err = c.Set(ctx, strconv.Itoa(k), soakValue(k, v, "set"), soakTTL)
					} else {
						err = c.Invalidate(ctx, strconv.Itoa(k))
					}
					hist.add(op, k, start, time.Now(), v, "-", soakErrClass(err), "")
					writeMu[k].Unlock()
				} else {
					var o Outcome
					gctx, cancel := context.WithTimeout(WithOutcome(ctx, &o), soakGetLimit)
					start := time.Now()
					val, err := c.Get(gctx, strconv.Itoa(k), soakTTL, load(k, rng, &rngMu))
					stop := time.Now()
					cancel()
					v, id := int64(-1), ""
					if err == nil {
						v, id = parseSoakValue(val)
					}
					hist.add("G", k, start, stop, v, o.String(), soakErrClass(err), id)
				}
				time.Sleep(pause)
			}
		})
	}
	wg.Wait()

	// After the faults (the last seconds were quiet): the hottest keys are
	// stored and served as hits by this same Cache.
	rep := soakReport{Inst: inst, Pid: pid, Ops: int(ops.Load()), GoroutinesStart: goroutinesStart}
	rng := rand.New(rand.NewSource(1))
	var rngMu sync.Mutex
	for k := range 5 {
		var o Outcome
		for range 3 {
			o = OutcomeUnknown
			if _, err := c.Get(WithOutcome(ctx, &o), strconv.Itoa(k), time.Minute, load(k, rng, &rngMu)); err == nil && o == OutcomeHit {
				break
			}
		}
		rep.Recovered = append(rep.Recovered, o.String())
	}
	rep.Stats = c.Stats()
	if err := hist.w.Flush(); err != nil {
		return err
	}
	c.Close()
	rdb.Close()
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > goroutinesStart && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	rep.GoroutinesEnd = runtime.NumGoroutine()
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("report-%d.json", inst)), b, 0o644); err != nil {
		return err
	}
	return errors.Join(failures...)
}

// ---------------------------------------------------------------------------
// The history check.

// soakOp is one line of a history.
type soakOp struct {
	proc       int
	op         byte // G get, S set, I invalidate, L load
	k          int
	start, end int64
	v          int64
	outcome    string
	class      string
	id         string
}

func readSoakHistory(dir string, procs int) ([]soakOp, error) {
	var ops []soakOp
	for i := range procs {
		f, err := os.Open(filepath.Join(dir, fmt.Sprintf("hist-%d.txt", i)))
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var o soakOp
			var op string
			if _, err := fmt.Sscan(sc.Text(), &op, &o.k, &o.start, &o.end, &o.v, &o.outcome, &o.class, &o.id); err != nil {
				f.Close()
				return nil, fmt.Errorf("history %d: %q: %w", i, sc.Text(), err)
			}
			o.proc, o.op = i, op[0]
			ops = append(ops, o)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return ops, nil
}

// sumStatsOf adds b to a, counter by counter.
func sumStatsOf(a, b Stats) Stats {
	va, vb := reflect.ValueOf(&a).Elem(), reflect.ValueOf(b)
	for i := range va.NumField() {
		va.Field(i).SetUint(va.Field(i).Uint() + vb.Field(i).Uint())
	}
	return a
}

// checkSoak runs the history checks and returns a summary.
func checkSoak(t *testing.T, h []soakOp, total Stats, t0 time.Time) string {
	t.Helper()
	bound := getBound(soakTimeouts, soakWait, soakLoadTO)
	var gets, writes, loads []soakOp
	errCount := map[string]int{}
	outcomes := map[string]int{}
	var durs []time.Duration
	for _, o := range h {
		switch o.op {
		case 'G':
			gets = append(gets, o)
			outcomes[o.outcome]++
			d := time.Duration(o.end - o.start)
			durs = append(durs, d)
			if o.class != "-" {
				errCount["get "+o.class]++
			}
			if o.class != "-" && o.class != "loadfailed" && o.class != "waittimeout" {
				if errCount["get "+o.class] <= 3 {
					t.Errorf("a Get of key %d got an undocumented error class %q", o.k, o.class)
				}
			}
			if d > bound {
				t.Errorf("a Get of key %d took %v, bound %v (outcome %s, %s)", o.k, d, bound, o.outcome, o.class)
			}
		case 'S', 'I':
			writes = append(writes, o)
			if o.class != "-" {
				errCount[string(o.op)+" "+o.class]++
				if o.class != "redis" {
					t.Errorf("a write of key %d got an undocumented error class %q", o.k, o.class)
				}
			}
		case 'L':
			loads = append(loads, o)
		}
	}

	// 3. Read your writes.
	done := map[int][]soakOp{} // completed writes per key, by end
	for _, w := range writes {
		if w.class == "-" {
			done[w.k] = append(done[w.k], w)
		}
	}
	for k := range done {
		slices.SortFunc(done[k], func(a, b soakOp) int { return int(a.end - b.end) })
	}
	stale, unchecked := 0, 0
	for _, r := range gets {
		if r.class != "-" {
			continue
		}
		ws := done[r.k]
		// Writes of a key are serialised: versions grow with end time.
		i := sort.Search(len(ws), func(i int) bool { return ws[i].v > r.v })
		if i == len(ws) || ws[i].end >= r.start {
			continue
		}
		w := ws[i]
		if r.outcome == OutcomeFallback.String() && r.proc != w.proc {
			// Guarantee 7's stated limit: a value loaded without Redis
			// (fail-open) cannot be checked against another process's
			// writes. The writer's own process is still held to it.
			unchecked++
			continue
		}
		stale++
		if stale <= 5 {
			t.Errorf("stale read: process %d read key %d at version %d (id %s, outcome %s) %v after a %c of version %d completed",
				r.proc, r.k, r.v, r.id, r.outcome, time.Duration(r.start-w.end), w.op, w.v)
		}
	}

	// 4. No two leased loads of a key overlap.
	leased := map[string]bool{}
	for _, o := range gets {
		if o.outcome == OutcomeLeader.String() && o.id != "-" {
			leased[o.id] = true
		}
	}
	byKey := map[int][]soakOp{}
	for _, l := range loads {
		if l.class == "ok" && leased[l.id] {
			byKey[l.k] = append(byKey[l.k], l)
		}
	}
	overlaps := 0
	for k, ls := range byKey {
		slices.SortFunc(ls, func(a, b soakOp) int { return int(a.start - b.start) })
		for i := 1; i < len(ls); i++ {
			if ls[i].start < ls[i-1].end {
				overlaps++
				if overlaps <= 5 {
					t.Errorf("key %d: leased loads %s and %s overlap by %v", k, ls[i-1].id, ls[i].id, time.Duration(ls[i-1].end-ls[i].start))
				}
			}
		}
	}

	// 5. Loads per key per TTL window.
	window := func(ns int64) int { return int(time.Duration(ns-t0.UnixNano()) / soakTTL) }
	type kw struct{ k, w int }
	leasedN, allowed := map[kw]int{}, map[kw]int{}
	for k, ls := range byKey {
		for _, l := range ls {
			leasedN[kw{k, window(l.start)}]++
		}
	}
	for _, l := range loads {
		if l.class != "ok" {
			allowed[kw{l.k, window(l.start)}]++
		}
	}
	for _, w := range writes {
		if w.op == 'I' {
			allowed[kw{w.k, window(w.start)}]++
		}
	}
	excess, worst := 0, 0
	for key, n := range leasedN {
		e := n - (1 + allowed[key])
		if e > 0 {
			excess += e
			worst = max(worst, e)
		}
	}
	budget := int(total.Fenced + total.CommitErrors)
	if excess > budget {
		t.Errorf("leased loads above 1 + invalidations + failed loads per key per %v window: %d in all (worst %d in one window), budget %d (fenced %d + commit errors %d)",
			soakTTL, excess, worst, budget, total.Fenced, total.CommitErrors)
	}
	var leasedTotal int
	for _, n := range leasedN {
		leasedTotal += n
	}

	slices.Sort(durs)
	pct := func(p float64) time.Duration {
		if len(durs) == 0 {
			return 0
		}
		return durs[min(len(durs)-1, int(float64(len(durs))*p))].Round(time.Microsecond)
	}
	return fmt.Sprintf("%d Gets (outcomes %v), %d writes, %d loads (%d leased and successful); Get latency p50 %v p99 %v p999 %v max %v (bound %v); errors %v; "+
		"read-your-writes: %d stale reads (%d fail-open reads behind another process's write, the stated limit); %d overlapping leased loads; load bound: excess %d (worst %d per key-window), budget %d",
		len(gets), outcomes, len(writes), len(loads), leasedTotal, pct(0.5), pct(0.99), pct(0.999), pct(1), bound, errCount,
		stale, unchecked, overlaps, excess, worst, budget)
}
