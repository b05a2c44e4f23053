// Package locktest is the conformance suite of herd's lock backends: the
// behaviour that [herd.Lock] and [herd.LeaseHandle] promise, written once
// and run against every backend, so that a program can move from one
// backend to another by changing its constructor.
//
// A backend's test calls [Run] with a function that returns a fresh
// [herd.Lock] on the backend's shared store (a new client, as another
// process would have), and with the backend's stated latencies:
//
//	func TestConformance(t *testing.T) {
//		locktest.Run(t, func(t *testing.T) herd.Lock[*postgres.Lease] {
//			l := postgres.New(cfg, nil)
//			t.Cleanup(func() { l.Close() })
//			return l
//		}, &locktest.Options{Wake: 50 * time.Millisecond})
//	}
//
// The package is not internal, so the backends in nested modules (each
// its own go.mod, such as github.com/herdkit/herd/lock/postgres) import it
// from their tests. It imports package testing and pgregory.net/rapid and
// is meant for tests only.
//
// The suite holds no timing assertion tighter than ten times the stated
// latency: a bound is checked only where its absence would mean a hang or
// a missed wake-up (a waiter that sleeps until a poll interval or a lease
// runs out), never to measure speed.
package locktest

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"pgregory.net/rapid"
)

// Options describes the backend to [Run]. A nil *Options, and every zero
// field, means the documented default.
type Options struct {
	// Wake is the backend's stated bound from a Release to the next
	// attempt of an Acquire waiting on the same key, in another Lock: its
	// notification latency or, for a backend that polls, its poll cap. The
	// suite allows ten times Wake for a waiter to take the lock after a
	// Release, for a cancelled Acquire to return and for Close to end a
	// waiting Acquire. Configure the backend's fallback re-check (poll)
	// well above ten times Wake when the test is to prove that the
	// notification, not the fallback, woke the waiter. Default: 100ms.
	Wake time.Duration

	// TTL is the lease length of the leases that must outlast a test's
	// steps. It must be at least 20 times Wake. Default: 20s.
	TTL time.Duration

	// Short is the lease length of the leases that must run out during a
	// test. Default, and least: 300ms.
	Short time.Duration

	// Lose, if not nil, ends lease from outside the way the backend's own
	// failure would (for a PostgreSQL lock, pg_terminate_backend of the
	// lease's connection; for an etcd lock, a revoke of its session's
	// lease). The suite then checks that Lost closes within ten times Wake
	// although the lease is kept alive, that Extend and Release report
	// [herd.ErrLeaseLost], and that another Lock takes the key with a
	// higher token.
	Lose func(t *testing.T, lease herd.LeaseHandle)

	// Holders is the number of Locks, each used by Holders goroutines, that
	// contend for one key in the exclusion test. Default: 3.
	Holders int
}

func (o *Options) resolve() Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.Wake <= 0 {
		c.Wake = 100 * time.Millisecond
	}
	if c.TTL <= 0 {
		c.TTL = 20 * time.Second
	}
	if c.Short <= 0 {
		c.Short = 300 * time.Millisecond
	}
	if c.Holders <= 0 {
		c.Holders = 3
	}
	return c
}

