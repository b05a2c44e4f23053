package herd

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"

	"github.com/redis/go-redis/v9"
)

// jobRig is one real redis-server with a Locker and a FencedStore on it,
// and a clock the test moves.
type jobRig struct {
	locks Lock[LeaseHandle]
	done  *FencedStore
	now   atomic.Pointer[time.Time]
}

func newJobRig(t *testing.T) *jobRig {
	t.Helper()
	rdb := redistest.Start(t).Client(t)
	locker := NewLocker(rdb, nil)
	t.Cleanup(func() { locker.Close() })
	r := &jobRig{locks: AnyLock(locker), done: NewFencedStore(rdb, "")}
	r.set(time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC))
	return r
}

func (r *jobRig) set(t time.Time) { r.now.Store(&t) }

// job returns a Job named after the test with a period of an hour, on the
// rig's clock.
func (r *jobRig) job(t *testing.T) *Job {
	return &Job{Name: "job-" + t.Name(), Period: time.Hour, Lock: r.locks, Done: r.done,
		Now: func() time.Time { return *r.now.Load() }}
}

// counting returns a JobFunc that counts its runs and returns err.
func counting(n *atomic.Int64, err error) JobFunc {
	return func(context.Context, LeaseHandle) error {
		n.Add(1)
		return err
	}
}

// TestJobOncePerPeriod: a second Run in the same period (another instance
// after the first finished) does not run the job; the next period does.
func TestJobOncePerPeriod(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	j := r.job(t)
	ctx := context.Background()
	var runs atomic.Int64
	steps := []struct {
		at      time.Time
		wantRan bool
	}{
		{time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC), true},
		{time.Date(2026, 12, 1, 3, 59, 59, 0, time.UTC), false},
		{time.Date(2026, 12, 1, 4, 0, 0, 0, time.UTC), true},
		{time.Date(2026, 12, 1, 4, 30, 0, 0, time.UTC), false},
		// A clock that is behind (skew) sees the previous period: done.
		{time.Date(2026, 12, 1, 3, 59, 58, 0, time.UTC), false},
	}
	for i, s := range steps {
		r.set(s.at)
		ran, err := j.Run(ctx, counting(&runs, nil))
		if err != nil || ran != s.wantRan {
			t.Fatalf("step %d at %v: ran %v, err %v; want ran %v, nil", i, s.at, ran, err, s.wantRan)
		}
	}
	if got := runs.Load(); got != 2 {
		t.Errorf("job ran %d times over 2 periods, want 2", got)
	}
}

// TestJobHeldLockDoesNotRun: while another instance holds the job's lock,
// Run returns (false, nil) without calling the job.
func TestJobHeldLockDoesNotRun(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	j := r.job(t)
	ctx := context.Background()
	var runs atomic.Int64
	ran, err := j.Run(ctx, func(ctx context.Context, lease LeaseHandle) error {
		ran, err := j.Run(ctx, counting(&runs, nil)) // a second instance, meanwhile
		if ran || err != nil {
			t.Errorf("second instance while the first runs: ran %v, err %v; want false, nil", ran, err)
		}
		return nil
	})
	if !ran || err != nil {
		t.Fatalf("first instance: ran %v, err %v", ran, err)
	}
	if runs.Load() != 0 {
		t.Errorf("the second instance ran the job")
	}
}

// TestJobErrorNotRecorded: a failed run records nothing, so the next tick
// runs the job again; once it succeeds the period is done.
func TestJobErrorNotRecorded(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	j := r.job(t)
	ctx := context.Background()
	boom := errors.New("boom")
	var runs atomic.Int64
	ran, err := j.Run(ctx, counting(&runs, boom))
	if !ran || !errors.Is(err, boom) {
		t.Fatalf("failing run: ran %v, err %v; want true, boom", ran, err)
	}
	if ran, err := j.Run(ctx, counting(&runs, nil)); !ran || err != nil {
		t.Fatalf("next tick: ran %v, err %v; want it run again", ran, err)
	}
	if ran, err := j.Run(ctx, counting(&runs, nil)); ran || err != nil {
		t.Fatalf("tick after success: ran %v, err %v; want done", ran, err)
	}
	if got := runs.Load(); got != 2 {
		t.Errorf("%d runs, want 2", got)
	}
}

