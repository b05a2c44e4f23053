package herd

import (
	"context"
	"errors"
	"fmt"
	"github.com/herdkit/herd/internal/redistest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestFill runs the Begin/Fill suite on miniredis, a real redis-server
// and a real cluster.
func TestFill(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Run("CommitThenHit", func(t *testing.T) { testFillCommitThenHit(t, b) })
			t.Run("LocalAndRemoteWaiters", func(t *testing.T) { testFillWaiters(t, b) })
			t.Run("AbortNotShared", func(t *testing.T) { testFillAbort(t, b, ErrNotShared) })
			t.Run("AbortFailure", func(t *testing.T) { testFillAbort(t, b, ErrLoadFailed) })
			t.Run("FollowerCancelled", func(t *testing.T) { testFillFollowerCancelled(t, b) })
			t.Run("BadCommit", func(t *testing.T) { testFillBadCommit(t, b) })
		})
	}
}

func testFillCommitThenHit(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	ctx := context.Background()
	key := testKey(t)
	hit, fill, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || hit != nil || fill == nil || !fill.Leased() {
		t.Fatalf("Begin on a cold key = (%v, %v, %v), want a leased Fill", hit, fill, err)
	}
	if err := fill.Commit([]byte("built"), time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	fill.Abort(errors.New("too late")) // after Commit: no effect
	hit, fill, err = c.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill != nil || hit == nil || string(hit.Value) != "built" || hit.Outcome != OutcomeHit {
		t.Fatalf("Begin after Commit = (%+v, %v, %v), want a hit", hit, fill, err)
	}
	if age := time.Since(hit.WrittenAt); age < 0 || age > time.Minute {
		t.Errorf("WrittenAt %v is not the commit time", hit.WrittenAt)
	}
	if n := b.rdb.Exists(ctx, mustKeys(t, key).Lease).Val(); n != 0 {
		t.Errorf("lease still held after Commit")
	}
}

func testFillWaiters(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	other := newTestCache(t, b.rdb, nil)
	ctx := context.Background()
	key := testKey(t)
	_, fill, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin: %v", err)
	}
	type res struct {
		hit *Hit
		err error
	}
	local, remote := make(chan res, 1), make(chan res, 1)
	go func() {
		h, f, err := c.Begin(ctx, key, time.Minute, nil)
		if f != nil {
			err = errors.New("a local waiter got a Fill")
		}
		local <- res{h, err}
	}()
	go func() {
		h, f, err := other.Begin(ctx, key, time.Minute, nil)
		if f != nil {
			err = errors.New("a remote waiter got a Fill")
		}
		remote <- res{h, err}
	}()
	waitFor(t, 5*time.Second, "the remote waiter to follow", func() bool { return other.Stats().Waits == 1 })
	waitSubscribedTB(t, b, mustKeys(t, key).Channel, 1)
	waitLocalWaiters(t, c, key, 1)
	if err := fill.Commit([]byte("shared"), time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]chan res{"local": local, "remote": remote} {
		r := <-ch
		if r.err != nil || r.hit == nil || string(r.hit.Value) != "shared" || r.hit.Outcome != OutcomeFollower {
			t.Errorf("%s waiter = (%+v, %v), want the committed value as a follower", name, r.hit, r.err)
		}
	}
}

