package herd_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/locktest"
	"github.com/redis/go-redis/v9"
)

// TestLockConformance runs the conformance suite of package locktest,
// written against the Lock and LeaseHandle interfaces, on this module's
// backends: Locker on a real redis-server, and Redlock over 3 real
// redis-servers. Each Lock the suite asks for is a new Locker or Redlock
// on the same servers, as another process would have.
func TestLockConformance(t *testing.T) {
	t.Parallel()
	t.Run("Locker", func(t *testing.T) {
		rdb := redistest.Start(t).Client(t)
		// Polling only once a minute: a waiter that took the key within
		// the suite's bound was woken by the release's notification.
		opt := &herd.LockerOptions{PollMin: time.Minute, PollMax: time.Minute}
		locktest.Run(t, func(t *testing.T) herd.Lock[*herd.Lease] {
			l := herd.NewLocker(rdb, opt)
			t.Cleanup(func() { l.Close() })
			return l
		}, &locktest.Options{Wake: 50 * time.Millisecond})
	})
	t.Run("Redlock", func(t *testing.T) {
		var masters []redis.UniversalClient
		for range 3 {
			masters = append(masters, redistest.Start(t).Client(t))
		}
		// The fallback re-check only once a minute, far above ten times
		// Wake: a waiter that took the key within the suite's bound was
		// woken by the release's notification on the masters.
		opt := &herd.RedlockOptions{NodeTimeout: time.Second, PollMin: time.Minute, PollMax: time.Minute}
		// Short is 2s, not the suite's least 300ms: a Redlock lease is
		// valid only for what is left of its length after the round to
		// every master, and a fresh Redlock's first round dials them. On
		// a loaded 2-core CI machine that round took over the 297ms a
		// 300ms lease leaves, and the suite's TryAcquire got ErrNoQuorum;
		// with 1s, a KeepAlive renewal (a round to three masters) once
		// landed after the lease's validity, and the keepalive case saw it
		// lost.
		locktest.Run(t, func(t *testing.T) herd.Lock[*herd.RedlockLease] {
			r := herd.NewRedlock(masters, opt)
			t.Cleanup(func() { r.Close() })
			return r
		}, &locktest.Options{Wake: 50 * time.Millisecond, Short: 2 * time.Second})
	})
}

// TestCheckLockKey: a lock key is 1 to MaxLockKeyBytes bytes; the error
// of a longer one names its length and the bound, and quotes only a short
// start of it, not cut inside a UTF-8 sequence (byte 32 of the key below
// is inside an é).
func TestCheckLockKey(t *testing.T) {
	t.Parallel()
	long := "x" + strings.Repeat("é", 1<<20)
	for _, tc := range []struct {
		name, key string
		ok        bool
	}{
		{"empty", "", false},
		{"one byte", "k", true},
		{"at the bound", long[:herd.MaxLockKeyBytes-1] + "k", true},
		{"one byte above", long[:herd.MaxLockKeyBytes+1], false},
		{"2 MiB", long, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := herd.CheckLockKey(tc.key)
			if tc.ok {
				if err != nil {
					t.Fatalf("got %.300v, want nil", err)
				}
				return
			}
			if !errors.Is(err, herd.ErrInvalidKey) {
				t.Fatalf("got %.300v, want ErrInvalidKey", err)
			}
			msg := err.Error()
			if len(msg) >= 300 || !utf8.ValidString(msg) {
				t.Errorf("error of %d bytes (valid UTF-8: %v), want under 300 and valid: %.300s", len(msg), utf8.ValidString(msg), msg)
			}
			if tc.key != "" && (!strings.Contains(msg, strconv.Itoa(len(tc.key))) || !strings.Contains(msg, strconv.Itoa(herd.MaxLockKeyBytes))) {
				t.Errorf("error %q names neither the length %d nor the bound %d", msg, len(tc.key), herd.MaxLockKeyBytes)
			}
			t.Log(msg)
		})
	}
}

// TestAnyLock: AnyLock holds either backend in one Lock[LeaseHandle], and
// a failed acquire gives a nil LeaseHandle, not a typed nil.
func TestAnyLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	locker := herd.NewLocker(rdb, nil)
	defer locker.Close()
	redlock := herd.NewRedlock([]redis.UniversalClient{
		redistest.Start(t).Client(t), redistest.Start(t).Client(t), redistest.Start(t).Client(t),
	}, nil)
	defer redlock.Close()
	for name, locks := range map[string]herd.Lock[herd.LeaseHandle]{
		"Locker": herd.AnyLock(locker), "Redlock": herd.AnyLock(redlock),
	} {
		t.Run(name, func(t *testing.T) {
			lease, err := locks.TryAcquire(ctx, "any-lock", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			again, err := locks.TryAcquire(ctx, "any-lock", time.Minute)
			if !errors.Is(err, herd.ErrLeaseHeld) || again != nil {
				t.Errorf("TryAcquire of a held key: %v, %#v; want ErrLeaseHeld and a nil LeaseHandle", err, again)
			}
		})
	}
	if AnyAgain := herd.AnyLock(herd.AnyLock(locker)); AnyAgain == nil {
		t.Error("AnyLock of a Lock[LeaseHandle] is nil")
	}
}
