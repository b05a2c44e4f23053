package herd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

// Attacks on the hit path (hit.go): a Get's own GET before any flight,
// and the flight that starts from that GET's reply.

// A blackholed Redis, callers whose deadlines are shorter than the
// client's ReadTimeout: each hit's GET (or Peek's) is handed to a
// goroutine, the caller leaves at its deadline, and the GET times out
// later. Those timeouts are Redis failures (the GETs ran under the
// Cache's context, not the callers'), so the breaker must open, and then
// Get loads locally and Peek says ErrUnavailable at once, as when the
// flight sent the GET. The hand-off dropped the GET's result once its
// caller had left: the breaker never learned of the failures, and every
// call ended at its deadline for as long as Redis was gone.
func TestHitAbandonedGETsOpenTheBreaker(t *testing.T) {
	for _, api := range []string{"Get", "Peek"} {
		t.Run(api, func(t *testing.T) {
			r := newFaultRig(t)
			to := timeouts{dial: 500 * time.Millisecond, read: 500 * time.Millisecond, write: 500 * time.Millisecond, retries: -1}
			rdb := r.client(to)
			c := r.cache(rdb, &Options{Prefix: "abandon", BreakerThreshold: 2, BreakerCooldown: time.Minute})
			bg := context.Background()
			const key = "abandoned"
			if err := c.Set(bg, key, []byte("stored"), time.Hour); err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			if v, err := c.Get(bg, key, time.Hour, constLoader(&calls, "local")); err != nil || string(v) != "stored" {
				t.Fatalf("warm Get = (%q, %v)", v, err)
			}
			r.proxy.SetBlackhole(true)
			t.Cleanup(func() {
				r.proxy.SetBlackhole(false)
				r.proxy.Cut()
			})
			// without Redis: the call ended otherwise than at its deadline.
			call := func(ctx context.Context) (withoutRedis bool) {
				if api == "Peek" {
					_, _, err := c.Peek(ctx, key)
					if errors.Is(err, ErrUnavailable) {
						return true
					}
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("Peek on a blackholed Redis: %v, want ErrUnavailable or context.DeadlineExceeded", err)
					}
					return false
				}
				v, err := c.Get(ctx, key, time.Hour, constLoader(&calls, "local"))
				if err == nil && string(v) == "local" {
					return true
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Get on a blackholed Redis = (%q, %v), want the local load or context.DeadlineExceeded", v, err)
				}
				return false
			}
			// 40 calls of 100 ms: 8 ReadTimeouts. The breaker needs two
			// failed GETs, the first of which fails one ReadTimeout after
			// the first call.
			n, without := 0, false
			for ; n < 40 && !(without && c.Stats().BreakerOpens > 0); n++ {
				ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
				without = call(ctx)
				cancel()
			}
			if s := c.Stats(); !without || s.BreakerOpens == 0 {
				t.Fatalf("after %d %ss of 100 ms against a blackholed Redis (client ReadTimeout %v), the breaker did not open "+
					"(the GETs' timeouts were not counted): Stats %+v", n, api, to.read, s)
			}
		})
	}
}