func testFillAbort(t *testing.T, b backend, want error) {
	c := newTestCache(t, b.rdb, nil)
	other := newTestCache(t, b.rdb, nil)
	ctx := context.Background()
	key := testKey(t)
	_, fill, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin: %v", err)
	}
	local, remote := make(chan error, 1), make(chan error, 1)
	go func() { _, _, err := c.Begin(ctx, key, time.Minute, nil); local <- err }()
	go func() {
		_, f, err := other.Begin(ctx, key, time.Minute, nil)
		if f != nil {
			// The abort released the lease just as the waiter looked at
			// Redis (its subscription's confirmation): it took the lease,
			// which is what a retry would do. Count it as told.
			err = want
			f.Abort(nil)
		}
		remote <- err
	}()
	waitFor(t, 5*time.Second, "the remote waiter to follow", func() bool { return other.Stats().Waits == 1 })
	waitSubscribedTB(t, b, mustKeys(t, key).Channel, 1)
	waitLocalWaiters(t, c, key, 1)
	start := time.Now()
	cause := errors.New("the handler failed")
	if want == ErrNotShared {
		cause = fmt.Errorf("%w: the response sets a cookie", ErrNotShared)
	}
	fill.Abort(cause)
	for name, ch := range map[string]chan error{"local": local, "remote": remote} {
		err := <-ch
		if !errors.Is(err, want) {
			t.Errorf("%s waiter: got %v, want %v", name, err, want)
		}
		// The cause said once, with its detail.
		if err != want && (strings.Count(err.Error(), ErrNotShared.Error()) > 1 || want == ErrNotShared && !strings.Contains(err.Error(), "sets a cookie")) {
			t.Errorf("%s waiter: %q, want %q once and the cause's detail", name, err, ErrNotShared)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("waiters learned of the abort after %v; the lease (1s) must not be waited out", d)
	}
	// The key is free: the next Begin leads.
	waitFor(t, 5*time.Second, "the lease to be free", func() bool {
		return b.rdb.Exists(ctx, mustKeys(t, key).Lease).Val() == 0
	})
	_, fill, err = other.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill == nil || !fill.Leased() {
		t.Fatalf("Begin after Abort = (%v, %v), want a new leased Fill", fill, err)
	}
	fill.Abort(nil)
}

func testFillFollowerCancelled(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	other := newTestCache(t, b.rdb, nil)
	key := testKey(t)
	_, fill, err := c.Begin(context.Background(), key, time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin: %v", err)
	}
	defer fill.Abort(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := other.Begin(ctx, key, time.Minute, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("remote follower with a 100ms deadline: got %v, want DeadlineExceeded", err)
	}
	if _, _, err := c.Begin(ctx, key, time.Minute, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("local follower with an expired deadline: got %v, want DeadlineExceeded", err)
	}
}

func testFillBadCommit(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, &Options{MaxValueBytes: 8})
	ctx := context.Background()
	key := testKey(t)
	if _, _, err := c.Begin(ctx, "", time.Minute, nil); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Begin(empty key): got %v, want ErrInvalidKey", err)
	}
	if _, _, err := c.Begin(ctx, key, 0, nil); !errors.Is(err, ErrInvalidTTL) {
		t.Errorf("Begin(ttl 0): got %v, want ErrInvalidTTL", err)
	}
	_, fill, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatal(err)
	}
	local := make(chan *Hit, 1)
	go func() {
		h, _, _ := c.Begin(ctx, key, time.Minute, nil)
		local <- h
	}()
	waitLocalWaiters(t, c, key, 1)
	if err := fill.Commit([]byte("more than eight bytes"), time.Minute, 0); !errors.Is(err, ErrValueTooLarge) {
		t.Errorf("Commit(too large): got %v, want ErrValueTooLarge", err)
	}
	if h := <-local; h == nil || string(h.Value) != "more than eight bytes" {
		t.Errorf("a local waiter got %+v, want the value that was too large to store", h)
	}
	if n := b.rdb.Exists(ctx, mustKeys(t, key).Lease, mustKeys(t, key).Value).Val(); n != 0 {
		t.Errorf("after a refused Commit the lease or a value remains")
	}
}

// With Redis down, Begin hands out an unleased Fill, and callers in the
// process share it.
func TestFillRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t, shortTimeouts), nil)
	srv.Stop(t)
	ctx := context.Background()
	_, fill, err := c.Begin(ctx, "k", time.Minute, nil)
	if err != nil || fill == nil || fill.Leased() {
		t.Fatalf("Begin with Redis down = (%v, %v), want an unleased Fill", fill, err)
	}
	got := make(chan string, 1)
	go func() {
		h, _, err := c.Begin(ctx, "k", time.Minute, nil)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(h.Value)
	}()
	waitLocalWaiters(t, c, "k", 1) // the second caller waits on the unleased Fill
	fill.Commit([]byte("local"), time.Minute, 0)
	if v := <-got; v != "local" {
		t.Errorf("second caller got %q, want the first caller's value", v)
	}
}

