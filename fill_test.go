package herd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
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
