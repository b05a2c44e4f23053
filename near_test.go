package herd

// Tests of the near cache (near.go) on a real redis-server: invalidation
// by other Caches and by this one, the staleness bound with a blocked
// subscriber, a killed pub/sub connection, a Redis restart, MaxAge and the
// fresh period, fills racing writes, coalesced fills, negative entries,
// commits and tag purges, bounded memory, a Cluster, Close. Cross-process
// tests are in near_process_test.go.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// nearTestStaleness is the Staleness of the tests' near caches: the
// bound they check, and far above a loopback round trip.
const nearTestStaleness = 300 * time.Millisecond

// newNearCache returns a Cache with the near cache on (MaxEntries 1000,
// MaxAge one minute unless near says otherwise) and waits until it serves.
func newNearCache(t testing.TB, rdb redis.UniversalClient, near NearOptions, tune func(*Options)) *Cache {
	t.Helper()
	if near.MaxEntries == 0 && near.MaxBytes == 0 {
		near.MaxEntries = 1000
	}
	setDefault(&near.MaxAge, time.Minute)
	setDefault(&near.Staleness, nearTestStaleness)
	opt := &Options{Near: near, DefaultLease: time.Second}
	if tune != nil {
		tune(opt)
	}
	c := newTestCache(t, rdb, opt)
	// Each of the tests' Caches plays a process of its own: the writes of
	// another Cache of the process would drop its copies at once (see
	// nearPeers), and the tests check the pub/sub path.
	c.leaveNearPeers()
	waitServing(t, c)
	return c
}

// waitServing waits until c's near cache serves hits.
func waitServing(t testing.TB, c *Cache) {
	t.Helper()
	waitFor(t, 15*time.Second, "the near cache to serve", func() bool { return nearServing(c) })
}

// noLoad is a loader that must not run.
func noLoad(t testing.TB) LoadFunc {
	return func(context.Context) ([]byte, error) {
		t.Errorf("the loader ran")
		return nil, errors.New("the loader must not run")
	}
}

// getString is Get with a loader that must not run.
func getString(t testing.TB, c *Cache, key string) string {
	t.Helper()
	v, err := c.Get(context.Background(), key, time.Minute, noLoad(t))
	if err != nil {
		t.Fatalf("Get %q: %v", key, err)
	}
	return string(v)
}

// warm Gets key from c until c holds a near copy (a message of an
// earlier write that lands during a fill makes it store nothing), and
// checks the value.
func warm(t *testing.T, c *Cache, key, want string) {
	t.Helper()
	waitFor(t, 5*time.Second, "a near copy of "+key, func() bool {
		if got := getString(t, c, key); got != want {
			t.Fatalf("Get %q = %q, want %q", key, got, want)
		}
		return nearHas(c, key)
	})
}

// nearServing reports whether c's near cache serves hits now.
func nearServing(c *Cache) bool { return c.near.serving(c.near.mono()) }

// nearHas reports whether c holds a near copy of key.
func nearHas(c *Cache, key string) bool {
	_, ok := c.near.store.GetIfPresent(key)
	return ok
}

// rawSet writes val at key's value name as a client outside herd would:
// an envelope fresh for ttl by c's clock, with no fence and no message.
func rawSet(t *testing.T, rdb redis.UniversalClient, c *Cache, key, val string, ttl time.Duration) {
	t.Helper()
	rawSetEnv(t, rdb, key, c.newEnvelope(0, []byte(val), ttl, 0, 0))
}

// rawSetEnv writes env at key's value name, as rawSet does.
func rawSetEnv(t *testing.T, rdb redis.UniversalClient, key string, env *envelope) {
	t.Helper()
	k := mustKeys(t, key)
	if err := rdb.Set(context.Background(), k.Value, env.Encode(), 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// setHooks installs hooks on c's near cache.
func setHooks(c *Cache, h *nearHooks) { c.near.hooks.Store(h) }

// gate blocks whoever passes it while it is shut.
type gate struct {
	shut   atomic.Bool
	mu     sync.Mutex
	open   chan struct{}
	passed atomic.Int64 // callers that reached the gate while it was shut
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) close() {
	g.mu.Lock()
	g.open = make(chan struct{})
	g.mu.Unlock()
	g.shut.Store(true)
}

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut.Swap(false) {
		close(g.open)
	}
}

func (g *gate) pass() {
	if !g.shut.Load() {
		return
	}
	g.passed.Add(1)
	g.mu.Lock()
	ch := g.open
	g.mu.Unlock()
	<-ch
}

func TestNearOptionsValidate(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]NearOptions{
		"negative MaxEntries":  {MaxEntries: -1},
		"negative MaxBytes":    {MaxBytes: -1},
		"both bounds":          {MaxEntries: 1, MaxBytes: 1},
		"negative MaxAge":      {MaxEntries: 1, MaxAge: -time.Second},
		"MaxAge below 1ms":     {MaxEntries: 1, MaxAge: time.Microsecond},
		"Staleness below 10ms": {MaxEntries: 1, Staleness: 5 * time.Millisecond},
		"negative Staleness":   {MaxEntries: 1, Staleness: -time.Second},
		"MaxAge without bound": {MaxAge: time.Second},
		"Staleness, no bound":  {Staleness: time.Second},
		"MaxAge above 50y":     {MaxEntries: 1, MaxAge: maxTTL + 1},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), "Options.Near") {
					t.Fatalf("New did not panic naming Options.Near: %v", r)
				}
			}()
			rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
			defer rdb.Close()
			New(rdb, &Options{Near: o})
		})
	}
	cfg := (&Options{}).resolve()
	if cfg.near.on {
		t.Error("the zero NearOptions turned the near cache on")
	}
	cfg = (&Options{Near: NearOptions{MaxBytes: 1 << 20}}).resolve()
	if !cfg.near.on || cfg.near.maxAge != defaultNearMaxAge || cfg.near.staleness != defaultNearStaleness {
		t.Errorf("defaults: %+v", cfg.near)
	}
}