// Run runs the conformance suite as subtests of t. newLock returns a
// fresh Lock on the backend's shared store; it is called several times per
// subtest, and each Lock it returns should behave as another process's
// would (its own connections). It closes the Lock itself, with t.Cleanup,
// unless the test closes it first (the Close subtest does).
//
// Every subtest uses keys of its own. The subtests are:
//
//   - held: TryAcquire of a held key fails at once with
//     [herd.ErrLeaseHeld], from another Lock and from the same one; a
//     fresh lease reports its key, a deadline in the future and Lost
//     open; after Release the next holder's token is higher.
//   - release: Release twice is nil, Release of a nil lease is nil,
//     Extend after Release is [herd.ErrLeaseLost].
//   - release of a lost lease: a lease that ran out cannot free the next
//     holder's lock; its Release and Extend report ErrLeaseLost.
//   - extend: Extend moves the deadline and keeps the lease past its
//     first length.
//   - keepalive: KeepAlive holds the lease past three lengths; with a cap,
//     the lease ends at the cap and another owner takes the key; an
//     Extend after KeepAlive never moves the Deadline past the cap.
//   - lost: a lease that is not renewed is lost at its deadline, and
//     another owner takes the key with a higher token.
//   - lose (with [Options.Lose]): a lease ended from outside is reported
//     lost at once, and another owner takes the key with a higher token.
//   - wake: an Acquire waiting on a held key takes it within ten times
//     Wake of the Release.
//   - cancel: an Acquire waiting on a held key returns within ten times
//     Wake of its context's cancellation, with an error wrapping
//     ErrLeaseHeld and context.Canceled, and leaves no lock behind; a
//     cancelled context fails TryAcquire and Acquire.
//   - close: an Acquire waiting when Close is called returns
//     [herd.ErrClosed] within ten times Wake; TryAcquire and Acquire after
//     Close return ErrClosed; a second Close returns.
//   - bad input: an empty key is [herd.ErrInvalidKey], a ttl of zero or
//     less [herd.ErrInvalidTTL].
//   - huge key is invalid at once: a key one byte above
//     [herd.MaxLockKeyBytes], and one of 1.2 MiB, fail TryAcquire and
//     Acquire at once with ErrInvalidKey, in an error of under 300 bytes
//     (it does not quote the key).
//   - key at the bound is a lock: a key of exactly MaxLockKeyBytes, of
//     bytes that backends escape, is taken, held against another Lock,
//     waited for and taken again with a higher token.
//   - exclusion: Holders Locks with Holders goroutines each take one key
//     in turn, through Acquire; never are two holders inside at once, and
//     each token is higher than the one before.
//   - model: a rapid state-machine test of TryAcquire, Extend and Release
//     on several Locks and keys against a model of who holds what.
func Run[L herd.LeaseHandle](t *testing.T, newLock func(t *testing.T) herd.Lock[L], opt *Options) {
	t.Helper()
	o := opt.resolve()
	if o.TTL < 20*o.Wake {
		t.Fatalf("locktest: Options.TTL (%v) must be at least 20 times Wake (%v)", o.TTL, o.Wake)
	}
	if o.Short < 300*time.Millisecond {
		t.Fatalf("locktest: Options.Short (%v) must be at least 300ms", o.Short)
	}
	s := &suite[L]{o: o, newLock: newLock}
	t.Run("held", s.held)
	t.Run("release", s.release)
	t.Run("release of a lost lease", s.releaseLost)
	t.Run("extend", s.extend)
	t.Run("keepalive", s.keepAlive)
	t.Run("lost", s.lost)
	if o.Lose != nil {
		t.Run("lose", s.lose)
	}
	t.Run("wake", s.wake)
	t.Run("cancel", s.cancel)
	t.Run("close", s.close)
	t.Run("bad input", s.badInput)
	t.Run("huge key is invalid at once", s.hugeKey)
	t.Run("key at the bound is a lock", s.keyAtBound)
	t.Run("hostile keys are distinct locks", s.hostileKeys)
	t.Run("concurrent releases of a lease", s.concurrentRelease)
	t.Run("exclusion", s.exclusion)
	t.Run("model", s.model)
}

type suite[L herd.LeaseHandle] struct {
	o       Options
	newLock func(t *testing.T) herd.Lock[L]
}

// bound is the suite's allowance for a wake-up: ten times Wake.
func (s *suite[L]) bound() time.Duration { return 10 * s.o.Wake }

// key returns a key no other test uses.
func key(t testing.TB) string {
	var b [6]byte
	_, _ = cryptorand.Read(b[:])
	return "locktest:" + t.Name() + ":" + hex.EncodeToString(b[:])
}

// must returns a function that returns its lease, or fails t when its
// error is not nil: s.must(t)(l.TryAcquire(ctx, key, ttl)).
func (s *suite[L]) must(t *testing.T) func(L, error) L {
	return func(l L, err error) L {
		t.Helper()
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		return l
	}
}

// released releases l at the end of the test (nil-safe, result ignored:
// the test checks the results it cares about itself).
func released(t *testing.T, l herd.LeaseHandle) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Release(ctx)
	})
}

