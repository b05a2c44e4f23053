package herd

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// Defect 7 of issue 12: every duration herd accepts can be stored, and
// every other one is rejected up front, naming the field and its range.

// TestTTLRangeValueCalls: a per-call ttl that passed validation used to
// overflow ttl + StaleFor, so every Get loaded and failed its commit and
// Set failed with "ERR invalid expire time". Out of range is now
// ErrInvalidTTL at once; the longest accepted ttl is stored.
func TestTTLRangeValueCalls(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	c := newTestCache(t, rdb, &Options{StaleFor: maxTTL})
	var calls atomic.Int64
	load := constLoader(&calls, "v")
	for _, ttl := range []time.Duration{math.MaxInt64, maxTTL + time.Millisecond, 0, 999 * time.Microsecond} {
		if _, err := c.Get(ctx, "k-get", ttl, load); !errors.Is(err, ErrInvalidTTL) || !strings.Contains(err.Error(), "between 1ms and") {
			t.Errorf("Get(ttl %v): got %v, want ErrInvalidTTL naming the range", ttl, err)
		}
		if _, err := Fetch(ctx, c, "k-get", ttl, func(context.Context) (int, error) { return 1, nil }); !errors.Is(err, ErrInvalidTTL) {
			t.Errorf("Fetch(ttl %v): got %v, want ErrInvalidTTL", ttl, err)
		}
		if err := c.Set(ctx, "k-set", []byte("v"), ttl); !errors.Is(err, ErrInvalidTTL) {
			t.Errorf("Set(ttl %v): got %v, want ErrInvalidTTL", ttl, err)
		}
		if _, _, err := c.Begin(ctx, "k-begin", ttl, nil); !errors.Is(err, ErrInvalidTTL) {
			t.Errorf("Begin(ttl %v): got %v, want ErrInvalidTTL", ttl, err)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the loader ran %d times for invalid ttls", n)
	}

	// The bounds themselves work: 3 Gets are 1 load and a stored value.
	for range 3 {
		if v, err := c.Get(ctx, "k-max", maxTTL, load); err != nil || string(v) != "v" {
			t.Fatalf("Get(ttl maxTTL, StaleFor maxTTL) = (%q, %v), want v", v, err)
		}
	}
	st := c.Stats()
	if calls.Load() != 1 || st.CommitErrors != 0 || st.Hits != 2 {
		t.Errorf("3 Gets at ttl maxTTL: loads %d, commit errors %d, hits %d; want 1, 0, 2", calls.Load(), st.CommitErrors, st.Hits)
	}
	if err := c.Set(ctx, "k-set", []byte("w"), maxTTL); err != nil {
		t.Errorf("Set(ttl maxTTL): %v", err)
	}
	if v, err := c.Get(ctx, "k-set", minTTL+time.Hour, load); err != nil || string(v) != "w" {
		t.Errorf("Get after Set(maxTTL) = (%q, %v), want w", v, err)
	}
	if pttl := rdb.PTTL(ctx, mustKeys(t, "k-set").Value).Val(); pttl < maxTTL {
		t.Errorf("PTTL of a value set for maxTTL with StaleFor maxTTL = %v, want at least %v", pttl, maxTTL)
	}
}

// TestTTLRangeLocker: a lease at or under the drift allowance (1% + 2ms)
// used to be accepted, and every acquire of a free key then failed as
// held. Leases under 10ms or over 50 years are now ErrInvalidTTL.
func TestTTLRangeLocker(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newTestLocker(t, rdb, nil)
	for _, ttl := range []time.Duration{2 * time.Millisecond, minLease - time.Millisecond, maxTTL + time.Millisecond, math.MaxInt64} {
		if _, err := l.TryAcquire(ctx, "free", ttl); !errors.Is(err, ErrInvalidTTL) || !strings.Contains(err.Error(), "between 10ms and") {
			t.Errorf("TryAcquire(ttl %v) of a free key: got %v, want ErrInvalidTTL naming the range", ttl, err)
		}
		if _, err := l.Acquire(ctx, "free", ttl); !errors.Is(err, ErrInvalidTTL) {
			t.Errorf("Acquire(ttl %v) of a free key: got %v, want ErrInvalidTTL", ttl, err)
		}
	}
	if n := rdb.Exists(ctx, mustKeys(t, "free").Lease).Val(); n != 0 {
		t.Errorf("an invalid acquire left a lease in Redis")
	}
	// The shortest lease is not rejected by validation (whether the reply
	// comes within its 7.9ms of validity depends on the host).
	if lease, err := l.TryAcquire(ctx, "short", minLease); errors.Is(err, ErrInvalidTTL) {
		t.Errorf("TryAcquire(ttl %v): got %v, want it accepted", minLease, err)
	} else if lease != nil {
		_ = lease.Release(ctx)
	}
	lease, err := l.TryAcquire(ctx, "long", maxTTL)
	if err != nil {
		t.Fatalf("TryAcquire(ttl maxTTL): %v", err)
	}
	defer lease.Release(ctx)
	if pttl := rdb.PTTL(ctx, mustKeys(t, "long").Lease).Val(); pttl < maxTTL-time.Minute {
		t.Errorf("PTTL of a lease for maxTTL = %v", pttl)
	}
	for _, ttl := range []time.Duration{2 * time.Millisecond, math.MaxInt64} {
		if err := lease.Extend(ctx, ttl); !errors.Is(err, ErrInvalidTTL) {
			t.Errorf("Extend(ttl %v): got %v, want ErrInvalidTTL", ttl, err)
		}
	}
	if err := lease.Extend(ctx, time.Minute); err != nil {
		t.Errorf("Extend(1m) after rejected extends: %v (the lease must be untouched)", err)
	}
}

// TestTTLRangeOptions: options that could never be stored (a NegativeTTL
// under 1ms became PX 0, a MinLease within the drift allowance made every
// acquire fail) make the constructors panic with the field and its range.
func TestTTLRangeOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		opt   *Options
		field string
	}{
		{"NegativeTTL under 1ms", &Options{NegativeTTL: 500 * time.Microsecond}, "Options.NegativeTTL"},
		{"MinLease within the drift allowance", &Options{MinLease: time.Millisecond}, "Options.MinLease"},
		{"DefaultLease within the drift allowance", &Options{DefaultLease: 2 * time.Millisecond}, "Options.DefaultLease"},
		{"MaxLease under 10ms", &Options{MaxLease: 5 * time.Millisecond}, "Options.MaxLease"},
		{"RefreshBackoff under 1ms", &Options{RefreshBackoff: time.Microsecond}, "Options.RefreshBackoff"},
		{"RefreshBackoffMax under 1ms", &Options{RefreshBackoffMax: time.Microsecond}, "Options.RefreshBackoffMax"},
		{"StaleFor that overflows", &Options{StaleFor: math.MaxInt64}, "Options.StaleFor"},
		{"LoadTimeout over 50 years", &Options{LoadTimeout: maxTTL + 1}, "Options.LoadTimeout"},
		{"negative WaitTimeout", &Options{WaitTimeout: -time.Second}, "Options.WaitTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := panicMessage(func() { tc.opt.resolve() })
			if !strings.HasPrefix(msg, "herd: "+tc.field+" ") || !strings.Contains(msg, "between") && !strings.Contains(msg, "up to") {
				t.Errorf("panic %q, want a \"herd: \" message naming %s and its range", msg, tc.field)
			}
		})
	}
	for _, tc := range []struct {
		name  string
		opt   *LockerOptions
		field string
	}{
		{"FenceTTL under 1ms", &LockerOptions{FenceTTL: time.Microsecond}, "LockerOptions.FenceTTL"},
		{"MaxWait over 50 years", &LockerOptions{MaxWait: math.MaxInt64}, "LockerOptions.MaxWait"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := panicMessage(func() { tc.opt.resolve() })
			if !strings.HasPrefix(msg, "herd: "+tc.field+" ") {
				t.Errorf("panic %q, want a \"herd: \" message naming %s", msg, tc.field)
			}
		})
	}
	// The bounds are accepted.
	for _, opt := range []*Options{
		{NegativeTTL: time.Millisecond, RefreshBackoff: time.Millisecond, RefreshBackoffMax: time.Millisecond},
		{MinLease: minLease, DefaultLease: minLease, MaxLease: minLease},
		{StaleFor: maxTTL, LoadTimeout: maxTTL, NegativeTTL: -1},
	} {
		if msg := panicMessage(func() { opt.resolve() }); msg != "" {
			t.Errorf("Options %+v: unexpected panic %q", *opt, msg)
		}
	}
}