// XFetch refreshes a read early with probability exp(−t/(βΔ)). The hit
// path draws once to decide whether to go to the flight, and the flight
// it starts drew again from the same reply: a read was an early refresh
// only when both draws said so, p² instead of p. Here p = ½ (the value
// written with Δ = ttl/(β ln 2), a fixed clock, a seeded source) over 400
// sequential Gets while the refresh they start is held: about 200 early
// refreshes are due, the double draw gave about 100.
func TestHitXFetchDrawsOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	clk := newFakeClock()
	c := withClock(newTestCache(t, rdb, &Options{EarlyRefresh: 1}), clk)
	rng := rand.New(rand.NewPCG(7, 11))
	c.rand = rng.Float64
	bg := context.Background()
	const key = "xfetch"
	const ttl = 10 * time.Minute // Δ ≈ 14 min: an envelope holds Δ up to 71 min
	delta := time.Duration(math.Round(float64(ttl) / math.Ln2))
	env := c.newEnvelope(1, []byte("v"), ttl, 0, delta)
	vkey, _ := valueKey(DefaultPrefix, key)
	if err := rdb.Set(bg, vkey, env.Encode(), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	refresh := newGatedLoader("refreshed")
	defer close(refresh.gate)
	const n = 400
	early := 0
	for i := range n {
		var o Outcome
		v, err := c.Get(WithOutcome(bg, &o), key, ttl, refresh.load)
		if err != nil || string(v) != "v" {
			t.Fatalf("Get %d = (%q, %v), want the stored v", i, v, err)
		}
		if o == OutcomeEarlyRefresh {
			early++
		}
	}
	t.Logf("%d early refreshes in %d reads", early, n)
	// 5 standard deviations of Binomial(400, ½) is 50.
	if want := n / 2; early < want-50 || early > want+50 {
		t.Errorf("%d early refreshes in %d reads at p = ½, want %d ± 50 (the double draw gives about %d)", early, n, want, n/4)
	}
	if s := c.Stats(); s.EarlyRefreshes != uint64(early) {
		t.Errorf("Stats.EarlyRefreshes = %d, outcomes said %d", s.EarlyRefreshes, early)
	}
}

// GetMany's read decides a fresh value the same way (freshHit) and then
// served the early one with a second draw: p² too.
func TestHitXFetchDrawsOnceInGetMany(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	clk := newFakeClock()
	c := withClock(newTestCache(t, rdb, &Options{EarlyRefresh: 1}), clk)
	rng := rand.New(rand.NewPCG(7, 11))
	c.rand = rng.Float64
	bg := context.Background()
	const key = "xfetch-many"
	const ttl = 10 * time.Minute
	env := c.newEnvelope(1, []byte("v"), ttl, 0, time.Duration(math.Round(float64(ttl)/math.Ln2)))
	vkey, _ := valueKey(DefaultPrefix, key)
	if err := rdb.Set(bg, vkey, env.Encode(), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	defer close(gate)
	load := func(ctx context.Context, keys []string) (map[string][]byte, error) {
		<-gate // the refresh they start waits: the value stays
		return map[string][]byte{key: []byte("refreshed")}, nil
	}
	const n = 400
	for i := range n {
		vals, err := c.GetMany(bg, []string{key}, ttl, load)
		if err != nil || string(vals[key]) != "v" {
			t.Fatalf("GetMany %d = (%q, %v), want the stored v", i, vals[key], err)
		}
	}
	early := c.Stats().EarlyRefreshes
	t.Logf("%d early refreshes in %d reads", early, n)
	if want := uint64(n / 2); early < want-50 || early > want+50 {
		t.Errorf("%d early refreshes in %d reads at p = ½, want %d ± 50 (the double draw gives about %d)", early, n, want, n/4)
	}
}

// lateKey marks a Get whose GET reply the lateHook holds.
type lateKey struct{}

// lateHook holds the GET of a marked caller after its reply came, until
// the caller's gate opens: a reply delivered late (a scheduler or GC
// pause) to a caller that sent its GET early.
type lateHook struct{ held chan struct{} }

type lateGate struct{ open chan struct{} }

func (h *lateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if g, ok := ctx.Value(lateKey{}).(*lateGate); ok && cmd.Name() == "get" {
			h.held <- struct{}{}
			<-g.open
		}
		return err
	}
}

