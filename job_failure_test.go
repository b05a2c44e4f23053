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

// TestJobMaxHoldShorterThanLease: Job's godoc says "MaxHold caps a
// run: KeepAlive stops renewing at MaxHold after the acquire, the lease
// then runs out and fn's ctx ends", and LeaseHandle's says maxHold is "an
// absolute cap on the whole holding". With a MaxHold shorter than the
// first renewal (a third of Lease), fn's ctx must still end near MaxHold,
// not at the end of the lease. The bound is 10×MaxHold, a third of Lease.
func TestJobMaxHoldShorterThanLease(t *testing.T) {
	t.Parallel()
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

// TestJobPanic: "A panic in fn is not recovered; the lock is
// released and the period stays unrecorded."
func TestJobPanic(t *testing.T) {
	t.Parallel()
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

// TestJobRedisDownDuringRun: Redis dies while fn runs and fn
// succeeds: Run returns (true, an error) within a bound, never (true, nil),
// and does not hang.
func TestJobRedisDownDuringRun(t *testing.T) {
	t.Parallel()
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

// TestJobCancelThenSucceed: fn's caller cancels ctx and fn still
// returns nil: "the work is done: record it even if ctx ended meanwhile".
func TestJobCancelThenSucceed(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	j := r.job(t)
	ctx, cancel := context.WithCancel(context.Background())
	ran, err := j.Run(ctx, func(context.Context, LeaseHandle) error {
		cancel()
		return nil
	})
	if !ran || err != nil {
		t.Fatalf("ran %v, err %v; want true, nil", ran, err)
	}
	var runs atomic.Int64
	if ran, err := j.Run(context.Background(), counting(&runs, nil)); ran || err != nil {
		t.Errorf("next tick: ran %v, err %v; want the period recorded", ran, err)
	}
}

// TestJobRedlock: a Job on AnyLock(Redlock) over three masters:
// while one instance runs, another's tick returns (false, nil); the
// period is then done for both. Then the documented backend rule: the
// same Name moved to a Locker on the first master, whose tokens differ,
// either runs normally (higher tokens) or is fenced, never silently
// recorded below the old token.
func TestJobRedlock(t *testing.T) {
	t.Parallel()
	var clients []redis.UniversalClient
	for range 3 {
		clients = append(clients, redistest.Start(t).Client(t))
	}
	// A node timeout of its own: the default, a tenth of the 1s lease,
	// is less than a loaded machine's first round (which dials every
	// master) can take, and A's Run then found no quorum.
	rl := NewRedlock(clients, &RedlockOptions{NodeTimeout: testNodeTimeout / 2})
	t.Cleanup(func() { rl.Close() })
	done := NewFencedStore(clients[0], "")
	at := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	mk := func(l Lock[LeaseHandle]) *Job {
		return &Job{Name: "job-redlock", Period: time.Hour, Lock: l, Done: done, Lease: time.Second,
			Now: func() time.Time { return at }}
	}
	a, b := mk(AnyLock(rl)), mk(AnyLock(rl))
	inA, release := make(chan struct{}), make(chan struct{})
	type res struct {
		ran bool
		err error
	}
	out := make(chan res, 1)
	var aTok uint64
	go func() {
		ran, err := a.Run(context.Background(), func(_ context.Context, l LeaseHandle) error {
			aTok = l.Token()
			close(inA)
			<-release
			return nil
		})
		out <- res{ran, err}
	}()
	select {
	case <-inA:
	case got := <-out: // A's Run returned without running fn (an acquire that found no quorum, say)
		t.Fatalf("A returned before running fn: %+v", got)
	}
	if ran, err := b.Run(context.Background(), func(context.Context, LeaseHandle) error { return nil }); ran || err != nil {
		t.Errorf("B while A runs: ran %v, err %v; want false, nil", ran, err)
	}
	close(release)
	if got := <-out; !got.ran || got.err != nil {
		t.Fatalf("A: %+v", got)
	}
	if ran, err := b.Run(context.Background(), func(context.Context, LeaseHandle) error { return nil }); ran || err != nil {
		t.Errorf("B after A: ran %v, err %v; want the period done", ran, err)
	}

	locker := NewLocker(clients[0], nil)
	t.Cleanup(func() { locker.Close() })
	at = at.Add(time.Hour)
	var lTok uint64
	ran, err := mk(AnyLock(locker)).Run(context.Background(), func(_ context.Context, l LeaseHandle) error {
		lTok = l.Token()
		return nil
	})
	t.Logf("Redlock token %d, Locker token %d: ran %v, err %v", aTok, lTok, ran, err)
	_, tok, gerr := done.Get(context.Background(), "job-redlock:done")
	if gerr != nil || tok < aTok {
		t.Errorf("record token %d (%v), below the Redlock holder's %d", tok, gerr, aTok)
	}
	if !ran && !errors.Is(err, ErrFenced) {
		t.Errorf("on the Locker: ran %v, err %v; want a run or ErrFenced", ran, err)
	}
}

// pausingLock hands out leases whose KeepAlive (called by Run right after
// the claim, before fn) first waits for gate: a holder paused between
// claiming the period and running the job.
type pausingLock struct {
	Lock[LeaseHandle]
	paused chan struct{} // closed when KeepAlive starts waiting
	gate   chan struct{}
}

type pausingLease struct {
	LeaseHandle
	l *pausingLock
}

func (p *pausingLock) TryAcquire(ctx context.Context, key string, ttl time.Duration) (LeaseHandle, error) {
	l, err := p.Lock.TryAcquire(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	return pausingLease{l, p}, nil
}

func (p pausingLease) KeepAlive(maxHold time.Duration) {
	close(p.l.paused)
	<-p.l.gate
	p.LeaseHandle.KeepAlive(maxHold)
}

// TestJobPausedAfterClaim: A claims the period, then pauses past
// its lease; B takes the lock, runs and records the period. When A
// resumes, its lease is known lost (Lost is closed, its Deadline passed)
// before fn is called: running the job then is a second run of a period
// already recorded, which Run can see. A must not run it.
func TestJobPausedAfterClaim(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	p := &pausingLock{Lock: r.locks, paused: make(chan struct{}), gate: make(chan struct{})}
	a := r.job(t)
	a.Lock, a.Lease = p, 300*time.Millisecond
	type res struct {
		ran bool
		err error
	}
	out := make(chan res, 1)
	var aRuns atomic.Int64
	go func() {
		ran, err := a.Run(context.Background(), counting(&aRuns, nil))
		out <- res{ran, err}
	}()
	<-p.paused
	var bRuns atomic.Int64
	if ran, err := runUntilRan(r.job(t), counting(&bRuns, nil)); !ran || err != nil {
		t.Fatalf("B: ran %v, err %v", ran, err)
	}
	close(p.gate)
	got := <-out
	if aRuns.Load() != 0 {
		t.Errorf("A ran the job after its lease was lost and B recorded the period (ran %v, err %v)", got.ran, got.err)
	}
	if got.ran || !errors.Is(got.err, ErrLeaseLost) {
		t.Errorf("A: ran %v, err %v; want false, ErrLeaseLost", got.ran, got.err)
	}
}
