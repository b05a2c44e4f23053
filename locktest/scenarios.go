package locktest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd"
)

// The scenarios of this file are the fault and edge cases that several
// backends test in the same way, with the parts that differ (how to cut
// a connection, how to see that a waiter is queued at the server) passed
// in. Each backend's TestXxx, named for the guarantee, calls one.

// KeepAliveCapBeforeFirstRenewal: KeepAlive's maxHold is an absolute cap
// on the holding, counted from the acquire. A cap (300ms) shorter than
// the first renewal's wait (a third to a half of the 6s lease) must
// still end the lease at the cap, not at the lease's own end: Deadline
// is at most the cap after KeepAlive, and Lost closes within half the
// lease.
func KeepAliveCapBeforeFirstRenewal[L herd.LeaseHandle](t *testing.T, l herd.Lock[L]) {
	t.Helper()
	ctx := context.Background()
	const ttl, maxHold = 6 * time.Second, 300 * time.Millisecond
	lease, err := l.TryAcquire(ctx, key(t), ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	capAt := time.Now().Add(maxHold)
	lease.KeepAlive(maxHold)
	if d := lease.Deadline(); d.After(capAt) {
		t.Errorf("Deadline %v after KeepAlive(%v), past the cap by %v", d, maxHold, d.Sub(capAt))
	}
	if !within(ttl/2, lease.Lost()) {
		t.Errorf("Lost still open %v after the acquire, with KeepAlive(%v)", ttl/2, maxHold)
	}
}

// CutHolder describes the backend to [CutHolderLost].
type CutHolder[L herd.LeaseHandle] struct {
	// Holder is the Lock of the holder, Waiter that of the waiter (with
	// its fallback re-check well above Bound, so that what wakes it is
	// the server's own news of the cut).
	Holder, Waiter herd.Lock[L]
	// Queued returns once the waiter's Acquire of key waits at the
	// server.
	Queued func(t *testing.T, key string)
	// Cut ends the holder's lease from outside, as the server would on a
	// failure (pg_terminate_backend of its connection, KILL of its
	// session, a revoke of its etcd lease).
	Cut func(t *testing.T, lease L)
	// Bound is the backend's stated bound from the cut to Lost, and to
	// the waiter's acquire.
	Bound time.Duration
}

// CutHolderLost: a holder (no KeepAlive, a 20s lease) whose lease is cut
// from outside sees Lost close within the bound, and a waiter queued in
// another Lock takes the lock within it, with a higher token. The lost
// lease's Release and Extend report [herd.ErrLeaseLost], and its Release
// leaves the new holder's lock alone: a TryAcquire from the old holder's
// Lock is [herd.ErrLeaseHeld].
func CutHolderLost[L herd.LeaseHandle](t *testing.T, c CutHolder[L]) {
	t.Helper()
	ctx := context.Background()
	k := key(t)
	const ttl = 20 * time.Second
	held, err := c.Holder.TryAcquire(ctx, k, ttl)
	if err != nil {
		t.Fatal(err)
	}
	released(t, held)
	wctx, cancel := context.WithTimeout(ctx, ttl)
	defer cancel()
	waiter := acquireAsync(wctx, c.Waiter, k, ttl)
	c.Queued(t, k)
	start := time.Now()
	c.Cut(t, held)
	if !within(c.Bound, held.Lost()) {
		t.Fatalf("Lost still open %v after the cut", time.Since(start))
	}
	t.Logf("Lost closed %v after the cut", time.Since(start).Round(time.Millisecond))
	var r result[L]
	if !within(c.Bound, chanOf(waiter, &r)) {
		t.Fatalf("the waiter did not take the lock within %v of the cut", c.Bound)
	}
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	next := r.lease
	released(t, next)
	if next.Token() <= held.Token() {
		t.Errorf("tokens %d then %d: not increasing", held.Token(), next.Token())
	}
	if err := held.Release(ctx); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Release of the cut lease: %v, want ErrLeaseLost", err)
	}
	if err := held.Extend(ctx, ttl); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Extend of the cut lease: %v, want ErrLeaseLost", err)
	}
	if l, err := c.Holder.TryAcquire(ctx, k, ttl); !errors.Is(err, herd.ErrLeaseHeld) {
		if err == nil {
			released(t, l)
		}
		t.Errorf("TryAcquire after the cut lease's Release: %v, want ErrLeaseHeld", err)
	}
}

// BadOptions checks that each call of bad, named for the option it gets
// wrong, panics with a message naming it, and that newNil (New with its
// required argument nil) panics.
func BadOptions(t *testing.T, bad map[string]func(), newNil func()) {
	t.Helper()
	for name, call := range bad {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), name) {
					t.Errorf("New with a bad %s: recovered %v, want a panic naming it", name, r)
				}
			}()
			call()
		})
	}
	defer func() {
		if recover() == nil {
			t.Error("New with nil did not panic")
		}
	}()
	newNil()
}

// ServerDown: with no server behind l, TryAcquire and Acquire fail at
// once (within 10s, which only stops a hang), with an error that is not
// [herd.ErrLeaseHeld] (the connection's).
func ServerDown[L herd.LeaseHandle](t *testing.T, l herd.Lock[L]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, call := range map[string]func(context.Context, string, time.Duration) (L, error){
		"TryAcquire": l.TryAcquire, "Acquire": l.Acquire,
	} {
		_, err := call(ctx, "down", time.Second)
		if err == nil || errors.Is(err, herd.ErrLeaseHeld) || ctx.Err() != nil {
			t.Errorf("%s with no server: %v, want a connection error at once", name, err)
		}
	}
}