// Read your writes through the pre-read, second round. A caller takes
// the next flight when the one it joined predates it, and took that next
// flight's answer unchecked ("it started after this caller joined").
// With pre-reads a flight that starts after the caller joined can answer
// from a GET sent before: here, the GETs of callers B, which read the
// stale v0 before Invalidate returned and whose replies reached them
// late. C starts after Invalidate returned, joins the rebuild under way
// (which cannot answer it: its commit is fenced, from before C came),
// then takes the next flight; when a B started that one, from its old
// reply, C got v0. The next flight's start is a race between C and the
// Bs, so the test runs rounds until one B won it (seen by the held
// refresh) or 20 rounds passed. C is a Get, then a GetMany, whose keys
// take the next flight likewise.
func TestHitNextFlightFromAnOlderPreRead(t *testing.T) {
	t.Parallel()
	for _, api := range []string{"Get", "GetMany"} { // what C calls
		t.Run(api, func(t *testing.T) {
			srv := redistest.Start(t)
			rdb := srv.Client(t)
			late := &lateHook{held: make(chan struct{}, 64)}
			rdb.AddHook(late)
			var armed atomic.Bool
			var dropped atomic.Int64
			release := make(chan struct{})
			obs := &Observer{Refresh: func(_ string, ev RefreshEvent) {
				if ev == RefreshDropped && armed.CompareAndSwap(true, false) {
					dropped.Add(1)
					// Hold the flight that serves the stale value for a while,
					// so that every caller taking the next flight joins it.
					select {
					case <-release:
					case <-time.After(300 * time.Millisecond):
					}
				}
			}}
			c := newTestCache(t, rdb, &Options{MaxRefreshes: 1, Observer: obs})
			w := newTestCache(t, srv.Client(t), &Options{StaleFor: time.Hour}) // another process: the writer
			bg := context.Background()
			stale := func(key string) {
				t.Helper()
				if err := w.Set(bg, key, []byte("v0"), time.Millisecond); err != nil {
					t.Fatal(err)
				}
				vkey, _ := valueKey(DefaultPrefix, key)
				waitFor(t, 5*time.Second, "v0 to go stale", func() bool {
					b, _ := rdb.Get(bg, vkey).Bytes()
					env, ok := wire.DecodeEnvelope(b)
					return ok && !time.Now().Before(env.SoftExp)
				})
			}
			// Fill the refresh pool (one slot) with a refresh that waits, so a
			// stale value served later drops its refresh, which the Observer sees.
			slot := newGatedLoader("slot")
			defer close(slot.gate)
			stale("slot")
			if v, err := c.Get(bg, "slot", time.Hour, slot.load); err != nil || string(v) != "v0" {
				t.Fatalf("stale Get of slot = (%q, %v)", v, err)
			}
			slot.waitEntered(t)

			const lateBs = 6
			rounds, violations := 0, 0
			for ; rounds < 20 && dropped.Load() == 0; rounds++ {
				key := fmt.Sprintf("next-flight-%d", rounds)
				// A leads a rebuild that waits.
				a := newGatedLoader("a")
				aDone := make(chan result, 1)
				go func() {
					v, err := c.Get(bg, key, time.Hour, a.load)
					aDone <- result{val: v, err: err}
				}()
				a.waitEntered(t)
				// The Bs read v0, stale, and their replies are held.
				stale(key)
				gate := &lateGate{open: make(chan struct{})}
				var openGate sync.Once
				t.Cleanup(func() { openGate.Do(func() { close(gate.open) }) })
				var bs sync.WaitGroup
				for range lateBs {
					bs.Go(func() {
						c.Get(context.WithValue(bg, lateKey{}, gate), key, time.Hour, a.load)
					})
				}
				// The Bs share reads: the first one's GET, sent from its own
				// goroutine (its ctx cannot end), is held; the others gather
				// behind it and are sent by a reader.
				select {
				case <-late.held:
				case <-time.After(10 * time.Second):
					t.Fatal("no B's GET was sent from its own goroutine")
				}
				if err := w.Invalidate(bg, key); err != nil {
					t.Fatal(err)
				}
				// C starts after Invalidate returned.
				cDone := make(chan result, 1)
				go func() {
					if api == "GetMany" {
						vals, err := c.GetMany(bg, []string{key}, time.Hour, func(context.Context, []string) (map[string][]byte, error) {
							return map[string][]byte{key: []byte("current")}, nil
						})
						cDone <- result{val: vals[key], err: err}
						return
					}
					v, err := c.Get(bg, key, time.Hour, func(context.Context) ([]byte, error) { return []byte("current"), nil })
					cDone <- result{val: v, err: err}
				}()
				waitFlightJoiners(t, c, key, 1) // C joins A's rebuild (the Bs' replies are held)
				openGate.Do(func() { close(gate.open) })
				waitFlightJoiners(t, c, key, 1+lateBs) // the Bs join it too, after C
				armed.Store(true)
				close(a.gate)
				if r := <-aDone; r.err != nil {
					t.Fatalf("A: %v", r.err)
				}
				r := <-cDone
				bs.Wait()
				armed.Store(false)
				if r.err == nil && string(r.val) == "v0" {
					violations++
				}
			}
			close(release)
			t.Logf("%d rounds, %d in which a B started the next flight", rounds, dropped.Load())
			if violations > 0 {
				t.Errorf("a Get that started after Invalidate returned got v0, written before it (%d of %d rounds)", violations, rounds)
			}
		})
	}
}