// A near hit after a fill; another Cache's Set drops the copy; this
// Cache's own Set drops it before returning, without the message.
func TestNearInvalidation(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	b := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	ctx := context.Background()
	const key = "near-inval"
	if err := a.Set(ctx, key, []byte("v1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	warm(t, b, key, "v1")
	before := b.Stats()
	for range 5 {
		if got := getString(t, b, key); got != "v1" {
			t.Fatalf("near Get = %q", got)
		}
	}
	if d := statsDelta(before, b.Stats()); d.NearHits != 5 || d.Hits != 0 {
		t.Fatalf("5 Gets of a near copy: %+v", d)
	}

	// Another process's write: the message drops b's copy.
	if err := a.Set(ctx, key, []byte("v2"), time.Minute); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "b's copy to be dropped", func() bool { return !nearHas(b, key) })
	if got := getString(t, b, key); got != "v2" {
		t.Fatalf("after a's Set: %q", got)
	}
	if b.Stats().NearInvalidations == 0 {
		t.Error("no invalidation counted")
	}
	warm(t, b, key, "v2")
	if err := a.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "b's copy to be dropped by a's Invalidate", func() bool { return !nearHas(b, key) })
	if err := a.Set(ctx, key, []byte("v2"), time.Minute); err != nil {
		t.Fatal(err)
	}

	// This Cache's write: its copy goes before Set returns, with its
	// subscriber blocked (so the message cannot be what drops it).
	warm(t, b, key, "v2")
	g := newGate()
	setHooks(b, &nearHooks{receive: func(string, uint64, any, error) { g.pass() }})
	g.close()
	defer g.release()
	if err := b.Set(ctx, key, []byte("v3"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := getString(t, b, key); got != "v3" {
		t.Fatalf("Get after this Cache's Set = %q", got)
	}
	if err := b.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	v, err := b.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) { return []byte("loaded"), nil })
	if err != nil || string(v) != "loaded" {
		t.Fatalf("Get after this Cache's Invalidate = %q, %v", v, err)
	}
}

// The staleness bound: with b's subscriber blocked (no message, no PONG
// is handled), b stops serving its near copy once Staleness has passed
// since a's write returned, and reads Redis; it serves from memory again
// once the subscriber goes on.
func TestNearStalenessBound(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil) // a writer without a near cache still invalidates
	b := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	ctx := context.Background()
	const key = "near-bound"
	if err := a.Set(ctx, key, []byte("old"), time.Minute); err != nil {
		t.Fatal(err)
	}
	warm(t, b, key, "old")
	g := newGate()
	setHooks(b, &nearHooks{receive: func(string, uint64, any, error) { g.pass() }})
	g.close()
	released := false
	defer func() {
		if !released {
			g.release()
		}
	}()
	if err := a.Set(ctx, key, []byte("new"), time.Minute); err != nil {
		t.Fatal(err)
	}
	acked := time.Now()
	before := b.Stats()
	served := map[string]int{}
	for {
		start := time.Now()
		got := getString(t, b, key)
		served[got]++
		if start.Sub(acked) > nearTestStaleness {
			if got != "new" {
				t.Fatalf("a Get %v after the write returned served %q (bound %v)", start.Sub(acked), got, nearTestStaleness)
			}
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// And every later one, while the subscriber stays blocked.
	for range 20 {
		if got := getString(t, b, key); got != "new" {
			t.Fatalf("after the bound: %q", got)
		}
	}
	d := statsDelta(before, b.Stats())
	if d.NearBypassed == 0 {
		t.Errorf("no Get bypassed the near cache while its heartbeat was late: %+v", d)
	}
	t.Logf("within the bound b served %v; near hits %d, bypassed %d", served, d.NearHits, d.NearBypassed)
	if g.passed.Load() == 0 {
		t.Fatal("the subscriber never reached the gate")
	}

	g.release()
	released = true
	waitServing(t, b)
	warm(t, b, key, "new")
	before = b.Stats()
	if got := getString(t, b, key); got != "new" {
		t.Fatalf("after the subscriber went on: %q", got)
	}
	if d := statsDelta(before, b.Stats()); d.NearHits != 1 {
		t.Errorf("the near cache did not serve again: %+v", d)
	}
}

// CLIENT KILL TYPE pubsub: the near cache is flushed and stops serving;
// it stays off while the new SUBSCRIBE is not sent, and while it is sent
// but not confirmed; Gets read Redis meanwhile (values written outside
// herd, which no message announces, show it); then it serves again.
func TestNearPubSubKilled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	admin := srv.Client(t)
	b := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	ctx := context.Background()
	const key = "near-kill"
	rawSet(t, rdb, b, key, "v1", time.Hour)
	warm(t, b, key, "v1")
	resub, confirm := newGate(), newGate()
	var confirmSeen atomic.Bool
	setHooks(b, &nearHooks{
		resubscribe: func(string) { resub.pass() },
		receive: func(_ string, gen uint64, msg any, _ error) {
			if _, ok := msg.(*redis.Subscription); ok && gen > 1 {
				confirmSeen.Store(true)
				confirm.pass()
			}
		},
	})
	resub.close()
	confirm.close()
	defer resub.release()
	defer confirm.release()
	flushes := b.Stats().NearFlushes
	if err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the near cache to notice", func() bool { return resub.passed.Load() > 0 })
	if nearServing(b) || nearHas(b, key) || b.Stats().NearFlushes == flushes {
		t.Fatalf("after the kill: serving %v, copy %v, flushes %d", nearServing(b), nearHas(b, key), b.Stats().NearFlushes-flushes)
	}
	rawSet(t, rdb, b, key, "v2", time.Hour)
	before := b.Stats()
	if got := getString(t, b, key); got != "v2" {
		t.Fatalf("unsubscribed: Get = %q, want v2 from Redis", got)
	}
	if d := statsDelta(before, b.Stats()); d.NearBypassed != 1 || d.Hits != 1 {
		t.Fatalf("unsubscribed: %+v", d)
	}

	// SUBSCRIBE sent, its confirmation held.
	resub.release()
	waitFor(t, 10*time.Second, "the SUBSCRIBE to reach the server", func() bool {
		m, _ := admin.PubSubNumSub(ctx, nearChannel(DefaultPrefix)).Result()
		return m[nearChannel(DefaultPrefix)] >= 1 && confirmSeen.Load()
	})
	rawSet(t, rdb, b, key, "v3", time.Hour)
	for range 3 {
		if got := getString(t, b, key); got != "v3" {
			t.Fatalf("subscribed, unconfirmed: Get = %q, want v3 from Redis", got)
		}
	}
	if nearHas(b, key) {
		t.Fatal("a fill stored a copy before the subscription was confirmed")
	}

	confirm.release()
	waitServing(t, b)
	warm(t, b, key, "v3")
	before = b.Stats()
	if got := getString(t, b, key); got != "v3" {
		t.Fatalf("resubscribed: Get = %q", got)
	}
	if d := statsDelta(before, b.Stats()); d.NearHits != 1 {
		t.Errorf("resubscribed: not served from memory: %+v", d)
	}
}