// within waits up to d for ch to be closed (or to yield a value); it
// reports whether it was.
func within[T any](d time.Duration, ch <-chan T) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ch:
		return true
	case <-timer.C:
		return false
	}
}

// pause waits for d. The suite uses it only to let a goroutine reach its
// wait before the event it waits for; a goroutine that is slower to get
// there makes the check weaker, never wrong.
func pause(d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
}

type result[L herd.LeaseHandle] struct {
	lease L
	err   error
	at    time.Time
}

// acquireAsync runs l.Acquire in a goroutine and returns its result
// channel.
func acquireAsync[L herd.LeaseHandle](ctx context.Context, l herd.Lock[L], key string, ttl time.Duration) <-chan result[L] {
	ch := make(chan result[L], 1)
	go func() {
		lease, err := l.Acquire(ctx, key, ttl)
		ch <- result[L]{lease, err, time.Now()}
	}()
	return ch
}

func (s *suite[L]) held(t *testing.T) {
	ctx := context.Background()
	a, b := s.newLock(t), s.newLock(t)
	k := key(t)
	before := time.Now()
	first := s.must(t)(a.TryAcquire(ctx, k, s.o.TTL))
	released(t, first)
	if first.Key() != k {
		t.Errorf("Key() = %q, want %q", first.Key(), k)
	}
	if d := first.Deadline(); !d.After(time.Now()) || d.After(before.Add(s.o.TTL)) {
		t.Errorf("Deadline() = %v: want in the future and at most the lease length (%v) after the call", d, s.o.TTL)
	}
	if isClosed(first.Lost()) {
		t.Error("Lost() of a fresh lease is closed")
	}
	for name, l := range map[string]herd.Lock[L]{"another Lock": b, "the same Lock": a} {
		if _, err := l.TryAcquire(ctx, k, s.o.TTL); !errors.Is(err, herd.ErrLeaseHeld) {
			t.Errorf("TryAcquire of a held key from %s: %v, want ErrLeaseHeld", name, err)
		}
	}
	if err := first.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	second := s.must(t)(b.TryAcquire(ctx, k, s.o.TTL))
	released(t, second)
	if second.Token() <= first.Token() {
		t.Errorf("tokens %d then %d: not increasing", first.Token(), second.Token())
	}
}

func (s *suite[L]) release(t *testing.T) {
	ctx := context.Background()
	l := s.must(t)(s.newLock(t).TryAcquire(ctx, key(t), s.o.TTL))
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("second Release: %v, want nil", err)
	}
	if err := l.Extend(ctx, s.o.TTL); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Extend after Release: %v, want ErrLeaseLost", err)
	}
	var none L
	if err := none.Release(ctx); err != nil {
		t.Errorf("Release of a nil lease: %v, want nil", err)
	}
}

func (s *suite[L]) releaseLost(t *testing.T) {
	ctx := context.Background()
	a, b, c := s.newLock(t), s.newLock(t), s.newLock(t)
	k := key(t)
	old := s.must(t)(a.TryAcquire(ctx, k, s.o.Short))
	released(t, old)
	if !within(10*s.o.Short, old.Lost()) {
		t.Fatalf("Lost() still open %v after a %v lease that nobody renewed", 10*s.o.Short, s.o.Short)
	}
	actx, cancel := context.WithTimeout(ctx, s.o.TTL)
	defer cancel()
	next := s.must(t)(b.Acquire(actx, k, s.o.TTL))
	released(t, next)
	if next.Token() <= old.Token() {
		t.Errorf("tokens %d then %d: not increasing", old.Token(), next.Token())
	}
	if err := old.Release(ctx); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Release of the lost lease: %v, want ErrLeaseLost", err)
	}
	if err := old.Extend(ctx, s.o.TTL); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Extend of the lost lease: %v, want ErrLeaseLost", err)
	}
	if _, err := c.TryAcquire(ctx, k, s.o.TTL); !errors.Is(err, herd.ErrLeaseHeld) {
		t.Errorf("TryAcquire after the old holder's Release: %v, want ErrLeaseHeld (the new holder's lock was freed)", err)
	}
	if isClosed(next.Lost()) {
		t.Error("the new holder's lease is lost")
	}
}

