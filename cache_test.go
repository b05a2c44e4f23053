package herd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestCache runs the cache-aside suite on miniredis, a real redis-server
// and a real 3-master Redis Cluster.
func TestCache(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Run("StampedeOneProcess", func(t *testing.T) { testStampedeOneProcess(t, b) })
			t.Run("LeaderCallerCancelled", func(t *testing.T) { testLeaderCallerCancelled(t, b) })
			t.Run("FollowerDeadline", func(t *testing.T) { testFollowerDeadline(t, b) })
			t.Run("LoaderPanic", func(t *testing.T) { testLoaderPanic(t, b) })
			t.Run("LoaderGoexit", func(t *testing.T) { testLoaderGoexit(t, b) })
			t.Run("LoaderBlackholed", func(t *testing.T) { testLoaderBlackholed(t, b) })
			t.Run("LoaderError", func(t *testing.T) { testLoaderError(t, b) })
			t.Run("InvalidateDuringRebuild", func(t *testing.T) { testInvalidateDuringRebuild(t, b) })
			t.Run("SetDuringRebuild", func(t *testing.T) { testSetDuringRebuild(t, b) })
			t.Run("SharedResultAliasing", func(t *testing.T) { testSharedResultAliasing(t, b) })
			t.Run("RoundTrips", func(t *testing.T) { testRoundTrips(t, b) })
			t.Run("CorruptValue", func(t *testing.T) { testCorruptValue(t, b) })
			t.Run("NegativeEntry", func(t *testing.T) { testNegativeEntry(t, b) })
			t.Run("BadInput", func(t *testing.T) { testCacheBadInput(t, b) })
			t.Run("Fetch", func(t *testing.T) { testFetch(t, b) })
			t.Run("FollowersAcrossCaches", func(t *testing.T) { testFollowersAcrossCaches(t, b) })
			t.Run("LargeValueNotInline", func(t *testing.T) { testLargeValueNotInline(t, b) })
			t.Run("FollowerFallback", func(t *testing.T) { testFollowerFallback(t, b) })
		})
	}
}

func newTestCache(t testing.TB, rdb redis.UniversalClient, opt *Options) *Cache {
	t.Helper()
	c := New(rdb, opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// gatedLoader counts its calls and blocks each one until the gate opens.
type gatedLoader struct {
	calls   atomic.Int64
	entered chan struct{} // receives once per call, when it starts
	gate    chan struct{} // closed to let calls return
	val     []byte
	err     error
	ctxErr  atomic.Value // the loader's ctx.Err() when the gate opened
}

func newGatedLoader(val string) *gatedLoader {
	return &gatedLoader{entered: make(chan struct{}, 100), gate: make(chan struct{}), val: []byte(val)}
}

func (g *gatedLoader) load(ctx context.Context) ([]byte, error) {
	g.calls.Add(1)
	g.entered <- struct{}{}
	select {
	case <-g.gate:
	case <-ctx.Done():
	}
	g.ctxErr.Store(fmt.Sprint(ctx.Err()))
	return g.val, g.err
}

func (g *gatedLoader) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the loader was not called")
	}
}

func constLoader(calls *atomic.Int64, val string) LoadFunc {
	return func(context.Context) ([]byte, error) {
		calls.Add(1)
		return []byte(val), nil
	}
}

// L01: 200 goroutines in one process, one origin call.
func testStampedeOneProcess(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	g := newGatedLoader("value")
	key := testKey(t)
	ctx := context.Background()
	const n = 200
	var started sync.WaitGroup
	results := make(chan []byte, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	started.Add(n)
	for range n {
		wg.Go(func() {
			started.Done()
			v, err := c.Get(ctx, key, time.Minute, g.load)
			if err != nil {
				errs <- err
				return
			}
			results <- v
		})
	}
	started.Wait()
	g.waitEntered(t)
	close(g.gate)
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Errorf("Get: %v", err)
	}
	got := 0
	for v := range results {
		got++
		if string(v) != "value" {
			t.Errorf("Get = %q, want %q", v, "value")
		}
	}
	if got != n {
		t.Errorf("%d callers served, want %d", got, n)
	}
	if calls := g.calls.Load(); calls != 1 {
		t.Errorf("origin calls = %d, want 1", calls)
	}
}

