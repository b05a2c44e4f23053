package herd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestLockConformance runs one suite, written against the Lock and
// LeaseHandle interfaces, on every backend: Locker on a real
// redis-server, and Redlock over 3 real redis-servers.
func TestLockConformance(t *testing.T) {
	t.Run("Locker", func(t *testing.T) {
		rdb := redistest.Start(t).Client(t)
		lockConformance(t, func(t *testing.T) Lock[*Lease] {
			l := NewLocker(rdb, nil)
			t.Cleanup(func() { l.Close() })
			return l
		})
	})
	t.Run("Redlock", func(t *testing.T) {
		var masters []redis.UniversalClient
		for range 3 {
			masters = append(masters, redistest.Start(t).Client(t))
		}
		lockConformance(t, func(t *testing.T) Lock[*RedlockLease] {
			r := NewRedlock(masters, &RedlockOptions{NodeTimeout: testNodeTimeout})
			t.Cleanup(func() { r.Close() })
			return r
		})
	})
}

// lockConformance is the behaviour every backend shares. newLock returns
// a fresh Lock (another process, as far as the lock can tell) on the same
// backing store.
func lockConformance[L LeaseHandle](t *testing.T, newLock func(*testing.T) Lock[L]) {
	ctx := context.Background()

	t.Run("exclusion and tokens", func(t *testing.T) {
		a, b := newLock(t), newLock(t)
		key := testKey(t)
		first, err := a.TryAcquire(ctx, key, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.TryAcquire(ctx, key, 5*time.Second); !errors.Is(err, ErrLeaseHeld) {
			t.Fatalf("TryAcquire of a held key: %v, want ErrLeaseHeld", err)
		}
		if first.Key() != key || !first.Deadline().After(time.Now()) || isClosed(first.Lost()) {
			t.Errorf("a fresh lease: key %q, deadline %v, lost %v", first.Key(), first.Deadline(), isClosed(first.Lost()))
		}
		waiter := make(chan error, 1)
		var second L
		go func() {
			var err error
			second, err = b.Acquire(ctx, key, 5*time.Second)
			waiter <- err
		}()
		if err := first.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := <-waiter; err != nil {
			t.Fatalf("Acquire after the release: %v", err)
		}
		defer second.Release(ctx)
		if second.Token() <= first.Token() {
			t.Errorf("tokens %d then %d: not increasing", first.Token(), second.Token())
		}
		if err := first.Release(ctx); err != nil {
			t.Errorf("second Release: %v, want nil", err)
		}
		if err := first.Extend(ctx, time.Second); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("Extend after Release: %v, want ErrLeaseLost", err)
		}
		var none L
		if err := none.Release(ctx); err != nil {
			t.Errorf("Release of a nil lease: %v", err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		l := newLock(t)
		if _, err := l.TryAcquire(ctx, "", time.Second); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("empty key: %v, want ErrInvalidKey", err)
		}
		if _, err := l.Acquire(ctx, testKey(t), 0); !errors.Is(err, ErrInvalidTTL) {
			t.Errorf("zero ttl: %v, want ErrInvalidTTL", err)
		}
	})

	t.Run("KeepAlive holds past the lease", func(t *testing.T) {
		a, b := newLock(t), newLock(t)
		key := testKey(t)
		const ttl = time.Second
		l, err := a.TryAcquire(ctx, key, ttl)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		l.KeepAlive(0)
		past := time.NewTimer(3 * ttl)
		defer past.Stop()
		select {
		case <-l.Lost():
			t.Fatal("lost while the watchdog renewed it")
		case <-past.C:
		}
		if _, err := b.TryAcquire(ctx, key, ttl); !errors.Is(err, ErrLeaseHeld) {
			t.Errorf("TryAcquire three lease lengths later: %v, want ErrLeaseHeld", err)
		}
	})

	t.Run("Lost when validity runs out", func(t *testing.T) {
		l, err := newLock(t).TryAcquire(ctx, testKey(t), 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		<-l.Lost() // no renewal: closes at the deadline
		if err := l.Extend(ctx, time.Second); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("Extend after Lost: %v, want ErrLeaseLost", err)
		}
	})
}