func (s *suite[L]) extend(t *testing.T) {
	ctx := context.Background()
	a, b := s.newLock(t), s.newLock(t)
	k := key(t)
	l := s.must(t)(a.TryAcquire(ctx, k, s.o.Short))
	released(t, l)
	first := l.Deadline()
	if err := l.Extend(ctx, s.o.TTL); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if !l.Deadline().After(first) {
		t.Errorf("Deadline() after Extend is %v, not after %v", l.Deadline(), first)
	}
	if within(3*s.o.Short, l.Lost()) {
		t.Fatal("lost within three times its first length, after an Extend to a longer one")
	}
	if _, err := b.TryAcquire(ctx, k, s.o.TTL); !errors.Is(err, herd.ErrLeaseHeld) {
		t.Errorf("TryAcquire past the first length of an extended lease: %v, want ErrLeaseHeld", err)
	}
}

func (s *suite[L]) keepAlive(t *testing.T) {
	ctx := context.Background()
	ttl := max(s.o.Short, time.Second) // renewals every third to half of it
	t.Run("no cap", func(t *testing.T) {
		a, b := s.newLock(t), s.newLock(t)
		k := key(t)
		l := s.must(t)(a.TryAcquire(ctx, k, ttl))
		released(t, l)
		l.KeepAlive(0)
		if within(3*ttl, l.Lost()) {
			t.Fatal("lost while KeepAlive renewed it")
		}
		if _, err := b.TryAcquire(ctx, k, ttl); !errors.Is(err, herd.ErrLeaseHeld) {
			t.Errorf("TryAcquire three lease lengths later: %v, want ErrLeaseHeld", err)
		}
	})
	t.Run("extend held to the cap", func(t *testing.T) {
		k := key(t)
		l := s.must(t)(s.newLock(t).TryAcquire(ctx, k, s.o.TTL))
		acquired := time.Now() // the cap counts from the acquire's start, before this
		released(t, l)
		maxHold := s.o.TTL / 2
		l.KeepAlive(maxHold)
		if err := l.Extend(ctx, 2*s.o.TTL); err != nil && !errors.Is(err, herd.ErrLeaseLost) {
			t.Fatalf("Extend after KeepAlive: %v", err)
		}
		if d := l.Deadline(); d.After(acquired.Add(maxHold)) {
			t.Errorf("Deadline %v after the acquire, past KeepAlive's cap of %v, after an Extend for %v", d.Sub(acquired), maxHold, 2*s.o.TTL)
		}
	})
	t.Run("cap", func(t *testing.T) {
		a, b := s.newLock(t), s.newLock(t)
		k := key(t)
		l := s.must(t)(a.TryAcquire(ctx, k, ttl))
		released(t, l)
		maxHold := 2 * ttl
		l.KeepAlive(maxHold)
		if !within(maxHold+2*ttl, l.Lost()) {
			t.Fatalf("still held %v after the acquire, past KeepAlive's cap of %v", maxHold+2*ttl, maxHold)
		}
		actx, cancel := context.WithTimeout(ctx, s.o.TTL)
		defer cancel()
		next := s.must(t)(b.Acquire(actx, k, ttl))
		released(t, next)
		if next.Token() <= l.Token() {
			t.Errorf("tokens %d then %d: not increasing", l.Token(), next.Token())
		}
	})
}

func (s *suite[L]) lost(t *testing.T) {
	ctx := context.Background()
	a, b := s.newLock(t), s.newLock(t)
	k := key(t)
	l := s.must(t)(a.TryAcquire(ctx, k, s.o.Short))
	released(t, l)
	if !within(10*s.o.Short, l.Lost()) {
		t.Fatalf("Lost() still open %v after a %v lease that nobody renewed", 10*s.o.Short, s.o.Short)
	}
	if time.Now().Before(l.Deadline()) {
		t.Errorf("Lost() closed before the lease's deadline %v, with nothing ending it", l.Deadline())
	}
	if err := l.Extend(ctx, s.o.TTL); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Extend after Lost: %v, want ErrLeaseLost", err)
	}
	actx, cancel := context.WithTimeout(ctx, s.o.TTL)
	defer cancel()
	next := s.must(t)(b.Acquire(actx, k, s.o.TTL))
	released(t, next)
	if next.Token() <= l.Token() {
		t.Errorf("tokens %d then %d: not increasing", l.Token(), next.Token())
	}
}