// A Redis restart: the near cache stops serving and is flushed; a write
// made while this process is not subscribed again (its message is lost
// to it) is seen once it serves again.
func TestNearRedisRestarted(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	b := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	ctx := context.Background()
	const key = "near-restart"
	if err := a.Set(ctx, key, []byte("v1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	warm(t, b, key, "v1")
	resub := newGate()
	setHooks(b, &nearHooks{resubscribe: func(string) { resub.pass() }})
	resub.close()
	defer resub.release()
	srv.Restart(t)
	waitFor(t, 10*time.Second, "the near cache to notice", func() bool { return resub.passed.Load() > 0 })
	if nearServing(b) || nearHas(b, key) {
		t.Fatal("still serving after the restart")
	}
	waitFor(t, 10*time.Second, "a's Set to go through", func() bool {
		return a.Set(ctx, key, []byte("v2"), time.Minute) == nil
	})
	for range 3 {
		v, err := b.Get(ctx, key, time.Minute, noLoad(t))
		if err == nil && string(v) != "v2" {
			t.Fatalf("unsubscribed after the restart: Get = %q", v)
		}
	}
	resub.release()
	waitServing(t, b)
	warm(t, b, key, "v2")
}

// MaxAge caps a near copy whatever the invalidations (values written
// outside herd are not announced); a copy never outlives its fresh period,
// nor, with EarlyRefresh, the window in which XFetch may refresh.
func TestNearMaxAge(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	clock := newFakeClock()
	const maxAge = 10 * time.Second
	b := newNearCache(t, srv.Client(t), NearOptions{MaxAge: maxAge}, func(o *Options) { o.StaleFor = time.Hour })
	b.now = clock.Now
	ctx := context.Background()

	t.Run("MaxAge", func(t *testing.T) {
		const key = "near-age"
		rawSet(t, rdb, b, key, "v1", time.Hour)
		warm(t, b, key, "v1")
		rawSet(t, rdb, b, key, "v2", time.Hour)
		clock.Advance(maxAge - time.Millisecond)
		if got := getString(t, b, key); got != "v1" {
			t.Fatalf("within MaxAge: %q, want the near copy v1", got)
		}
		clock.Advance(time.Millisecond)
		before := b.Stats()
		if got := getString(t, b, key); got != "v2" {
			t.Fatalf("at MaxAge: %q, want v2 from Redis", got)
		}
		if d := statsDelta(before, b.Stats()); d.NearHits != 0 || d.NearMisses != 1 {
			t.Errorf("at MaxAge: %+v", d)
		}
	})

	t.Run("FreshPeriod", func(t *testing.T) {
		const key = "near-fresh"
		rawSetEnv(t, rdb, key, b.newEnvelope(0, []byte("v1"), time.Second, time.Hour, 0)) // fresh 1s, then stale for 1h
		warm(t, b, key, "v1")
		clock.Advance(time.Second - time.Millisecond)
		if got := getString(t, b, key); got != "v1" || b.Stats().NearHits == 0 {
			t.Fatalf("fresh: %q", got)
		}
		clock.Advance(time.Millisecond)
		refreshed := make(chan struct{})
		var o Outcome
		before := b.Stats()
		v, err := b.Get(WithOutcome(ctx, &o), key, time.Minute, func(context.Context) ([]byte, error) {
			close(refreshed)
			return []byte("v2"), nil
		})
		if err != nil || string(v) != "v1" || o != OutcomeStale {
			t.Fatalf("at the end of the fresh period: %q, %v, %v; want the stale v1 from Redis", v, err, o)
		}
		if d := statsDelta(before, b.Stats()); d.NearHits != 0 || d.StaleServed != 1 {
			t.Errorf("at the end of the fresh period: %+v", d)
		}
		<-refreshed
	})

	t.Run("EarlyRefreshWindow", func(t *testing.T) {
		e := newNearCache(t, srv.Client(t), NearOptions{MaxAge: maxAge}, func(o *Options) { o.EarlyRefresh = 1 })
		e.now = clock.Now
		e.rand = func() float64 { return 0 } // XFetch never due
		const key = "near-xfetch"
		rawSetEnv(t, rdb, key, e.newEnvelope(0, []byte("v1"), 5*time.Second, 0, time.Second)) // Δ 1s: window 3s
		warm(t, e, key, "v1")
		clock.Advance(2*time.Second - time.Millisecond)
		before := e.Stats()
		getString(t, e, key)
		if d := statsDelta(before, e.Stats()); d.NearHits != 1 {
			t.Fatalf("before the window: %+v", d)
		}
		clock.Advance(time.Millisecond)
		before = e.Stats()
		getString(t, e, key)
		if d := statsDelta(before, e.Stats()); d.NearHits != 0 || d.Hits != 1 {
			t.Fatalf("in the window: %+v (want a Redis hit, where XFetch may refresh)", d)
		}
	})
}

// A fill that read the key before a write of this process, or before a
// message of another's, does not store what it read; a caller that joins
// it after a write of its own process returned does not take its answer.
func TestNearFillRacesWrite(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	b := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	ctx := context.Background()

	for _, writer := range []string{"this process", "another process"} {
		t.Run(writer, func(t *testing.T) {
			key := "near-race-" + strings.ReplaceAll(writer, " ", "-")
			heard := b.Stats().NearInvalidations
			if err := a.Set(ctx, key, []byte("old"), time.Minute); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5*time.Second, "the message of the first write", func() bool { return b.Stats().NearInvalidations == heard+1 })
			fill, joined := newGate(), make(chan struct{}, 8)
			setHooks(b, &nearHooks{
				beforeFill: func(string) { fill.pass() },
				joined:     func(string) { joined <- struct{}{} },
			})
			defer setHooks(b, nil)
			fill.close()
			first := make(chan string, 1)
			go func() {
				v, _ := b.Get(ctx, key, time.Minute, noLoad(t))
				first <- string(v)
			}()
			<-joined
			waitFor(t, 5*time.Second, "the fill to read Redis", func() bool { return fill.passed.Load() == 1 })
			w := b
			if writer == "another process" {
				w = a
			}
			heard = b.Stats().NearInvalidations
			if err := w.Set(ctx, key, []byte("new"), time.Minute); err != nil {
				t.Fatal(err)
			}
			if w == a {
				waitFor(t, 5*time.Second, "the message", func() bool { return b.Stats().NearInvalidations == heard+1 })
			}
			late := make(chan string, 1)
			go func() {
				v, _ := b.Get(ctx, key, time.Minute, noLoad(t))
				late <- string(v)
			}()
			<-joined
			fill.release()
			t.Logf("the first caller got %q", <-first) // it joined before the write: either
			if got := <-late; got != "new" && w == b {
				t.Fatalf("a caller that joined the fill after its own process's Set returned got %q", got)
			}
			if nearHas(b, key) {
				if e, _ := b.near.store.GetIfPresent(key); string(e.val) == "old" {
					t.Fatal("the fill stored the value it read before the write")
				}
			}
			if got := getString(t, b, key); got != "new" {
				t.Fatalf("Get after the race = %q", got)
			}
			// b hears its own Set too: let that message land here, not in
			// the next subtest's count of the first write's message.
			waitFor(t, 5*time.Second, "the message of the Set", func() bool { return b.Stats().NearInvalidations == heard+1 })
		})
	}
}

// A hot key whose near copy was dropped: 64 callers, one GET.
func TestNearFillCoalesces(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	var gets atomic.Int64
	k := mustKeys(t, "near-hot")
	rdb.AddHook(countGets{key: k.Value, n: &gets})
	b := newNearCache(t, rdb, NearOptions{}, nil)
	ctx := context.Background()
	if err := b.Set(ctx, "near-hot", []byte("v"), time.Minute); err != nil {
		t.Fatal(err)
	}
	// The Set's own message, which would refuse a fill it lands in.
	waitFor(t, 5*time.Second, "the Set's message", func() bool { return b.Stats().NearInvalidations == 1 })
	const callers = 64
	var joins atomic.Int64
	fill := newGate()
	setHooks(b, &nearHooks{
		beforeFill: func(string) { fill.pass() },
		joined:     func(string) { joins.Add(1) },
	})
	fill.close()
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			if got := getString(t, b, "near-hot"); got != "v" {
				t.Errorf("Get = %q", got)
			}
		})
	}
	waitFor(t, 10*time.Second, "every caller to join the fill", func() bool { return joins.Load() == callers })
	fill.release()
	wg.Wait()
	for range 100 {
		getString(t, b, "near-hot")
	}
	if n := gets.Load(); n != 1 {
		t.Errorf("%d callers and 100 more Gets sent %d GETs, want 1", callers, n)
	}
	if s := b.Stats(); s.NearMisses != callers || s.NearHits != 100 {
		t.Errorf("stats %+v", s)
	}
}