// A stale hit through Begin refreshes with the given function.
func TestFillStaleRefresh(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	clk := newFakeClock()
	c := withClock(newTestCache(t, srv.Client(t), nil), clk)
	ctx := context.Background()
	_, fill, err := c.Begin(ctx, "k", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	fill.Commit([]byte("old"), time.Minute, time.Hour)
	clk.Advance(2 * time.Minute)
	var calls atomic.Int64
	refresh := func(context.Context) ([]byte, error) {
		calls.Add(1)
		return []byte("new"), nil
	}
	prepared := 0
	prepare := func() LoadFunc { prepared++; return refresh }
	hit, _, err := c.Begin(ctx, "k", time.Minute, prepare)
	if err != nil || string(hit.Value) != "old" || hit.Outcome != OutcomeStale {
		t.Fatalf("stale Begin = (%+v, %v), want the old value, outcome stale", hit, err)
	}
	// Probes without a refresh function of their own: one that reads the
	// old value just as the refresh ends would start (and prepare) a
	// refresh of its own, which is not what is counted here.
	waitFor(t, 5*time.Second, "the refresh", func() bool {
		h, _, _ := c.Begin(ctx, "k", time.Minute, nil)
		return h != nil && string(h.Value) == "new"
	})
	if calls.Load() != 1 || prepared != 1 {
		t.Errorf("refresh calls = %d, prepared %d times; want 1 and 1 (prepared in Begin's goroutine when the refresh starts)", calls.Load(), prepared)
	}
}

// waitLocalWaiters waits until n callers wait on c's local Fill of key.
func waitLocalWaiters(t *testing.T, c *Cache, key string, n int) {
	t.Helper()
	waitFor(t, 5*time.Second, "local waiters", func() bool {
		c.fillMu.Lock()
		defer c.fillMu.Unlock()
		lf := c.fills[key]
		return lf != nil && lf.waiters >= n
	})
}

// Options.WaitTimeout: "When set, it is a hard bound." A Begin that
// waits for this process's Fill, sees it handed over late in its budget,
// and then follows the caller that took the lease next, must still give
// up at one WaitTimeout from its start, not at a fresh budget per wait.
func TestBeginWaitTimeoutBoundsEveryWaitOfOneCall(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const budget = 2 * time.Second
	c := newTestCache(t, srv.Client(t), &Options{WaitTimeout: budget})
	ctx := context.Background()
	key := testKey(t)
	_, first, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || first == nil {
		t.Fatalf("first Begin = (%v, %v), want a Fill", first, err)
	}
	type result struct {
		fill *Fill
		hit  *Hit
		err  error
		took time.Duration
	}
	out := make(chan result, 2)
	start := time.Now()
	for range 2 {
		go func() {
			t0 := time.Now()
			hit, fl, err := c.Begin(ctx, key, time.Minute, nil)
			out <- result{fl, hit, err, time.Since(t0)}
		}()
	}
	waitFor(t, 5*time.Second, "both Begins waiting on the first Fill", func() bool {
		c.fillMu.Lock()
		defer c.fillMu.Unlock()
		lf := c.fills[key]
		return lf != nil && lf.waiters == 2
	})
	// Late in the waiters' budget, the first Fill's caller leaves: one
	// waiter takes the lease, and holds it; the other follows it.
	time.Sleep(time.Until(start.Add(9 * budget / 10)))
	first.Handover()
	a := <-out
	if a.fill == nil || !a.fill.Leased() {
		t.Fatalf("the first Begin to return after the hand-over: fill %v, hit %v, err %v; want the lease", a.fill, a.hit, a.err)
	}
	defer a.fill.Abort(nil)
	b := <-out
	if b.fill != nil {
		defer b.fill.Abort(nil)
	}
	// Fallback LoadLocally: an unleased Fill once the budget is spent.
	if b.fill == nil || b.fill.Leased() {
		t.Fatalf("the follower: fill %v, hit %v, err %v; want an unleased Fill (Fallback LoadLocally)", b.fill, b.hit, b.err)
	}
	// Wait by wait, it would take 1.9 budgets; a loaded machine gets 0.4.
	if b.took > budget+2*budget/5 {
		t.Errorf("the follower's Begin took %v with WaitTimeout %v: each wait had a budget of its own", b.took.Round(time.Millisecond), budget)
	}
}

// Fill.Commit's doc: "Calls after the first Commit or Abort do nothing and
// return nil", and Cache.Close's: "A Fill that Close aborted has given its
// lease back: its Commit and Abort do nothing and return nil". A late
// Commit whose arguments would have been refused on a live Fill (an
// oversized value, a bad ttl) still does nothing, so it must return nil
// too: a caller that logs or counts Commit's error after Close (the HTTP
// middleware finishing a response while the server shuts down) must not
// see a failure for a Fill that no longer exists.
func TestFillCommitAfterCloseAbortedItReturnsNil(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, &Options{MaxValueBytes: 8})
	ctx := context.Background()
	key := testKey(t)
	hit, fill, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || hit != nil || fill == nil || !fill.Leased() {
		t.Fatalf("Begin on a cold key = (%v, %v, %v), want a leased Fill", hit, fill, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, mustKeys(t, key).Lease).Val(); n != 0 {
		t.Fatalf("lease still held after Close aborted the Fill")
	}
	for name, commit := range map[string]func() error{
		"a value above MaxValueBytes": func() error { return fill.Commit([]byte(strings.Repeat("x", 64)), time.Minute, 0) },
		"a ttl of zero":               func() error { return fill.Commit([]byte("v"), 0, 0) },
		"a valid value":               func() error { return fill.Commit([]byte("v"), time.Minute, 0) },
	} {
		if err := commit(); err != nil {
			t.Errorf("Commit with %s after Close aborted the Fill = %v, want nil (the doc: it does nothing and returns nil)", name, err)
		}
	}
	if err := fill.Pass(nil, 0); err != nil {
		t.Errorf("Pass with a ttl of zero after Close aborted the Fill = %v, want nil (Pass's doc: calls after the first Commit, Abort, Handover or Pass do nothing and return nil)", err)
	}
}

// The same for a Fill that was already committed.
func TestFillSecondCommitReturnsNil(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, &Options{MaxValueBytes: 8})
	ctx := context.Background()
	key := testKey(t)
	_, fill, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin on a cold key: fill %v, err %v", fill, err)
	}
	if err := fill.Commit([]byte("built"), time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	if err := fill.Commit([]byte(strings.Repeat("x", 64)), time.Minute, 0); err != nil {
		t.Errorf("second Commit (oversized) = %v, want nil: calls after the first Commit do nothing and return nil", err)
	}
	if err := fill.Commit([]byte("late"), 0, 0); err != nil {
		t.Errorf("second Commit (ttl 0) = %v, want nil: calls after the first Commit do nothing and return nil", err)
	}
	got, found, err := c.Peek(ctx, key)
	if err != nil || !found || string(got) != "built" {
		t.Errorf("Peek after the late Commits = (%q, %v, %v), want the first Commit's value", got, found, err)
	}
}

