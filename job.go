package herd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// JobFunc is the work of a [Job]. Its ctx ends when the caller's ctx ends
// or when the lease is lost (then context.Cause(ctx) is [ErrLeaseLost]);
// lease is the holding the run is under, whose Token a job passes to every
// fenced write it makes.
type JobFunc func(ctx context.Context, lease LeaseHandle) error

// FencedRecords is where a [Job] records the periods it completed: a store
// that refuses a write whose token is below the highest it has seen for the
// key (with [ErrFenced]) and reports a missing key with [ErrNotFound].
// Fence raises the key's fence to token and returns its value in one
// atomic step (creating a missing key with an empty value), so that no
// write of a lower token lands after the value it returns.
// [*FencedStore] is one.
type FencedRecords interface {
	Get(ctx context.Context, key string) ([]byte, uint64, error)
	Set(ctx context.Context, key string, token uint64, val []byte, ttl time.Duration) error
	Fence(ctx context.Context, key string, token uint64) ([]byte, error)
}

// Job runs a function at most once per period across every instance that
// runs the same Job: call [Job.Run] on every tick of every instance's
// scheduler, and one of them does the work each period. TryAcquire with a
// deferred Release alone only stops runs from overlapping: three instances
// whose ticks are a little apart would each run the job in turn.
//
// Each period has a start, Now() truncated to Period (with the default
// clock, periods of a day start at midnight UTC, of an hour on the hour).
// Done holds one record per Job, under Name + ":done", the start of the
// last period completed. Run:
//
//  1. reads the record and returns (false, nil) when the current period,
//     or a later one, is recorded (one GET, no lock);
//  2. takes the lock Name for Lease with TryAcquire, and returns (false,
//     nil) when another instance holds it;
//  3. claims the period under the lock: it raises the record's fence to
//     its lease's token and reads the record in one step ([FencedRecords]
//     Fence), so that any older holder's writes to it are refused from
//     then on, and returns (false, nil) when the period is recorded;
//  4. runs fn with KeepAlive(MaxHold) on the lease and a ctx that ends
//     when the lease is lost;
//  5. when fn returns nil, records the period with the lease's token, a
//     fenced write, and releases the lock.
//
// What happens when things go wrong:
//
//   - fn fails (an error, or ctx ended): nothing is recorded and Run
//     returns (true, the error); the next tick, on any instance, runs the
//     job again. A panic in fn is not recovered; the lock is released and
//     the period stays unrecorded.
//   - The lease is lost after the claim but before fn starts (the holder
//     paused past it): fn is not called, Run returns (false, an error
//     wrapping [ErrLeaseLost]), and the period is done by whichever
//     instance took the lock meanwhile, or by the next tick.
//   - The lease is lost mid-run (a Redis failover, MaxHold passed, the
//     holder paused past its lease): fn's ctx ends with cause
//     [ErrLeaseLost] and the error Run returns wraps it. A holder that
//     ignores its ctx and finishes anyway still attempts the record: when
//     no other instance took the lock meanwhile it is accepted (the work
//     was done), and when one did, that one's claim has raised the token,
//     so the record is refused with [ErrFenced] (Run returns (true, an
//     error wrapping ErrFenced)) and the period is recorded once, by the
//     newer holder. The work itself may then have run twice: only fencing
//     the job's own writes with lease.Token() makes that harmless.
//   - Clock skew between instances: each computes the period from its own
//     clock, but a period at or before the one recorded counts as done, so
//     an instance whose clock is behind never runs a period again; one
//     whose clock is ahead starts the next period early, by its skew, and
//     the others then find it done. Keep hosts in NTP sync so that "early"
//     stays small.
//
// The tokens written to the record must come from one lock name on one
// backend: moving a Job to another backend, whose tokens may be lower,
// needs a new Name (or the old record deleted).
//
// The fields are read by Run and must not change while a Run is in
// progress; a Job is safe for concurrent use otherwise.
type Job struct {
	// Name names the job: the lock's key, and the record's key with
	// ":done" appended. It must not be empty, nor longer than
	// [MaxLockKeyBytes].
	Name string

	// Period is how often the job runs at most; it must be positive.
	Period time.Duration

	// Lock is the lock the instances share, any backend ([AnyLock]).
	Lock Lock[LeaseHandle]

	// Done is where completed periods are recorded ([NewFencedStore]).
	Done FencedRecords

	// Lease is the lease length the lock is taken for; KeepAlive renews
	// it while fn runs. Default: 30s.
	Lease time.Duration

	// MaxHold caps a run: fn's ctx ends MaxHold after the acquire (with
	// cause [ErrLeaseLost]) and KeepAlive stops renewing there, so the
	// lease runs out by itself (by the end of the lease it had then, when
	// MaxHold is shorter than a third of Lease) unless fn returns and
	// Run releases it. Default: Period.
	MaxHold time.Duration

	// Now is the clock that periods are computed from. Default: time.Now.
	Now func() time.Time
}