// L02: the leader's caller leaves; the load goes on for the others.
func testLeaderCallerCancelled(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	g := newGatedLoader("value")
	key := testKey(t)
	cctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := c.Get(cctx, key, time.Minute, g.load)
		first <- err
	}()
	g.waitEntered(t)
	second := make(chan []byte, 1)
	go func() {
		v, _ := c.Get(context.Background(), key, time.Minute, g.load)
		second <- v
	}()
	cancel()
	select {
	case err := <-first:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled caller: got %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled caller did not return")
	}
	close(g.gate)
	if v := <-second; string(v) != "value" {
		t.Errorf("other caller got %q, want %q", v, "value")
	}
	if got := g.ctxErr.Load(); got != "<nil>" {
		t.Errorf("loader's ctx.Err() = %v after a caller cancelled, want nil", got)
	}
	if calls := g.calls.Load(); calls != 1 {
		t.Errorf("origin calls = %d, want 1", calls)
	}
}

// L03: a follower with a short deadline leaves on time; the rebuild
// still completes and is stored.
func testFollowerDeadline(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	g := newGatedLoader("value")
	key := testKey(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), key, time.Minute, g.load)
		done <- err
	}()
	g.waitEntered(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, key, time.Minute, g.load); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("follower with a 50ms deadline: got %v, want DeadlineExceeded", err)
	}
	close(g.gate)
	if err := <-done; err != nil {
		t.Fatalf("leader: %v", err)
	}
	var calls atomic.Int64
	if v, err := c.Get(context.Background(), key, time.Minute, constLoader(&calls, "other")); err != nil || string(v) != "value" || calls.Load() != 0 {
		t.Errorf("Get after the rebuild = (%q, %v) with %d loads, want the stored value and no load", v, err, calls.Load())
	}
}

// L04: a panicking loader fails every caller with *PanicError, releases
// the lease at once, and does not poison the key.
func testLoaderPanic(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	key := testKey(t)
	keys := mustKeys(t, key)
	gate := make(chan struct{})
	var calls atomic.Int64
	panicky := func(context.Context) ([]byte, error) {
		calls.Add(1)
		<-gate
		panic("boom")
	}
	const n = 20
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			_, err := c.Get(context.Background(), key, time.Minute, panicky)
			errs <- err
		})
	}
	waitFor(t, 5*time.Second, "the loader to start", func() bool { return calls.Load() == 1 })
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		var pe *PanicError
		if !errors.Is(err, ErrLoadFailed) || !errors.As(err, &pe) || pe.Value != "boom" || len(pe.Stack) == 0 {
			t.Errorf("caller: got %v, want ErrLoadFailed wrapping a *PanicError(boom) with a stack", err)
		}
	}
	if n := b.rdb.Exists(context.Background(), keys.Lease).Val(); n != 0 {
		t.Errorf("lease key still exists after the panic")
	}
	if v, err := c.Get(context.Background(), key, time.Minute, constLoader(&calls, "ok")); err != nil || string(v) != "ok" {
		t.Errorf("Get after the panic = (%q, %v), want a fresh load", v, err)
	}
}

func testLoaderGoexit(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	key := testKey(t)
	_, err := c.Get(context.Background(), key, time.Minute, func(context.Context) ([]byte, error) {
		runtime.Goexit()
		return nil, nil
	})
	if !errors.Is(err, ErrLoadFailed) || !errors.Is(err, errGoexit) {
		t.Errorf("Goexit in the loader: got %v, want ErrLoadFailed wrapping errGoexit", err)
	}
	var calls atomic.Int64
	if v, err := c.Get(context.Background(), key, time.Minute, constLoader(&calls, "ok")); err != nil || string(v) != "ok" {
		t.Errorf("Get after Goexit = (%q, %v), want a fresh load", v, err)
	}
}