// TestFillPassFenced: a pass mark is written like a value, so a Pass by a
// rebuild that started before an Invalidate or a Set of its key (in
// another process) leaves no mark: the purge stands, and the Set's value
// is served. After the mark, a Set or an Invalidate replaces it at once.
func TestFillPassFenced(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestCache(t, b.rdb, nil)
			other := newTestCache(t, b.rdb, nil)
			ctx := context.Background()
			for _, purge := range []string{"invalidate", "set"} {
				key := testKey(t) + "/" + purge
				_, fill, err := c.Begin(ctx, key, time.Minute, nil)
				if err != nil || fill == nil || !fill.Leased() {
					t.Fatalf("Begin on a cold key = (%v, %v), want a leased Fill", fill, err)
				}
				if purge == "set" {
					err = other.Set(ctx, key, []byte("set"), time.Minute)
				} else {
					err = other.Invalidate(ctx, key)
				}
				if err != nil {
					t.Fatal(err)
				}
				_ = fill.Pass(errors.New("sets a cookie"), time.Minute)
				for name, cache := range map[string]*Cache{"this": c, "other": other} {
					hit, f, err := cache.Begin(ctx, key, time.Minute, nil)
					if f != nil {
						f.Abort(nil)
					}
					switch {
					case errors.Is(err, ErrPass):
						t.Errorf("%s after a %s during the rebuild: %s process finds the rebuild's pass mark", purge, purge, name)
					case purge == "set" && (hit == nil || string(hit.Value) != "set"):
						t.Errorf("%s process after a Set during the rebuild: (%v, %v, %v), want the Set's value", name, hit, f, err)
					case purge == "invalidate" && f == nil:
						t.Errorf("%s process after an Invalidate during the rebuild: (%v, %v), want a Fill", name, hit, err)
					}
				}
			}
			// A mark, then a purge of it.
			for _, purge := range []string{"invalidate", "set"} {
				key := testKey(t) + "/after-" + purge
				_, fill, err := c.Begin(ctx, key, time.Minute, nil)
				if err != nil || fill == nil {
					t.Fatal(fill, err)
				}
				if err := fill.Pass(nil, time.Minute); err != nil {
					t.Fatal(err)
				}
				if purge == "set" {
					err = other.Set(ctx, key, []byte("set"), time.Minute)
				} else {
					err = other.Invalidate(ctx, key)
				}
				if err != nil {
					t.Fatal(err)
				}
				hit, f, err := c.Begin(ctx, key, time.Minute, nil)
				if f != nil {
					f.Abort(nil)
				}
				if errors.Is(err, ErrPass) || (purge == "set" && (hit == nil || string(hit.Value) != "set")) || (purge == "invalidate" && f == nil) {
					t.Errorf("after a %s of a marked key: (%v, %v, %v)", purge, hit, f, err)
				}
			}
		})
	}
}

