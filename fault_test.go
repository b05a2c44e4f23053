package herd

// Fault scenarios: herd behind a TCP fault proxy (internal/faultproxy) or
// with its redis-server restarted, paused or killed, asserting the pass
// criteria of the catalog (shared/TESTCATALOG.md §5) in every scenario:
//
//   - every caller returns within its bound, measured per Get and compared
//     with the configured wait budget, the load and the client timeouts;
//   - every caller gets a value or a documented error (errors.Is one of
//     herd's sentinels or a context error);
//   - loads per key stay within the documented bound for the fault;
//   - no stale overwrite: values carry a version from the source (a Redis
//     INCR on a client that bypasses the proxy), and a monitor samples the
//     stored envelope: its fence and its version never go backwards;
//   - no goroutine growth: runtime.NumGoroutine and goleak before and after;
//   - recovery without a restart: the same Cache serves hits and stores
//     values again once the fault ends.
//
// Leases are fixed (MinLease = MaxLease = DefaultLease) and assertions are
// in multiples of them. Gates and hooks order events; sleeps only keep a
// fault on for a while.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/faultproxy"
	"github.com/herdkit/herd/internal/lease"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// faultLease is the lease of every fault scenario.
const faultLease = 500 * time.Millisecond

// faultSlack is added to every computed bound: scheduling on a loaded
// 2-core machine under -race.
const faultSlack = time.Second

// faultOptions returns Cache options with the fixed lease and opt's other
// fields.
func faultOptions(opt Options) *Options {
	opt.MinLease, opt.MaxLease, opt.DefaultLease = faultLease, faultLease, faultLease
	return &opt
}

// timeouts are the client timeouts of a scenario.
type timeouts struct {
	dial, read, write time.Duration
	retries           int // go-redis MaxRetries: -1 none, n ≥ 1 that many retries
}

// tune returns a go-redis option setter for t.
func (to timeouts) tune(o *redis.Options) {
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = to.dial, to.read, to.write
	o.MaxRetries = to.retries
	o.DialerRetries = 1
	o.MinRetryBackoff, o.MaxRetryBackoff = 8*time.Millisecond, 64*time.Millisecond
}

// call bounds one Redis command: every attempt may dial, write and read.
func (to timeouts) call() time.Duration {
	attempts := 1 + max(to.retries, 0)
	return time.Duration(attempts) * (to.dial + to.write + to.read + 64*time.Millisecond)
}

// getBound is the longest a Get may take: its wait budget, its load, and
// the Redis commands of a flight (GET, ACQUIRE twice, SUBSCRIBE, COMMIT or
// RELEASE, a GET and ACQUIRE per look while following), each bounded by
// the client's timeouts.
func getBound(to timeouts, wait, load time.Duration) time.Duration {
	return wait + load + 6*to.call() + faultSlack
}

// faultRig is one scenario's world: a redis-server, clients that bypass
// every fault (direct for assertions, mon for the monitor), the fault
// proxy, the source of truth (a version counter per key, in this process,
// so that it survives a Redis restart), and the Caches and clients the
// scenario makes, closed by finish.
type faultRig struct {
	t      *testing.T
	srv    *redistest.Server // nil on a cluster
	direct redis.UniversalClient
	mon    redis.UniversalClient
	proxy  *faultproxy.Proxy // nil on a cluster

	goroutines int
	leakOpts   []goleak.Option

	mu      sync.Mutex
	closers []func()
	loads   map[string]*atomic.Int64
	source  map[string]*atomic.Int64
}

func newFaultRig(t *testing.T) *faultRig {
	t.Helper()
	srv := redistest.Start(t)
	r := &faultRig{t: t, srv: srv, loads: map[string]*atomic.Int64{}, source: map[string]*atomic.Int64{}}
	r.direct = srv.Client(t)
	r.mon = srv.Client(t, timeouts{dial: 200 * time.Millisecond, read: 200 * time.Millisecond, write: 200 * time.Millisecond, retries: -1}.tune)
	for _, c := range []redis.UniversalClient{r.direct, r.mon} {
		if err := c.Ping(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	r.loadScripts()
	r.goroutines = runtime.NumGoroutine()
	// A restarted server has a new reaper goroutine in redistest.
	r.leakOpts = []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/herdkit/herd/internal/redistest.(*Server).launchLocked.func1")}
	p, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	r.proxy = p
	r.closers = append(r.closers, func() { p.Close() })
	t.Cleanup(r.closeAll)
	return r
}

// loadScripts loads herd's scripts into the server's script cache, so that
// every script runs as EVALSHA with its digest (the proxy's faults find a
// script by it) instead of a first NOSCRIPT and EVAL.
func (r *faultRig) loadScripts() {
	r.t.Helper()
	for _, s := range []*script{acquireScript, extendScript, releaseScript, commitScript, setScript, invalidateScript} {
		if err := s.rs.Load(context.Background(), r.direct).Err(); err != nil {
			r.t.Fatal(err)
		}
	}
}

// client returns a client through the proxy with the given timeouts.
func (r *faultRig) client(to timeouts) *redis.Client {
	return r.clientTo(r.proxy.Addr(), to)
}

// clientTo returns a client of addr with the given timeouts.
func (r *faultRig) clientTo(addr string, to timeouts) *redis.Client {
	opt := &redis.Options{Addr: addr}
	to.tune(opt)
	c := redis.NewClient(opt)
	r.mu.Lock()
	r.closers = append(r.closers, func() { c.Close() })
	r.mu.Unlock()
	return c
}

// cache returns a Cache on rdb, closed by finish.
func (r *faultRig) cache(rdb redis.UniversalClient, opt *Options) *Cache {
	c := New(rdb, opt)
	r.mu.Lock()
	r.closers = append(r.closers, func() { c.Close() })
	r.mu.Unlock()
	return c
}

// closeAll closes Caches first, then clients and the proxy.
func (r *faultRig) closeAll() {
	r.mu.Lock()
	cl := r.closers
	r.closers = nil
	r.mu.Unlock()
	// Caches were added after the proxy and their clients: close in
	// reverse order.
	for i := len(cl) - 1; i >= 0; i-- {
		cl[i]()
	}
}

// finish closes everything the scenario made and checks that no goroutine
// outlives it.
func (r *faultRig) finish() {
	r.t.Helper()
	r.closeAll()
	checkGoroutines(r.t, r.goroutines, r.leakOpts...)
}

// checkGoroutines waits (bounded) for the goroutine count to fall back to
// baseline and runs goleak against the goroutines present at the start.
func checkGoroutines(t *testing.T, baseline int, opts ...goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	n := runtime.NumGoroutine()
	for n > baseline && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	if n > baseline {
		t.Errorf("goroutines: %d after the scenario, %d before", n, baseline)
	}
	goleak.VerifyNone(t, opts...)
}

// loader returns a loader for key that counts its calls, reads a new
// version from the source as it starts and returns "key#version". hook,
// if not nil, runs after the read with the call's number.
func (r *faultRig) loader(key string, hook func(n int64)) LoadFunc {
	r.mu.Lock()
	cnt, src := r.loads[key], r.source[key]
	if cnt == nil {
		cnt, src = &atomic.Int64{}, &atomic.Int64{}
		r.loads[key], r.source[key] = cnt, src
	}
	r.mu.Unlock()
	return func(ctx context.Context) ([]byte, error) {
		n := cnt.Add(1)
		v := src.Add(1)
		if hook != nil {
			hook(n)
		}
		return []byte(key + "#" + strconv.FormatInt(v, 10)), nil
	}
}

// loadCount returns how many times key's loaders ran.
func (r *faultRig) loadCount(key string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.loads[key]; c != nil {
		return c.Load()
	}
	return 0
}

// version parses the version of a value made by loader; -1 if it is not one.
func version(val []byte) int64 {
	i := bytes.LastIndexByte(val, '#')
	if i < 0 {
		return -1
	}
	v, err := strconv.ParseInt(string(val[i+1:]), 10, 64)
	if err != nil {
		return -1
	}
	return v
}

// stored returns the envelope stored for key (ok false when there is none).
func (r *faultRig) stored(key string) (envelope, bool) {
	keys, _ := makeKeys(DefaultPrefix, key)
	b, err := r.direct.Get(context.Background(), keys.Value).Bytes()
	if err != nil {
		return envelope{}, false
	}
	return wire.DecodeEnvelope(b)
}

// checkStored asserts that key holds a value with version want whose
// fence is the highest the key's counter issued.
func (r *faultRig) checkStored(key string, want int64) {
	r.t.Helper()
	env, ok := r.stored(key)
	if !ok {
		r.t.Errorf("%s: no value stored, want version %d", key, want)
		return
	}
	if got := version(env.Payload); got != want {
		r.t.Errorf("%s: stored version %d (%q), want %d", key, got, env.Payload, want)
	}
	keys, _ := makeKeys(DefaultPrefix, key)
	if n, _ := r.direct.HGet(context.Background(), keys.Fence, "n").Uint64(); env.Fence != n {
		r.t.Errorf("%s: stored fence %d, want the highest issued %d", key, env.Fence, n)
	}
}

// monitor samples the stored envelope of one key through the direct
// client until stopped, and records every time its fence or its version
// went backwards: a stale overwrite.
type monitor struct {
	stop, done chan struct{}
	samples    int
	violations []string
}

func (r *faultRig) watch(key string) *monitor {
	m := &monitor{stop: make(chan struct{}), done: make(chan struct{})}
	keys, _ := makeKeys(DefaultPrefix, key)
	rdb := r.mon
	go func() {
		defer close(m.done)
		var fence uint64
		ver := int64(-1)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-tick.C:
			}
			b, err := rdb.Get(context.Background(), keys.Value).Bytes()
			if err != nil {
				continue // a miss, or Redis away
			}
			env, ok := wire.DecodeEnvelope(b)
			if !ok {
				m.violations = append(m.violations, fmt.Sprintf("corrupt envelope stored: %q", b))
				continue
			}
			m.samples++
			v := version(env.Payload)
			if env.Fence < fence || v < ver {
				m.violations = append(m.violations, fmt.Sprintf("stored (fence %d, version %d) after (fence %d, version %d)", env.Fence, v, fence, ver))
			}
			fence, ver = max(fence, env.Fence), max(ver, v)
		}
	}()
	return m
}