// FenceTableDropped: a Lock whose fence table (tokens kept in the
// database) was dropped after it created it creates it again (its doc:
// "created if missing"): the next TryAcquire succeeds, and its token is
// higher than the one before the drop. drop drops the table.
func FenceTableDropped[L herd.LeaseHandle](t *testing.T, l herd.Lock[L], drop func(t *testing.T)) {
	t.Helper()
	ctx := context.Background()
	k := key(t)
	lease, err := l.TryAcquire(ctx, k, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	first := lease.Token()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	drop(t)
	lease, err = l.TryAcquire(ctx, k, time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after the fence table was dropped: %v", err)
	}
	defer lease.Release(ctx)
	if lease.Token() <= first {
		t.Errorf("token after the drop: %d, want above %d", lease.Token(), first)
	}
}

// TableCreationBlocked describes the backend to
// [CancelWhileTableCreationBlocks].
type TableCreationBlocked[L herd.LeaseHandle] struct {
	// Lock is a Lock whose fence table does not exist yet, and whose
	// creation Block makes wait.
	Lock herd.Lock[L]
	// Block makes another session hold what the fence table's CREATE
	// needs; the returned function lets it go.
	Block func(t *testing.T) (unblock func())
	// Waiting reports whether an attempt's CREATE waits for it.
	Waiting func(t *testing.T) bool
}

// CancelWhileTableCreationBlocks: TryAcquire's context bounds the call.
// While another attempt of the Lock is stuck creating the fence table (a
// 20s context), a TryAcquire with a 200ms context must return when that
// context ends, with its error: within 2s.
func CancelWhileTableCreationBlocks[L herd.LeaseHandle](t *testing.T, b TableCreationBlocked[L]) {
	t.Helper()
	ctx := context.Background()
	unblock := b.Block(t)
	stuckCtx, stuckCancel := context.WithTimeout(ctx, 20*time.Second)
	defer stuckCancel()
	stuck := acquireAsyncWith(stuckCtx, b.Lock.TryAcquire, key(t), time.Second)
	for deadline := time.Now().Add(10 * time.Second); !b.Waiting(t); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			unblock()
			t.Fatal("the first attempt's CREATE never waited")
		}
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	done := acquireAsyncWith(short, b.Lock.TryAcquire, key(t), time.Second)
	var r result[L]
	returned := within(2*time.Second, chanOf(done, &r))
	switch {
	case !returned:
		t.Errorf("TryAcquire with a 200ms context still running after %v", time.Since(start))
	case !errors.Is(r.err, context.DeadlineExceeded):
		t.Errorf("TryAcquire: %v, want its context's end", r.err)
	}
	unblock()
	stuckCancel()
	releaseResult(<-stuck)
	if !returned {
		r = <-done
	}
	releaseResult(r)
}

// releaseResult releases r's lease, if it has one.
func releaseResult[L herd.LeaseHandle](r result[L]) {
	if r.err == nil {
		_ = r.lease.Release(context.Background())
	}
}

// acquireAsyncWith runs call (a TryAcquire or an Acquire) in a
// goroutine and returns its result channel.
func acquireAsyncWith[L herd.LeaseHandle](ctx context.Context, call func(context.Context, string, time.Duration) (L, error), key string, ttl time.Duration) <-chan result[L] {
	ch := make(chan result[L], 1)
	go func() {
		lease, err := call(ctx, key, ttl)
		ch <- result[L]{lease, err, time.Now()}
	}()
	return ch
}

// StalledServer describes the backend to [CancelWithServerStalled].
type StalledServer[L herd.LeaseHandle] struct {
	// Holder and Waiter are two Locks on a server of the test's own.
	Holder, Waiter herd.Lock[L]
	// Queued returns once the waiter's Acquire of key is queued at the
	// server.
	Queued func(t *testing.T, key string)
	// Pause stops the server (SIGSTOP) until the returned function
	// resumes it; it must be safe to call twice.
	Pause func(t *testing.T) (resume func())
	// TTL is the lease length of both.
	TTL time.Duration
}

// CancelWithServerStalled: herd.Lock's contract says a wait cut short by
// ctx returns at once. With the server stopped (SIGSTOP), an Acquire
// queued behind a holder must return within 500ms of its ctx's
// cancellation (not after a request timeout spent on cleanup), with an
// error wrapping [herd.ErrLeaseHeld] and context.Canceled.
func CancelWithServerStalled[L herd.LeaseHandle](t *testing.T, s StalledServer[L]) {
	t.Helper()
	ctx := context.Background()
	k := key(t)
	held, err := s.Holder.TryAcquire(ctx, k, s.TTL)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := acquireAsync(wctx, s.Waiter, k, s.TTL)
	s.Queued(t, k)
	resume := s.Pause(t)
	defer resume()
	cancel()
	cancelled := time.Now()
	var r result[L]
	if !within(10*time.Second, chanOf(ch, &r)) {
		t.Fatal("Acquire did not return within 10s of its cancel")
	}
	took := time.Since(cancelled)
	resume()
	releaseResult(r)
	if !errors.Is(r.err, herd.ErrLeaseHeld) || !errors.Is(r.err, context.Canceled) {
		t.Errorf("Acquire: %v, want ErrLeaseHeld and context.Canceled", r.err)
	}
	if took > 500*time.Millisecond {
		t.Errorf("Acquire returned %v after its context was cancelled, want at once (< 500ms)", took)
	}
	_ = held.Release(ctx)
}