// The claims that held: what was tried, each with a ctx that can end (the
// hand-off path) and one that cannot (the caller's own GET).

func hitContexts() map[string]func() (context.Context, context.CancelFunc) {
	return map[string]func() (context.Context, context.CancelFunc){
		"background": func() (context.Context, context.CancelFunc) { return context.Background(), func() {} },
		"cancellable": func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Minute)
		},
	}
}

// Read your writes across processes through the hit: after Set,
// Invalidate, over a stale value, a negative entry, a pass mark and an
// early-refresh-due value, a Get in another process sees the write.
func TestHitReadYourWritesHolds(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for name, mk := range hitContexts() {
		t.Run(name, func(t *testing.T) {
			// One freshness clock for the reader and the writer: "stale" is
			// a step of it, not a wait (the values' hard TTL, an hour past
			// their fresh period, is Redis's real time).
			clk := newFakeClock()
			c := withClock(newTestCache(t, srv.Client(t), &Options{NegativeTTL: time.Hour, EarlyRefresh: 1e6, StaleFor: time.Hour}), clk)
			w := withClock(newTestCache(t, srv.Client(t), &Options{StaleFor: time.Hour}), clk)
			rdb := srv.Client(t)
			bg := context.Background()
			var calls atomic.Int64
			get := func(key, load string) ([]byte, error) {
				ctx, cancel := mk()
				defer cancel()
				return c.Get(ctx, key, time.Hour, func(context.Context) ([]byte, error) {
					calls.Add(1)
					if load == "" {
						return nil, ErrNotFound
					}
					return []byte(load), nil
				})
			}
			check := func(what string, v []byte, err error, want string) {
				t.Helper()
				if err != nil || string(v) != want {
					t.Errorf("%s: Get = (%q, %v), want %q", what, v, err, want)
				}
			}
			for _, before := range []string{"fresh", "stale", "negative", "pass", "early"} {
				key := name + "-" + before
				vkey, _ := valueKey(DefaultPrefix, key)
				switch before {
				case "fresh":
					if err := w.Set(bg, key, []byte("old"), time.Hour); err != nil {
						t.Fatal(err)
					}
				case "stale":
					if err := w.Set(bg, key, []byte("old"), time.Millisecond); err != nil {
						t.Fatal(err)
					}
					clk.Advance(5 * time.Millisecond)
				case "negative":
					if _, err := get(key, ""); !errors.Is(err, ErrNotFound) {
						t.Fatalf("negative load: %v", err)
					}
				case "pass":
					e := c.newEnvelope(1, []byte("reason"), time.Hour, 0, 0)
					e.Pass = true
					if err := rdb.Set(bg, vkey, e.Encode(), time.Hour).Err(); err != nil {
						t.Fatal(err)
					}
				case "early":
					e := c.newEnvelope(1, []byte("old"), time.Hour, 0, time.Hour)
					if err := rdb.Set(bg, vkey, e.Encode(), time.Hour).Err(); err != nil {
						t.Fatal(err)
					}
				}
				if err := w.Set(bg, key, []byte("new"), time.Hour); err != nil {
					t.Fatal(err)
				}
				v, err := get(key, "loaded")
				check(before+" then Set", v, err, "new")
				if err := w.Invalidate(bg, key); err != nil {
					t.Fatal(err)
				}
				v, err = get(key, "loaded-"+before)
				check(before+" then Set, Invalidate", v, err, "loaded-"+before)
			}
		})
	}
}