// TestLoadTooLargeCountedAlike: a loader's value above MaxValueBytes is
// a failed load both in Stats and to the Observer (the Prometheus
// adapter's loads_total): Stats counted a load error while the Observer
// was told the load succeeded.
func TestLoadTooLargeCountedAlike(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	co, obs := newCountingObserver()
	c := newTestCache(t, srv.Client(t), &Options{Observer: obs, MaxValueBytes: 1024})
	_, err := c.Get(context.Background(), "big", time.Minute, func(context.Context) ([]byte, error) {
		return make([]byte, 2048), nil
	})
	if !errors.Is(err, ErrValueTooLarge) {
		t.Fatalf("Get of a too large value: %v, want ErrValueTooLarge", err)
	}
	s := c.Stats()
	var failed int
	errs := co.loadErrs()
	for _, e := range errs {
		if e != nil && !errors.Is(e, ErrNotShared) && !errors.Is(e, ErrNotFound) {
			failed++
		}
	}
	if len(errs) != int(s.Loads+s.LocalLoads) || failed != int(s.LoadErrors) {
		t.Errorf("Observer: %d loads, %d failed (%v); Stats: %d loads, %d load errors", len(errs), failed, errs, s.Loads+s.LocalLoads, s.LoadErrors)
	}
}

// countingObserver counts Lookup outcomes and Load results.
type countingObserver struct {
	mu      sync.Mutex
	lookups map[Outcome]int
	loads   []error
}

func newCountingObserver() (*countingObserver, *Observer) {
	co := &countingObserver{lookups: map[Outcome]int{}}
	return co, &Observer{
		Lookup: func(_ string, o Outcome) {
			co.mu.Lock()
			defer co.mu.Unlock()
			co.lookups[o]++
		},
		Load: func(_ string, _ time.Duration, err error, _ bool) {
			co.mu.Lock()
			defer co.mu.Unlock()
			co.loads = append(co.loads, err)
		},
	}
}

