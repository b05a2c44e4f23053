package herd

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/wire"
)

// fakeClock is a settable clock for freshness decisions.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_800_000_000, 0)} }

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

// withClock makes c judge freshness by clk.
func withClock(c *Cache, clk *fakeClock) *Cache {
	c.now = clk.Now
	return c
}

// TestFreshness runs the freshness suite on miniredis and a real
// redis-server. Freshness is judged by a fake clock; Redis keeps the
// values (their hard TTL is real time, far longer than the test).
func TestFreshness(t *testing.T) {
	t.Parallel()
	for _, b := range standaloneBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Run("StaleWhileRevalidate", func(t *testing.T) { testStaleWhileRevalidate(t, b) })
			t.Run("OneRefreshAcrossCaches", func(t *testing.T) { testOneRefreshAcrossCaches(t, b) })
			t.Run("StaleIfError", func(t *testing.T) { testStaleIfError(t, b) })
			t.Run("NegativeRefreshes", func(t *testing.T) { testNegativeRefreshes(t, b) })
			t.Run("RefreshPoolFull", func(t *testing.T) { testRefreshPoolFull(t, b) })
			t.Run("XFetchOneLoadPerExpiry", func(t *testing.T) { testXFetchOneLoadPerExpiry(t, b) })
			t.Run("Outcomes", func(t *testing.T) { testOutcomes(t, b) })
		})
	}
}

func testStaleWhileRevalidate(t *testing.T, b backend) {
	clk := newFakeClock()
	c := withClock(newTestCache(t, b.rdb, &Options{StaleFor: time.Hour}), clk)
	ctx := context.Background()
	key := testKey(t)
	var n atomic.Int64
	gate := make(chan struct{})
	load := func(context.Context) ([]byte, error) {
		if n.Add(1) > 1 {
			<-gate
		}
		return []byte{byte('0' + n.Load())}, nil
	}
	if v, err := c.Get(ctx, key, time.Minute, load); err != nil || string(v) != "1" {
		t.Fatalf("cold Get = (%q, %v)", v, err)
	}
	clk.Advance(61 * time.Second) // past ttl, within StaleFor
	var out Outcome
	v, err := c.Get(WithOutcome(ctx, &out), key, time.Minute, load)
	if err != nil || string(v) != "1" || out != OutcomeStale {
		t.Fatalf("stale Get = (%q, %v, %v), want the old value at once, outcome stale", v, err, out)
	}
	// More stale hits while the refresh runs start no other load.
	for range 5 {
		if v, _ := c.Get(ctx, key, time.Minute, load); string(v) != "1" {
			t.Errorf("stale Get during the refresh = %q, want %q", v, "1")
		}
	}
	close(gate)
	waitFor(t, 5*time.Second, "the refresh to commit", func() bool {
		v, _ := c.Get(WithOutcome(ctx, &out), key, time.Minute, load)
		return string(v) == "2" && out == OutcomeHit
	})
	if got := n.Load(); got != 2 {
		t.Errorf("loads = %d, want 2 (cold + one refresh)", got)
	}
	if s := c.Stats(); s.Refreshes != 1 || s.StaleServed < 6 {
		t.Errorf("Stats = %+v, want 1 refresh and ≥ 6 stale served", s)
	}
}

// Several caches (as several processes) see the same stale value at once:
// one refresh reaches the source.
func testOneRefreshAcrossCaches(t *testing.T, b backend) {
	clk := newFakeClock()
	ctx := context.Background()
	key := testKey(t)
	var loads atomic.Int64
	gate := make(chan struct{})
	load := func(context.Context) ([]byte, error) {
		if loads.Add(1) > 1 {
			<-gate
		}
		return []byte("v"), nil
	}
	var cs []*Cache
	for range 4 {
		cs = append(cs, withClock(newTestCache(t, b.rdb, &Options{StaleFor: time.Hour}), clk))
	}
	if _, err := cs[0].Get(ctx, key, time.Minute, load); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	var wg sync.WaitGroup
	for _, c := range cs {
		for range 10 {
			wg.Go(func() {
				if _, err := c.Get(ctx, key, time.Minute, load); err != nil {
					t.Errorf("stale Get: %v", err)
				}
			})
		}
	}
	wg.Wait()
	waitFor(t, 5*time.Second, "one refresh to start", func() bool { return loads.Load() == 2 })
	close(gate)
	waitFor(t, 5*time.Second, "the refreshes to finish", func() bool {
		var busy int
		for _, c := range cs {
			c.refreshMu.Lock()
			busy += len(c.refreshing)
			c.refreshMu.Unlock()
		}
		return busy == 0
	})
	// Later stale hits of the same expired value: nothing left to refresh.
	for _, c := range cs {
		c.Get(ctx, key, time.Minute, load)
	}
	if got := loads.Load(); got != 2 {
		t.Errorf("loads = %d, want 2 (cold + exactly one refresh for 4 caches × 10 callers)", got)
	}
}