func (s *suite[L]) lose(t *testing.T) {
	ctx := context.Background()
	a, b := s.newLock(t), s.newLock(t)
	k := key(t)
	l := s.must(t)(a.TryAcquire(ctx, k, s.o.TTL))
	released(t, l)
	l.KeepAlive(0)
	actx, cancel := context.WithTimeout(ctx, s.o.TTL)
	defer cancel()
	waiter := acquireAsync(actx, b, k, s.o.TTL)
	pause(2 * s.o.Wake) // let the waiter reach its wait
	s.o.Lose(t, l)
	if !within(s.bound(), l.Lost()) {
		t.Fatalf("Lost() still open %v after the lease was ended from outside", s.bound())
	}
	if err := l.Extend(ctx, s.o.TTL); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Extend after the loss: %v, want ErrLeaseLost", err)
	}
	var r result[L]
	select {
	case r = <-waiter:
	case <-actx.Done():
		t.Fatalf("no other owner took the key within %v of its loss", s.o.TTL)
	}
	next := s.must(t)(r.lease, r.err)
	released(t, next)
	if next.Token() <= l.Token() {
		t.Errorf("tokens %d then %d: not increasing", l.Token(), next.Token())
	}
	if err := l.Release(ctx); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Release after the loss: %v, want ErrLeaseLost", err)
	}
	if isClosed(next.Lost()) {
		t.Error("the old holder's Release ended the new holder's lease")
	}
}

func (s *suite[L]) wake(t *testing.T) {
	ctx := context.Background()
	a, b := s.newLock(t), s.newLock(t)
	k := key(t)
	held := s.must(t)(a.TryAcquire(ctx, k, s.o.TTL))
	released(t, held)
	actx, cancel := context.WithTimeout(ctx, s.o.TTL)
	defer cancel()
	waiter := acquireAsync(actx, b, k, s.o.TTL)
	pause(2 * s.o.Wake) // let the waiter reach its wait
	start := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	releasing := time.Since(start)
	var r result[L]
	select {
	case r = <-waiter:
	case <-actx.Done():
		t.Fatalf("the waiter did not take the key within %v of the Release", s.o.TTL)
	}
	next := s.must(t)(r.lease, r.err)
	released(t, next)
	if took := r.at.Sub(start); took > s.bound() {
		t.Errorf("the waiter took the key %v after the Release was sent (the Release itself took %v); the bound is %v (ten times Wake, %v)", took, releasing, s.bound(), s.o.Wake)
	}
}

func (s *suite[L]) cancel(t *testing.T) {
	ctx := context.Background()
	a, b, c := s.newLock(t), s.newLock(t), s.newLock(t)
	k := key(t)
	held := s.must(t)(a.TryAcquire(ctx, k, s.o.TTL))
	released(t, held)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waiter := acquireAsync(cctx, b, k, s.o.TTL)
	pause(2 * s.o.Wake)
	cancel()
	var r result[L]
	if !within(s.bound(), chanOf(waiter, &r)) {
		t.Fatalf("Acquire still waiting %v after its context was cancelled", s.bound())
	}
	if r.err == nil {
		released(t, r.lease)
		t.Fatal("Acquire of a held key returned a lease after its context was cancelled")
	}
	if !errors.Is(r.err, herd.ErrLeaseHeld) || !errors.Is(r.err, context.Canceled) {
		t.Errorf("Acquire cancelled: %v, want ErrLeaseHeld and context.Canceled", r.err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	next := s.must(t)(c.TryAcquire(ctx, k, s.o.TTL)) // the cancelled call left no lock behind
	released(t, next)
	if err := next.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}

	done, stop := context.WithCancel(ctx)
	stop()
	if l, err := c.TryAcquire(done, k, s.o.TTL); err == nil {
		released(t, l)
		t.Error("TryAcquire with a cancelled context returned a lease")
	}
	if l, err := c.Acquire(done, k, s.o.TTL); !errors.Is(err, context.Canceled) {
		if err == nil {
			released(t, l)
		}
		t.Errorf("Acquire with a cancelled context: %v, want context.Canceled", err)
	}
}

// chanOf forwards one value of ch into *dst and closes the returned
// channel.
func chanOf[T any](ch <-chan T, dst *T) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		*dst = <-ch
		close(done)
	}()
	return done
}