func (co *countingObserver) lookup(o Outcome) int {
	co.mu.Lock()
	defer co.mu.Unlock()
	return co.lookups[o]
}

func (co *countingObserver) loadErrs() []error {
	co.mu.Lock()
	defer co.mu.Unlock()
	return append([]error(nil), co.loads...)
}

// TestFillPass: a Fill that passes tells its waiters, local and remote,
// to build the value themselves, and leaves a mark that makes every later
// Begin, in every process, return ErrPass at once, without a lease; Get
// rebuilds over the mark.
func TestFillPass(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			co, obs := newCountingObserver()
			c := newTestCache(t, b.rdb, &Options{Observer: obs})
			other := newTestCache(t, b.rdb, nil)
			ctx := context.Background()
			key := testKey(t)
			_, fill, err := c.Begin(ctx, key, time.Minute, nil)
			if err != nil || fill == nil || !fill.Leased() {
				t.Fatalf("Begin on a cold key = (%v, %v), want a leased Fill", fill, err)
			}
			local, remote := make(chan error, 1), make(chan error, 1)
			go func() { _, _, err := c.Begin(ctx, key, time.Minute, nil); local <- err }()
			go func() {
				_, f, err := other.Begin(ctx, key, time.Minute, nil)
				if f != nil {
					f.Abort(nil)
					err = errors.New("a remote waiter got a Fill")
				}
				remote <- err
			}()
			waitFor(t, 5*time.Second, "the remote waiter to follow", func() bool { return other.Stats().Waits == 1 })
			waitSubscribedTB(t, b, mustKeys(t, key).Channel, 1)
			waitLocalWaiters(t, c, key, 1)
			if err := fill.Pass(errors.New("sets a cookie"), time.Minute); err != nil {
				t.Fatal(err)
			}
			for name, ch := range map[string]chan error{"local": local, "remote": remote} {
				if err := <-ch; !errors.Is(err, ErrNotShared) || errors.Is(err, ErrPass) {
					t.Errorf("%s waiter: got %v, want ErrNotShared (it waited on the rebuild, it found no mark)", name, err)
				}
			}
			keys := mustKeys(t, key)
			if pttl := b.rdb.PTTL(ctx, keys.Value).Val(); pttl <= 0 || pttl > time.Minute {
				t.Errorf("the mark's PTTL is %v, want at most the Pass ttl (1m)", pttl)
			}
			for name, cache := range map[string]*Cache{"this": c, "other": other} {
				hit, f, err := cache.Begin(ctx, key, time.Minute, nil)
				if hit != nil || f != nil || !errors.Is(err, ErrPass) || !errors.Is(err, ErrNotShared) {
					t.Errorf("%s process: Begin on a marked key = (%v, %v, %v), want ErrPass wrapped with ErrNotShared", name, hit, f, err)
				}
			}
			if n := b.rdb.Exists(ctx, keys.Lease).Val(); n != 0 {
				t.Errorf("a Begin on a marked key took the lease")
			}
			if s := c.Stats(); s.Passes != 1 || s.NotShared != 1 || s.Loads != 1 || s.LoadErrors != 0 {
				t.Errorf("Stats = passes %d, not shared %d, loads %d, load errors %d; want 1, 1, 1, 0", s.Passes, s.NotShared, s.Loads, s.LoadErrors)
			}
			if got := co.lookup(OutcomePass); got != 1 {
				t.Errorf("Observer: %d pass lookups, want 1", got)
			}
			if errs := co.loadErrs(); len(errs) != 1 || !errors.Is(errs[0], ErrNotShared) {
				t.Errorf("Observer loads %v, want one, not shared", errs)
			}
			// Get reads the mark as a miss: its loader runs and its value
			// replaces the mark.
			v, err := other.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) { return []byte("value"), nil })
			if err != nil || string(v) != "value" {
				t.Fatalf("Get on a marked key = (%q, %v), want its loader's value", v, err)
			}
			hit, _, err := c.Begin(ctx, key, time.Minute, nil)
			if err != nil || hit == nil || string(hit.Value) != "value" {
				t.Errorf("Begin after Get = (%+v, %v), want Get's value", hit, err)
			}
		})
	}
}