// L05: a loader that never answers is cut off at LoadTimeout; the next
// Get calls the origin again.
func testLoaderBlackholed(t *testing.T, b backend) {
	const timeout = 300 * time.Millisecond
	c := newTestCache(t, b.rdb, &Options{LoadTimeout: timeout})
	key := testKey(t)
	keys := mustKeys(t, key)
	var calls atomic.Int64
	blackhole := func(ctx context.Context) ([]byte, error) {
		calls.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	start := time.Now()
	_, err := c.Get(context.Background(), key, time.Minute, blackhole)
	if !errors.Is(err, ErrLoadFailed) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("blackholed loader: got %v, want ErrLoadFailed wrapping DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*timeout {
		t.Errorf("caller returned after %v, want about LoadTimeout (%v)", d, timeout)
	}
	if n := b.rdb.Exists(context.Background(), keys.Lease).Val(); n != 0 {
		t.Errorf("lease key still exists after the load timed out")
	}
	if v, err := c.Get(context.Background(), key, time.Minute, constLoader(&calls, "ok")); err != nil || string(v) != "ok" || calls.Load() != 2 {
		t.Errorf("Get after the timeout = (%q, %v), calls %d; want a fresh load (2 calls)", v, err, calls.Load())
	}
}

func testLoaderError(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	key := testKey(t)
	errOrigin := errors.New("origin down")
	var calls atomic.Int64
	_, err := c.Get(context.Background(), key, time.Minute, func(context.Context) ([]byte, error) {
		calls.Add(1)
		return nil, errOrigin
	})
	if !errors.Is(err, ErrLoadFailed) || !errors.Is(err, errOrigin) {
		t.Errorf("got %v, want ErrLoadFailed wrapping the loader's error", err)
	}
	// Errors are not cached: the next Get calls the origin again.
	if v, err := c.Get(context.Background(), key, time.Minute, constLoader(&calls, "ok")); err != nil || string(v) != "ok" || calls.Load() != 2 {
		t.Errorf("Get after an error = (%q, %v), calls %d; want a new load", v, err, calls.Load())
	}
	if s := c.Stats(); s.LoadErrors != 1 {
		t.Errorf("Stats.LoadErrors = %d, want 1", s.LoadErrors)
	}
}

// L06: a rebuild that started before Invalidate never writes its value.
func testInvalidateDuringRebuild(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	g := newGatedLoader("stale")
	key := testKey(t)
	keys := mustKeys(t, key)
	ctx := context.Background()
	done := make(chan []byte, 1)
	go func() {
		v, _ := c.Get(ctx, key, time.Minute, g.load)
		done <- v
	}()
	g.waitEntered(t)
	if err := c.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	close(g.gate)
	if v := <-done; string(v) != "stale" {
		t.Errorf("the leader's own callers got %q, want its value %q", v, "stale")
	}
	if n := b.rdb.Exists(ctx, keys.Value).Val(); n != 0 {
		t.Errorf("a value from before the Invalidate was stored")
	}
	if s := c.Stats(); s.Fenced != 1 {
		t.Errorf("Stats.Fenced = %d, want 1", s.Fenced)
	}
	var calls atomic.Int64
	if v, err := c.Get(ctx, key, time.Minute, constLoader(&calls, "fresh")); err != nil || string(v) != "fresh" || calls.Load() != 1 {
		t.Errorf("Get after Invalidate = (%q, %v), calls %d; want a fresh load", v, err, calls.Load())
	}
}

// Set during a rebuild wins: the rebuild's late commit is fenced.
func testSetDuringRebuild(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	g := newGatedLoader("old")
	key := testKey(t)
	ctx := context.Background()
	done := make(chan struct{})
	go func() {
		c.Get(ctx, key, time.Minute, g.load)
		close(done)
	}()
	g.waitEntered(t)
	if err := c.Set(ctx, key, []byte("set"), time.Minute); err != nil {
		t.Fatal(err)
	}
	close(g.gate)
	<-done
	var calls atomic.Int64
	if v, err := c.Get(ctx, key, time.Minute, constLoader(&calls, "loaded")); err != nil || string(v) != "set" || calls.Load() != 0 {
		t.Errorf("Get after Set = (%q, %v), calls %d; want the Set value without a load", v, err, calls.Load())
	}
	env, ok := wire.DecodeEnvelope([]byte(b.rdb.Get(ctx, mustKeys(t, key).Value).Val()))
	if !ok || env.Fence == 0 {
		t.Errorf("stored envelope %+v: want an intact envelope stamped with Set's fence", env)
	}
}

// L07: callers of one flight may modify what they get.
func testSharedResultAliasing(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	g := newGatedLoader("abcdef")
	key := testKey(t)
	const n = 50
	var wg sync.WaitGroup
	bad := make(chan string, n)
	for range n {
		wg.Go(func() {
			v, err := c.Get(context.Background(), key, time.Minute, g.load)
			if err != nil || string(v) != "abcdef" {
				bad <- fmt.Sprintf("(%q, %v)", v, err)
				return
			}
			for i := range v {
				v[i] = 'x'
			}
		})
	}
	g.waitEntered(t)
	waitFlightJoiners(t, c, key, n-1) // every other caller shares the flight whose result they alias
	close(g.gate)
	wg.Wait()
	close(bad)
	for s := range bad {
		t.Errorf("caller saw %s, want its own intact copy", s)
	}
}

// cmdLog is a go-redis hook that records command names.
type cmdLog struct {
	mu    sync.Mutex
	names []string
}

func (h *cmdLog) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cmdLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.names = append(h.names, cmd.Name())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h *cmdLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		for _, c := range cmds {
			h.names = append(h.names, c.Name())
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (h *cmdLog) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.names
	h.names = nil
	return n
}

// A hit is one GET; a leader's miss of a new key, once misses turned cold
// reads on, is ACQUIRE and COMMIT.
func testRoundTrips(t *testing.T, b backend) {
	if b.cluster {
		t.Skip("a cluster client adds CLUSTER SLOTS and COMMAND INFO probes on first use; the standalone backends count exactly")
	}
	var rdb *redis.Client
	if b.mini != nil {
		rdb = redis.NewClient(&redis.Options{Addr: b.mini.Addr()})
	} else {
		rdb = redis.NewClient(b.rdb.(*redis.Client).Options())
	}
	defer rdb.Close()
	c := newTestCache(t, rdb, nil)
	ctx := context.Background()
	var calls atomic.Int64
	// Warm the script cache so EVALSHA does not fall back to EVAL.
	if _, err := c.Get(ctx, testKey(t)+"warm", time.Minute, constLoader(&calls, "w")); err != nil {
		t.Fatal(err)
	}
	log := &cmdLog{}
	rdb.AddHook(log)
	key := testKey(t)
	if _, err := c.Get(ctx, key, time.Minute, constLoader(&calls, "v")); err != nil {
		t.Fatal(err)
	}
	// The warm-up missed a key this Cache did not know: cold reads are on,
	// so this miss of another new key is ACQUIRE and COMMIT, no GET.
	if got, want := strings.Join(log.take(), " "), "evalsha evalsha"; got != want {
		t.Errorf("leader miss sent %q, want %q", got, want)
	}
	if _, err := c.Get(ctx, key, time.Minute, constLoader(&calls, "v")); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(log.take(), " "), "get"; got != want {
		t.Errorf("hit sent %q, want %q", got, want)
	}
}

// H11: corrupt or foreign bytes at the value key are a miss, rebuilt.
func testCorruptValue(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	ctx := context.Background()
	var calls atomic.Int64
	good := (&envelope{SoftExp: time.Now().Add(time.Hour), Payload: []byte("payload")}).Encode()
	flipped := bytes.Clone(good)
	flipped[len(flipped)-1] ^= 0x01
	for i, bad := range []func(key string) error{
		func(k string) error { return b.rdb.Set(ctx, k, "not an envelope", 0).Err() },
		func(k string) error { return b.rdb.Set(ctx, k, good[:wire.EnvelopeHeader-1], 0).Err() },
		func(k string) error { return b.rdb.Set(ctx, k, flipped, 0).Err() },
		func(k string) error { return b.rdb.Set(ctx, k, append([]byte{9}, good[1:]...), 0).Err() },
		func(k string) error { return b.rdb.HSet(ctx, k, "f", "v").Err() }, // wrong type
	} {
		key := fmt.Sprintf("%s-%d", testKey(t), i)
		if err := bad(mustKeys(t, key).Value); err != nil {
			t.Fatal(err)
		}
		v, err := c.Get(ctx, key, time.Minute, constLoader(&calls, "rebuilt"))
		if err != nil || string(v) != "rebuilt" {
			t.Errorf("case %d: Get = (%q, %v), want a rebuild", i, v, err)
		}
		if v, err := c.Get(ctx, key, time.Minute, constLoader(&calls, "again")); err != nil || string(v) != "rebuilt" {
			t.Errorf("case %d: second Get = (%q, %v), want the rebuilt value stored", i, v, err)
		}
	}
	if s := c.Stats(); s.Corrupt != 4 {
		t.Errorf("Stats.Corrupt = %d, want 4 (the wrong-type value is a plain miss)", s.Corrupt)
	}
}

func testNegativeEntry(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	key := testKey(t)
	var calls atomic.Int64
	notFound := func(context.Context) ([]byte, error) {
		calls.Add(1)
		return nil, fmt.Errorf("user 42: %w", ErrNotFound)
	}
	for i := range 3 {
		if _, err := c.Get(context.Background(), key, time.Minute, notFound); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get %d: got %v, want ErrNotFound", i, err)
		}
	}
	if calls.Load() != 1 {
		t.Errorf("origin calls = %d, want 1 (the negative entry answers the rest)", calls.Load())
	}
	if s := c.Stats(); s.NegativeHits != 2 {
		t.Errorf("Stats.NegativeHits = %d, want 2", s.NegativeHits)
	}
	// With negatives off, every Get asks the origin.
	c2 := newTestCache(t, b.rdb, &Options{NegativeTTL: -1, Prefix: "neg"})
	for range 2 {
		if _, err := c2.Get(context.Background(), key, time.Minute, notFound); !errors.Is(err, ErrNotFound) {
			t.Errorf("got %v, want ErrNotFound", err)
		}
	}
	if calls.Load() != 3 {
		t.Errorf("origin calls = %d, want 3 with NegativeTTL < 0", calls.Load())
	}
}