// TestNegativeTTLMillisecondStored: the shortest NegativeTTL is written
// (it used to be PX 0, a failed commit).
func TestNegativeTTLMillisecondStored(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	c := newTestCache(t, rdb, &Options{NegativeTTL: time.Millisecond})
	_, err := c.Get(context.Background(), "gone", time.Minute, func(context.Context) ([]byte, error) { return nil, ErrNotFound })
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get: got %v, want ErrNotFound", err)
	}
	if st := c.Stats(); st.CommitErrors != 0 {
		t.Errorf("commit errors = %d, want 0", st.CommitErrors)
	}
}

// TestCommitScriptValidatesFirst: a COMMIT that fails must change
// nothing. It used to delete the lease (and mark it released) before a
// SET that then failed, so the waiters were never woken and a retry found
// no lease.
func TestCommitScriptValidatesFirst(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := newTestLocker(t, rdb, nil)
	for _, tc := range []struct {
		name   string
		ttl    string
		before func(k keyFamily)
	}{
		{"zero ttl", "0", nil},
		{"negative ttl", "-5", nil},
		{"ttl not a number", "soon", nil},
		{"fence of the wrong type", "60000", func(k keyFamily) {
			rdb.Del(ctx, k.Fence)
			rdb.Set(ctx, k.Fence, "not a hash", 0)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := testKey(t)
			lease, err := l.TryAcquire(ctx, key, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			k := lease.keys
			if tc.before != nil {
				tc.before(k)
			}
			fence, _ := rdb.HGet(ctx, k.Fence, "r").Result()
			err = commitScript.rs.Run(ctx, rdb, []string{k.Value, k.Lease, k.Fence, k.Backoff},
				lease.token, "envelope", tc.ttl, lease.value, "PUBLISH", k.Channel, "w", "r").Err()
			if err == nil {
				t.Fatal("COMMIT with an invalid argument succeeded")
			}
			if got := rdb.Get(ctx, k.Lease).Val(); got != lease.value {
				t.Errorf("after a failed COMMIT (%v) the lease is %q, want it still held (%q)", err, got, lease.value)
			}
			if got, _ := rdb.HGet(ctx, k.Fence, "r").Result(); got != fence {
				t.Errorf("after a failed COMMIT the released marker is %q, want %q", got, fence)
			}
			if n := rdb.Exists(ctx, k.Value).Val(); n != 0 {
				t.Errorf("a failed COMMIT wrote the value")
			}
		})
	}
}

// panicMessage runs f and returns the string it panicked with, or "".
func panicMessage(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg, _ = r.(string)
			if msg == "" {
				msg = "non-string panic"
			}
		}
	}()
	f()
	return ""
}