// countGets counts the GETs of one key.
type countGets struct {
	key string
	n   *atomic.Int64
}

func (countGets) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countGets) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); strings.EqualFold(cmd.Name(), "get") && len(a) == 2 && a[1] == h.key {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (countGets) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Negative entries are kept near and dropped by a write.
func TestNearNegative(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	b := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	ctx := context.Background()
	const key = "near-negative"
	notFound := func(context.Context) ([]byte, error) { return nil, ErrNotFound }
	if _, err := b.Get(ctx, key, time.Minute, notFound); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "a near copy of the negative entry", func() bool {
		if _, err := b.Get(ctx, key, time.Minute, noLoad(t)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("negative entry: %v", err)
		}
		return nearHas(b, key)
	})
	before := b.Stats()
	var o Outcome
	if _, err := b.Get(WithOutcome(ctx, &o), key, time.Minute, noLoad(t)); !errors.Is(err, ErrNotFound) || o != OutcomeNegative {
		t.Fatalf("near negative: %v, %v", err, o)
	}
	if d := statsDelta(before, b.Stats()); d.NearHits != 1 {
		t.Fatalf("%+v", d)
	}
	if err := a.Set(ctx, key, []byte("found"), time.Minute); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the negative copy to be dropped", func() bool { return !nearHas(b, key) })
	if got := getString(t, b, key); got != "found" {
		t.Fatalf("after the Set: %q", got)
	}
}

// A leader's COMMIT announces the new value: a near copy of a value that
// vanished from Redis without a message (deleted outside herd) goes when
// another process rebuilds the key.
func TestNearCommitInvalidates(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	a := newTestCache(t, srv.Client(t), nil)
	b := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	ctx := context.Background()
	const key = "near-commit"
	if err := a.Set(ctx, key, []byte("v1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	warm(t, b, key, "v1")
	if err := rdb.Del(ctx, mustKeys(t, key).Value).Err(); err != nil {
		t.Fatal(err)
	}
	v, err := a.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) { return []byte("v2"), nil })
	if err != nil || string(v) != "v2" {
		t.Fatalf("a's rebuild: %q, %v", v, err)
	}
	waitFor(t, 5*time.Second, "b's copy to be dropped", func() bool { return !nearHas(b, key) })
	if got := getString(t, b, key); got != "v2" {
		t.Fatalf("b after a's commit: %q", got)
	}

	// A Fill's Commit, and a Pass mark, likewise.
	warm(t, b, key, "v2")
	rdb.Del(ctx, mustKeys(t, key).Value)
	_, fill, err := a.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin: %v, %v", fill, err)
	}
	if err := fill.Commit([]byte("v3"), time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "b's copy to be dropped by the Fill", func() bool { return !nearHas(b, key) })
	if got := getString(t, b, key); got != "v3" {
		t.Fatalf("b after the Fill: %q", got)
	}
	warm(t, b, key, "v3")
	rdb.Del(ctx, mustKeys(t, key).Value)
	_, fill, err = a.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin: %v, %v", fill, err)
	}
	if err := fill.Pass(nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "b's copy to be dropped by the pass mark", func() bool { return !nearHas(b, key) })

	// This process's own commit drops its copy before Commit returns,
	// with its subscriber blocked (the message cannot be what does it).
	// (Begin serves a near copy as Get does, so the copy of v4 is put in
	// place while the Fill is open.)
	rdb.Del(ctx, mustKeys(t, key).Value)
	_, fill, err = b.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin: %v, %v", fill, err)
	}
	g := newGate()
	setHooks(b, &nearHooks{receive: func(string, uint64, any, error) { g.pass() }})
	g.close()
	defer g.release()
	n := b.near
	id := nearIDOf(key)
	if !n.insert(key, nearEntry{id: id, val: []byte("v4"), expires: time.Now().Add(time.Hour), deadline: n.mono() + int64(time.Hour), epoch: n.epoch.Load(), softExp: time.Now().Add(time.Hour)}, n.snapshot(id)) {
		t.Fatal("could not put a copy of v4 in place")
	}
	if got := getString(t, b, key); got != "v4" {
		t.Fatalf("b before its Fill's Commit: %q, want its near copy v4", got)
	}
	if err := fill.Commit([]byte("v5"), time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	if got := getString(t, b, key); got != "v5" {
		t.Fatalf("b after its own Fill's Commit: %q", got)
	}
}