// defaultJobLease is Job.Lease's default.
const defaultJobLease = 30 * time.Second

// RunJob is [Job.Run] for a Job of name and period on lock, recording to
// done, with the defaults of every other field: it runs fn unless the
// current period is recorded done or another instance holds the lock.
//
//	var locks herd.Lock[herd.LeaseHandle] = herd.AnyLock(herd.NewLocker(rdb, nil))
//	ran, err := herd.RunJob(ctx, locks, herd.NewFencedStore(rdb, ""), "nightly-report", 24*time.Hour, report)
func RunJob(ctx context.Context, lock Lock[LeaseHandle], done FencedRecords, name string, period time.Duration, fn JobFunc) (ran bool, err error) {
	j := Job{Name: name, Period: period, Lock: lock, Done: done}
	return j.Run(ctx, fn)
}

// Run runs fn once for the current period unless the period is recorded
// done or another instance holds the lock (see [Job]). ran reports whether
// fn was called. The error is nil when fn ran and its period was recorded,
// or when fn did not need to run; otherwise it is:
//
//   - [ErrInvalidJob] for a nil fn, Lock or Done, or a Period of zero or
//     less; [ErrInvalidJob] and [ErrInvalidKey] for an empty Name or one
//     longer than [MaxLockKeyBytes] (the lock's key); then nothing is
//     touched;
//   - the lock's or the store's error (wrapped), such as ctx's error when
//     ctx ended before fn was called (also during the acquire, whose error
//     then wraps [ErrLeaseHeld] as well: ran is false and nothing was
//     recorded);
//   - an error wrapping [ErrNotReplicated] when the store could not
//     confirm the claim (ran false: fn is not called) or the record (ran
//     true: fn ran, but a failover may lose the record and the period run
//     again) on the replicas; [FencedStore] waits for them;
//   - fn's error (wrapped, and joined with [ErrLeaseLost] when the lease
//     was lost), with ran true: nothing was recorded;
//   - an error wrapping [ErrFenced], when a newer holder claimed the
//     period: before fn (ran false) or while fn ran (ran true);
//   - an error wrapping [ErrLeaseLost] with ran false, when the lease was
//     lost between the claim and fn's start (the holder was paused past
//     it): fn is not called, as another instance may have run the period.
func (j *Job) Run(ctx context.Context, fn JobFunc) (ran bool, err error) {
	if err := j.check(fn); err != nil {
		return false, err
	}
	now := time.Now
	if j.Now != nil {
		now = j.Now
	}
	start := now().Truncate(j.Period)
	key := j.Name + ":done"
	if _, done, err := j.record(ctx, key, start); err != nil || done {
		return false, err
	}
	ttl := j.Lease
	if ttl <= 0 {
		ttl = defaultJobLease
	}
	maxHold := j.MaxHold
	if maxHold <= 0 {
		maxHold = j.Period
	}
	// KeepAlive's cap counts from the acquire; fn's ctx ends at it here
	// too, since a cap before KeepAlive's first renewal (a third of the
	// lease) leaves the lease to run to its own end.
	capAt := time.Now().Add(maxHold)
	lease, err := j.Lock.TryAcquire(ctx, j.Name, ttl)
	if err != nil && ctx.Err() != nil {
		// ctx ended during the acquire, which then wraps ErrLeaseHeld
		// too: nobody is known to hold the lock, and the period is not
		// recorded. That is ctx's error, not "another instance has it".
		if !errors.Is(err, ctx.Err()) {
			err = errors.Join(err, ctx.Err())
		}
		return false, fmt.Errorf("herd: job %q: %w", j.Name, err)
	}
	if errors.Is(err, ErrLeaseHeld) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("herd: job %q: %w", j.Name, err)
	}
	// A release error means the lease was lost or Redis failed: the run's
	// outcome is already in err, and the lease ends with its ttl anyway.
	defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()

	// The claim reads the record with the fence it raises: a read, then a
	// rewrite, would overwrite an older holder's record landing between
	// them (a holder paused past its lease that finished), and run the
	// period again.
	val, err := j.Done.Fence(ctx, key, lease.Token())
	if err != nil {
		// Also when the claim is not on the replicas (ErrNotReplicated):
		// fn does not run under a claim a failover may undo.
		return false, fmt.Errorf("herd: job %q: claim the period: %w", j.Name, err)
	}
	if done, err := j.periodDone(val, start); err != nil || done {
		return false, err
	}

	lease.KeepAlive(maxHold)
	if lostBefore(lease) || !time.Now().Before(capAt) {
		// Paused past the lease since the claim: another instance may
		// have run and recorded the period meanwhile. Not running is
		// safe either way: the period is unrecorded or done.
		return false, fmt.Errorf("herd: job %q: %w before the job started", j.Name, ErrLeaseLost)
	}
	if err := runUnderLease(ctx, lease, capAt, fn); err != nil {
		return true, fmt.Errorf("herd: job %q: %w", j.Name, err)
	}
	// The work is done: record it even if ctx ended meanwhile, bounded by
	// one lease length.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
	defer cancel()
	if err := j.Done.Set(rctx, key, lease.Token(), []byte(strconv.FormatInt(start.UnixNano(), 10)), 0); err != nil {
		// A record the replicas did not acknowledge is ErrNotReplicated
		// (FencedStore): a failover may lose it, and the period run again.
		return true, fmt.Errorf("herd: job %q: record the period: %w", j.Name, err)
	}
	return true, nil
}