// TestFillPassExpires: the mark lives in Redis for the ttl Pass was
// given, then the key leads again.
func TestFillPassExpires(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, nil)
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	_, fill, err := c.Begin(ctx, "k", time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatal(err)
	}
	if err := fill.Pass(nil, ttl); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Begin(ctx, "k", time.Minute, nil); !errors.Is(err, ErrPass) {
		t.Fatalf("Begin after Pass: %v, want ErrPass", err)
	}
	if pttl := rdb.PTTL(ctx, mustKeys(t, "k").Value).Val(); pttl <= 0 || pttl > ttl {
		t.Errorf("the mark's PTTL is %v, want in (0, %v]", pttl, ttl)
	}
	deadline := time.Now().Add(10 * ttl)
	for {
		_, f, err := c.Begin(ctx, "k", time.Minute, nil)
		if f != nil {
			f.Abort(nil)
			break
		}
		if !errors.Is(err, ErrPass) {
			t.Fatalf("Begin while marked: %v, want ErrPass", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key is still marked %v after a Pass of %v", 10*ttl, ttl)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, fill, err = c.Begin(ctx, "bad", time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatal(err)
	}
	if err := fill.Pass(nil, 0); !errors.Is(err, ErrInvalidTTL) {
		t.Errorf("Pass(ttl 0): %v, want ErrInvalidTTL", err)
	}
	if _, f, err := c.Begin(ctx, "bad", time.Minute, nil); f == nil {
		t.Errorf("Begin after a Pass with an invalid ttl: %v, want a Fill (no mark, the Fill aborted)", err)
	} else {
		f.Abort(nil)
	}
}

// TestFillLoadAccounting: every end of a Fill but a hand-over is one load
// in Stats and one Observer.Load, and only failures are load errors: a
// value that was not for sharing is counted apart.
func TestFillLoadAccounting(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	co, obs := newCountingObserver()
	c := newTestCache(t, srv.Client(t), &Options{Observer: obs, MaxValueBytes: 8})
	ctx := context.Background()
	steps := []struct {
		name      string
		end       func(*Fill)
		notShared bool
		failure   bool
	}{
		{"Commit", func(f *Fill) { f.Commit([]byte("ok"), time.Minute, 0) }, false, false},
		{"Abort(ErrNotShared)", func(f *Fill) { f.Abort(ErrNotShared) }, true, false},
		{"Abort(failure)", func(f *Fill) { f.Abort(errors.New("500")) }, false, true},
		{"Commit(too large)", func(f *Fill) { f.Commit([]byte("more than eight"), time.Minute, 0) }, true, false},
		{"Pass", func(f *Fill) { f.Pass(errors.New("private"), time.Minute) }, true, false},
		{"Handover", func(f *Fill) { f.Handover() }, false, false},
	}
	var want Stats
	for i, s := range steps {
		_, f, err := c.Begin(ctx, "k"+string(rune('a'+i)), time.Minute, nil)
		if err != nil || f == nil {
			t.Fatalf("%s: Begin = (%v, %v)", s.name, f, err)
		}
		s.end(f)
		if s.name != "Handover" {
			want.Loads++
		}
		if s.notShared {
			want.NotShared++
		}
		if s.failure {
			want.LoadErrors++
		}
		got := c.Stats()
		if got.Loads != want.Loads || got.NotShared != want.NotShared || got.LoadErrors != want.LoadErrors {
			t.Errorf("after %s: loads %d, not shared %d, load errors %d; want %d, %d, %d", s.name,
				got.Loads, got.NotShared, got.LoadErrors, want.Loads, want.NotShared, want.LoadErrors)
		}
	}
	errs := co.loadErrs()
	if len(errs) != int(want.Loads) {
		t.Fatalf("Observer.Load called %d times, want %d (one per load)", len(errs), want.Loads)
	}
	var notShared, failed int
	for _, err := range errs {
		switch {
		case errors.Is(err, ErrNotShared):
			notShared++
		case err != nil:
			failed++
		}
	}
	if notShared != int(want.NotShared) || failed != int(want.LoadErrors) {
		t.Errorf("Observer loads: %d not shared, %d failed; want %d, %d", notShared, failed, want.NotShared, want.LoadErrors)
	}
	if n := co.lookup(OutcomeLeader); n != len(steps) {
		t.Errorf("Observer: %d leader lookups, want %d", n, len(steps))
	}
}

// TestLookupLeaderPerLoad: of the callers of one rebuild in a process,
// one reports the leader's outcome and the others a follower's, for Get
// (callers sharing a flight) and for Begin (callers waiting on a Fill,
// whatever its end), so that leader lookups count loads.
func TestLookupLeaderPerLoad(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()

	t.Run("Get", func(t *testing.T) {
		co, obs := newCountingObserver()
		c := newTestCache(t, rdb, &Options{Observer: obs})
		gl := newGatedLoader("v")
		const n = 8
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				if _, err := c.Get(ctx, "get", time.Minute, gl.load); err != nil {
					t.Errorf("Get: %v", err)
				}
			})
		}
		<-gl.entered
		waitFlightJoiners(t, c, "get", n-1) // the others share the flight: followers, not leaders
		close(gl.gate)
		wg.Wait()
		leader, follower, hit := co.lookup(OutcomeLeader), co.lookup(OutcomeFollower), co.lookup(OutcomeHit)
		if leader != 1 || leader+follower+hit != n || gl.calls.Load() != 1 {
			t.Errorf("%d Gets, one load (%d): %d leader, %d follower, %d hit lookups; want 1 leader and %d in all", n, gl.calls.Load(), leader, follower, hit, n)
		}
	})

	t.Run("Begin", func(t *testing.T) {
		co, obs := newCountingObserver()
		c := newTestCache(t, rdb, &Options{Observer: obs})
		for _, cause := range []error{ErrNotShared, errors.New("failed")} {
			key := "begin-" + cause.Error()
			_, fill, err := c.Begin(ctx, key, time.Minute, nil)
			if err != nil || fill == nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { _, _, err := c.Begin(ctx, key, time.Minute, nil); done <- err }()
			waitLocalWaiters(t, c, key, 1)
			fill.Abort(cause)
			if err := <-done; err == nil {
				t.Errorf("the waiter got no error after Abort(%v)", cause)
			}
		}
		if l, f := co.lookup(OutcomeLeader), co.lookup(OutcomeFollower); l != 2 || f != 2 {
			t.Errorf("two Fills aborted, each with a local waiter: %d leader, %d follower lookups; want 2 and 2", l, f)
		}
	})
}