// A failed refresh keeps serving the stale value without error, and
// refreshes back off instead of hitting the source on every hit.
func testStaleIfError(t *testing.T, b backend) {
	clk := newFakeClock()
	// The backoff marker's life in Redis is real time, and the 20 stale
	// hits below must fall within one step on a loaded machine (with
	// 300ms, CI saw the marker expire during them).
	const step = 2 * time.Second
	var skipped atomic.Int64
	obs := &Observer{Refresh: func(_ string, ev RefreshEvent) {
		if ev == RefreshSkipped {
			skipped.Add(1)
		}
	}}
	c := withClock(newTestCache(t, b.rdb, &Options{StaleFor: time.Hour, RefreshBackoff: step, RefreshBackoffMax: step, Observer: obs}), clk)
	ctx := context.Background()
	key := testKey(t)
	var calls atomic.Int64
	var failing atomic.Bool
	load := func(context.Context) ([]byte, error) {
		calls.Add(1)
		if failing.Load() {
			return nil, errors.New("origin down")
		}
		return []byte("good"), nil
	}
	if _, err := c.Get(ctx, key, time.Minute, load); err != nil {
		t.Fatal(err)
	}
	failing.Store(true)
	clk.Advance(2 * time.Minute)
	if v, err := c.Get(ctx, key, time.Minute, load); err != nil || string(v) != "good" {
		t.Fatalf("stale Get = (%q, %v), want the stale value", v, err)
	}
	waitFor(t, 5*time.Second, "the failed refresh", func() bool { return c.Stats().RefreshErrors == 1 })
	if n := b.rdb.Exists(ctx, mustKeys(t, key).Backoff).Val(); n != 1 {
		t.Fatalf("no refresh backoff in Redis after a failed refresh")
	}
	// Within the backoff step, stale hits do not call the source, and once
	// this process has heard of the backoff it stops asking Redis.
	for range 20 {
		if v, err := c.Get(ctx, key, time.Minute, load); err != nil || string(v) != "good" {
			t.Fatalf("stale Get during backoff = (%q, %v)", v, err)
		}
		waitFor(t, 5*time.Second, "the refresh attempt to settle", func() bool {
			c.refreshMu.Lock()
			defer c.refreshMu.Unlock()
			return len(c.refreshing) == 0
		})
	}
	if n := skipped.Load(); b.mini == nil && n > 1 {
		t.Errorf("%d refresh attempts asked Redis during one backoff step, want at most 1", n)
	}
	if b.mini == nil {
		// Real expiry of the backoff marker: the next stale hit retries.
		if got := calls.Load(); got != 2 {
			t.Errorf("source calls during the backoff = %d, want 2 (load + one failed refresh)", got)
		}
		failing.Store(false)
		waitFor(t, 10*step, "a refresh after the backoff", func() bool {
			v, _ := c.Get(ctx, key, time.Minute, load)
			return c.Stats().Refreshes >= 2 && string(v) == "good" && calls.Load() >= 3
		})
		if n := b.rdb.Exists(ctx, mustKeys(t, key).Backoff).Val(); n != 0 {
			t.Errorf("the backoff marker survived a successful refresh")
		}
	}
}

func testNegativeRefreshes(t *testing.T, b backend) {
	clk := newFakeClock()
	c := withClock(newTestCache(t, b.rdb, &Options{StaleFor: time.Hour, NegativeTTL: time.Minute}), clk)
	ctx := context.Background()
	key := testKey(t)
	var calls atomic.Int64
	var exists atomic.Bool
	load := func(context.Context) ([]byte, error) {
		calls.Add(1)
		if !exists.Load() {
			return nil, ErrNotFound
		}
		return []byte("created"), nil
	}
	if _, err := c.Get(ctx, key, time.Minute, load); !errors.Is(err, ErrNotFound) {
		t.Fatalf("got %v, want ErrNotFound", err)
	}
	exists.Store(true)
	clk.Advance(2 * time.Minute)
	var out Outcome
	if _, err := c.Get(WithOutcome(ctx, &out), key, time.Minute, load); !errors.Is(err, ErrNotFound) || out != OutcomeStale {
		t.Fatalf("stale negative: got (%v, %v), want ErrNotFound at once, outcome stale", err, out)
	}
	waitFor(t, 5*time.Second, "the negative entry to refresh", func() bool {
		v, err := c.Get(ctx, key, time.Minute, load)
		return err == nil && string(v) == "created"
	})
	if calls.Load() != 2 {
		t.Errorf("loads = %d, want 2", calls.Load())
	}
}