func (s *suite[L]) close(t *testing.T) {
	ctx := context.Background()
	a, b := s.newLock(t), s.newLock(t)
	k := key(t)
	held := s.must(t)(a.TryAcquire(ctx, k, s.o.TTL))
	released(t, held)
	actx, cancel := context.WithTimeout(ctx, s.o.TTL)
	defer cancel()
	waiter := acquireAsync(actx, b, k, s.o.TTL)
	pause(2 * s.o.Wake)
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	var r result[L]
	if !within(s.bound(), chanOf(waiter, &r)) {
		t.Fatalf("Acquire still waiting %v after Close", s.bound())
	}
	if !errors.Is(r.err, herd.ErrClosed) {
		t.Errorf("Acquire waiting at Close: %v, want ErrClosed", r.err)
	}
	if !within(s.o.TTL, closed) {
		t.Fatalf("Close did not return within %v", s.o.TTL)
	}
	if _, err := b.TryAcquire(ctx, key(t), s.o.TTL); !errors.Is(err, herd.ErrClosed) {
		t.Errorf("TryAcquire after Close: %v, want ErrClosed", err)
	}
	if _, err := b.Acquire(ctx, key(t), s.o.TTL); !errors.Is(err, herd.ErrClosed) {
		t.Errorf("Acquire after Close: %v, want ErrClosed", err)
	}
	again := make(chan error, 1)
	go func() { again <- b.Close() }()
	if !within(s.o.TTL, again) {
		t.Fatalf("a second Close did not return within %v", s.o.TTL)
	}
}

func (s *suite[L]) badInput(t *testing.T) {
	ctx := context.Background()
	l := s.newLock(t)
	for name, call := range map[string]func(context.Context, string, time.Duration) (L, error){
		"TryAcquire": l.TryAcquire, "Acquire": l.Acquire,
	} {
		if _, err := call(ctx, "", s.o.TTL); !errors.Is(err, herd.ErrInvalidKey) {
			t.Errorf("%s with an empty key: %v, want ErrInvalidKey", name, err)
		}
		for _, ttl := range []time.Duration{0, -time.Second} {
			if _, err := call(ctx, key(t), ttl); !errors.Is(err, herd.ErrInvalidTTL) {
				t.Errorf("%s with ttl %v: %v, want ErrInvalidTTL", name, ttl, err)
			}
		}
	}
}

// hugeKeyBytes is the length of the huge keys of hugeKey: 1.2 MiB, above
// the request limits of ZooKeeper (jute.maxbuffer, 1 MiB) and etcd
// (1.5 MiB, once escaped).
const hugeKeyBytes = 6 << 20 / 5

func (s *suite[L]) hugeKey(t *testing.T) {
	l := s.newLock(t)
	for _, n := range []int{herd.MaxLockKeyBytes + 1, hugeKeyBytes} {
		k := key(t)
		k += strings.Repeat("k", n-len(k))
		for name, call := range map[string]func(context.Context, string, time.Duration) (L, error){
			"TryAcquire": l.TryAcquire, "Acquire": l.Acquire,
		} {
			ctx, cancel := context.WithTimeout(context.Background(), s.bound())
			start := time.Now()
			lease, err := call(ctx, k, s.o.TTL)
			took := time.Since(start)
			cancel()
			if err == nil {
				released(t, lease)
				t.Errorf("%s of a %d-byte key: took the lock, want ErrInvalidKey", name, n)
				continue
			}
			if !errors.Is(err, herd.ErrInvalidKey) {
				t.Errorf("%s of a %d-byte key: %.300v (after %v), want ErrInvalidKey", name, n, err, took)
			}
			if msg := err.Error(); len(msg) >= 300 {
				t.Errorf("%s of a %d-byte key: an error of %d bytes, want under 300: %.300s", name, n, len(msg), msg)
			}
		}
	}
}