// A tag purge drops the near copies of its keys: this Cache's before
// InvalidateTag returns, every other's by the INVALIDATE messages.
func TestNearTagPurge(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	b := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	ctx := context.Background()
	keys := []string{"near-tag-1", "near-tag-2", "near-tag-3"}
	for _, k := range keys {
		if err := a.Set(ctx, k, []byte("v"), time.Minute, "t"); err != nil {
			t.Fatal(err)
		}
		warm(t, a, k, "v")
		warm(t, b, k, "v")
	}
	g := newGate()
	setHooks(a, &nearHooks{receive: func(string, uint64, any, error) { g.pass() }})
	g.close()
	defer g.release()
	if err := a.InvalidateTag(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		waitFor(t, 5*time.Second, "b's copies to be dropped", func() bool { return !nearHas(b, k) })
	}
	loaded := func(context.Context) ([]byte, error) { return []byte("rebuilt"), nil }
	for _, k := range keys {
		if v, err := a.Get(ctx, k, time.Minute, loaded); err != nil || string(v) != "rebuilt" {
			t.Fatalf("a after its purge: %q, %v", v, err)
		}
	}
}

// The store stays within MaxEntries and MaxBytes, however many keys pass.
func TestNearMemoryBounded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)

	t.Run("MaxEntries", func(t *testing.T) {
		// 200,000 distinct keys (20 times the bound) through the fill's
		// insert (the store alone: as many GETs would take minutes under
		// -race), then 8,000 through Set and Get (16 times the bound).
		const bound = 10_000
		c := newNearCache(t, srv.Client(t), NearOptions{MaxEntries: bound}, nil)
		n := c.near
		val := []byte("0123456789abcdef")
		var wg sync.WaitGroup
		const workers, per = 4, 50_000
		for w := range workers {
			wg.Go(func() {
				for i := range per {
					key := strconv.Itoa(w*per + i)
					id := nearIDOf(key)
					n.insert(key, nearEntry{id: id, val: val, expires: time.Now().Add(time.Hour), epoch: n.epoch.Load()}, n.snapshot(id))
				}
			})
		}
		wg.Wait()
		n.store.CleanUp()
		// The bound is the claim; the store admits by frequency (TinyLFU), so
		// under load it may hold far fewer of 200,000 one-time keys.
		if size := n.store.EstimatedSize(); size > bound || size == 0 {
			t.Fatalf("after %d keys the store holds %d entries (bound %d)", workers*per, size, bound)
		}

		small := newNearCache(t, srv.Client(t), NearOptions{MaxEntries: 500}, nil)
		ctx := context.Background()
		var errs atomic.Int64
		for w := range 16 {
			wg.Go(func() {
				for i := w; i < 8_000; i += 16 {
					key := "near-mem-" + strconv.Itoa(i)
					if small.Set(ctx, key, val, time.Minute) != nil {
						errs.Add(1)
						continue
					}
					if v, err := small.Get(ctx, key, time.Minute, noLoad(t)); err != nil || string(v) != string(val) {
						errs.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if errs.Load() > 0 {
			t.Fatalf("%d failed calls", errs.Load())
		}
		small.near.store.CleanUp()
		if size := small.near.store.EstimatedSize(); size > 500 {
			t.Fatalf("after 8,000 keys through Get the store holds %d entries (bound 500)", size)
		}
	})

	t.Run("MaxBytes", func(t *testing.T) {
		const bound = 1 << 20
		c := newNearCache(t, srv.Client(t), NearOptions{MaxBytes: bound}, nil)
		n := c.near
		val := make([]byte, 4096)
		for i := range 5000 { // 20 MB offered
			key := strconv.Itoa(i)
			id := nearIDOf(key)
			n.insert(key, nearEntry{id: id, val: val, expires: time.Now().Add(time.Hour), epoch: n.epoch.Load()}, n.snapshot(id))
		}
		n.store.CleanUp()
		if w := n.store.WeightedSize(); w > bound || w < bound/2 {
			t.Fatalf("the store weighs %d bytes (bound %d)", w, bound)
		}
		if size := n.store.EstimatedSize(); size > bound/(4096+nearEntryOverhead) {
			t.Fatalf("the store holds %d entries of 4 KiB (bound %d bytes)", size, bound)
		}
	})
}

// On a Cluster the near cache holds one connection per master, and a
// write in any slot reaches it: within the bound of a's Set returning.
func TestNearCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	a := newTestCache(t, cl.Client(t), nil)
	b := newNearCache(t, cl.Client(t), NearOptions{}, nil)
	ctx := context.Background()
	b.near.mu.Lock()
	conns := len(b.near.conns)
	b.near.mu.Unlock()
	if conns != 3 {
		t.Fatalf("%d subscriber connections, want one per master (3)", conns)
	}
	cc := cl.Client(t)
	masters := map[string]bool{}
	var keys []string
	for i := 0; len(keys) < 30; i++ {
		key := "near-cluster-" + strconv.Itoa(i)
		m, err := cc.MasterForKey(ctx, mustKeys(t, key).Value)
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = true
		keys = append(keys, key)
	}
	if len(masters) != 3 {
		t.Fatalf("the keys cover %d masters", len(masters))
	}
	for _, k := range keys {
		if err := a.Set(ctx, k, []byte("old"), time.Minute); err != nil {
			t.Fatal(err)
		}
		warm(t, b, k, "old")
	}
	for _, k := range keys {
		if err := a.Set(ctx, k, []byte("new"), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	acked := time.Now()
	time.Sleep(time.Until(acked.Add(nearTestStaleness + time.Millisecond)))
	for _, k := range keys {
		if got := getString(t, b, k); got != "new" {
			t.Fatalf("%s: %q, %v after the write returned (bound %v)", k, got, time.Since(acked), nearTestStaleness)
		}
	}
	for _, k := range keys {
		warm(t, b, k, "new")
	}
	before := b.Stats()
	for _, k := range keys {
		if got := getString(t, b, k); got != "new" {
			t.Fatal(got)
		}
	}
	if d := statsDelta(before, b.Stats()); d.NearHits != uint64(len(keys)) {
		t.Errorf("near hits %d of %d", d.NearHits, len(keys))
	}
}

// A Redis that stops answering (SIGSTOP): the heartbeat goes unanswered,
// so the near cache stops serving within the bound and Get fails open as
// it does without one; it serves again once Redis answers.
func TestNearRedisPaused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	b := newNearCache(t, srv.Client(t, func(o *redis.Options) {
		o.ReadTimeout, o.WriteTimeout, o.MaxRetries = 200*time.Millisecond, 200*time.Millisecond, -1
	}), NearOptions{}, func(o *Options) { o.LoadTimeout = 5 * time.Second })
	ctx := context.Background()
	const key = "near-paused"
	if err := b.Set(ctx, key, []byte("cached"), time.Minute); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the Set's message", func() bool { return b.Stats().NearInvalidations == 1 })
	warm(t, b, key, "cached")
	srv.Pause(t)
	paused := time.Now()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume(t)
		}
	}()
	waitFor(t, 5*time.Second, "the near cache to stop serving", func() bool { return !nearServing(b) })
	if d := time.Since(paused); d > nearTestStaleness+100*time.Millisecond {
		t.Logf("stopped serving %v after the pause (bound %v: measured from the last answered PING, sent before the pause)", d, nearTestStaleness)
	}
	v, err := b.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) { return []byte("local"), nil })
	if err != nil || string(v) != "local" {
		t.Fatalf("Redis paused: Get = %q, %v; want the local load", v, err)
	}
	srv.Resume(t)
	resumed = true
	waitServing(t, b)
	waitFor(t, 10*time.Second, "Gets through Redis again", func() bool {
		v, err := b.Get(ctx, key, time.Minute, noLoad(t))
		return err == nil && string(v) == "cached"
	})
	warm(t, b, key, "cached")
}