func testRefreshPoolFull(t *testing.T, b backend) {
	clk := newFakeClock()
	c := withClock(newTestCache(t, b.rdb, &Options{StaleFor: time.Hour, MaxRefreshes: 1}), clk)
	ctx := context.Background()
	gate := make(chan struct{})
	var refreshing atomic.Int64
	slow := func(context.Context) ([]byte, error) {
		if refreshing.Load() > 0 {
			<-gate
		}
		return []byte("v"), nil
	}
	keys := []string{testKey(t) + "a", testKey(t) + "b"}
	for _, k := range keys {
		if _, err := c.Get(ctx, k, time.Minute, slow); err != nil {
			t.Fatal(err)
		}
	}
	refreshing.Store(1)
	clk.Advance(2 * time.Minute)
	c.Get(ctx, keys[0], time.Minute, slow) // takes the only slot and blocks
	waitFor(t, 5*time.Second, "the first refresh to start", func() bool { return c.Stats().Refreshes == 1 })
	c.Get(ctx, keys[1], time.Minute, slow) // finds the pool full
	if s := c.Stats(); s.RefreshesDropped != 1 {
		t.Errorf("Stats.RefreshesDropped = %d, want 1", s.RefreshesDropped)
	}
	close(gate)
}

// XFetch with the lease: many caches decide to refresh early at once; the
// source sees one load per expiry.
func testXFetchOneLoadPerExpiry(t *testing.T, b backend) {
	clk := newFakeClock()
	ctx := context.Background()
	key := testKey(t)
	var loads atomic.Int64
	// The refresh holds until every read has returned: with β this large a
	// value is due again as soon as it is written, so a read that came
	// after the refresh's commit would rightly start a second one.
	readsDone := make(chan struct{})
	load := func(context.Context) ([]byte, error) {
		if loads.Add(1) > 1 {
			<-readsDone
		}
		time.Sleep(5 * time.Millisecond) // a measurable Δ
		return []byte("v"), nil
	}
	var cs []*Cache
	for range 4 {
		c := withClock(newTestCache(t, b.rdb, &Options{EarlyRefresh: 1e6}), clk)
		cs = append(cs, c)
	}
	if _, err := cs[0].Get(ctx, key, time.Minute, load); err != nil {
		t.Fatal(err)
	}
	clk.Advance(59 * time.Second) // 1s before expiry: with β huge, every read is due
	var wg sync.WaitGroup
	for _, c := range cs {
		for range 10 {
			wg.Go(func() {
				var out Outcome
				if _, err := c.Get(WithOutcome(ctx, &out), key, time.Minute, load); err != nil {
					t.Errorf("Get: %v", err)
				}
			})
		}
	}
	wg.Wait()
	close(readsDone)
	waitFor(t, 5*time.Second, "the early refresh", func() bool { return loads.Load() == 2 })
	waitFor(t, 5*time.Second, "refreshes to settle", func() bool {
		var busy int
		for _, c := range cs {
			c.refreshMu.Lock()
			busy += len(c.refreshing)
			c.refreshMu.Unlock()
		}
		return busy == 0
	})
	var early uint64
	for _, c := range cs {
		early += c.Stats().EarlyRefreshes
	}
	if got := loads.Load(); got != 2 || early == 0 {
		t.Errorf("loads = %d (early refreshes started %d), want 2: cold + one early refresh", got, early)
	}
}

