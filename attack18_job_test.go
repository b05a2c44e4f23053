package herd

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestAttack18JobMaxHoldShorterThanLease: Job's godoc says "MaxHold caps a
// run: KeepAlive stops renewing at MaxHold after the acquire, the lease
// then runs out and fn's ctx ends", and LeaseHandle's says maxHold is "an
// absolute cap on the whole holding". With a MaxHold shorter than the
// first renewal (a third of Lease), fn's ctx must still end near MaxHold,
// not at the end of the lease. The bound is 10×MaxHold, a third of Lease.
func TestAttack18JobMaxHoldShorterThanLease(t *testing.T) {
	r := newJobRig(t)
	j := r.job(t)
	j.Lease, j.MaxHold = 9*time.Second, 300*time.Millisecond
	ran, err := j.Run(context.Background(), func(ctx context.Context, _ LeaseHandle) error {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(10 * j.MaxHold):
			return errors.New("fn's ctx still open at 10×MaxHold")
		}
	})
	if !ran || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("ran %v, err %v; want true, ErrLeaseLost (MaxHold ended the run)", ran, err)
	}
}

// TestAttack18JobPanic: "A panic in fn is not recovered; the lock is
// released and the period stays unrecorded."
func TestAttack18JobPanic(t *testing.T) {
	r := newJobRig(t)
	j := r.job(t)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not propagate")
			}
		}()
		_, _ = j.Run(context.Background(), func(context.Context, LeaseHandle) error { panic("boom") })
	}()
	l, err := r.locks.TryAcquire(context.Background(), j.Name, time.Second)
	if err != nil {
		t.Fatalf("lock still held after the panic: %v", err)
	}
	_ = l.Release(context.Background())
	var runs atomic.Int64
	if ran, err := j.Run(context.Background(), counting(&runs, nil)); !ran || err != nil {
		t.Fatalf("after the panic: ran %v, err %v; want the period still to run", ran, err)
	}
}

// TestAttack18JobRedisDownDuringRun: Redis dies while fn runs and fn
// succeeds: Run returns (true, an error) within a bound, never (true, nil),
// and does not hang.
func TestAttack18JobRedisDownDuringRun(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetries = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond, 1
	})
	locker := NewLocker(rdb, nil)
	t.Cleanup(func() { locker.Close() })
	j := &Job{Name: "job-down", Period: time.Hour, Lock: AnyLock(locker), Done: NewFencedStore(rdb, ""), Lease: time.Second}
	type res struct {
		ran bool
		err error
	}
	out := make(chan res, 1)
	go func() {
		ran, err := j.Run(context.Background(), func(context.Context, LeaseHandle) error {
			srv.Kill(t)
			return nil
		})
		out <- res{ran, err}
	}()
	select {
	case got := <-out:
		if !got.ran || got.err == nil {
			t.Fatalf("ran %v, err %v; want true and the record's error", got.ran, got.err)
		}
		t.Logf("Run returned %v", got.err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run hung with Redis down")
	}
}