// TestJobContextCancel: a ctx that ended before Run does not run the job;
// one that ends during the job ends the job's ctx, and nothing is
// recorded.
func TestJobContextCancel(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	j := r.job(t)
	var runs atomic.Int64

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if ran, err := j.Run(ctx, counting(&runs, nil)); ran || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: ran %v, err %v; want false, context.Canceled", ran, err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	ran, err := j.Run(ctx, func(jctx context.Context, _ LeaseHandle) error {
		cancel()
		<-jctx.Done() // ends with ctx: no timer needed, cancel was called
		return jctx.Err()
	})
	if !ran || !errors.Is(err, context.Canceled) {
		t.Errorf("cancel during the job: ran %v, err %v; want true, context.Canceled", ran, err)
	}
	if ran, err := j.Run(context.Background(), counting(&runs, nil)); !ran || err != nil {
		t.Errorf("after the cancelled run: ran %v, err %v; want it run (nothing recorded)", ran, err)
	}
	if runs.Load() != 1 {
		t.Errorf("%d runs of the counting job, want 1", runs.Load())
	}
}

// TestJobLeaseLostEndsJobContext: when the lease is lost mid-run (here
// MaxHold stops the renewals, so it runs out), the job's ctx ends with
// cause ErrLeaseLost, Run's error wraps it and nothing is recorded.
func TestJobLeaseLostEndsJobContext(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	j := r.job(t)
	j.Lease, j.MaxHold = 300*time.Millisecond, 300*time.Millisecond
	var cause error
	ran, err := j.Run(context.Background(), func(ctx context.Context, _ LeaseHandle) error {
		bound := time.NewTimer(30 * j.Lease) // only against a hang
		defer bound.Stop()
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return ctx.Err()
		case <-bound.C:
			return errors.New("the job's ctx did not end at the lease's loss")
		}
	})
	if !errors.Is(cause, ErrLeaseLost) {
		t.Errorf("job ctx cause %v, want ErrLeaseLost", cause)
	}
	if !ran || !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Run: ran %v, err %v; want true, ErrLeaseLost", ran, err)
	}
	if _, _, err := r.done.Get(context.Background(), j.Name+":done"); err != nil {
		t.Fatalf("record: %v", err)
	}
	if _, done, _ := j.record(context.Background(), j.Name+":done", *r.now.Load()); done {
		t.Errorf("the lost run recorded its period")
	}
}

// TestJobOlderHolderFenced: holder A's lease runs out mid-run (its MaxHold
// stops the renewals: as a paused process's would) and B takes the lock
// and claims the period. A finishes while B still runs: A's record is
// refused with ErrFenced, because B's claim raised the token. B records
// the period; a third instance then finds it done.
func TestJobOlderHolderFenced(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	ctx := context.Background()
	a := r.job(t)
	a.Lease, a.MaxHold = 300*time.Millisecond, 300*time.Millisecond
	b := r.job(t)

	aLost := make(chan struct{})
	bRunning, bGo := make(chan struct{}), make(chan struct{})
	var aToken, bToken uint64
	type result struct {
		ran bool
		err error
	}
	aDone := make(chan result, 1)
	go func() {
		ran, err := a.Run(ctx, func(_ context.Context, lease LeaseHandle) error {
			aToken = lease.Token()
			<-lease.Lost() // MaxHold: the lease runs out after 300 ms
			close(aLost)
			select { // A ignores its ctx and finishes while B runs
			case <-bRunning:
			case <-time.After(time.Minute): // only against a hang
			}
			return nil
		})
		aDone <- result{ran, err}
	}()
	<-aLost
	bRes := make(chan result, 1)
	go func() {
		// A's lease ends in Redis a drift allowance after A saw it lost:
		// B's first ticks may still find the lock held.
		ran, err := runUntilRan(b, func(_ context.Context, lease LeaseHandle) error {
			bToken = lease.Token()
			close(bRunning)
			<-bGo
			return nil
		})
		bRes <- result{ran, err}
	}()
	ar := <-aDone
	if !ar.ran || !errors.Is(ar.err, ErrFenced) {
		t.Errorf("A: ran %v, err %v; want true, ErrFenced", ar.ran, ar.err)
	}
	close(bGo)
	br := <-bRes
	if !br.ran || br.err != nil {
		t.Fatalf("B: ran %v, err %v; want true, nil", br.ran, br.err)
	}
	if bToken <= aToken {
		t.Fatalf("B's token %d is not above A's %d", bToken, aToken)
	}
	val, tok, err := r.done.Get(ctx, b.Name+":done")
	want := strconv.FormatInt(r.now.Load().Truncate(time.Hour).UnixNano(), 10)
	if err != nil || tok != bToken || string(val) != want {
		t.Errorf("record %q token %d (%v), want %q by B's token %d", val, tok, err, want, bToken)
	}
	var runs atomic.Int64
	if ran, err := r.job(t).Run(ctx, counting(&runs, nil)); ran || err != nil {
		t.Errorf("third instance: ran %v, err %v; want the period done", ran, err)
	}
}