// TestXFetchProbability checks the per-read refresh probability against
// exp(−t/(βΔ)) with a seeded random source.
func TestXFetchProbability(t *testing.T) {
	t.Parallel()
	c := &Cache{cfg: cacheConfig{Options: Options{EarlyRefresh: 1.5}}}
	rng := rand.New(rand.NewPCG(1, 2))
	c.rand = rng.Float64
	const delta = 200 * time.Millisecond
	now := time.Unix(1_800_000_000, 0)
	for _, t0 := range []float64{0, 0.25, 0.5, 1, 2, 4} {
		left := time.Duration(t0 * 1.5 * float64(delta))
		env := envelope{Delta: delta, SoftExp: now.Add(left)}
		const n = 40000
		due := 0
		for range n {
			if c.xfetchDue(env, now) {
				due++
			}
		}
		got := float64(due) / n
		want := math.Exp(-t0)
		// 5 standard deviations of a binomial proportion, at least 0.005.
		tol := max(5*math.Sqrt(want*(1-want)/n), 0.005)
		if math.Abs(got-want) > tol {
			t.Errorf("t = %.2f·βΔ: refresh probability %.4f, want %.4f ± %.4f", t0, got, want, tol)
		}
	}
	// Off when β is 0, for negative entries, and without a known Δ.
	env := envelope{Delta: delta, SoftExp: now}
	c.cfg.EarlyRefresh = 0
	if c.xfetchDue(env, now.Add(-time.Millisecond)) {
		t.Error("due with EarlyRefresh 0")
	}
	c.cfg.EarlyRefresh = 1
	if c.xfetchDue(envelope{SoftExp: now}, now.Add(-time.Millisecond)) {
		t.Error("due without a rebuild time")
	}
	if c.xfetchDue(envelope{Negative: true, Delta: delta, SoftExp: now}, now.Add(-time.Millisecond)) {
		t.Error("due for a negative entry")
	}
}

func testOutcomes(t *testing.T, b backend) {
	clk := newFakeClock()
	c := withClock(newTestCache(t, b.rdb, &Options{StaleFor: time.Hour}), clk)
	ctx := context.Background()
	key := testKey(t)
	var calls atomic.Int64
	get := func(key string, load LoadFunc) Outcome {
		var o Outcome
		c.Get(WithOutcome(ctx, &o), key, time.Minute, load)
		return o
	}
	if o := get(key, constLoader(&calls, "v")); o != OutcomeLeader {
		t.Errorf("cold miss: outcome %v, want leader", o)
	}
	if o := get(key, constLoader(&calls, "v")); o != OutcomeHit {
		t.Errorf("hit: outcome %v, want hit", o)
	}
	clk.Advance(2 * time.Minute)
	if o := get(key, constLoader(&calls, "v")); o != OutcomeStale {
		t.Errorf("stale: outcome %v, want stale", o)
	}
	notFound := func(context.Context) ([]byte, error) { return nil, ErrNotFound }
	get(key+"neg", notFound)
	if o := get(key+"neg", notFound); o != OutcomeNegative {
		t.Errorf("negative: outcome %v, want negative", o)
	}
	for o, want := range map[Outcome]string{OutcomeHit: "hit", OutcomeStale: "stale", OutcomeEarlyRefresh: "early-refresh",
		OutcomeLeader: "leader", OutcomeFollower: "follower", OutcomeFallback: "fallback", OutcomeNegative: "negative"} {
		if o.String() != want {
			t.Errorf("Outcome(%d).String() = %q, want %q", o, o.String(), want)
		}
	}
}

// SetExpiry lets the loader choose the entry's ttl and stale window.
func TestSetExpiry(t *testing.T) {
	t.Parallel()
	for _, b := range standaloneBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			clk := newFakeClock()
			c := withClock(newTestCache(t, b.rdb, nil), clk)
			ctx := context.Background()
			key := testKey(t)
			load := func(ctx context.Context) ([]byte, error) {
				SetExpiry(ctx, 10*time.Second, 50*time.Second)
				return []byte("v"), nil
			}
			if _, err := c.Get(ctx, key, time.Hour, load); err != nil {
				t.Fatal(err)
			}
			env, ok := wire.DecodeEnvelope([]byte(b.rdb.Get(ctx, mustKeys(t, key).Value).Val()))
			if !ok {
				t.Fatal("no envelope stored")
			}
			if fresh, stale := env.SoftExp.Sub(env.WrittenAt), env.StaleExp.Sub(env.WrittenAt); fresh != 10*time.Second || stale != time.Minute {
				t.Errorf("stored fresh for %v and servable for %v, want 10s and 1m (SetExpiry over the call's 1h)", fresh, stale)
			}
			if pttl := b.rdb.PTTL(ctx, mustKeys(t, key).Value).Val(); b.mini == nil && (pttl > time.Minute || pttl < 50*time.Second) {
				t.Errorf("Redis PTTL = %v, want the hard TTL of about 1m", pttl)
			}
			clk.Advance(30 * time.Second)
			var out Outcome
			if _, err := c.Get(WithOutcome(ctx, &out), key, time.Hour, load); err != nil || out != OutcomeStale {
				t.Errorf("Get 30s later: outcome %v (%v), want stale", out, err)
			}
			SetExpiry(ctx, time.Second, time.Second) // outside a loader: no effect, no panic
		})
	}
}