// check stops the monitor and reports its violations.
func (m *monitor) check(t *testing.T, key string) {
	t.Helper()
	close(m.stop)
	<-m.done
	for _, v := range m.violations {
		t.Errorf("%s: stale overwrite: %s", key, v)
	}
}

// result is what one Get returned.
type result struct {
	cache   int
	val     []byte
	err     error
	dur     time.Duration
	outcome Outcome
}

// wave runs perCache concurrent Gets of key on every Cache, all released
// at once, and returns their results. ctx bounds each Get.
func wave(ctx context.Context, caches []*Cache, perCache int, key string, load LoadFunc) []result {
	res := make([]result, len(caches)*perCache)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for ci, c := range caches {
		for j := range perCache {
			i := ci*perCache + j
			wg.Go(func() {
				<-start
				var o Outcome
				t0 := time.Now()
				v, err := c.Get(WithOutcome(ctx, &o), key, time.Minute, load)
				res[i] = result{cache: ci, val: v, err: err, dur: time.Since(t0), outcome: o}
			})
		}
	}
	close(start)
	wg.Wait()
	return res
}

// startWave is wave in the background; the returned function waits for it.
func startWave(ctx context.Context, caches []*Cache, perCache int, key string, load LoadFunc) func() []result {
	ch := make(chan []result, 1)
	go func() { ch <- wave(ctx, caches, perCache, key, load) }()
	return func() []result { return <-ch }
}