// runUntilRan calls j.Run every few milliseconds until it runs fn or
// fails, for at most 10 s.
func runUntilRan(j *Job, fn JobFunc) (bool, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ran, err := j.Run(context.Background(), fn)
		if ran || err != nil || time.Now().After(deadline) {
			return ran, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestJobBadInput: every invalid Job or func is a clear error at once, and
// nothing runs.
func TestJobBadInput(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	fn := func(context.Context, LeaseHandle) error {
		t.Error("the job ran")
		return nil
	}
	for _, tc := range []struct {
		name string
		job  Job
		fn   JobFunc
		want []error
	}{
		{"empty name", Job{Period: time.Hour, Lock: r.locks, Done: r.done}, fn, []error{ErrInvalidJob, ErrInvalidKey}},
		{"name above MaxLockKeyBytes", Job{Name: strings.Repeat("j", 6<<20/5), Period: time.Hour, Lock: r.locks, Done: r.done}, fn, []error{ErrInvalidJob, ErrInvalidKey}},
		{"zero period", Job{Name: "j", Lock: r.locks, Done: r.done}, fn, []error{ErrInvalidJob}},
		{"negative period", Job{Name: "j", Period: -time.Second, Lock: r.locks, Done: r.done}, fn, []error{ErrInvalidJob}},
		{"nil func", Job{Name: "j", Period: time.Hour, Lock: r.locks, Done: r.done}, nil, []error{ErrInvalidJob}},
		{"nil lock", Job{Name: "j", Period: time.Hour, Done: r.done}, fn, []error{ErrInvalidJob}},
		{"nil store", Job{Name: "j", Period: time.Hour, Lock: r.locks}, fn, []error{ErrInvalidJob}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran, err := tc.job.Run(context.Background(), tc.fn)
			if ran {
				t.Errorf("ran")
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("err %.300v, want it to wrap %v", err, w)
				}
			}
			if len(err.Error()) >= 300 {
				t.Errorf("an error of %d bytes, want under 300: %.300s", len(err.Error()), err)
			}
			t.Log(err)
		})
	}
	if ran, err := RunJob(context.Background(), r.locks, r.done, "", time.Hour, fn); ran || !errors.Is(err, ErrInvalidKey) {
		t.Errorf("RunJob with an empty name: ran %v, err %v", ran, err)
	}
}

// TestRunJob: the function form runs once per period with the wall clock.
func TestRunJob(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	ctx := context.Background()
	var runs atomic.Int64
	for range 3 {
		if _, err := RunJob(ctx, r.locks, r.done, "once-"+t.Name(), 24*time.Hour, counting(&runs, nil)); err != nil {
			t.Fatal(err)
		}
	}
	// A day boundary between the calls would allow 2.
	if got := runs.Load(); got < 1 || got > 2 {
		t.Errorf("%d runs in 3 calls within a day, want 1", got)
	}
}