func (s *suite[L]) keyAtBound(t *testing.T) {
	ctx := context.Background()
	a, b := s.newLock(t), s.newLock(t)
	// Bytes that backends escape, and the escape character itself.
	k := key(t) + ":"
	k += strings.Repeat("/%\x00\xff", herd.MaxLockKeyBytes)[:herd.MaxLockKeyBytes-len(k)]
	held := s.must(t)(a.TryAcquire(ctx, k, s.o.TTL))
	released(t, held)
	if held.Key() != k {
		t.Errorf("Key() is not the key acquired (%d bytes, want %d)", len(held.Key()), len(k))
	}
	if _, err := b.TryAcquire(ctx, k, s.o.TTL); !errors.Is(err, herd.ErrLeaseHeld) {
		t.Errorf("TryAcquire of the held key from another Lock: %.300v, want ErrLeaseHeld", err)
	}
	actx, cancel := context.WithTimeout(ctx, s.o.TTL)
	defer cancel()
	waiter := acquireAsync(actx, b, k, s.o.TTL)
	pause(2 * s.o.Wake) // let the waiter reach its wait
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release: %.300v", err)
	}
	var r result[L]
	select {
	case r = <-waiter:
	case <-actx.Done():
		t.Fatalf("the waiter did not take the key within %v of the Release", s.o.TTL)
	}
	if r.err != nil {
		t.Fatalf("Acquire: %.300v", r.err)
	}
	next := r.lease
	released(t, next)
	if next.Token() <= held.Token() {
		t.Errorf("tokens %d then %d: not increasing", held.Token(), next.Token())
	}
	if err := next.Release(ctx); err != nil {
		t.Errorf("Release: %.300v", err)
	}
}

// hostileKeys: names that escape to prefixes of one another, or look
// like escapes, path separators, a NUL byte, invalid UTF-8 and a name at
// the bound are distinct locks: all can be held at once, and each is held
// for a second TryAcquire.
func (s *suite[L]) hostileKeys(t *testing.T) {
	ctx := context.Background()
	l := s.newLock(t)
	base := key(t)
	names := []string{
		base, base + "/", base + "/x", base + "%2F", base + "%252F", base + "%", base + ".",
		base + "/..", base + "\x00", base + "\xff\xfe", base + "é", base + " ", base + "/" + base,
		base + strings.Repeat("k", herd.MaxLockKeyBytes-len(base)),
	}
	var leases []L
	for _, n := range names {
		lease, err := l.TryAcquire(ctx, n, s.o.TTL)
		if err != nil {
			t.Errorf("TryAcquire %.60q while the others are held: %.200v", n, err)
			continue
		}
		leases = append(leases, lease)
	}
	for _, n := range names {
		if _, err := l.TryAcquire(ctx, n, s.o.TTL); !errors.Is(err, herd.ErrLeaseHeld) {
			t.Errorf("second TryAcquire of %.60q: %.200v, want ErrLeaseHeld", n, err)
		}
	}
	for _, lease := range leases {
		if err := lease.Release(ctx); err != nil {
			t.Error(err)
		}
	}
}

// concurrentRelease: a lease's methods are safe for concurrent use, and
// releasing again after a Release is not an error: two Releases of one
// lease at once both return nil (neither may report it lost).
func (s *suite[L]) concurrentRelease(t *testing.T) {
	ctx := context.Background()
	l := s.newLock(t)
	for i := range 30 {
		lease := s.must(t)(l.TryAcquire(ctx, key(t), s.o.TTL))
		errs := make(chan error, 2)
		start := make(chan struct{})
		for range 2 {
			go func() {
				<-start
				errs <- lease.Release(ctx)
			}()
		}
		close(start)
		for range 2 {
			if err := <-errs; err != nil {
				t.Errorf("round %d: a concurrent Release: %v", i, err)
			}
		}
		if t.Failed() {
			return
		}
	}
}

