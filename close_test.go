package herd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// Defect 8 of issue 12: every call after Close returns ErrClosed. Leases
// handed out before Close stay their holders': Extend and Release work.

func TestLockerClosedRefusesCalls(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := NewLocker(rdb, nil)
	held, err := l.TryAcquire(ctx, "held", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if lease, err := l.TryAcquire(ctx, "free", time.Minute); !errors.Is(err, ErrClosed) || lease != nil {
		t.Errorf("TryAcquire of a free key after Close = (%v, %v), want ErrClosed", lease, err)
	}
	if lease, err := l.Acquire(ctx, "free", time.Minute); !errors.Is(err, ErrClosed) || lease != nil {
		t.Errorf("Acquire of a free key after Close = (%v, %v), want ErrClosed", lease, err)
	}
	if n := rdb.Exists(ctx, mustKeys(t, "free").lease).Val(); n != 0 {
		t.Errorf("a call after Close took a lease in Redis")
	}
	// The lease handed out before Close is still its holder's.
	if err := held.Extend(ctx, 2*time.Minute); err != nil {
		t.Errorf("Extend after Close: %v, want nil", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Errorf("Release after Close: %v, want nil", err)
	}
	if n := rdb.Exists(ctx, mustKeys(t, "held").lease).Val(); n != 0 {
		t.Errorf("Release after Close left the lease in Redis")
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestLockerCloseEndsWaitingAcquire(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	holder := newTestLocker(t, rdb, nil)
	held, err := holder.TryAcquire(ctx, "k", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	waiting := make(chan struct{}, 1)
	l := NewLocker(rdb, &LockerOptions{MaxWait: time.Minute, Observer: &Observer{
		Lease: func(_ string, ev LeaseEvent) {
			if ev == LeaseContended {
				select {
				case waiting <- struct{}{}:
				default:
				}
			}
		},
	}})
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(wctx, "k", time.Minute)
		if lease != nil {
			_ = lease.Release(ctx)
		}
		done <- err
	}()
	<-waiting
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire waiting when Close was called returned %v, want ErrClosed", err)
	}
}

func TestCacheClosedRefusesCalls(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	c := New(rdb, nil)
	if err := c.Set(ctx, "k", []byte("before"), time.Minute); err != nil {
		t.Fatal(err)
	}
	_, fill, err := c.Begin(ctx, "filled", time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin = (%v, %v), want a Fill", fill, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close aborted the open Fill and gave its lease back.
	if err := fill.Commit([]byte("late"), time.Minute, 0); err != nil {
		t.Errorf("Commit of a Fill Close aborted: %v, want nil (a no-op)", err)
	}
	if n := rdb.Exists(ctx, mustKeys(t, "filled").value, mustKeys(t, "filled").lease).Val(); n != 0 {
		t.Errorf("after Close and a late Commit, %d of the Fill's value and lease keys exist, want 0", n)
	}
	loads := 0
	load := func(context.Context) ([]byte, error) { loads++; return []byte("v"), nil }
	if err := c.Set(ctx, "k", []byte("after"), time.Minute); !errors.Is(err, ErrClosed) {
		t.Errorf("Set after Close: got %v, want ErrClosed", err)
	}
	if err := c.Invalidate(ctx, "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("Invalidate after Close: got %v, want ErrClosed", err)
	}
	if err := c.InvalidateSoft(ctx, "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("InvalidateSoft after Close: got %v, want ErrClosed", err)
	}
	if _, _, err := c.Peek(ctx, "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("Peek after Close: got %v, want ErrClosed", err)
	}
	if err := c.SetTagged(ctx, "k", []byte("after"), time.Minute, "t"); !errors.Is(err, ErrClosed) {
		t.Errorf("SetTagged after Close: got %v, want ErrClosed", err)
	}
	if err := c.InvalidateTag(ctx, "t"); !errors.Is(err, ErrClosed) {
		t.Errorf("InvalidateTag after Close: got %v, want ErrClosed", err)
	}
	if _, err := c.Get(ctx, "k", time.Minute, load); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close: got %v, want ErrClosed", err)
	}
	if _, err := Fetch(ctx, c, "k", time.Minute, func(context.Context) (string, error) { return "v", nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("Fetch after Close: got %v, want ErrClosed", err)
	}
	if _, _, err := c.Begin(ctx, "k", time.Minute, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Begin after Close: got %v, want ErrClosed", err)
	}
	if loads != 0 {
		t.Errorf("a loader ran %d times after Close", loads)
	}
	// Neither Set nor Invalidate touched Redis.
	b, err := rdb.Get(ctx, mustKeys(t, "k").value).Bytes()
	env, ok := decodeEnvelope(b)
	if err != nil || !ok || string(env.payload) != "before" {
		t.Errorf("the value after Close is (%q, %v), want the one Set before Close", env.payload, err)
	}
}