// TestJobCompleted: Completed tells "done this period" from "not done"
// (Run's (false, nil) is both "done" and "held elsewhere"), reads the last
// period recorded, sees a later period as done (a clock behind), and
// rejects a bad Job.
func TestJobCompleted(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	j := r.job(t)
	ctx := context.Background()
	check := func(step string, wantDone bool, wantLast time.Time) {
		t.Helper()
		done, last, err := j.Completed(ctx)
		if err != nil || done != wantDone || !last.Equal(wantLast) {
			t.Errorf("%s: Completed = %v, %v, %v; want %v, %v, nil", step, done, last, err, wantDone, wantLast)
		}
	}
	three := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	check("no record", false, time.Time{})

	// Held by another instance: Run says (false, nil), Completed says not done.
	lease, err := r.locks.TryAcquire(ctx, j.Name, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	if ran, err := j.Run(ctx, counting(&runs, nil)); ran || err != nil {
		t.Fatalf("Run while held: %v, %v; want false, nil", ran, err)
	}
	check("held, not run", false, time.Time{})
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	r.set(three.Add(10 * time.Minute))
	if ran, err := j.Run(ctx, counting(&runs, nil)); !ran || err != nil {
		t.Fatalf("Run: %v, %v; want true, nil", ran, err)
	}
	check("after the run", true, three)
	r.set(three.Add(-time.Minute)) // a clock behind: a later period is recorded
	check("clock behind", true, three)
	r.set(three.Add(time.Hour)) // the next period
	check("next period", false, three)

	for _, bad := range []*Job{
		{Period: time.Hour, Done: r.done},
		{Name: "x", Done: r.done},
		{Name: "x", Period: time.Hour},
	} {
		if _, _, err := bad.Completed(ctx); !errors.Is(err, ErrInvalidJob) {
			t.Errorf("Completed of %+v: %v, want ErrInvalidJob", bad, err)
		}
	}
	if err := r.done.Set(ctx, j.Name+":done", 1<<62, []byte("not a time"), 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := j.Completed(ctx); err == nil {
		t.Error("Completed of a foreign record: nil error")
	}
}

// cancelAfterGet is a record store that ends ctx after its first read:
// the Job's acquire then runs on an ended ctx.
type cancelAfterGet struct {
	FencedRecords
	cancel context.CancelFunc
}

func (s cancelAfterGet) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	v, tok, err := s.FencedRecords.Get(ctx, key)
	s.cancel()
	return v, tok, err
}

// TestJobRunReturnsCtxErrorWhenCtxEndsDuringTheAcquire: Run's promise
// that it returns ctx's error when ctx ended before fn was called, also
// when ctx ends during the acquire (whose error then wraps ErrLeaseHeld
// too): not (false, nil), which says another instance holds the lock.
func TestJobRunReturnsCtxErrorWhenCtxEndsDuringTheAcquire(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	j := r.job(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	j.Done = cancelAfterGet{FencedRecords: r.done, cancel: cancel}
	var runs atomic.Int64
	ran, err := j.Run(ctx, counting(&runs, nil))
	if ran || runs.Load() != 0 || !errors.Is(err, context.Canceled) {
		t.Errorf("Run with ctx ended during the acquire = %v, %v (%d runs), want false and context.Canceled", ran, err, runs.Load())
	}
}

// TestJobRecordNotOnTheReplicasIsReported: Run's (true, nil) means the
// period is recorded where a failover keeps it. A record the replicas do
// not acknowledge (one replica stopped while fn runs) is reported as
// ErrNotReplicated, with ran true.
func TestJobRecordNotOnTheReplicasIsReported(t *testing.T) {
	t.Parallel()
	p := startReplicated(t)
	locker := NewLocker(p.m, &LockerOptions{ReplicaTimeout: failoverReplicaTimeout})
	defer locker.Close()
	j := &Job{Name: "job-" + t.Name(), Period: time.Hour, Lock: AnyLock(locker), Done: NewFencedStore(p.m, "")}
	ran, err := j.Run(context.Background(), func(context.Context, LeaseHandle) error {
		p.replica.Pause(t)
		return nil
	})
	defer p.replica.Resume(t)
	if !ran || !errors.Is(err, ErrNotReplicated) {
		t.Errorf("Run whose record no longer reaches a replica = %v, %v, want true and ErrNotReplicated", ran, err)
	}
}

// TestJobRunsOncePerPeriodAcrossAFailover: Job's promise, "at most once
// per period across the fleet" across a failover, or Run says it could
// not record the period. Instance A runs the job for one period with both
// replicas attached, then both replicas leave the master (the link cut,
// the master still writable) and A runs the next period; the first
// replica is promoted and instance B runs that period there. A's Run is
// refused (ErrNotReplicated) and the period runs once, on B: with the
// default user (its process remembers the 2 replicas for a minute), and
// with a user that may not run INFO (no @dangerous) given the count. With
// that user and the default count, no Run can confirm its claim: the
// first is refused with an error that names the fix.
func TestJobRunsOncePerPeriodAcrossAFailover(t *testing.T) {
	t.Parallel()
	for _, tc := range failoverUsers {
		t.Run(tc.name, func(t *testing.T) {
			p := startReplicated(t)
			for _, c := range []*redis.Client{p.m, p.r, p.o} {
				addAppUser(t, c)
			}
			ctx := context.Background()
			clock := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
			now := func() time.Time { return clock }
			instance := func(addr string, acks int) *Job {
				rdb := redis.NewClient(&redis.Options{Addr: addr, Username: tc.user, Password: tc.pw})
				t.Cleanup(func() { rdb.Close() })
				locker := NewLocker(rdb, &LockerOptions{ReplicaAcks: acks, ReplicaTimeout: failoverReplicaTimeout})
				t.Cleanup(func() { locker.Close() })
				store := NewFencedStore(rdb, "").WithReplicaWait(acks, failoverReplicaTimeout)
				return &Job{Name: "job-" + t.Name(), Period: time.Hour, Lock: AnyLock(locker), Done: store, Now: now}
			}
			var runs atomic.Int64
			a := instance(p.master.Addr(), tc.acks)
			if tc.user != "" && tc.acks == 0 {
				ran, err := a.Run(ctx, counting(&runs, nil))
				if ran || !errors.Is(err, ErrNotReplicated) || !strings.Contains(err.Error(), "+info") {
					t.Fatalf("a Run by a user without INFO, default count = %v, %v; want false and ErrNotReplicated naming +info", ran, err)
				}
				return
			}
			if ran, err := a.Run(ctx, counting(&runs, nil)); !ran || err != nil {
				t.Fatalf("A's run of the first period with both replicas attached = %v, %v; want true, nil", ran, err)
			}
			p.sync(t)
			p.cut(t)
			clock = clock.Add(time.Hour)
			runs.Store(0)
			ranA, errA := a.Run(ctx, counting(&runs, nil))
			p.promote(t)
			bAcks := tc.acks
			if bAcks > 0 {
				bAcks = 1 // the promoted replica has the other one
			}
			b := instance(p.replica.Addr(), bAcks)
			ranB, errB := b.Run(ctx, counting(&runs, nil))
			if errB != nil {
				t.Fatalf("B's run on the promoted replica: %v", errB)
			}
			if errA == nil && runs.Load() > 1 {
				t.Fatalf("the second period ran %d times: A's Run said (%v, nil), ran and recorded, and after the failover B ran it again (ran %v)", runs.Load(), ranA, ranB)
			}
			if ranA && errA == nil {
				t.Errorf("A's Run after both replicas left = (true, nil), want an error wrapping ErrNotReplicated")
			} else if errA != nil && !errors.Is(errA, ErrNotReplicated) {
				t.Errorf("A's Run after both replicas left = %v, %v; want ErrNotReplicated", ranA, errA)
			}
		})
	}
}

// lateRecord is a record store whose second call (a Run's first under the
// lock) is followed, once it returns, by an older holder's record: A
// claimed the period, paused past its lease and finished just as B took
// the lock.
type lateRecord struct {
	FencedRecords
	calls  atomic.Int64
	record func() // A's record
}

func (s *lateRecord) after() {
	if s.calls.Add(1) == 2 {
		s.record()
	}
}

func (s *lateRecord) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	defer s.after()
	return s.FencedRecords.Get(ctx, key)
}

func (s *lateRecord) Set(ctx context.Context, key string, token uint64, val []byte, ttl time.Duration) error {
	defer s.after()
	return s.FencedRecords.Set(ctx, key, token, val, ttl)
}

func (s *lateRecord) Fence(ctx context.Context, key string, token uint64) ([]byte, error) {
	defer s.after()
	return s.FencedRecords.Fence(ctx, key, token)
}

// TestJobRecordLandingAsTheNextHolderClaimsIsNotRunAgain: an older
// holder's record that lands just as the next holder takes the lock is
// either refused (ErrFenced: the period is the new holder's) or seen by
// the new holder's claim, which then does not run the period again. A
// claim that read the record and then rewrote it with the new token
// overwrote such a record and ran the period a second time.
func TestJobRecordLandingAsTheNextHolderClaimsIsNotRunAgain(t *testing.T) {
	t.Parallel()
	r := newJobRig(t)
	ctx := context.Background()
	j := r.job(t)
	key := j.Name + ":done"
	start := r.now.Load().Truncate(time.Hour)
	// A: took the lock, claimed the period, and lost its lease.
	a, err := r.locks.TryAcquire(ctx, j.Name, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.done.Fence(ctx, key, a.Token()); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var aErr error
	j.Done = &lateRecord{FencedRecords: r.done, record: func() {
		aErr = r.done.Set(ctx, key, a.Token(), []byte(strconv.FormatInt(start.UnixNano(), 10)), 0)
	}}
	var runs atomic.Int64
	ran, err := j.Run(ctx, counting(&runs, nil))
	switch {
	case aErr == nil && (ran || runs.Load() != 0 || err != nil):
		t.Errorf("B ran the period (ran %v, %d runs, err %v) after A's record of it was accepted", ran, runs.Load(), err)
	case aErr != nil && !errors.Is(aErr, ErrFenced):
		t.Fatalf("A's record: %v, want nil or ErrFenced", aErr)
	case aErr != nil && (!ran || err != nil):
		t.Errorf("B: ran %v, err %v after A's record was refused; want the period run and recorded", ran, err)
	}
	val, tok, err := r.done.Get(ctx, key)
	if err != nil || string(val) != strconv.FormatInt(start.UnixNano(), 10) || tok < a.Token() {
		t.Errorf("record %q token %d (%v), want the period recorded", val, tok, err)
	}
}