func testCacheBadInput(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, &Options{MaxValueBytes: 1024})
	ctx := context.Background()
	var calls atomic.Int64
	load := constLoader(&calls, "v")
	for _, tc := range []struct {
		name string
		key  string
		ttl  time.Duration
		load LoadFunc
		want error
	}{
		{"empty key", "", time.Minute, load, ErrInvalidKey},
		{"nil loader", "k", time.Minute, nil, ErrNilLoader},
		{"zero ttl", "k", 0, load, ErrInvalidTTL},
		{"negative ttl", "k", -time.Minute, load, ErrInvalidTTL},
		{"value too large", testKey(t), time.Minute, func(context.Context) ([]byte, error) { return make([]byte, 2048), nil }, ErrValueTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := c.Get(ctx, tc.key, tc.ttl, tc.load); !errors.Is(err, tc.want) {
				t.Errorf("Get: got %v, want %v", err, tc.want)
			}
		})
	}
	if calls.Load() != 0 {
		t.Errorf("the loader ran %d times for invalid calls", calls.Load())
	}
	if n := b.rdb.Exists(ctx, mustKeys(t, testKey(t)).Value).Val(); n != 0 {
		t.Errorf("a value over MaxValueBytes was stored")
	}
	if err := c.Set(ctx, "k", make([]byte, 2048), time.Minute); !errors.Is(err, ErrValueTooLarge) {
		t.Errorf("Set(2 KiB) with MaxValueBytes 1024: got %v, want ErrValueTooLarge", err)
	}
	if err := c.Set(ctx, "", nil, time.Minute); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Set(empty key): got %v, want ErrInvalidKey", err)
	}
	if err := c.Set(ctx, "k", nil, 0); !errors.Is(err, ErrInvalidTTL) {
		t.Errorf("Set(ttl 0): got %v, want ErrInvalidTTL", err)
	}
	if err := c.Invalidate(ctx, ""); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Invalidate(empty key): got %v, want ErrInvalidKey", err)
	}
	if _, err := Fetch[int](ctx, c, "k", time.Minute, nil); !errors.Is(err, ErrNilLoader) {
		t.Errorf("Fetch(nil loader): got %v, want ErrNilLoader", err)
	}
}