// A Ring: one connection per shard, and a write on either reaches the
// near cache.
func TestNearRing(t *testing.T) {
	t.Parallel()
	s1, s2 := redistest.Start(t), redistest.Start(t)
	ring := func() *redis.Ring {
		r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": s1.Addr(), "b": s2.Addr()}})
		t.Cleanup(func() { r.Close() })
		return r
	}
	a := newTestCache(t, ring(), nil)
	b := newNearCache(t, ring(), NearOptions{}, nil)
	b.near.mu.Lock()
	conns := len(b.near.conns)
	b.near.mu.Unlock()
	if conns != 2 {
		t.Fatalf("%d subscriber connections, want one per shard (2)", conns)
	}
	ctx := context.Background()
	shards := map[string]bool{}
	r := ring()
	for i := range 12 {
		key := "near-ring-" + strconv.Itoa(i)
		sh, err := r.GetShardClientForKey(mustKeys(t, key).Value)
		if err != nil {
			t.Fatal(err)
		}
		shards[sh.Options().Addr] = true
		if err := a.Set(ctx, key, []byte("old"), time.Minute); err != nil {
			t.Fatal(err)
		}
		warm(t, b, key, "old")
		if err := a.Set(ctx, key, []byte("new"), time.Minute); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "b's copy of "+key+" to be dropped", func() bool { return !nearHas(b, key) })
		if got := getString(t, b, key); got != "new" {
			t.Fatalf("%s: %q", key, got)
		}
	}
	if len(shards) != 2 {
		t.Fatalf("the keys cover %d shards", len(shards))
	}
}

// Bad input goes where it goes without the near cache.
func TestNearBadInput(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	b := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	ctx := context.Background()
	if _, err := b.Get(ctx, "", time.Minute, noLoad(t)); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
	if _, err := b.Get(ctx, "k", 0, noLoad(t)); !errors.Is(err, ErrInvalidTTL) {
		t.Errorf("zero ttl: %v", err)
	}
	if _, err := b.Get(ctx, "k", time.Minute, nil); !errors.Is(err, ErrNilLoader) {
		t.Errorf("nil loader: %v", err)
	}
	if _, err := Fetch(ctx, b, "", time.Minute, func(context.Context) (int, error) { return 1, nil }); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Fetch, empty key: %v", err)
	}
	// A value written outside herd that is no envelope: a miss, counted
	// once (by the flight), rebuilt, then near.
	rdb := srv.Client(t)
	rdb.Set(ctx, mustKeys(t, "near-corrupt").Value, "not an envelope", 0)
	v, err := b.Get(ctx, "near-corrupt", time.Minute, func(context.Context) ([]byte, error) { return []byte("rebuilt"), nil })
	if err != nil || string(v) != "rebuilt" || b.Stats().Corrupt != 1 {
		t.Fatalf("corrupt value: %q, %v, corrupt %d", v, err, b.Stats().Corrupt)
	}
	warm(t, b, "near-corrupt", "rebuilt")
	n, err := Fetch(ctx, b, "near-fetch", time.Minute, func(context.Context) (int, error) { return 42, nil })
	if err != nil || n != 42 {
		t.Fatal(n, err)
	}
	waitFor(t, 5*time.Second, "a near copy for Fetch", func() bool {
		n, err := Fetch(ctx, b, "near-fetch", time.Minute, func(context.Context) (int, error) { return 0, errors.New("no") })
		if err != nil || n != 42 {
			t.Fatal(n, err)
		}
		return nearHas(b, "near-fetch")
	})
}

// A caller that joins a fill more than Staleness after the fill's GET was
// sent does not take its answer: another process's write may have
// returned in between (here it did, and its message came).
func TestNearFillJoinerBound(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	b := newNearCache(t, srv.Client(t), NearOptions{}, nil)
	ctx := context.Background()
	const key = "near-joiner"
	heard := b.Stats().NearInvalidations
	if err := a.Set(ctx, key, []byte("old"), time.Minute); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the first write's message", func() bool { return b.Stats().NearInvalidations == heard+1 })
	fill, joined := newGate(), make(chan struct{}, 8)
	setHooks(b, &nearHooks{
		beforeFill: func(string) { fill.pass() },
		joined:     func(string) { joined <- struct{}{} },
	})
	fill.close()
	defer fill.release()
	sent := time.Now() // before the fill's GET is sent
	first := make(chan string, 1)
	go func() {
		v, _ := b.Get(ctx, key, time.Minute, noLoad(t))
		first <- string(v)
	}()
	<-joined
	waitFor(t, 5*time.Second, "the fill to read Redis", func() bool { return fill.passed.Load() == 1 })
	if err := a.Set(ctx, key, []byte("new"), time.Minute); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the second write's message", func() bool { return b.Stats().NearInvalidations == heard+2 })
	time.Sleep(time.Until(sent.Add(nearTestStaleness + 10*time.Millisecond)))
	late := make(chan string, 1)
	go func() {
		v, _ := b.Get(ctx, key, time.Minute, noLoad(t))
		late <- string(v)
	}()
	<-joined
	fill.release()
	if got := <-late; got != "new" {
		t.Fatalf("a caller that joined the fill %v after its GET, after another process's write returned, got %q", nearTestStaleness, got)
	}
	t.Logf("the first caller got %q", <-first)
}

