package herd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

// TestInvalidateSoft runs the soft invalidation suite on miniredis, a
// real redis-server and a real 3-master Redis Cluster.
func TestInvalidateSoft(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Run("ServesStaleOneRebuild", func(t *testing.T) { testSoftServesStaleOneRebuild(t, b) })
			t.Run("FencesOlderRebuild", func(t *testing.T) { testSoftFencesOlderRebuild(t, b) })
			t.Run("WindowIsTheValuesLife", func(t *testing.T) { testSoftWindow(t, b) })
			t.Run("MissingKey", func(t *testing.T) { testSoftMissingKey(t, b) })
			t.Run("NegativeEntry", func(t *testing.T) { testSoftNegativeEntry(t, b) })
			t.Run("PassMark", func(t *testing.T) { testSoftPassMark(t, b) })
			t.Run("RefreshFails", func(t *testing.T) { testSoftRefreshFails(t, b) })
			t.Run("BadInput", func(t *testing.T) { testSoftBadInput(t, b) })
		})
	}
}

// peekEnvelope returns the envelope stored for key (prefix herd).
func peekEnvelope(t *testing.T, rdb redis.UniversalClient, key string) (envelope, bool) {
	t.Helper()
	b, err := rdb.Get(context.Background(), mustKeys(t, key).Value).Bytes()
	if errors.Is(err, redis.Nil) {
		return envelope{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	env, ok := wire.DecodeEnvelope(b)
	if !ok {
		t.Fatalf("the value of %q is not an intact envelope: %q", key, b)
	}
	return env, true
}

// fenceOf returns key's fence counter.
func fenceOf(t *testing.T, rdb redis.UniversalClient, key string) uint64 {
	t.Helper()
	n, err := rdb.HGet(context.Background(), mustKeys(t, key).Fence, "n").Uint64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// After a soft invalidation, Gets from three Caches (as three processes)
// and many goroutines get the old value at once, marked stale, while one
// gated rebuild runs; once it commits, every Cache serves the new value.
// StaleFor is 0: the stale window is the soft invalidation's own.
func testSoftServesStaleOneRebuild(t *testing.T, b backend) {
	ctx := context.Background()
	key := testKey(t)
	var cs []*Cache
	for range 3 {
		cs = append(cs, newTestCache(t, b.rdb, &Options{StaleFor: 0}))
	}
	var calls atomic.Int64
	if _, err := cs[0].Get(ctx, key, time.Hour, constLoader(&calls, "v1")); err != nil {
		t.Fatal(err)
	}
	before := fenceOf(t, b.rdb, key)
	if err := cs[1].InvalidateSoft(ctx, key); err != nil {
		t.Fatal(err)
	}
	if after := fenceOf(t, b.rdb, key); after <= before {
		t.Errorf("fence after InvalidateSoft = %d, want above %d", after, before)
	}
	g := newGatedLoader("v2")
	staleGets := func(round string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, 3*16)
		for _, c := range cs {
			for range 16 {
				wg.Go(func() {
					// A Get that waits for the gated rebuild would hang:
					// its deadline turns that into a failure.
					gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					defer cancel()
					var o Outcome
					v, err := c.Get(WithOutcome(gctx, &o), key, time.Hour, g.load)
					if err != nil || string(v) != "v1" || o != OutcomeStale {
						errs <- fmt.Errorf("%s: Get = (%q, %v), outcome %v; want the old value v1 at once, outcome stale", round, v, err, o)
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	staleGets("first Gets after InvalidateSoft")
	g.waitEntered(t) // the refresh runs, held at the gate
	staleGets("Gets while the rebuild is held")
	if n := g.calls.Load(); n != 1 {
		t.Errorf("rebuilds while held = %d, want 1 across 3 Caches and 96 Gets", n)
	}
	close(g.gate)
	for i, c := range cs {
		waitFor(t, 10*time.Second, fmt.Sprintf("Cache %d to serve the rebuilt value", i), func() bool {
			var o Outcome
			v, err := c.Get(WithOutcome(ctx, &o), key, time.Hour, g.load)
			return err == nil && string(v) == "v2" && o == OutcomeHit
		})
	}
	if n := g.calls.Load(); n != 1 {
		t.Errorf("rebuilds = %d, want 1", n)
	}
	var refreshes uint64
	for _, c := range cs {
		refreshes += c.Stats().Refreshes
	}
	if refreshes != 1 {
		t.Errorf("refreshes across the Caches = %d, want 1", refreshes)
	}
}

// A rebuild that began before the soft invalidation (a stale refresh in
// Cache A, held at a gate) is fenced: its commit is refused and the old
// value stays, stale; a rebuild that begins after it lands.
func testSoftFencesOlderRebuild(t *testing.T, b backend) {
	ctx := context.Background()
	key := testKey(t)
	clk := newFakeClock()
	a := withClock(newTestCache(t, b.rdb, &Options{StaleFor: time.Hour}), clk)
	bc := withClock(newTestCache(t, b.rdb, &Options{StaleFor: time.Hour}), clk)
	var calls atomic.Int64
	if _, err := a.Get(ctx, key, time.Minute, constLoader(&calls, "v1")); err != nil {
		t.Fatal(err)
	}
	clk.Advance(61 * time.Second) // stale: the next Get starts a refresh
	old := newGatedLoader("old-rebuild")
	if v, err := a.Get(ctx, key, time.Minute, old.load); err != nil || string(v) != "v1" {
		t.Fatalf("stale Get = (%q, %v), want v1", v, err)
	}
	old.waitEntered(t)
	if err := bc.InvalidateSoft(ctx, key); err != nil {
		t.Fatal(err)
	}
	close(old.gate)
	waitFor(t, 10*time.Second, "the older rebuild's commit to be fenced", func() bool { return a.Stats().Fenced == 1 })
	// The refresh goroutine has ended once its slot is free again.
	waitFor(t, 10*time.Second, "the older refresh to end", func() bool {
		a.refreshMu.Lock()
		defer a.refreshMu.Unlock()
		_, busy := a.refreshing[key]
		return !busy
	})
	if env, ok := peekEnvelope(t, b.rdb, key); !ok || string(env.Payload) != "v1" {
		t.Fatalf("after the fenced commit the value is %q (found %v), want the old v1: the older rebuild ended the stale period", env.Payload, ok)
	}
	var o Outcome
	if v, found, err := bc.Peek(WithOutcome(ctx, &o), key); err != nil || !found || string(v) != "v1" || o != OutcomeStale {
		t.Errorf("Peek after the fenced commit = (%q, %v, %v), outcome %v; want v1, stale", v, found, err, o)
	}
	// The next stale Get starts a rebuild that began after the
	// invalidation: it lands.
	waitFor(t, 10*time.Second, "a rebuild after the invalidation to land", func() bool {
		var o Outcome
		v, err := bc.Get(WithOutcome(ctx, &o), key, time.Minute, constLoader(&calls, "v2"))
		return err == nil && string(v) == "v2" && o == OutcomeHit
	})
	if n := calls.Load(); n != 2 {
		t.Errorf("loads = %d, want 2 (the cold load and one rebuild after the invalidation)", n)
	}
}

// The old value stays servable for what was left of its life, never
// longer: with StaleFor 0, until its ttl ends. Redis's expiry of it does
// not move.
func testSoftWindow(t *testing.T, b backend) {
	ctx := context.Background()
	key := testKey(t)
	clk := newFakeClock()
	c := withClock(newTestCache(t, b.rdb, nil), clk)
	var calls atomic.Int64
	if _, err := c.Get(ctx, key, time.Hour, constLoader(&calls, "v1")); err != nil {
		t.Fatal(err)
	}
	vkey := mustKeys(t, key).Value
	pttl := b.rdb.PTTL(ctx, vkey).Val()
	clk.Advance(20 * time.Minute)
	if err := c.InvalidateSoft(ctx, key); err != nil {
		t.Fatal(err)
	}
	if after := b.rdb.PTTL(ctx, vkey).Val(); after <= 0 || after > pttl {
		t.Errorf("PTTL after InvalidateSoft = %v, want in (0, %v]: the value's life must not grow", after, pttl)
	}
	env, ok := peekEnvelope(t, b.rdb, key)
	if !ok || !env.SoftExp.Equal(env.WrittenAt) || !env.StaleExp.Equal(env.WrittenAt.Add(time.Hour)) || env.Delta != 0 {
		t.Fatalf("envelope after InvalidateSoft: found %v, written %v, fresh until %v, stale until %v, Δ %v; want fresh until its write, stale until write + 1h, Δ 0",
			ok, env.WrittenAt, env.SoftExp, env.StaleExp, env.Delta)
	}
	var o Outcome
	if v, found, err := c.Peek(WithOutcome(ctx, &o), key); err != nil || !found || string(v) != "v1" || o != OutcomeStale {
		t.Errorf("Peek 20 min into the hour = (%q, %v, %v), outcome %v; want v1, stale", v, found, err, o)
	}
	clk.Advance(39 * time.Minute)
	if v, found, err := c.Peek(WithOutcome(ctx, &o), key); err != nil || !found || string(v) != "v1" || o != OutcomeStale {
		t.Errorf("Peek 59 min into the hour = (%q, %v, %v), outcome %v; want v1, stale", v, found, err, o)
	}
	clk.Advance(2 * time.Minute)
	if v, found, err := c.Peek(ctx, key); err != nil || found {
		t.Errorf("Peek past the hour = (%q, %v, %v), want not found", v, found, err)
	}
}

// A soft invalidation of a key with no value is a plain one: it fences
// a rebuild in flight, and the next Get loads.
func testSoftMissingKey(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	ctx := context.Background()
	key := testKey(t)
	if err := c.InvalidateSoft(ctx, key); err != nil {
		t.Fatalf("InvalidateSoft of a key never written: %v", err)
	}
	g := newGatedLoader("before")
	done := make(chan []byte, 1)
	go func() {
		v, _ := c.Get(ctx, key, time.Minute, g.load)
		done <- v
	}()
	g.waitEntered(t)
	if err := c.InvalidateSoft(ctx, key); err != nil {
		t.Fatal(err)
	}
	close(g.gate)
	if v := <-done; string(v) != "before" {
		t.Errorf("the leader's own callers got %q, want its value", v)
	}
	if _, ok := peekEnvelope(t, b.rdb, key); ok {
		t.Errorf("a value from a rebuild that began before InvalidateSoft was stored")
	}
	if s := c.Stats(); s.Fenced != 1 {
		t.Errorf("Stats.Fenced = %d, want 1", s.Fenced)
	}
	var calls atomic.Int64
	var o Outcome
	if v, err := c.Get(WithOutcome(ctx, &o), key, time.Minute, constLoader(&calls, "fresh")); err != nil || string(v) != "fresh" || o != OutcomeLeader {
		t.Errorf("Get after InvalidateSoft of a missing key = (%q, %v), outcome %v; want a load", v, err, o)
	}
	// A value past its stale window (by the Cache's clock) is no value
	// either: it is deleted.
	clk := newFakeClock()
	clk.now = time.Now().Add(2 * time.Minute)
	later := withClock(newTestCache(t, b.rdb, nil), clk)
	if _, ok := peekEnvelope(t, b.rdb, key); !ok {
		t.Fatal("no value stored (the test proves nothing)")
	}
	if err := later.InvalidateSoft(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, ok := peekEnvelope(t, b.rdb, key); ok {
		t.Errorf("an expired value was kept by InvalidateSoft, want it deleted")
	}
}

// A negative entry is kept as a stale negative entry: Get still gets
// ErrNotFound at once while one refresh runs.
func testSoftNegativeEntry(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, &Options{NegativeTTL: time.Hour})
	ctx := context.Background()
	key := testKey(t)
	notFound := func(context.Context) ([]byte, error) { return nil, ErrNotFound }
	if _, err := c.Get(ctx, key, time.Hour, notFound); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get = %v, want ErrNotFound", err)
	}
	if err := c.InvalidateSoft(ctx, key); err != nil {
		t.Fatal(err)
	}
	g := newGatedLoader("now-there")
	var o Outcome
	if _, err := c.Get(WithOutcome(ctx, &o), key, time.Hour, g.load); !errors.Is(err, ErrNotFound) || o != OutcomeStale {
		t.Errorf("Get after InvalidateSoft of a negative entry = %v, outcome %v; want ErrNotFound at once, stale", err, o)
	}
	g.waitEntered(t)
	close(g.gate)
	waitFor(t, 10*time.Second, "the refresh to land", func() bool {
		v, err := c.Get(ctx, key, time.Hour, g.load)
		return err == nil && string(v) == "now-there"
	})
	if n := g.calls.Load(); n != 1 {
		t.Errorf("rebuilds = %d, want 1", n)
	}
}

// A pass mark is no value to keep: it is deleted.
func testSoftPassMark(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	ctx := context.Background()
	key := testKey(t)
	_, fill, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin = (%v, %v), want a Fill", fill, err)
	}
	if err := fill.Pass(errors.New("per user"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, ok := peekEnvelope(t, b.rdb, key); !ok {
		t.Fatal("no pass mark stored (the test proves nothing)")
	}
	if err := c.InvalidateSoft(ctx, key); err != nil {
		t.Fatal(err)
	}
	if env, ok := peekEnvelope(t, b.rdb, key); ok {
		t.Errorf("after InvalidateSoft the pass mark is still there (pass %v), want it deleted", env.Pass)
	}
}

// When the refresh after a soft invalidation fails, the old value keeps
// being served, with no error (stale-if-error); a refresh after the
// backoff lands.
func testSoftRefreshFails(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, &Options{RefreshBackoff: 300 * time.Millisecond})
	ctx := context.Background()
	key := testKey(t)
	var calls atomic.Int64
	if _, err := c.Get(ctx, key, time.Hour, constLoader(&calls, "v1")); err != nil {
		t.Fatal(err)
	}
	if err := c.InvalidateSoft(ctx, key); err != nil {
		t.Fatal(err)
	}
	var failing atomic.Bool
	failing.Store(true)
	var fails atomic.Int64
	load := func(context.Context) ([]byte, error) {
		if failing.Load() {
			fails.Add(1)
			return nil, errors.New("source down")
		}
		return []byte("v2"), nil
	}
	get := func() ([]byte, Outcome, error) {
		var o Outcome
		v, err := c.Get(WithOutcome(ctx, &o), key, time.Hour, load)
		return v, o, err
	}
	if v, o, err := get(); err != nil || string(v) != "v1" || o != OutcomeStale {
		t.Fatalf("Get = (%q, %v, %v), want v1, stale", v, o, err)
	}
	waitFor(t, 10*time.Second, "the refresh to fail", func() bool { return c.Stats().RefreshErrors >= 1 })
	for range 5 {
		if v, o, err := get(); err != nil || string(v) != "v1" || o != OutcomeStale {
			t.Errorf("Get after the failed refresh = (%q, %v, %v), want the old v1, stale, no error", v, o, err)
		}
	}
	failing.Store(false)
	waitFor(t, 10*time.Second, "a refresh after the backoff to land", func() bool {
		if b.mini != nil {
			b.mini.FastForward(100 * time.Millisecond) // its keys expire by its own clock only
		}
		v, o, err := get()
		return err == nil && string(v) == "v2" && o == OutcomeHit
	})
	if fails.Load() < 1 {
		t.Errorf("failed loads = %d, want at least 1", fails.Load())
	}
}

func testSoftBadInput(t *testing.T, b backend) {
	c := New(b.rdb, nil)
	ctx := context.Background()
	if err := c.InvalidateSoft(ctx, ""); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("InvalidateSoft(\"\") = %v, want ErrInvalidKey", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.InvalidateSoft(cctx, testKey(t)); !errors.Is(err, context.Canceled) {
		t.Errorf("InvalidateSoft with a cancelled ctx = %v, want context.Canceled", err)
	}
	c.Close()
	if err := c.InvalidateSoft(ctx, testKey(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("InvalidateSoft after Close = %v, want ErrClosed", err)
	}
}

// softRaceHook makes another write of the key land just before each of
// the first n soft invalidation scripts, as a commit or a Set of another
// process racing the compare-and-swap would.
type softRaceHook struct {
	n     atomic.Int64
	write func()
}

func (h *softRaceHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *softRaceHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && (args[1] == softScript.rs.Hash() || args[1] == softLua) && h.n.Add(-1) >= 0 {
			h.write()
		}
		return next(ctx, cmd)
	}
}
func (h *softRaceHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestInvalidateSoftLostRace: a write that lands between the soft
// invalidation's read and its script makes the script refuse and hand
// back the new value, which the next round marks stale; after four lost
// rounds the key is invalidated outright.
func TestInvalidateSoftLostRace(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, tc := range []struct {
		races int
		want  string // the payload left, stale; "" for none
	}{{1, "raced-1"}, {3, "raced-3"}, {softTries, ""}} {
		t.Run(fmt.Sprint(tc.races), func(t *testing.T) {
			ctx := context.Background()
			key := testKey(t)
			other := newTestCache(t, srv.Client(t), nil)
			hooked := srv.Client(t)
			var wrote atomic.Int64
			h := &softRaceHook{write: func() {
				if err := other.Set(ctx, key, fmt.Appendf(nil, "raced-%d", wrote.Add(1)), time.Hour); err != nil {
					t.Error(err)
				}
			}}
			// Loaded first, so that each round sends the script once.
			if err := softScript.rs.Load(ctx, hooked).Err(); err != nil {
				t.Fatal(err)
			}
			h.n.Store(int64(tc.races))
			hooked.AddHook(h)
			c := newTestCache(t, hooked, nil)
			if err := c.Set(ctx, key, []byte("v1"), time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := c.InvalidateSoft(ctx, key); err != nil {
				t.Fatal(err)
			}
			if n := wrote.Load(); n != int64(tc.races) {
				t.Fatalf("raced writes = %d, want %d (the hook did not fire: the test proves nothing)", n, tc.races)
			}
			var o Outcome
			v, found, err := c.Peek(WithOutcome(ctx, &o), key)
			switch {
			case err != nil:
				t.Fatal(err)
			case tc.want == "" && found:
				t.Errorf("after %d lost rounds Peek = (%q, found), want the key invalidated outright", tc.races, v)
			case tc.want != "" && (!found || string(v) != tc.want || o != OutcomeStale):
				t.Errorf("Peek = (%q, %v), outcome %v; want the last raced value %q, stale", v, found, o, tc.want)
			}
			// Every raced Set came before the invalidation: no rebuild that
			// began before the last of them may commit after it.
			if env, ok := peekEnvelope(t, srv.Client(t), key); ok && env.Fence != fenceOf(t, srv.Client(t), key) {
				t.Errorf("the stored value's fence %d is not the key's fence %d", env.Fence, fenceOf(t, srv.Client(t), key))
			}
		})
	}
}

// TestInvalidateSoftNotReplicated: with too few replicas, InvalidateSoft
// reports ErrNotReplicated as Invalidate does; the master has the write.
func TestInvalidateSoftNotReplicated(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	c := newTestCache(t, rdb, &Options{ReplicaAcks: 1, ReplicaTimeout: 50 * time.Millisecond})
	plain := newTestCache(t, rdb, &Options{ReplicaAcks: -1})
	key := "unreplicated"
	if err := plain.Set(ctx, key, []byte("v1"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := c.Invalidate(ctx, key+"-plain"); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("Invalidate = %v, want ErrNotReplicated (the test proves nothing)", err)
	}
	if err := c.InvalidateSoft(ctx, key); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("InvalidateSoft = %v, want ErrNotReplicated", err)
	}
	var o Outcome
	if v, found, err := plain.Peek(WithOutcome(ctx, &o), key); err != nil || !found || string(v) != "v1" || o != OutcomeStale {
		t.Errorf("Peek after the unreplicated InvalidateSoft = (%q, %v, %v), outcome %v; want v1 stale on the master", v, found, err, o)
	}
}

// TestInvalidateSoftRedisDown: with Redis gone, InvalidateSoft returns
// the Redis error (as Invalidate does), and works again once it is back.
func TestInvalidateSoftRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t, shortTimeouts), nil)
	ctx := context.Background()
	if err := c.Set(ctx, "k", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	srv.Kill(t)
	if err := c.InvalidateSoft(ctx, "k"); err == nil || !isInfraError(errors.Unwrap(err)) {
		t.Errorf("InvalidateSoft with Redis killed = %v, want the connection error", err)
	}
	srv.Restart(t)
	waitFor(t, 10*time.Second, "InvalidateSoft to reach Redis again", func() bool {
		return c.InvalidateSoft(ctx, "k") == nil
	})
}

// BenchmarkInvalidateSoft compares InvalidateSoft with Invalidate (each
// followed by a Set that puts the value back), for a 512-byte and a
// 256 KiB value, on a real redis-server, in the same run.
func BenchmarkInvalidateSoft(b *testing.B) {
	rdb := redistest.Start(b).Client(b)
	c := newTestCache(b, rdb, nil)
	ctx := context.Background()
	for _, size := range []int{512, 256 << 10} {
		payload := make([]byte, size)
		for _, mode := range []struct {
			name string
			inv  func(context.Context, string) error
		}{{"Invalidate", c.Invalidate}, {"InvalidateSoft", c.InvalidateSoft}} {
			b.Run(fmt.Sprintf("%s/%dB", mode.name, size), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if err := c.Set(ctx, "k", payload, time.Hour); err != nil {
						b.Fatal(err)
					}
					if err := mode.inv(ctx, "k"); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