// TestTTLRangeLoaderExpiry: SetExpiry and Fill.Commit could set a ttl or
// staleFor whose sum overflowed, so the commit failed. SetExpiry now
// ignores them (the call's ttl applies) and Fill.Commit rejects them.
func TestTTLRangeLoaderExpiry(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	c := newTestCache(t, rdb, nil)
	var calls atomic.Int64
	load := func(ctx context.Context) ([]byte, error) {
		calls.Add(1)
		SetExpiry(ctx, math.MaxInt64, math.MaxInt64)
		return []byte("v"), nil
	}
	for range 2 {
		if v, err := c.Get(ctx, "k", time.Minute, load); err != nil || string(v) != "v" {
			t.Fatalf("Get = (%q, %v), want v", v, err)
		}
	}
	if st := c.Stats(); calls.Load() != 1 || st.CommitErrors != 0 {
		t.Errorf("SetExpiry(MaxInt64, MaxInt64): loads %d, commit errors %d; want 1, 0", calls.Load(), st.CommitErrors)
	}
	_, fill, err := c.Begin(ctx, "k-fill", time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin = (%v, %v), want a Fill", fill, err)
	}
	if err := fill.Commit([]byte("v"), time.Minute, math.MaxInt64); !errors.Is(err, ErrInvalidTTL) {
		t.Errorf("Fill.Commit(staleFor MaxInt64): got %v, want ErrInvalidTTL", err)
	}
	if st := c.Stats(); st.CommitErrors != 0 {
		t.Errorf("commit errors = %d, want 0", st.CommitErrors)
	}
}