// InvalidateSoft drops near copies like Invalidate: the old value is then
// served as a stale hit from Redis while one rebuild runs, never from
// memory.
func TestNearInvalidateSoft(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	opts := func(o *Options) { o.StaleFor = time.Minute }
	a := newTestCache(t, srv.Client(t), &Options{StaleFor: time.Minute})
	b := newNearCache(t, srv.Client(t), NearOptions{}, opts)
	ctx := context.Background()
	const key = "near-soft"
	if err := a.Set(ctx, key, []byte("v1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	warm(t, b, key, "v1")
	if err := a.InvalidateSoft(ctx, key); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "b's copy to be dropped", func() bool { return !nearHas(b, key) })
	rebuilt := make(chan struct{})
	var o Outcome
	v, err := b.Get(WithOutcome(ctx, &o), key, time.Minute, func(context.Context) ([]byte, error) {
		defer close(rebuilt)
		return []byte("v2"), nil
	})
	if err != nil || string(v) != "v1" || o != OutcomeStale {
		t.Fatalf("after a's soft invalidation: %q, %v, %v; want the stale v1 from Redis", v, err, o)
	}
	<-rebuilt
	waitFor(t, 5*time.Second, "the rebuild's commit", func() bool {
		v, err := b.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) { return []byte("v2"), nil })
		return err == nil && string(v) == "v2"
	})
	warm(t, b, key, "v2")

	// This process's own: dropped before InvalidateSoft returns.
	g := newGate()
	setHooks(b, &nearHooks{receive: func(string, uint64, any, error) { g.pass() }})
	g.close()
	defer g.release()
	if err := b.InvalidateSoft(ctx, key); err != nil {
		t.Fatal(err)
	}
	if nearHas(b, key) {
		t.Fatal("b's own soft invalidation left its near copy")
	}
}

// A fill that finds nothing fresh hands its read to the flight, as the
// hit path does: a stale value costs one GET, not two.
func TestNearFillReadGoesToFlight(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	var gets atomic.Int64
	const key = "near-stale-read"
	rdb.AddHook(countGets{key: mustKeys(t, key).Value, n: &gets})
	clock := newFakeClock()
	b := newNearCache(t, rdb, NearOptions{}, func(o *Options) { o.StaleFor = time.Hour })
	b.now = clock.Now
	rawSetEnv(t, srv.Client(t), key, b.newEnvelope(0, []byte("v1"), time.Second, time.Hour, 0))
	clock.Advance(2 * time.Second)
	refreshed := make(chan struct{})
	var o Outcome
	v, err := b.Get(WithOutcome(context.Background(), &o), key, time.Minute, func(context.Context) ([]byte, error) {
		defer close(refreshed)
		return []byte("v2"), nil
	})
	if err != nil || string(v) != "v1" || o != OutcomeStale {
		t.Fatalf("stale: %q, %v, %v", v, err, o)
	}
	<-refreshed
	if n := gets.Load(); n != 1 {
		t.Fatalf("a stale Get sent %d GETs, want 1", n)
	}
}

// revLen is the number of keys in n's reverse index.
func revLen(n *near) int {
	total := 0
	for i := range n.rev {
		r := &n.rev[i]
		r.mu.Lock()
		total += len(r.m)
		r.mu.Unlock()
	}
	return total
}

// TestNearReverseIndexFollowsTheStore: the store is keyed by the key and
// the messages carry its ID; the reverse index from IDs to keys holds
// exactly the keys the store holds, through evictions, drops and flushes,
// so its memory is bounded with the store's, and a message finds the copy
// it is for.
func TestNearReverseIndexFollowsTheStore(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newNearCache(t, srv.Client(t), NearOptions{MaxEntries: 100}, nil)
	n := c.near
	val := []byte("v")
	put := func(key string) {
		id := nearIDOf(key)
		if !n.insert(key, nearEntry{id: id, val: val, fence: 7, expires: time.Now().Add(time.Hour), deadline: n.mono() + int64(time.Hour), epoch: n.epoch.Load()}, n.snapshot(id)) {
			t.Fatalf("insert of %q refused", key)
		}
	}
	for i := range 10_000 {
		put("k" + strconv.Itoa(i))
	}
	n.store.CleanUp()
	size := n.store.EstimatedSize()
	if size > 100 {
		t.Fatalf("store holds %d entries (bound 100)", size)
	}
	if got := revLen(n); got != size {
		t.Fatalf("reverse index holds %d keys, the store %d: evictions left keys behind", got, size)
	}

	// A message for a held key drops it; one for the very write the copy
	// holds leaves it; one for an evicted key is a no-op.
	put("held")
	n.drop(nearIDOf("held"), 7)
	if !nearHas(c, "held") {
		t.Fatal("a message of the write the copy holds dropped it")
	}
	n.drop(nearIDOf("held"), 8)
	if nearHas(c, "held") {
		t.Fatal("a message of a newer write left the copy")
	}
	n.drop(nearIDOf("k0"), 9)
	n.store.CleanUp()
	if got, size := revLen(n), n.store.EstimatedSize(); got != size {
		t.Fatalf("after drops: reverse index %d keys, store %d", got, size)
	}

	n.flush()
	n.store.CleanUp()
	if got := revLen(n); got != 0 {
		t.Fatalf("after a flush the reverse index holds %d keys", got)
	}
}

// TestNearDropRacesInsert: a fill that took its snapshot before a drop
// of its key never leaves a copy, however the two interleave (the drop
// raises the stripe's sequence before it reads the reverse index, and the
// insert writes the index before it checks the sequence).
func TestNearDropRacesInsert(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newNearCache(t, srv.Client(t), NearOptions{MaxEntries: 1000}, nil)
	n := c.near
	val := []byte("v")
	for i := range 20_000 {
		key := "race" + strconv.Itoa(i%50)
		id := nearIDOf(key)
		snap := n.snapshot(id)
		var wg sync.WaitGroup
		wg.Go(func() {
			n.insert(key, nearEntry{id: id, val: val, expires: time.Now().Add(time.Hour), deadline: n.mono() + int64(time.Hour), epoch: snap.epoch}, snap)
		})
		wg.Go(func() { n.drop(id, 0) })
		wg.Wait()
		if nearHas(c, key) {
			t.Fatalf("round %d: a copy read before the drop stayed", i)
		}
	}
}