func testFetch(t *testing.T, b backend) {
	type user struct {
		ID   int
		Name string
	}
	c := newTestCache(t, b.rdb, nil)
	ctx := context.Background()
	key := testKey(t)
	var calls atomic.Int64
	load := func(context.Context) (user, error) {
		calls.Add(1)
		return user{42, "Ada"}, nil
	}
	for range 2 {
		u, err := Fetch(ctx, c, key, time.Minute, load)
		if err != nil || u != (user{42, "Ada"}) {
			t.Errorf("Fetch = (%+v, %v), want {42 Ada}", u, err)
		}
	}
	if calls.Load() != 1 {
		t.Errorf("loads = %d, want 1", calls.Load())
	}
	// Stored bytes that do not decode into T are a clear error.
	if _, err := Fetch(ctx, c, key, time.Minute, func(context.Context) ([]string, error) { return nil, nil }); err == nil || !strings.Contains(err.Error(), "decode") {
		t.Errorf("Fetch into the wrong type: got %v, want a decode error", err)
	}
}

// Several Caches on one Redis (as several processes would be): one load,
// the others are followers woken by the notification.
func testFollowersAcrossCaches(t *testing.T, b backend) {
	key := testKey(t)
	g := newGatedLoader("shared")
	// The gate opens once every follower has looked again after
	// subscribing and after its subscription's confirmation (its second
	// and third ACQUIRE): a follower descheduled past the commit would find
	// the value on such a look, and its wait would end by no message.
	// (A NOSCRIPT reply, which go-redis follows with an EVAL, is not counted.)
	var acquired atomic.Int64
	var counting atomic.Bool
	counting.Store(true)
	defer counting.Store(false)
	lease := mustKeys(t, key).Lease
	b.rdb.AddHook(cmdHook{after: func(cmd redis.Cmder) {
		if counting.Load() && cmd.Err() == nil && isAcquireCmd(cmd) && slices.Contains(cmd.Args(), any(lease)) {
			acquired.Add(1)
		}
	}})
	// No poll may come before the value: the leader's lease (whose end a
	// follower looks at) and the followers' PollMax are longer than the
	// test, however slow the machine, so a poll here means a message was
	// missed.
	leader := newTestCache(t, b.rdb, &Options{DefaultLease: time.Minute, MaxLease: time.Minute})
	done := make(chan []byte, 1)
	go func() {
		v, _ := leader.Get(context.Background(), key, time.Minute, g.load)
		done <- v
	}()
	g.waitEntered(t)
	var (
		mu   sync.Mutex
		ends []WaitEnd
	)
	obs := &Observer{Wait: func(_ string, _ time.Duration, end WaitEnd) {
		mu.Lock()
		ends = append(ends, end)
		mu.Unlock()
	}}
	var followers []*Cache
	results := make(chan []byte, 3)
	for range 3 {
		f := newTestCache(t, b.rdb, &Options{Observer: obs, PollMax: time.Minute})
		followers = append(followers, f)
		go func() {
			v, err := f.Get(context.Background(), key, time.Minute, g.load)
			if err != nil {
				v = []byte(err.Error())
			}
			results <- v
		}()
	}
	waitFor(t, 5*time.Second, "followers to wait", func() bool {
		n := 0
		for _, f := range followers {
			n += int(f.Stats().Waits)
		}
		return n == 3
	})
	waitSubscribedTB(t, b, mustKeys(t, key).Channel, 3)
	waitFor(t, 5*time.Second, "followers to look again after subscribing", func() bool {
		return acquired.Load() >= 1+3*3 // the leader's, then each follower's three
	})
	close(g.gate)
	<-done
	for range 3 {
		if v := <-results; string(v) != "shared" {
			t.Errorf("follower got %q, want %q", v, "shared")
		}
	}
	if calls := g.calls.Load(); calls != 1 {
		t.Errorf("origin calls = %d, want 1", calls)
	}
	// Every wait ended on a message (the value, or the subscription's
	// confirmation that made the follower look just as the value landed),
	// never on a poll.
	var polled uint64
	for _, f := range followers {
		polled += f.Stats().Polled
	}
	mu.Lock()
	defer mu.Unlock()
	if polled != 0 || len(ends) != 3 || slices.ContainsFunc(ends, func(e WaitEnd) bool { return e != WaitNotified }) {
		t.Errorf("followers' waits ended %v with %d polls; want 3 ended by messages, no polls", ends, polled)
	}
}