// documented reports whether err is one of the errors herd documents for Get.
func documented(err error) bool {
	for _, s := range []error{ErrLoadFailed, ErrWaitTimeout, ErrUnavailable, ErrNotFound, ErrClosed,
		ErrValueTooLarge, context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// checkResults asserts that every Get returned within bound, and a value
// (wantValue) or a documented error. It returns the largest duration.
func checkResults(t *testing.T, what string, res []result, bound time.Duration, wantValue bool) time.Duration {
	t.Helper()
	var longest time.Duration
	bad := 0
	for _, r := range res {
		longest = max(longest, r.dur)
		switch {
		case r.dur > bound:
			t.Errorf("%s: a Get of cache %d took %v, bound %v (outcome %v, err %v)", what, r.cache, r.dur, bound, r.outcome, r.err)
		case r.err != nil && !documented(r.err):
			t.Errorf("%s: a Get of cache %d returned an undocumented error: %v", what, r.cache, r.err)
		case r.err != nil && wantValue:
			bad++
			if bad <= 3 {
				t.Errorf("%s: a Get of cache %d returned %v, want a value", what, r.cache, r.err)
			}
		case r.err == nil && version(r.val) < 0:
			t.Errorf("%s: a Get of cache %d returned %q, not a value of the source", what, r.cache, r.val)
		}
	}
	return longest
}

// versions returns the distinct versions among the results' values.
func versions(res []result) []int64 {
	var vs []int64
	for _, r := range res {
		if r.err == nil && !slices.Contains(vs, version(r.val)) {
			vs = append(vs, version(r.val))
		}
	}
	slices.Sort(vs)
	return vs
}

// until polls cond every 2ms for up to d; for hooks that must not call
// t.Fatal (they run in the Cache's goroutines).
func until(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// sumStats adds the counters of caches.
func sumStats(caches ...*Cache) Stats {
	var total Stats
	vt := reflect.ValueOf(&total).Elem()
	for _, c := range caches {
		vs := reflect.ValueOf(c.Stats())
		for i := range vt.NumField() {
			vt.Field(i).SetUint(vt.Field(i).Uint() + vs.Field(i).Uint())
		}
	}
	return total
}

// recoverWave checks recovery without a restart. Each Cache first waits
// (bounded) until it is served from Redis again (its breaker may still be
// open for up to its cooldown): a hit on the stored key hot, or, without
// one, a Get that is not a local load. Then a wave of all Caches on a cold
// key loads exactly once and stores the value, and hot is a hit on every
// Cache without a load.
func (r *faultRig) recoverWave(caches []*Cache, to timeouts, hot string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	probe := hot
	if probe == "" {
		probe = "recover-probe"
	}
	for i, c := range caches {
		var o Outcome
		ok := until(10*time.Second, func() bool {
			_, err := c.Get(WithOutcome(ctx, &o), probe, time.Minute, r.loader(probe, nil))
			return err == nil && (o == OutcomeHit || (hot == "" && o != OutcomeFallback))
		})
		if !ok {
			r.t.Errorf("recovery: cache %d not served from Redis within 10s (last outcome %v)", i, o)
			return
		}
	}
	key := "recover-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	res := wave(ctx, caches, 3, key, r.loader(key, nil))
	checkResults(r.t, "recovery wave", res, getBound(to, 2*faultLease, 0), true)
	if n := r.loadCount(key); n != 1 {
		r.t.Errorf("recovery: %d loads of a cold key for a wave, want 1", n)
	}
	r.checkStored(key, 1)
	if hot == "" {
		return
	}
	before := r.loadCount(hot)
	for i, c := range caches {
		var o Outcome
		v, err := c.Get(WithOutcome(ctx, &o), hot, time.Minute, r.loader(hot, nil))
		if err != nil || o != OutcomeHit {
			r.t.Errorf("recovery: cache %d: Get(%s) = (%q, %v) with outcome %v, want a hit", i, hot, v, err, o)
		}
	}
	if n := r.loadCount(hot) - before; n != 0 {
		r.t.Errorf("recovery: %d loads of the stored key %s, want 0", n, hot)
	}
}

// ---------------------------------------------------------------------------
// Latency.

// TestFaultLatency: 50ms on every reply (the proxy delays the server's
// replies). Waves of 3 Caches × 8 callers on cold keys still make one load
// each; every caller returns within 3 leases; the hit path works and is
// one round trip (about the injected latency, no more than a lease).
func TestFaultLatency(t *testing.T) {
	r := newFaultRig(t)
	const latency = 50 * time.Millisecond
	to := timeouts{dial: time.Second, read: time.Second, write: time.Second, retries: 1}
	r.proxy.SetLatency(faultproxy.Downstream, latency)
	var caches []*Cache
	for range 3 {
		caches = append(caches, r.cache(r.client(to), faultOptions(Options{WaitTimeout: 4 * faultLease})))
	}
	ctx := context.Background()
	for w := range 3 {
		key := fmt.Sprintf("latency-%d", w)
		m := r.watch(key)
		load := r.loader(key, func(int64) { time.Sleep(50 * time.Millisecond) })
		res := wave(ctx, caches, 8, key, load)
		longest := checkResults(t, key, res, 3*faultLease, true)
		m.check(t, key)
		if n := r.loadCount(key); n != 1 {
			t.Errorf("%s: %d loads, want 1", key, n)
		}
		if vs := versions(res); len(vs) != 1 {
			t.Errorf("%s: callers got versions %v, want one", key, vs)
		}
		r.checkStored(key, 1)
		t.Logf("%s: 24 callers, 1 load, slowest %v", key, longest.Round(time.Millisecond))
	}
	// The hit path: one GET, delayed by the proxy.
	var slowest time.Duration
	for i, c := range caches {
		for range 5 {
			var o Outcome
			t0 := time.Now()
			v, err := c.Get(WithOutcome(ctx, &o), "latency-0", time.Minute, r.loader("latency-0", nil))
			d := time.Since(t0)
			slowest = max(slowest, d)
			if err != nil || version(v) != 1 || o != OutcomeHit {
				t.Errorf("cache %d: hit = (%q, %v, %v), want version 1 as a hit", i, v, err, o)
			}
			if d < latency || d > latency+faultLease {
				t.Errorf("cache %d: a hit took %v, want between the %v latency and a lease more", i, d, latency)
			}
		}
	}
	if n := r.loadCount("latency-0"); n != 1 {
		t.Errorf("hits loaded: %d loads of latency-0, want 1", n)
	}
	s := sumStats(caches...)
	if s.Loads != 3 || s.LocalLoads != 0 || s.Fenced != 0 || s.CommitErrors != 0 {
		t.Errorf("Stats: loads=%d local=%d fenced=%d commitErrors=%d, want 3, 0, 0, 0", s.Loads, s.LocalLoads, s.Fenced, s.CommitErrors)
	}
	t.Logf("hits through %v latency: slowest %v; follows=%d hits=%d", latency, slowest.Round(time.Millisecond), s.Waits, s.Hits)
	r.proxy.SetLatency(faultproxy.Downstream, 0)
	r.finish()
}

// ---------------------------------------------------------------------------
// Connections cut at the COMMIT; lost replies (D10).

// TestFaultCommitCut: the leader's connection is reset exactly when its
// COMMIT is sent: before the server sees it ("cut"), or after the server
// ran it, instead of the reply ("lost reply"); with go-redis retries (2)
// and without. 3 Caches × 5 callers per wave; the other two Caches follow.
//
//   - cut, no retry: the commit fails (CommitErrors 1), the leader's
//     callers get its value unstored, the lease stays until it lapses and
//     one follower takes over: 2 loads, the second version stored.
//   - cut, retries: go-redis re-sends the COMMIT on a new connection: 1 load.
//   - lost reply, retries: the retried COMMIT finds its fence still
//     current and writes again (idempotent): 1 load, no error, not fenced.
//   - lost reply, no retry: the value was stored by the first run; the
//     leader counts a commit error; the followers got the message: 1 load.
//
// In all: every caller gets a value within its bound; the stored value is
// the newest load's, with the highest fence; no stale overwrite; the next
// wave loads once and the key is served as a hit.
func TestFaultCommitCut(t *testing.T) {
	for _, tc := range []struct {
		name         string
		lostReply    bool
		retries      int
		loads        int64
		commitErrors uint64
	}{
		{"cut/no-retry", false, -1, 2, 1},
		{"cut/retry", false, 2, 1, 0},
		{"lost-reply/retry", true, 2, 1, 0},
		{"lost-reply/no-retry", true, -1, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newFaultRig(t)
			to := timeouts{dial: 300 * time.Millisecond, read: 300 * time.Millisecond, write: 300 * time.Millisecond, retries: tc.retries}
			var caches []*Cache
			for range 3 {
				caches = append(caches, r.cache(r.client(to), faultOptions(Options{WaitTimeout: 4 * faultLease})))
			}
			key := "commit-" + strings.ReplaceAll(tc.name, "/", "-")
			sha := []byte(commitScript.rs.Hash())
			var fault *faultproxy.Fault
			load := r.loader(key, func(n int64) {
				if n != 1 {
					return
				}
				// The two other Caches follow; then the commit is faulted.
				until(5*time.Second, func() bool { return sumStats(caches...).Waits >= 2 })
				if tc.lostReply {
					fault = r.proxy.DropReply(sha)
				} else {
					fault = r.proxy.CutRequest(sha, 0)
				}
			})
			m := r.watch(key)
			res := wave(context.Background(), caches, 5, key, load)
			m.check(t, key)
			checkResults(t, key, res, getBound(to, 4*faultLease, 0), true)
			s := sumStats(caches...)
			select {
			case <-fault.Fired():
			default:
				t.Fatalf("the fault on the COMMIT did not fire (loads %d; %s; versions served %v)", r.loadCount(key), cpStatsLine(s), versions(res))
			}
			if n := r.loadCount(key); n != tc.loads {
				t.Errorf("%d loads, want %d", n, tc.loads)
			}
			if s.CommitErrors != tc.commitErrors || s.Fenced != 0 || s.LocalLoads != 0 {
				t.Errorf("Stats: commitErrors=%d fenced=%d local=%d, want %d, 0, 0", s.CommitErrors, s.Fenced, s.LocalLoads, tc.commitErrors)
			}
			r.checkStored(key, tc.loads)
			t.Logf("versions served %v; %s", versions(res), cpStatsLine(s))
			r.recoverWave(caches, to, key)
			r.finish()
		})
	}
}

// TestFaultLostReply (D10): the reply of a script is lost after the server
// ran it, and go-redis retries (MaxRetries 1):
//
//   - ACQUIRE: the retried acquire is recognised as this owner's, so the
//     caller leads at once (no self-lockout for the lease): one origin
//     call, the Get well under a lease, the value stored, and a follower
//     on another Cache gets it by the wake-up.
//   - RELEASE after a loader error: the retried release reports released,
//     the lease is gone at once, the follower gets ErrLoadFailed at once,
//     and the next Get leads without waiting out the lease.
//   - ACQUIRE without retries: the caller fails open (a local load,
//     unstored) within the client timeouts; the orphaned lease blocks the
//     key for at most one lease, after which another Cache takes over.
func TestFaultLostReply(t *testing.T) {
	ctx := context.Background()
	t.Run("acquire", func(t *testing.T) {
		r := newFaultRig(t)
		to := timeouts{dial: 300 * time.Millisecond, read: 300 * time.Millisecond, write: 300 * time.Millisecond, retries: 1}
		a := r.cache(r.client(to), faultOptions(Options{}))
		b := r.cache(r.direct, faultOptions(Options{WaitTimeout: 4 * faultLease}))
		key := "lost-acquire"
		fault := r.proxy.DropReply([]byte(acquireScript.rs.Hash()))
		followed := make(chan result, 1)
		load := r.loader(key, func(int64) {
			go func() {
				var o Outcome
				t0 := time.Now()
				v, err := b.Get(WithOutcome(ctx, &o), key, time.Minute, r.loader(key, nil))
				followed <- result{val: v, err: err, dur: time.Since(t0), outcome: o}
			}()
			until(5*time.Second, func() bool { return b.Stats().Waits == 1 })
		})
		m := r.watch(key)
		t0 := time.Now()
		v, err := a.Get(ctx, key, time.Minute, load)
		d := time.Since(t0)
		f := <-followed
		m.check(t, key)
		select {
		case <-fault.Fired():
		default:
			t.Fatal("the ACQUIRE's reply was not dropped")
		}
		if err != nil || version(v) != 1 {
			t.Errorf("Get = (%q, %v), want version 1", v, err)
		}
		// Leading at once: the Get's own time is one retried round trip
		// plus the follower hook, far below the lease it would wait out
		// if the retry did not recognise its own lease.
		if d > faultLease {
			t.Errorf("Get with a lost ACQUIRE reply took %v, want well under the %v lease (no self-lockout)", d, faultLease)
		}
		if f.err != nil || version(f.val) != 1 || f.outcome != OutcomeFollower {
			t.Errorf("follower: (%q, %v, %v), want version 1 as a follower", f.val, f.err, f.outcome)
		}
		if n := r.loadCount(key); n != 1 {
			t.Errorf("origin calls = %d, want 1", n)
		}
		if s := a.Stats(); s.Leads != 1 || s.LocalLoads != 0 || s.FailOpen != 0 || s.Waits != 0 {
			t.Errorf("leader Stats: %s, want it led once, without fail-open", cpStatsLine(s))
		}
		r.checkStored(key, 1)
		t.Logf("Get with a lost ACQUIRE reply: %v; follower: %v", d.Round(time.Millisecond), f.dur.Round(time.Millisecond))
		r.recoverWave([]*Cache{a, b}, to, key)
		r.finish()
	})
	t.Run("release", func(t *testing.T) {
		r := newFaultRig(t)
		to := timeouts{dial: 300 * time.Millisecond, read: 300 * time.Millisecond, write: 300 * time.Millisecond, retries: 1}
		a := r.cache(r.client(to), faultOptions(Options{}))
		b := r.cache(r.direct, faultOptions(Options{WaitTimeout: 4 * faultLease}))
		key := "lost-release"
		fault := r.proxy.DropReply([]byte(releaseScript.rs.Hash()))
		followed := make(chan result, 1)
		channel := mustKeys(t, key).Channel
		failing := func(context.Context) ([]byte, error) {
			go func() {
				t0 := time.Now()
				_, err := b.Get(ctx, key, time.Minute, r.loader(key, nil))
				followed <- result{err: err, dur: time.Since(t0)}
			}()
			// The follower must be subscribed on the server before the
			// failure is published, or it misses the message and, on its
			// subscription's confirmation, takes over the free lease.
			until(5*time.Second, func() bool {
				return b.Stats().Waits == 1 && r.direct.PubSubNumSub(ctx, channel).Val()[channel] == 1
			})
			return nil, errors.New("source down")
		}
		t0 := time.Now()
		_, err := a.Get(ctx, key, time.Minute, failing)
		d := time.Since(t0)
		f := <-followed
		select {
		case <-fault.Fired():
		default:
			t.Fatal("the RELEASE's reply was not dropped")
		}
		if !errors.Is(err, ErrLoadFailed) || d > faultLease {
			t.Errorf("leader: %v after %v, want ErrLoadFailed well within a lease", err, d)
		}
		if !errors.Is(f.err, ErrLoadFailed) || f.dur > faultLease {
			t.Errorf("follower: %v after %v, want ErrLoadFailed well within a lease (woken, not waiting out the lease)", f.err, f.dur)
		}
		keys := mustKeys(t, key)
		if n := r.direct.Exists(ctx, keys.Lease).Val(); n != 0 {
			t.Errorf("the lease is still held after the retried release")
		}
		t0 = time.Now()
		v, err := a.Get(ctx, key, time.Minute, r.loader(key, nil))
		if d := time.Since(t0); err != nil || version(v) != 1 || d > faultLease {
			t.Errorf("the next Get: (%q, %v) after %v, want version 1 at once", v, err, d)
		}
		r.checkStored(key, 1)
		r.finish()
	})
	t.Run("acquire/no-retry", func(t *testing.T) {
		r := newFaultRig(t)
		to := timeouts{dial: 300 * time.Millisecond, read: 300 * time.Millisecond, write: 300 * time.Millisecond, retries: -1}
		a := r.cache(r.client(to), faultOptions(Options{}))
		b := r.cache(r.direct, faultOptions(Options{WaitTimeout: 4 * faultLease}))
		key := "lost-acquire-noretry"
		fault := r.proxy.DropReply([]byte(acquireScript.rs.Hash()))
		var o Outcome
		t0 := time.Now()
		v, err := a.Get(WithOutcome(ctx, &o), key, time.Minute, r.loader(key, nil))
		d := time.Since(t0)
		<-fault.Fired()
		if err != nil || version(v) != 1 || o != OutcomeFallback {
			t.Errorf("Get = (%q, %v, %v), want a local load (fail-open)", v, err, o)
		}
		if bound := getBound(to, 0, 0); d > bound {
			t.Errorf("fail-open Get took %v, bound %v", d, bound)
		}
		if _, ok := r.stored(key); ok {
			t.Errorf("a value was stored by a flight without a lease")
		}
		// The lease the lost reply orphaned blocks the key for at most a lease.
		var ob Outcome
		t0 = time.Now()
		v, err = b.Get(WithOutcome(ctx, &ob), key, time.Minute, r.loader(key, nil))
		db := time.Since(t0)
		if err != nil || version(v) != 2 || ob != OutcomeLeader {
			t.Errorf("other Cache: (%q, %v, %v), want version 2, led after a takeover", v, err, ob)
		}
		if db > faultLease+faultSlack {
			t.Errorf("other Cache waited %v for the orphaned lease, want at most the %v lease", db, faultLease)
		}
		r.checkStored(key, 2)
		t.Logf("fail-open Get %v; orphaned lease blocked the other Cache %v", d.Round(time.Millisecond), db.Round(time.Millisecond))
		r.finish()
	})
}

// ---------------------------------------------------------------------------
// Blackhole.

// TestFaultBlackhole: Redis (behind the proxy) accepts connections and
// requests and never answers, for 3 times the client timeouts. Fail-open
// Caches: every Get returns a value, loaded locally, within the client
// timeouts plus the load; FailClosed: ErrUnavailable within the client
// timeouts, and no load. The breaker opens. After the blackhole the same
// Caches store values and serve hits again.
func TestFaultBlackhole(t *testing.T) {
	r := newFaultRig(t)
	to := timeouts{dial: 200 * time.Millisecond, read: 200 * time.Millisecond, write: 200 * time.Millisecond, retries: 1}
	opt := Options{BreakerThreshold: 3, BreakerCooldown: 200 * time.Millisecond}
	open := []*Cache{r.cache(r.client(to), faultOptions(opt)), r.cache(r.client(to), faultOptions(opt))}
	closedOpt := opt
	closedOpt.FailClosed = true
	closed := r.cache(r.client(to), faultOptions(closedOpt))
	ctx := context.Background()
	if _, err := open[0].Get(ctx, "warm", time.Minute, r.loader("warm", nil)); err != nil {
		t.Fatal(err)
	}

	r.proxy.SetBlackhole(true)
	const hole = 3 * 600 * time.Millisecond // 3 × (dial + write + read)
	end := time.Now().Add(hole)
	bound := getBound(to, 0, 0)
	var mu sync.Mutex
	var openRes, closedRes []result
	var closedLoads atomic.Int64
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for i := 0; time.Now().Before(end) && i < 50; i++ {
				key := []string{"warm", "cold-" + strconv.Itoa(i%3)}[i%2]
				c, ci := open[g%2], g%2
				if g >= 4 {
					c, ci = closed, 2
				}
				load := r.loader(key, nil)
				if c == closed {
					load = func(context.Context) ([]byte, error) { closedLoads.Add(1); return nil, errors.New("must not run") }
				}
				t0 := time.Now()
				v, err := c.Get(ctx, key, time.Minute, load)
				res := result{cache: ci, val: v, err: err, dur: time.Since(t0)}
				mu.Lock()
				if c == closed {
					closedRes = append(closedRes, res)
				} else {
					openRes = append(openRes, res)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r.proxy.SetBlackhole(false)
	lo := checkResults(t, "fail-open in the blackhole", openRes, bound, true)
	lc := checkResults(t, "fail-closed in the blackhole", closedRes, bound, false)
	for _, res := range closedRes {
		if !errors.Is(res.err, ErrUnavailable) {
			t.Errorf("FailClosed Get in the blackhole: (%q, %v), want ErrUnavailable", res.val, res.err)
			break
		}
	}
	if n := closedLoads.Load(); n != 0 {
		t.Errorf("the FailClosed Cache ran its loader %d times", n)
	}
	s := sumStats(open...)
	if s.FailOpen == 0 || s.BreakerOpens == 0 {
		t.Errorf("Stats: failOpen=%d breakerOpens=%d, want both > 0", s.FailOpen, s.BreakerOpens)
	}
	t.Logf("blackhole %v: %d fail-open Gets (slowest %v), %d fail-closed (slowest %v), bound %v; %s",
		hole, len(openRes), lo.Round(time.Millisecond), len(closedRes), lc.Round(time.Millisecond), bound, cpStatsLine(s))

	r.recoverWave(append(open, closed), to, "warm")
	r.finish()
}

// ---------------------------------------------------------------------------
// Redis restarted and paused mid-wave.

// TestFaultRedisRestartMidWave: while the leader (Cache A) loads and two
// other Caches follow, Redis restarts empty (no persistence). The
// followers' pub/sub connections resubscribe, the lease is gone, and one
// of them takes over: 2 loads in all (Redis restart: a new fence epoch,
// at most one extra load). A's commit is fenced by the counter re-seeded
// from the Redis clock. Every caller gets a value within the budget; the
// stored value is the takeover's, never A's; the next wave loads once.
func TestFaultRedisRestartMidWave(t *testing.T) {
	r := newFaultRig(t)
	to := timeouts{dial: 300 * time.Millisecond, read: 300 * time.Millisecond, write: 300 * time.Millisecond, retries: 1}
	var caches []*Cache
	for range 3 {
		// Straight to the server (Restart keeps its port).
		caches = append(caches, r.cache(r.clientTo(r.srv.Addr(), to), faultOptions(Options{WaitTimeout: 10 * faultLease})))
	}
	key := "restart-wave"
	gate := make(chan struct{})
	load := r.loader(key, func(n int64) {
		if n == 1 {
			<-gate
		}
	})
	m := r.watch(key)
	done := startWave(context.Background(), caches, 5, key, load)
	waitFor(t, 10*time.Second, "the leader to load and the others to follow", func() bool {
		return r.loadCount(key) == 1 && sumStats(caches...).Waits == 2
	})
	var leader int
	for i, c := range caches {
		if c.Stats().Leads == 1 {
			leader = i
		}
	}
	r.srv.Restart(t)
	restarted := time.Now()
	waitFor(t, 10*time.Second, "a follower to take over after the restart", func() bool { return r.loadCount(key) == 2 })
	takeover := time.Since(restarted)
	close(gate)
	res := done()
	m.check(t, key)
	checkResults(t, key, res, getBound(to, 10*faultLease, 0), true)
	if n := r.loadCount(key); n != 2 {
		t.Errorf("%d loads, want 2 (the leader's and one takeover after the restart)", n)
	}
	ls := caches[leader].Stats()
	if ls.Fenced+ls.CommitErrors != 1 {
		t.Errorf("the leader's commit after the restart: fenced=%d commitErrors=%d, want it rejected", ls.Fenced, ls.CommitErrors)
	}
	r.checkStored(key, 2)
	for _, res := range res {
		if res.cache != leader && version(res.val) != 2 {
			t.Errorf("a follower of cache %d got version %d, want the takeover's 2", res.cache, version(res.val))
		}
	}
	t.Logf("takeover %v after the restart; leader Stats: %s", takeover.Round(time.Millisecond), cpStatsLine(ls))
	r.loadScripts()
	r.recoverWave(caches, to, key)
	r.finish()
}

// TestFaultRedisPaused: Redis is frozen (SIGSTOP) for 4 read timeouts
// while the leader commits and another Cache follows. The leader's commit
// times out (its request is still queued in the server's socket); its
// callers get its value within the client timeouts. The follower keeps
// waiting within its budget; a FailClosed Cache gets ErrUnavailable within
// the timeouts while Redis is frozen. After SIGCONT the queued commands
// run in some order: whatever the order, the stored value never goes
// backwards, at most 2 loads happen, and the next wave loads once.
func TestFaultRedisPaused(t *testing.T) {
	r := newFaultRig(t)
	to := timeouts{dial: 200 * time.Millisecond, read: 200 * time.Millisecond, write: 200 * time.Millisecond, retries: 1}
	opt := Options{WaitTimeout: 8 * faultLease, BreakerCooldown: 200 * time.Millisecond}
	a := r.cache(r.clientTo(r.srv.Addr(), to), faultOptions(opt))
	b := r.cache(r.clientTo(r.srv.Addr(), to), faultOptions(opt))
	closedOpt := opt
	closedOpt.FailClosed = true
	closed := r.cache(r.clientTo(r.srv.Addr(), to), faultOptions(closedOpt))
	key := "paused"
	paused := make(chan struct{})
	load := r.loader(key, func(n int64) {
		if n == 1 {
			until(5*time.Second, func() bool { return b.Stats().Waits == 1 })
			<-paused
		}
	})
	m := r.watch(key)
	ctx := context.Background()
	doneA := startWave(ctx, []*Cache{a}, 5, key, load)
	waitFor(t, 10*time.Second, "the leader to load", func() bool { return r.loadCount(key) == 1 })
	doneB := startWave(ctx, []*Cache{b}, 5, key, load)
	waitFor(t, 10*time.Second, "the other Cache to follow", func() bool { return b.Stats().Waits == 1 })
	r.srv.Pause(t)
	pausedAt := time.Now()
	close(paused) // the leader returns and commits into the frozen server
	t0 := time.Now()
	_, err := closed.Get(ctx, "paused-closed", time.Minute, r.loader("paused-closed", nil))
	if d := time.Since(t0); !errors.Is(err, ErrUnavailable) || d > getBound(to, 0, 0) {
		t.Errorf("FailClosed Get with Redis frozen: %v after %v, want ErrUnavailable within %v", err, d, getBound(to, 0, 0))
	}
	resA := doneA()
	if d := time.Since(pausedAt); d < 4*to.read {
		time.Sleep(4*to.read - d)
	}
	r.srv.Resume(t)
	resB := doneB()
	m.check(t, key)
	checkResults(t, "leader's callers", resA, getBound(to, 0, 0), true)
	checkResults(t, "follower's callers", resB, getBound(to, opt.WaitTimeout, 0), true)
	if n := r.loadCount(key); n < 1 || n > 2 {
		t.Errorf("%d loads, want 1 or 2", n)
	}
	if s := a.Stats(); s.CommitErrors != 1 {
		t.Errorf("leader: commitErrors=%d, want 1 (its commit timed out)", s.CommitErrors)
	}
	env, ok := r.stored(key)
	t.Logf("stored after the pause: %q (ok %v); loads %d; leader %s; follower %s", env.Payload, ok, r.loadCount(key), cpStatsLine(a.Stats()), cpStatsLine(b.Stats()))
	r.recoverWave([]*Cache{a, b, closed}, to, "")
	r.finish()
}

// ---------------------------------------------------------------------------
// D09: a delayed write is fenced.

// TestFaultDelayedWrite (D09).
//
//   - commit: after the leader (Cache A, behind the proxy) loaded, its link
//     to Redis gets 3 leases of latency, so its COMMIT reaches Redis long
//     after its lease lapsed; meanwhile Cache B (direct) takes over, loads
//     and commits. A's commit arrives and is fenced (A's Stats.Fenced 1);
//     the stored value is B's, with the highest fence; A's callers get
//     A's value (documented), B's get B's within a lease and a half.
//   - acquire reply: the replies on A's link are delayed by 1.2 leases, so
//     A's ACQUIRE reply comes after the lease's validity: A must treat it
//     as not acquired (Leads 0) and give the lease back, and B, arriving
//     meanwhile, leads within a lease (no lockout beyond the lease). A's
//     Get takes its wait budget plus every round trip at 1.2 leases each
//     (the budget bounds the wait, the client timeouts each call).
func TestFaultDelayedWrite(t *testing.T) {
	ctx := context.Background()
	t.Run("commit", func(t *testing.T) {
		r := newFaultRig(t)
		slow := timeouts{dial: time.Second, read: 8 * faultLease, write: time.Second, retries: -1}
		a := r.cache(r.client(slow), faultOptions(Options{WaitTimeout: 10 * faultLease}))
		b := r.cache(r.direct, faultOptions(Options{WaitTimeout: 10 * faultLease}))
		key := "delayed-commit"
		load := r.loader(key, func(n int64) {
			if n == 1 {
				until(5*time.Second, func() bool { return b.Stats().Waits == 1 })
				r.proxy.SetLatency(faultproxy.Upstream, 3*faultLease)
			}
		})
		m := r.watch(key)
		doneA := startWave(ctx, []*Cache{a}, 3, key, load)
		waitFor(t, 10*time.Second, "A to load", func() bool { return r.loadCount(key) >= 1 })
		bStart := time.Now()
		resB := wave(ctx, []*Cache{b}, 3, key, load)
		bDur := time.Since(bStart)
		resA := doneA()
		m.check(t, key)
		checkResults(t, "A", resA, 3*faultLease+getBound(slow, 0, 0), true)
		checkResults(t, "B", resB, 3*faultLease, true)
		if s := a.Stats(); s.Fenced != 1 || s.Loads != 1 {
			t.Errorf("A: %s, want its one commit fenced", cpStatsLine(s))
		}
		if s := b.Stats(); s.Takeovers != 1 || s.Loads != 1 {
			t.Errorf("B: %s, want one takeover and one load", cpStatsLine(s))
		}
		if vs := versions(resA); !slices.Equal(vs, []int64{1}) {
			t.Errorf("A's callers got versions %v, want [1] (the leader's own value)", vs)
		}
		if vs := versions(resB); !slices.Equal(vs, []int64{2}) {
			t.Errorf("B's callers got versions %v, want [2]", vs)
		}
		r.checkStored(key, 2)
		t.Logf("B served after %v (lease %v); A's delayed commit fenced", bDur.Round(time.Millisecond), faultLease)
		r.proxy.SetLatency(faultproxy.Upstream, 0)
		r.recoverWave([]*Cache{a, b}, slow, key)
		r.finish()
	})
	t.Run("acquire-reply", func(t *testing.T) {
		r := newFaultRig(t)
		slow := timeouts{dial: time.Second, read: 8 * faultLease, write: time.Second, retries: -1}
		a := r.cache(r.client(slow), faultOptions(Options{WaitTimeout: 3 * faultLease}))
		b := r.cache(r.direct, faultOptions(Options{WaitTimeout: 10 * faultLease}))
		key := "delayed-acquire"
		// Replies 1.2 leases late: after the lease's local validity.
		r.proxy.SetLatency(faultproxy.Downstream, faultLease*6/5)
		doneA := startWave(ctx, []*Cache{a}, 1, key, r.loader(key, nil))
		keys := mustKeys(t, key)
		waitFor(t, 5*time.Second, "A's ACQUIRE to take the lease", func() bool { return r.direct.Exists(ctx, keys.Lease).Val() == 1 })
		var ob Outcome
		t0 := time.Now()
		v, err := b.Get(WithOutcome(ctx, &ob), key, time.Minute, r.loader(key, nil))
		db := time.Since(t0)
		resA := doneA()
		checkResults(t, "A", resA, a.cfg.WaitTimeout+getBound(slow, 0, 0), false)
		if err != nil || ob != OutcomeLeader || db > faultLease+faultSlack {
			t.Errorf("B: (%q, %v, %v) after %v, want to lead within the %v lease", v, err, ob, db, faultLease)
		}
		if s := a.Stats(); s.Leads != 0 || s.Loads != 0 {
			t.Errorf("A: %s, want no lead from a reply that came after the lease's validity", cpStatsLine(s))
		}
		t.Logf("B led after %v; A: (%q, %v) after %v, outcome %v", db.Round(time.Millisecond), resA[0].val, resA[0].err, resA[0].dur.Round(time.Millisecond), resA[0].outcome)
		r.proxy.SetLatency(faultproxy.Downstream, 0)
		r.finish()
	})
}

// ---------------------------------------------------------------------------
// D12: the client's wall clock jumps.

// TestFaultClockJump (D12): the leader's wall clock (the Cache's now, the
// only clock herd lets a test move; herd uses it for freshness) jumps by
// +1h or -1h a lease into a load that would run 5 leases, with MaxHold 3
// leases. Leases use monotonic time, so the jump must change nothing about
// them: the lease key is present throughout the first 3 leases (no
// premature abandonment) and the follower on another Cache is not served
// before the cap. At the cap the lease ends (the watchdog's last renewal
// is cut to it) and the load is abandoned (its timeout is MaxHold), so by
// the cap plus a lease (no over-extension) the follower has either taken
// over and loaded, or got the abandoned load's ErrLoadFailed; either way
// the key then holds the follower's version. The freshness effect of the jump is the documented one
// (the writer's clock) and is checked too: after +1h the value looks
// fresh to a reader with a correct clock; after -1h it is already expired
// for it, so that reader rebuilds.
func TestFaultClockJump(t *testing.T) {
	for _, jump := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprintf("%+v", jump), func(t *testing.T) {
			r := newFaultRig(t)
			ctx := context.Background()
			a := r.cache(r.direct, faultOptions(Options{MaxHold: 3 * faultLease, LoadTimeout: 10 * faultLease}))
			var offset atomic.Int64
			a.now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
			b := r.cache(r.direct, faultOptions(Options{WaitTimeout: 20 * faultLease}))
			key := "clock-" + strconv.FormatBool(jump > 0)
			keys := mustKeys(t, key)
			acquired := make(chan time.Time, 1)
			var absent atomic.Int64 // samples without the lease key in the first 3 leases
			sampled := make(chan struct{})
			abandoned := make(chan struct{}) // closed when A's abandoned loader returns
			load := r.loader(key, func(n int64) {
				if n != 1 {
					return
				}
				defer close(abandoned)
				start := time.Now()
				acquired <- start
				go func() {
					defer close(sampled)
					for time.Since(start) < 3*faultLease-50*time.Millisecond {
						if r.direct.Exists(ctx, keys.Lease).Val() == 0 {
							absent.Add(1)
						}
						time.Sleep(5 * time.Millisecond)
					}
				}()
				time.Sleep(faultLease)
				offset.Store(int64(jump))
				time.Sleep(4 * faultLease) // past MaxHold: abandoned
			})
			waveStart := time.Now() // A's acquire starts after this: the cap counts from it
			doneA := startWave(ctx, []*Cache{a}, 1, key, load)
			start := <-acquired
			var ob Outcome
			v, err := b.Get(WithOutcome(ctx, &ob), key, time.Minute, r.loader(key, nil))
			takeover, sinceWave := time.Since(start), time.Since(waveStart)
			resA := doneA()
			<-sampled
			if n := absent.Load(); n != 0 {
				t.Errorf("the lease key was absent in %d samples during the first 3 leases (premature abandonment)", n)
			}
			tookOver := err == nil && ob == OutcomeLeader && version(v) == 2
			if !tookOver && !errors.Is(err, ErrLoadFailed) {
				t.Errorf("B: (%q, %v, %v), want a takeover with version 2 or the abandoned load's ErrLoadFailed", v, err, ob)
			}
			// The cap counts from A's acquire, which comes before its load
			// (by a round trip and more on a loaded machine) and after the
			// wave began: not served before the cap after the wave began,
			// nor later than a lease after the cap after the load began.
			if sinceWave < 3*faultLease-lease.Drift(faultLease) || takeover > 4*faultLease+faultSlack {
				t.Errorf("B served %v after A's wave began and %v after its load started, want from the %v cap to a lease after it", sinceWave, takeover, 3*faultLease)
			}
			if !errors.Is(resA[0].err, ErrLoadFailed) {
				t.Errorf("A: (%q, %v), want ErrLoadFailed (the loader ran past MaxHold)", resA[0].val, resA[0].err)
			}
			if !tookOver {
				t0 := time.Now()
				v, err = b.Get(WithOutcome(ctx, &ob), key, time.Minute, r.loader(key, nil))
				if d := time.Since(t0); err != nil || ob != OutcomeLeader || version(v) != 2 || d > faultLease {
					t.Errorf("B again: (%q, %v, %v) after %v, want version 2, led at once", v, err, ob, d)
				}
			}
			r.checkStored(key, 2)
			// Freshness after the jump, judged by the writer's clock.
			fresh := key + "-fresh"
			if _, err := a.Get(ctx, fresh, time.Minute, r.loader(fresh, nil)); err != nil {
				t.Fatal(err)
			}
			var o Outcome
			if _, err := b.Get(WithOutcome(ctx, &o), fresh, time.Minute, r.loader(fresh, nil)); err != nil {
				t.Fatal(err)
			}
			want := OutcomeHit
			if jump < 0 {
				want = OutcomeLeader // written already expired for a correct clock
			}
			if o != want {
				t.Errorf("a correct-clock reader of a value written with the clock %+v off: outcome %v, want %v", jump, o, want)
			}
			t.Logf("takeover %v after the load started (cap %v); a correct-clock reader of a value written %+v off: %v",
				takeover.Round(time.Millisecond), 3*faultLease, jump, o)
			// A's loader ignores its context (that is the point): it still
			// sleeps after the test is done with it. Let it return before the
			// leak check rather than count on the check's retries.
			select {
			case <-abandoned:
			case <-time.After(10 * faultLease):
				t.Error("A's abandoned loader did not return")
			}
			r.finish()
		})
	}
}

// ---------------------------------------------------------------------------
// Redis Cluster.

// clusterTimeouts are the cluster clients' timeouts in the cluster
// scenarios.
var clusterTimeouts = timeouts{dial: 300 * time.Millisecond, read: 300 * time.Millisecond, write: 300 * time.Millisecond, retries: 1}

// clusterRedirects is the cluster clients' MaxRedirects.
const clusterRedirects = 3

func (to timeouts) tuneCluster(o *redis.ClusterOptions) {
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = to.dial, to.read, to.write
	o.MaxRetries, o.MaxRedirects = to.retries, clusterRedirects
	o.DialerRetries = 1
	o.MinRetryBackoff, o.MaxRetryBackoff = 8*time.Millisecond, 64*time.Millisecond
}

// clusterBound is getBound for a cluster client: every command may be
// tried on up to MaxRedirects+1 nodes.
func clusterBound(to timeouts, wait time.Duration) time.Duration {
	return wait + 6*(clusterRedirects+1)*to.call() + faultSlack
}

// newClusterRig is newFaultRig on a running cluster, without a proxy.
// nodes are clients of each node, for administration.
func newClusterRig(t *testing.T, cl *redistest.Cluster) (*faultRig, []*redis.Client) {
	t.Helper()
	r := &faultRig{t: t, loads: map[string]*atomic.Int64{}, source: map[string]*atomic.Int64{}}
	r.direct = cl.Client(t)
	r.mon = cl.Client(t, timeouts{dial: 200 * time.Millisecond, read: 200 * time.Millisecond, write: 200 * time.Millisecond, retries: -1}.tuneCluster)
	var nodes []*redis.Client
	for _, s := range cl.Servers() {
		nodes = append(nodes, s.Client(t, timeouts{dial: time.Second, read: 2 * time.Second, write: time.Second, retries: -1}.tune))
	}
	ctx := context.Background()
	for _, c := range []redis.UniversalClient{r.direct, r.mon} {
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		if err := n.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	r.goroutines = runtime.NumGoroutine()
	r.leakOpts = []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/herdkit/herd/internal/redistest.(*Server).launchLocked.func1")}
	t.Cleanup(r.closeAll)
	return r, nodes
}

// clusterClient returns a cluster client with the given timeouts, closed
// by finish.
func (r *faultRig) clusterClient(cl *redistest.Cluster, to timeouts) *redis.ClusterClient {
	opt := &redis.ClusterOptions{Addrs: cl.Addrs()}
	to.tuneCluster(opt)
	c := redis.NewClusterClient(opt)
	r.mu.Lock()
	r.closers = append(r.closers, func() { c.Close() })
	r.mu.Unlock()
	return c
}

// masterOf returns the address of the master that serves key's names.
func masterOf(t *testing.T, cc *redis.ClusterClient, key string) string {
	t.Helper()
	keys := mustKeys(t, key)
	m, err := cc.MasterForKey(context.Background(), keys.Value)
	if err != nil {
		t.Fatalf("master of %q: %v", key, err)
	}
	return m.Options().Addr
}

// waitClusterOK waits until every node reports cluster_state:ok.
func waitClusterOK(t *testing.T, nodes []*redis.Client, d time.Duration) {
	t.Helper()
	waitFor(t, d, "cluster_state:ok on every node", func() bool {
		for _, n := range nodes {
			info, err := n.ClusterInfo(context.Background()).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		return true
	})
}

// TestFaultClusterMasterKilled (C03-like, on the 3-master cluster without
// replicas): one master is SIGKILLed under load, so the keys of its slots
// are unavailable (the survivors are set to cluster-require-full-coverage
// no, or the whole cluster would refuse service once the node is marked
// failed). For 3s, three Caches read 30 warm keys spread over the masters:
//
//   - "open" (default breaker): every Get returns a value within its
//     bound; keys on the dead master load locally (fail-open);
//   - "isolated" (breaker threshold out of reach): keys on live masters
//     are still hits, with no load;
//   - "closed" (FailClosed, same breaker threshold): dead-master keys get
//     ErrUnavailable within the bound, live keys their values.
//
// The open Cache's breaker is per Cache, not per node: errors on the dead
// master's keys open it and its live keys are then loaded locally too for
// a while; the test logs how many.
//
// After the node restarts (empty, same id and slots) and the cluster is ok
// again, the same Caches are served from Redis again and a wave on a cold
// key of the restarted master loads once.
func TestFaultClusterMasterKilled(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	r, nodes := newClusterRig(t, cl)
	ctx := context.Background()
	for _, n := range nodes {
		if err := n.ConfigSet(ctx, "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
	}
	to := clusterTimeouts
	open := r.cache(r.clusterClient(cl, to), faultOptions(Options{BreakerCooldown: 200 * time.Millisecond}))
	iso := r.cache(r.clusterClient(cl, to), faultOptions(Options{BreakerThreshold: 1 << 30}))
	closed := r.cache(r.clusterClient(cl, to), faultOptions(Options{BreakerThreshold: 1 << 30, FailClosed: true}))
	caches := []*Cache{open, iso, closed}

	victim := cl.Servers()[0]
	cc := r.direct.(*redis.ClusterClient)
	var keys []string
	dead := map[string]bool{}
	for i := range 30 {
		k := "ck-" + strconv.Itoa(i)
		keys = append(keys, k)
		dead[k] = masterOf(t, cc, k) == victim.Addr()
		if _, err := iso.Get(ctx, k, time.Minute, r.loader(k, nil)); err != nil {
			t.Fatal(err)
		}
	}
	var nDead int
	for _, d := range dead {
		if d {
			nDead++
		}
	}
	if nDead == 0 || nDead == len(keys) {
		t.Fatalf("%d of %d keys on the victim: want some on each side", nDead, len(keys))
	}
	loadsBefore := map[string]int64{}
	for _, k := range keys {
		loadsBefore[k] = r.loadCount(k)
	}

	victim.Kill(t)
	killed := time.Now()
	var mu sync.Mutex
	var recs []keyedResult
	var wg sync.WaitGroup
	end := time.Now().Add(3 * time.Second)
	for ci, c := range caches {
		for g := range 3 {
			wg.Go(func() {
				for i := g; time.Now().Before(end) && i < 10000; i += 3 {
					k := keys[i%len(keys)]
					load := r.loader(k, nil)
					var o Outcome
					t0 := time.Now()
					v, err := c.Get(WithOutcome(ctx, &o), k, time.Minute, load)
					mu.Lock()
					recs = append(recs, keyedResult{result{cache: ci, val: v, err: err, dur: time.Since(t0), outcome: o}, k})
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	bound := clusterBound(to, 2*faultLease)
	var byCache [3][]result
	var openLiveLocal, isoLiveHits, isoLive int
	for _, rc := range recs {
		byCache[rc.cache] = append(byCache[rc.cache], rc.result)
		switch {
		case rc.cache == 0 && !dead[rc.key] && rc.outcome == OutcomeFallback:
			openLiveLocal++
		case rc.cache == 1 && !dead[rc.key]:
			isoLive++
			if rc.outcome == OutcomeHit {
				isoLiveHits++
			}
		case rc.cache == 2 && dead[rc.key] && !errors.Is(rc.err, ErrUnavailable):
			t.Errorf("closed Cache, key %s on the dead master: (%q, %v), want ErrUnavailable", rc.key, rc.val, rc.err)
		case rc.cache == 2 && !dead[rc.key] && rc.err != nil:
			t.Errorf("closed Cache, key %s on a live master: %v, want its value", rc.key, rc.err)
		}
	}
	lo := checkResults(t, "open", byCache[0], bound, true)
	li := checkResults(t, "isolated", byCache[1], bound, true)
	lc := checkResults(t, "closed", byCache[2], bound, false)
	if isoLive == 0 || isoLiveHits != isoLive {
		t.Errorf("isolated Cache: %d of %d Gets of live keys were hits, want all", isoLiveHits, isoLive)
	}
	for _, k := range keys {
		if !dead[k] && r.loadCount(k) != loadsBefore[k]+int64(countLocal(recs, k)) {
			// Live keys load only locally in the open Cache (breaker open).
			t.Errorf("live key %s: %d loads during the outage, want only the open Cache's local loads (%d)", k, r.loadCount(k)-loadsBefore[k], countLocal(recs, k))
		}
	}
	t.Logf("master %s killed, %d of %d keys on it; %d Gets in %v; slowest open %v, isolated %v, closed %v (bound %v); open Cache: %d live-key Gets loaded locally while its breaker was open; %s",
		victim.Addr(), nDead, len(keys), len(recs), time.Since(killed).Round(time.Millisecond), lo.Round(time.Millisecond), li.Round(time.Millisecond), lc.Round(time.Millisecond), bound, openLiveLocal, cpStatsLine(open.Stats()))

	victim.Restart(t)
	waitClusterOK(t, nodes, 30*time.Second)
	// Recovery: every Cache is served from Redis again, and a cold key on
	// the restarted master loads once for a wave.
	for i, c := range caches {
		var o Outcome
		k := keys[slices.IndexFunc(keys, func(k string) bool { return dead[k] })]
		ok := until(15*time.Second, func() bool {
			_, err := c.Get(WithOutcome(ctx, &o), k, time.Minute, r.loader(k, nil))
			return err == nil && o != OutcomeFallback
		})
		if !ok {
			t.Errorf("cache %d: not served from the restarted master within 15s (outcome %v)", i, o)
		}
	}
	var cold string
	for i := 0; cold == "" && i < 1000; i++ {
		if k := "cold-" + strconv.Itoa(i); masterOf(t, cc, k) == victim.Addr() {
			cold = k
		}
	}
	res := wave(ctx, caches, 4, cold, r.loader(cold, nil))
	checkResults(t, "after the restart", res, bound, true)
	if n := r.loadCount(cold); n != 1 {
		t.Errorf("after the restart: %d loads of a cold key on the restarted master, want 1", n)
	}
	r.checkStored(cold, 1)
	r.finish()
}

// keyedResult is a result with its key.
type keyedResult struct {
	result
	key string
}

// countLocal counts the local loads among recs for key: distinct values
// served with OutcomeFallback (each is one loader run).
func countLocal(recs []keyedResult, key string) int {
	seen := map[string]bool{}
	for _, rc := range recs {
		if rc.key == key && rc.outcome == OutcomeFallback && rc.err == nil {
			seen[string(rc.val)] = true
		}
	}
	return len(seen)
}

// TestFaultClusterSlotMigration (C02): the slot of a hot key moves from
// its master to another one under load (CLUSTER SETSLOT IMPORTING and
// MIGRATING, MIGRATE of the slot's keys in batches, SETSLOT NODE on every
// node), while two Caches × 4 goroutines read the key and a writer
// invalidates it every 50ms so that it is rebuilt throughout. During the
// migration herd's scripts meet ASK redirects (keys already moved) and
// TRYAGAIN (a script whose keys are split between the nodes), and NOSCRIPT
// on the new owner. Checked: every Get returns a value within its bound
// (no caller-visible error); leased loads ≤ 2 per invalidation epoch; the
// stored fence and version never go backwards; afterwards the slot is
// served by the new master and a wave after an Invalidate loads once.
func TestFaultClusterSlotMigration(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	r, nodes := newClusterRig(t, cl)
	ctx := context.Background()
	to := timeouts{dial: time.Second, read: time.Second, write: time.Second, retries: 3}
	caches := []*Cache{
		r.cache(r.clusterClient(cl, to), faultOptions(Options{})),
		r.cache(r.clusterClient(cl, to), faultOptions(Options{})),
	}
	cc := r.direct.(*redis.ClusterClient)
	key := "hot"
	keys := mustKeys(t, key)
	slot, err := nodes[0].ClusterKeySlot(ctx, keys.Value).Result()
	if err != nil {
		t.Fatal(err)
	}
	srcAddr := masterOf(t, cc, key)
	var src, dst *redis.Client
	for _, n := range nodes {
		switch {
		case n.Options().Addr == srcAddr:
			src = n
		case dst == nil:
			dst = n
		}
	}
	ids := map[*redis.Client]string{}
	for _, n := range nodes {
		id, err := n.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatal(err)
		}
		ids[n] = id
	}
	// Fill the slot with the hot key's names before the move.
	if _, err := caches[0].Get(ctx, key, time.Minute, r.loader(key, nil)); err != nil {
		t.Fatal(err)
	}

	m := r.watch(key)
	stop := make(chan struct{})
	var mu sync.Mutex
	var res []result
	var invalidations, invalidateErrs atomic.Int64
	var wg sync.WaitGroup
	load := r.loader(key, func(int64) { time.Sleep(5 * time.Millisecond) })
	for ci, c := range caches {
		for range 4 {
			wg.Go(func() {
				for i := 0; i < 100000; i++ {
					select {
					case <-stop:
						return
					default:
					}
					var o Outcome
					t0 := time.Now()
					v, err := c.Get(WithOutcome(ctx, &o), key, time.Minute, load)
					mu.Lock()
					res = append(res, result{cache: ci, val: v, err: err, dur: time.Since(t0), outcome: o})
					mu.Unlock()
				}
			})
		}
	}
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			invalidations.Add(1)
			if err := caches[0].Invalidate(ctx, key); err != nil {
				invalidateErrs.Add(1)
			}
		}
	})

	time.Sleep(300 * time.Millisecond)
	migrate := func() error {
		if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src]).Err(); err != nil {
			return fmt.Errorf("SETSLOT IMPORTING: %w", err)
		}
		if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst]).Err(); err != nil {
			return fmt.Errorf("SETSLOT MIGRATING: %w", err)
		}
		host, port, _ := strings.Cut(dst.Options().Addr, ":")
		moved := 0
		for range 200 {
			ks, err := src.ClusterGetKeysInSlot(ctx, int(slot), 1).Result()
			if err != nil {
				return fmt.Errorf("GETKEYSINSLOT: %w", err)
			}
			if len(ks) == 0 {
				break
			}
			args := []any{"MIGRATE", host, port, "", 0, 5000, "REPLACE", "KEYS"}
			for _, k := range ks {
				args = append(args, k)
			}
			if err := src.Do(ctx, args...).Err(); err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("MIGRATE %v: %w", ks, err)
			}
			moved += len(ks)
			time.Sleep(150 * time.Millisecond) // traffic meets the half-moved slot
		}
		if n, _ := src.ClusterCountKeysInSlot(ctx, int(slot)).Result(); n != 0 {
			return fmt.Errorf("%d keys still in slot %d on the source", n, slot)
		}
		for _, n := range []*redis.Client{dst, src} {
			if err := n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[dst]).Err(); err != nil {
				return fmt.Errorf("SETSLOT NODE: %w", err)
			}
		}
		for _, n := range nodes {
			if n != src && n != dst {
				if err := n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[dst]).Err(); err != nil {
					return fmt.Errorf("SETSLOT NODE: %w", err)
				}
			}
		}
		t.Logf("moved slot %d (%d keys) from %s to %s", slot, moved, srcAddr, dst.Options().Addr)
		return nil
	}
	merr := migrate()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	m.check(t, key)
	if merr != nil {
		t.Fatalf("migration: %v", merr)
	}
	longest := checkResults(t, "during the migration", res, getBound(to, 2*faultLease, 5*time.Millisecond), true)
	s := sumStats(caches...)
	epochs := invalidations.Load() + 1
	if int64(s.Loads) > 2*epochs {
		t.Errorf("%d leased loads for %d invalidation epochs, want at most 2 per epoch", s.Loads, epochs)
	}
	waitFor(t, 10*time.Second, "the slot to be served by the new master", func() bool {
		cc.ReloadState(ctx)
		return masterOf(t, cc, key) == dst.Options().Addr
	})
	if err := caches[0].Invalidate(ctx, key); err != nil {
		t.Fatalf("Invalidate after the move: %v", err)
	}
	before := r.loadCount(key)
	after := wave(ctx, caches, 4, key, r.loader(key, nil))
	checkResults(t, "after the move", after, getBound(to, 2*faultLease, 5*time.Millisecond), true)
	if n := r.loadCount(key) - before; n != 1 {
		t.Errorf("after the move: %d loads for a wave, want 1", n)
	}
	env, _ := r.stored(key)
	r.checkStored(key, version(env.Payload))
	t.Logf("%d Gets during the migration, slowest %v; %d invalidations (%d failed); %s",
		len(res), longest.Round(time.Millisecond), invalidations.Load(), invalidateErrs.Load(), cpStatsLine(s))
	r.finish()
}