// TestNearBegin: Begin (the middleware's entry point) answers from the
// near cache as Get does: one fill per key, then hits with no Redis
// command and the value's own WrittenAt and Expires; a write in another
// Cache (process) takes the copy away, and the next Begin builds again.
func TestNearBegin(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	log := &cmdLog{}
	rdbB := srv.Client(t)
	rdbB.AddHook(log)
	a := newTestCache(t, srv.Client(t), nil)
	b := newNearCache(t, rdbB, NearOptions{}, nil)
	ctx := context.Background()
	const key = "page"
	if err := a.Set(ctx, key, []byte("v1"), time.Hour); err != nil {
		t.Fatal(err)
	}
	begin := func() (*Hit, *Fill) {
		t.Helper()
		hit, fill, err := b.Begin(ctx, key, time.Hour, nil)
		if err != nil {
			t.Fatalf("Begin: %v", err)
		}
		return hit, fill
	}
	first, fill := begin()
	if fill != nil || string(first.Value) != "v1" {
		t.Fatalf("first Begin: hit %+v, fill %v; want the stored v1", first, fill)
	}
	waitFor(t, 5*time.Second, "Begin's fill to store a copy", func() bool {
		if hit, fill := begin(); fill != nil || string(hit.Value) != "v1" {
			t.Fatalf("Begin: hit %+v, fill %v; want the stored v1", hit, fill)
		}
		return nearHas(b, key)
	})
	log.take()
	before := b.Stats().NearHits
	for range 20 {
		hit, fill := begin()
		if fill != nil || string(hit.Value) != "v1" || hit.Outcome != OutcomeHit {
			t.Fatalf("Begin from the near cache: hit %+v, fill %v", hit, fill)
		}
		if !hit.WrittenAt.Equal(first.WrittenAt) || !hit.Expires.Equal(first.Expires) {
			t.Fatalf("near hit WrittenAt %v Expires %v, want the value's %v %v", hit.WrittenAt, hit.Expires, first.WrittenAt, first.Expires)
		}
		hit.Value[0] = 'X' // the caller's own copy
	}
	if cmds := log.take(); len(cmds) != 0 {
		t.Errorf("20 near hits of Begin sent %v to Redis, want nothing", cmds)
	}
	if got := b.Stats().NearHits - before; got != 20 {
		t.Errorf("NearHits grew by %d, want 20", got)
	}

	if err := a.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the invalidation to reach the near cache", func() bool { return !nearHas(b, key) })
	hit, fill := begin()
	if fill == nil {
		t.Fatalf("Begin after another process's Invalidate: hit %+v, want a Fill", hit)
	}
	if err := fill.Commit([]byte("v2"), time.Hour, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "a Begin served v2", func() bool {
		hit, fill := begin()
		if fill != nil {
			fill.Abort(nil)
			return false
		}
		return string(hit.Value) == "v2"
	})
	waitFor(t, 5*time.Second, "the copy of v2", func() bool {
		if hit, fill := begin(); fill != nil || string(hit.Value) != "v2" {
			t.Fatalf("Begin after the commit of v2: hit %+v, fill %v", hit, fill)
		}
		return nearHas(b, key)
	})

	// Negative entries: Begin reports ErrNotFound from memory.
	if _, err := a.Get(ctx, "gone", time.Hour, func(context.Context) ([]byte, error) { return nil, ErrNotFound }); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the negative copy", func() bool {
		_, _, err := b.Begin(ctx, "gone", time.Hour, nil)
		return errors.Is(err, ErrNotFound) && nearHas(b, "gone")
	})
	log.take()
	if _, _, err := b.Begin(ctx, "gone", time.Hour, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Begin of a negative near copy: %v, want ErrNotFound", err)
	}
	if cmds := log.take(); len(cmds) != 0 {
		t.Errorf("a negative near hit of Begin sent %v", cmds)
	}
}

// TestNearGetMany: GetMany answers from near copies with no Redis
// command, copies the fresh values its MGET read (so a service that only
// reads in batches gets the near cache too), hands the caller its own
// bytes (mutating them leaves the copy as it was), and a write in another
// Cache (process) takes a copy away.
func TestNearGetMany(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	log := &cmdLog{}
	rdbB := srv.Client(t)
	rdbB.AddHook(log)
	a := newTestCache(t, srv.Client(t), nil)
	b := newNearCache(t, rdbB, NearOptions{}, nil)
	ctx := context.Background()
	keys := []string{"m1", "m2", "m3"}
	for _, k := range keys {
		if err := a.Set(ctx, k, []byte("v-"+k), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	noLoad := func(context.Context, []string) (map[string][]byte, error) {
		t.Error("a batch of stored keys called the loader")
		return nil, nil
	}
	many := func() map[string][]byte {
		t.Helper()
		got, err := b.GetMany(ctx, keys, time.Hour, noLoad)
		if err != nil {
			t.Fatalf("GetMany: %v", err)
		}
		for _, k := range keys {
			if string(got[k]) != "v-"+k {
				t.Fatalf("GetMany[%s] = %q", k, got[k])
			}
		}
		return got
	}
	waitFor(t, 5*time.Second, "GetMany to copy its values", func() bool {
		got := many()
		got["m1"][0] = 'X' // the caller's own bytes
		return nearHas(b, "m1") && nearHas(b, "m2") && nearHas(b, "m3")
	})
	log.take()
	before := b.Stats().NearHits
	for range 10 {
		many()["m2"][0] = 'Y'
	}
	if cmds := log.take(); len(cmds) != 0 {
		t.Errorf("10 batches from near copies sent %v", cmds)
	}
	if got := b.Stats().NearHits - before; got != 30 {
		t.Errorf("NearHits grew by %d, want 30", got)
	}
	if got := getString(t, b, "m1"); got != "v-m1" {
		t.Fatalf("Get after the callers mutated their bytes: %q", got)
	}

	if err := a.Set(ctx, "m3", []byte("v-m3-new"), time.Hour); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the write to reach b's near cache", func() bool { return !nearHas(b, "m3") })
	got, err := b.GetMany(ctx, keys, time.Hour, noLoad)
	if err != nil || string(got["m3"]) != "v-m3-new" || string(got["m1"]) != "v-m1" {
		t.Fatalf("GetMany after another process's Set: %q, %v", got, err)
	}
}