// Corrupt bytes, a hash at the value key, a 1 MB key and hostile keys:
// a miss (corrupt counted once per Get), rebuilt and then hit, no error.
func TestHitHostileValuesAndKeys(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for name, mk := range hitContexts() {
		t.Run(name, func(t *testing.T) {
			rdb := srv.Client(t)
			c := newTestCache(t, rdb, &Options{Prefix: "hostile-" + name})
			bg := context.Background()
			var calls atomic.Int64
			get := func(key string) ([]byte, error) {
				ctx, cancel := mk()
				defer cancel()
				return c.Get(ctx, key, time.Hour, constLoader(&calls, "rebuilt:"+key[:min(len(key), 8)]))
			}
			bigKey := strings.Repeat("k", 1<<20)
			keys := []string{"garbage", "hash", "short", bigKey, "{}\x00\r\n*3\r\n$3\r\nDEL", "}{", strings.Repeat("{", 1000)}
			for _, key := range keys {
				vkey, _ := valueKey("hostile-"+name, key)
				switch key {
				case "garbage":
					rdb.Set(bg, vkey, "\x01garbage-bytes", 0)
				case "hash":
					rdb.HSet(bg, vkey, "a", "b")
				case "short":
					rdb.Set(bg, vkey, []byte{wire.EnvelopeVersion}, 0)
				}
				want := "rebuilt:" + key[:min(len(key), 8)]
				for i := range 3 {
					v, err := get(key)
					if err != nil || string(v) != want {
						t.Errorf("key %.20q, Get %d = (%.20q, %v), want %q", key, i, v, err, want)
					}
				}
			}
			s := c.Stats()
			if s.Corrupt != 2 || s.Loads != uint64(len(keys)) || s.Hits != uint64(2*len(keys)) {
				t.Errorf("Stats: Corrupt %d (want 2), Loads %d (want %d), Hits %d (want %d)", s.Corrupt, s.Loads, len(keys), s.Hits, 2*len(keys))
			}
		})
	}
}