// A value over NotifyMaxBytes is announced, not sent: followers GET it.
func testLargeValueNotInline(t *testing.T, b backend) {
	key := testKey(t)
	big := strings.Repeat("x", 4096)
	g := newGatedLoader(big)
	leader := newTestCache(t, b.rdb, &Options{NotifyMaxBytes: 1024})
	follower := newTestCache(t, b.rdb, &Options{NotifyMaxBytes: 1024})
	go leader.Get(context.Background(), key, time.Minute, g.load)
	g.waitEntered(t)
	res := make(chan []byte, 1)
	go func() {
		v, _ := follower.Get(context.Background(), key, time.Minute, g.load)
		res <- v
	}()
	waitFor(t, 5*time.Second, "the follower to wait", func() bool { return follower.Stats().Waits == 1 })
	close(g.gate)
	if v := <-res; string(v) != big {
		t.Errorf("follower got %d bytes, want the 4096-byte value", len(v))
	}
}

// D15: a follower that spends its budget applies Fallback.
func testFollowerFallback(t *testing.T, b backend) {
	key := testKey(t)
	g := newGatedLoader("slow")
	defer close(g.gate)
	leader := newTestCache(t, b.rdb, nil)
	go leader.Get(context.Background(), key, time.Minute, g.load)
	g.waitEntered(t)

	const budget = 300 * time.Millisecond
	ctx := context.Background()
	errFollower := newTestCache(t, b.rdb, &Options{WaitTimeout: budget, Fallback: ReturnError})
	if _, err := errFollower.Get(ctx, key, time.Minute, g.load); !errors.Is(err, ErrWaitTimeout) {
		t.Errorf("ReturnError: got %v, want ErrWaitTimeout", err)
	}
	staleFollower := newTestCache(t, b.rdb, &Options{WaitTimeout: budget, Fallback: ServeStale})
	if _, err := staleFollower.Get(ctx, key, time.Minute, g.load); !errors.Is(err, ErrWaitTimeout) {
		t.Errorf("ServeStale without a stale value: got %v, want ErrWaitTimeout", err)
	}
	localFollower := newTestCache(t, b.rdb, &Options{WaitTimeout: budget})
	var calls atomic.Int64
	if v, err := localFollower.Get(ctx, key, time.Minute, constLoader(&calls, "local")); err != nil || string(v) != "local" {
		t.Errorf("LoadLocally: got (%q, %v), want a local load", v, err)
	}
	if s := localFollower.Stats(); s.WaitTimeouts != 1 || s.LocalLoads != 1 {
		t.Errorf("Stats = %+v, want one wait timeout and one local load", s)
	}
	if n := b.rdb.Exists(ctx, mustKeys(t, key).Value).Val(); n != 0 {
		t.Errorf("the local fallback load was stored; it holds no lease and must not write")
	}
}