// Completed reports what the record says, with one read and no lock:
// done is true when the current period (by Now), or a later one, is
// recorded complete, by any instance; last is the start of the last
// period recorded complete (the zero Time when none is). Run's (false,
// nil) means either that the period is done or that another instance
// holds the lock and may be running it now; Completed tells the two
// apart. It returns [ErrInvalidJob] for an empty or too long Name, a
// Period of zero or less or a nil Done, and the store's error (wrapped)
// or an error for a record that is not one of a Job's.
func (j *Job) Completed(ctx context.Context) (done bool, last time.Time, err error) {
	if err := j.checkRecord(); err != nil {
		return false, time.Time{}, err
	}
	now := time.Now
	if j.Now != nil {
		now = j.Now
	}
	val, done, err := j.record(ctx, j.Name+":done", now().Truncate(j.Period))
	if err != nil || len(val) == 0 {
		return false, time.Time{}, err
	}
	ns, _ := strconv.ParseInt(string(val), 10, 64) // record parsed it
	return done, time.Unix(0, ns).UTC(), nil
}

// check validates the job and fn.
func (j *Job) check(fn JobFunc) error {
	if err := j.checkRecord(); err != nil {
		return err
	}
	switch {
	case fn == nil:
		return fmt.Errorf("%w %q: nil func", ErrInvalidJob, j.Name)
	case j.Lock == nil:
		return fmt.Errorf("%w %q: nil Lock", ErrInvalidJob, j.Name)
	}
	return nil
}

// checkRecord validates what reading the job's record needs: Name,
// Period and Done.
func (j *Job) checkRecord() error {
	switch {
	case j.Name == "":
		return fmt.Errorf("%w: %w: empty name", ErrInvalidJob, ErrInvalidKey)
	case len(j.Name) > MaxLockKeyBytes:
		// The lock's key: checked here, so that no error quotes it whole.
		return fmt.Errorf("%w: name: %w", ErrInvalidJob, CheckLockKey(j.Name))
	case j.Period <= 0:
		return fmt.Errorf("%w %q: period %v (must be positive)", ErrInvalidJob, j.Name, j.Period)
	case j.Done == nil:
		return fmt.Errorf("%w %q: nil Done", ErrInvalidJob, j.Name)
	}
	return nil
}

// record reads the job's record: the bytes stored (nil for none) and
// whether they mark start, or a later period, done.
func (j *Job) record(ctx context.Context, key string, start time.Time) (val []byte, done bool, err error) {
	val, _, err = j.Done.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("herd: job %q: read the record: %w", j.Name, err)
	}
	done, err = j.periodDone(val, start)
	return val, done, err
}

// periodDone reports whether val, the record's value, says the period
// that begins at start (or a later one) is done.
func (j *Job) periodDone(val []byte, start time.Time) (bool, error) {
	if len(val) == 0 { // claimed, never completed
		return false, nil
	}
	last, err := strconv.ParseInt(string(val), 10, 64)
	if err != nil {
		return false, fmt.Errorf("herd: job %q: record %q is not a period start: %w", j.Name, val, err)
	}
	return last >= start.UnixNano(), nil
}

// lostBefore reports whether lease is known lost or past its deadline.
func lostBefore(lease LeaseHandle) bool {
	select {
	case <-lease.Lost():
		return true
	default:
		return !time.Now().Before(lease.Deadline())
	}
}

// runUnderLease calls fn with a ctx that ends with ctx, when lease is
// lost or at capAt (MaxHold), and returns fn's error, joined with
// ErrLeaseLost when the lease was lost or the cap passed. No goroutine
// outlives the call.
func runUnderLease(ctx context.Context, lease LeaseHandle, capAt time.Time, fn JobFunc) error {
	jctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	capped := time.AfterFunc(time.Until(capAt), func() { cancel(ErrLeaseLost) })
	defer capped.Stop()
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-lease.Lost():
			cancel(ErrLeaseLost)
		case <-stop:
		}
	}()
	defer func() { // also when fn panics
		close(stop)
		<-watched
	}()
	err := fn(jctx, lease)
	if err != nil && errors.Is(context.Cause(jctx), ErrLeaseLost) && !errors.Is(err, ErrLeaseLost) {
		err = errors.Join(err, ErrLeaseLost)
	}
	return err
}