// A miss of a new key after a miss is ACQUIRE, COMMIT (a cold read: the
// first miss of a new Cache is GET, ACQUIRE, COMMIT), and a hit one GET,
// with a ctx that can end; each hit is counted once with its outcome.
func TestHitRoundTripsAndCounts(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	var lookups sync.Map
	c := newTestCache(t, rdb, &Options{Observer: &Observer{Lookup: func(_ string, o Outcome) {
		n, _ := lookups.LoadOrStore(o, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var calls atomic.Int64
	if _, err := c.Get(ctx, "warm", time.Hour, constLoader(&calls, "w")); err != nil {
		t.Fatal(err)
	}
	log := &cmdLog{}
	rdb.AddHook(log)
	var o Outcome
	if _, err := c.Get(WithOutcome(ctx, &o), "rt", time.Hour, constLoader(&calls, "v")); err != nil || o != OutcomeLeader {
		t.Fatalf("miss: %v, outcome %v", err, o)
	}
	if got := strings.Join(log.take(), " "); got != "evalsha evalsha" {
		t.Errorf("a miss sent %q, want evalsha evalsha (the warm miss turned cold reads on: ACQUIRE, COMMIT)", got)
	}
	for range 50 { // one after another: each its own GET
		var o Outcome
		v, err := c.Get(WithOutcome(ctx, &o), "rt", time.Hour, constLoader(&calls, "x"))
		if err != nil || string(v) != "v" || o != OutcomeHit {
			t.Errorf("hit = (%q, %v), outcome %v", v, err, o)
		}
	}
	gets := hitGETs(t, log)
	if gets != 50 {
		t.Errorf("50 hits sent %d GETs, want 50", gets)
	}
	n, _ := lookups.Load(OutcomeHit)
	if s := c.Stats(); s.Hits != 50 || n == nil || n.(*atomic.Int64).Load() != 50 {
		t.Errorf("Stats.Hits = %d, Observer hits %v, want 50 each", s.Hits, n)
	}
}

// The breaker: while troubled, hits go to the flight, which probes after
// the cooldown; a Redis that comes back closes the breaker and the next
// hits are plain hits again.
func TestHitBreakerProbesAndCloses(t *testing.T) {
	r := newFaultRig(t)
	to := timeouts{dial: 300 * time.Millisecond, read: 300 * time.Millisecond, write: 300 * time.Millisecond, retries: -1}
	rdb := r.client(to)
	var circuit []bool
	var mu sync.Mutex
	c := r.cache(rdb, &Options{Prefix: "brk", BreakerThreshold: 2, BreakerCooldown: 300 * time.Millisecond,
		Observer: &Observer{Circuit: func(open bool) { mu.Lock(); circuit = append(circuit, open); mu.Unlock() }}})
	bg := context.Background()
	if err := c.Set(bg, "b", []byte("stored"), time.Hour); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	r.proxy.SetBlackhole(true)
	for range 4 {
		v, err := c.Get(bg, "b", time.Hour, constLoader(&calls, "local"))
		if err != nil || string(v) != "local" {
			t.Fatalf("Get on a blackholed Redis = (%q, %v), want the local load", v, err)
		}
	}
	if s := c.Stats(); s.BreakerOpens != 1 {
		t.Fatalf("BreakerOpens = %d, want 1", s.BreakerOpens)
	}
	r.proxy.SetBlackhole(false)
	r.proxy.Cut()
	waitFor(t, 20*to.read, "a hit after Redis came back", func() bool {
		ctx, cancel := context.WithTimeout(bg, time.Minute)
		defer cancel()
		var o Outcome
		v, err := c.Get(WithOutcome(ctx, &o), "b", time.Hour, constLoader(&calls, "local"))
		return err == nil && string(v) == "stored" && o == OutcomeHit
	})
	mu.Lock()
	defer mu.Unlock()
	if len(circuit) != 2 || !circuit[0] || circuit[1] {
		t.Errorf("circuit events %v, want [true false]", circuit)
	}
	if c.brk.troubled.Load() {
		t.Error("the breaker is still troubled after the hits")
	}
}

// Master-only reads with a handed-off hit: a ReadOnly cluster client
// whose replica lags serves the master's value, not the replica's.
func TestHitReplicaReadsHandedOff(t *testing.T) {
	t.Parallel()
	cl := redistest.StartClusterReplicas(t, 3, 1)
	bg := context.Background()
	ro := cl.Client(t, func(o *redis.ClusterOptions) { o.ReadOnly = true })
	c := newTestCache(t, ro, &Options{ReplicaAcks: -1})
	const key = "handed-off"
	vkey := mustKeys(t, key).Value
	master, replica := slotNodes(t, ro, vkey)
	if err := c.Set(bg, key, []byte("v1"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if n, err := master.Wait(bg, 1, 10_000).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}
	for _, kv := range [][2]string{{"masteruser", "herd-test-nobody"}, {"masterauth", "wrong"}} {
		if err := replica.ConfigSet(bg, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := replica.Do(bg, "CLIENT", "KILL", "TYPE", "master").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the replica's master link to go down", func() bool {
		return strings.Contains(replica.Info(bg, "replication").Val(), "master_link_status:down")
	})
	if err := c.Set(bg, key, []byte("v2"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if b, _ := ro.Get(bg, vkey).Bytes(); !bytesHavePayload(b, "v1") {
		t.Fatal("the ReadOnly client's own GET does not reach the stale replica (the test proves nothing)")
	}
	var calls atomic.Int64
	for i := range 5 {
		ctx, cancel := context.WithTimeout(bg, time.Minute)
		v, err := c.Get(ctx, key, time.Hour, constLoader(&calls, "loaded"))
		cancel()
		if err != nil || !bytes.Equal(v, []byte("v2")) {
			t.Errorf("handed-off Get %d after Set(v2) = (%q, %v), want v2", i, v, err)
		}
	}
}