// failCodec is a Codec whose Marshal fails.
type failCodec struct{ JSON }

var errCodec = errors.New("codec says no")

func (failCodec) Marshal(any) ([]byte, error) { return nil, errCodec }

// TestSetValueRoundTrip: a value written with SetValue (with tags
// or without) is what Fetch[T] returns, without calling the loader; a tagged one goes
// with its tag.
func TestSetValueRoundTrip(t *testing.T) {
	t.Parallel()
	type user struct {
		ID   int
		Name string
	}
	c := New(redistest.Start(t).Client(t), nil)
	defer c.Close()
	ctx := context.Background()
	noLoad := func(context.Context) (user, error) {
		t.Error("the loader ran: the written value was not read back")
		return user{}, nil
	}
	want := user{42, "Ada"}
	if err := SetValue(ctx, c, "user:42", want, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, err := Fetch(ctx, c, "user:42", time.Minute, noLoad); err != nil || got != want {
		t.Errorf("Fetch after SetValue: %+v, %v; want %+v", got, err, want)
	}

	tagged := user{7, "Grace"}
	if err := SetValue(ctx, c, "user:7", tagged, time.Minute, "team:1"); err != nil {
		t.Fatal(err)
	}
	if got, err := Fetch(ctx, c, "user:7", time.Minute, noLoad); err != nil || got != tagged {
		t.Errorf("Fetch after a tagged SetValue: %+v, %v; want %+v", got, err, tagged)
	}
	if err := c.InvalidateTag(ctx, "team:1"); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := c.Peek(ctx, "user:7"); ok || err != nil {
		t.Errorf("after InvalidateTag: %q, %v, %v; want nothing", v, ok, err)
	}
}

// TestSetValueCodecError: a value the codec cannot encode is a wrapped
// codec error and nothing is written; the same for JSON's own failure.
func TestSetValueCodecError(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	c := New(rdb, &Options{Codec: failCodec{}})
	defer c.Close()
	if err := SetValue(ctx, c, "k", 1, time.Minute); !errors.Is(err, errCodec) {
		t.Errorf("SetValue with a failing codec: %v, want it to wrap the codec's error", err)
	}
	if err := SetValue(ctx, c, "k", 1, time.Minute, "t"); !errors.Is(err, errCodec) {
		t.Errorf("tagged SetValue with a failing codec: %v, want it to wrap the codec's error", err)
	}
	if _, ok, err := c.Peek(ctx, "k"); ok || err != nil {
		t.Errorf("after the failed writes: ok %v, err %v; want nothing stored", ok, err)
	}

	j := New(rdb, nil)
	defer j.Close()
	var jerr *json.UnsupportedTypeError
	if err := SetValue(ctx, j, "ch", make(chan int), time.Minute); !errors.As(err, &jerr) {
		t.Errorf("SetValue of a chan with JSON: %v, want a *json.UnsupportedTypeError", err)
	}
}

// TestGetAfterASetIsAnsweredByItWhileAnOlderLoadRuns: a Get that begins
// after another process's Set of the key returned gets the Set's value at
// once, while this process's flight of the key still runs a load begun
// before the Set: it neither waits for that load nor takes its result,
// whether the load then fails or succeeds. (A hostile reading broke this
// when a Get joined a young flight without reading.)
func TestGetAfterASetIsAnsweredByItWhileAnOlderLoadRuns(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name string
		val  []byte
		err  error
	}{{"load fails", nil, errors.New("source down")}, {"load succeeds", []byte("from before the Set"), nil}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newTestCache(t, srv.Client(t), nil)
			w := newTestCache(t, srv.Client(t), nil) // another process: the writer
			bg := context.Background()
			key := testKey(t)
			entered, release := make(chan struct{}), make(chan struct{})
			aDone := make(chan struct{})
			go func() {
				defer close(aDone)
				c.Get(bg, key, time.Hour, func(context.Context) ([]byte, error) {
					close(entered)
					<-release
					return tc.val, tc.err
				})
			}()
			<-entered
			defer func() { close(release); <-aDone }()
			if err := w.Set(bg, key, []byte("set"), time.Hour); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(bg, 10*time.Second)
			defer cancel()
			v, err := c.Get(ctx, key, time.Hour, func(context.Context) ([]byte, error) { return []byte("reloaded"), nil })
			if err != nil || string(v) != "set" {
				t.Fatalf("a Get begun after the Set returned, while the older load runs: (%q, %v); want the Set's value at once", v, err)
			}
		})
	}
}