// TestFollowerReadIsNotAHit: a follower that reads the value its leader
// stored counts as a follow, not as a hit.
func TestFollowerReadIsNotAHit(t *testing.T) {
	t.Parallel()
	for _, b := range standaloneBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			// The wake-up carries no value: the follower reads it.
			c := newTestCache(t, b.rdb, &Options{NotifyMaxBytes: -1})
			other := newTestCache(t, b.rdb, nil)
			ctx := context.Background()
			key := testKey(t)
			_, fill, err := c.Begin(ctx, key, time.Minute, nil)
			if err != nil || fill == nil {
				t.Fatal(err)
			}
			got := make(chan *Hit, 1)
			go func() { h, _, _ := other.Begin(ctx, key, time.Minute, nil); got <- h }()
			waitFor(t, 5*time.Second, "the follower", func() bool { return other.Stats().Waits == 1 })
			fill.Commit([]byte("v"), time.Minute, 0)
			if h := <-got; h == nil || h.Outcome != OutcomeFollower {
				t.Fatalf("the follower got %+v, want the value as a follower", h)
			}
			if s := other.Stats(); s.Hits != 0 || s.Waits != 1 {
				t.Errorf("follower's Stats: hits %d, follows %d; want 0, 1", s.Hits, s.Waits)
			}
		})
	}
}