func (s *suite[L]) exclusion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*s.o.TTL)
	defer cancel()
	k := key(t)
	const rounds = 3
	var (
		inside atomic.Int32
		mu     sync.Mutex // guards last, taken only by a holder
		last   uint64
		holds  atomic.Int32
		errs   = make(chan error, s.o.Holders*s.o.Holders*(rounds+1))
		wg     sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		select {
		case errs <- fmt.Errorf(format, args...):
		default:
		}
	}
	for range s.o.Holders {
		l := s.newLock(t)
		for range s.o.Holders {
			wg.Go(func() {
				for done := 0; done < rounds; {
					lease, err := l.Acquire(ctx, k, s.o.TTL)
					if errors.Is(err, herd.ErrWaitTimeout) {
						continue // the backend's wait limit: wait again
					}
					if err != nil {
						fail("Acquire: %v", err)
						return
					}
					if n := inside.Add(1); n != 1 {
						fail("%d holders at once (token %d)", n, lease.Token())
					}
					mu.Lock()
					if lease.Token() <= last {
						fail("token %d after %d: not increasing", lease.Token(), last)
					}
					last = lease.Token()
					mu.Unlock()
					holds.Add(1)
					inside.Add(-1)
					if err := lease.Release(ctx); err != nil {
						fail("Release: %v", err)
						return
					}
					done++
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if want := int32(s.o.Holders * s.o.Holders * rounds); holds.Load() != want {
		t.Errorf("%d holdings, want %d", holds.Load(), want)
	}
}

func (s *suite[L]) model(t *testing.T) {
	locks := []herd.Lock[L]{s.newLock(t), s.newLock(t), s.newLock(t)}
	rapid.Check(t, func(rt *rapid.T) {
		ctx := context.Background()
		keys := []string{key(t), key(t)}
		type holding struct {
			lease    L
			key      string
			released bool
		}
		var leases []*holding
		holder := map[string]*holding{} // the model: who holds each key
		last := map[string]uint64{}
		defer func() {
			for _, h := range leases {
				_ = h.lease.Release(ctx)
			}
		}()
		rt.Repeat(map[string]func(*rapid.T){
			"TryAcquire": func(rt *rapid.T) {
				l := rapid.SampledFrom(locks).Draw(rt, "lock")
				k := rapid.SampledFrom(keys).Draw(rt, "key")
				lease, err := l.TryAcquire(ctx, k, s.o.TTL)
				if holder[k] != nil {
					if err == nil {
						leases = append(leases, &holding{lease: lease, key: k})
						rt.Fatalf("TryAcquire(%q) succeeded while the model has it held", k)
					}
					if !errors.Is(err, herd.ErrLeaseHeld) {
						rt.Fatalf("TryAcquire(%q) of a held key: %v, want ErrLeaseHeld", k, err)
					}
					return
				}
				if err != nil {
					rt.Fatalf("TryAcquire(%q) of a free key: %v", k, err)
				}
				h := &holding{lease: lease, key: k}
				leases = append(leases, h)
				holder[k] = h
				if lease.Token() <= last[k] {
					rt.Fatalf("token %d after %d for %q: not increasing", lease.Token(), last[k], k)
				}
				last[k] = lease.Token()
			},
			"Release": func(rt *rapid.T) {
				if len(leases) == 0 {
					rt.Skip("no lease yet")
				}
				h := rapid.SampledFrom(leases).Draw(rt, "lease")
				if err := h.lease.Release(ctx); err != nil {
					rt.Fatalf("Release (released before: %v): %v, want nil", h.released, err)
				}
				if !h.released {
					h.released = true
					delete(holder, h.key)
				}
			},
			"Extend": func(rt *rapid.T) {
				if len(leases) == 0 {
					rt.Skip("no lease yet")
				}
				h := rapid.SampledFrom(leases).Draw(rt, "lease")
				err := h.lease.Extend(ctx, s.o.TTL)
				switch {
				case h.released && !errors.Is(err, herd.ErrLeaseLost):
					rt.Fatalf("Extend of a released lease: %v, want ErrLeaseLost", err)
				case !h.released && err != nil:
					rt.Fatalf("Extend of a held lease: %v", err)
				}
			},
			"": func(rt *rapid.T) {
				for k, h := range holder {
					if isClosed(h.lease.Lost()) {
						rt.Fatalf("the holder of %q is lost", k)
					}
				}
			},
		})
	})
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
