package herd

import (
	"errors"
	"fmt"

	"github.com/herdkit/herd/internal/sentinel"
)

// Sentinel errors. Compare with [errors.Is]: herd wraps them with context
// (the key, the Redis error) and sometimes joins them with a context error.
var (
	// ErrInvalidKey is returned, at once and without touching Redis, for an
	// empty key. Any other string, binary included, is a valid key of the
	// cache; a lock's key must also be at most [MaxLockKeyBytes] long, in
	// every lock backend ([CheckLockKey]).
	ErrInvalidKey = errors.New("herd: invalid key")

	// ErrInvalidTTL is returned, at once and without touching Redis, for a
	// time-to-live or lease length herd cannot store: a value's ttl must be
	// between 1ms (Redis counts in milliseconds) and 50 years (so that
	// ttl + [Options.StaleFor] and the fence's TTL cannot overflow), a
	// lease's between 10ms (herd subtracts 1% + 2ms of every lease for
	// clock drift) and 50 years. The error names the range.
	ErrInvalidTTL = errors.New("herd: invalid ttl")

	// ErrLeaseHeld is returned by [Locker.TryAcquire] when another owner
	// holds the lease, and (joined with [ErrWaitTimeout] or the context's
	// error) by [Locker.Acquire] when its wait ends before the lease is free.
	ErrLeaseHeld = sentinel.ErrLeaseHeld // "herd: lease held by another owner"

	// ErrLeaseLost is returned by [Lease.Extend] and [Lease.Release] when the
	// lease is no longer this owner's: it expired, was taken over, or was
	// deleted from outside. Stop the protected work and do not write its
	// result without a fencing check.
	ErrLeaseLost = errors.New("herd: lease lost")

	// ErrFenced is returned by [FencedStore.Set] when a writer with a higher
	// fencing token has already written: the caller's lease was superseded
	// and its write was rejected.
	ErrFenced = errors.New("herd: fenced: a newer lease holder has written")

	// ErrWaitTimeout is returned when a bounded wait (for example
	// [Locker.Acquire] past [LockerOptions.MaxWait]) runs out before the
	// awaited event happened.
	ErrWaitTimeout = errors.New("herd: wait timed out")

	// ErrNotFound means "no such value". A loader returns it (possibly
	// wrapped) to say the source has no value for the key: the Cache then
	// stores a negative entry for [Options.NegativeTTL], and Get, Fetch and
	// every waiter return ErrNotFound without calling the source again
	// until it expires; one marked [NoShare] is this process's only.
	// [FencedStore.Get] returns it for an absent record.
	ErrNotFound = errors.New("herd: not found")

	// ErrNilLoader is returned, at once, by [Cache.Get] and [Fetch] when
	// the loader is nil.
	ErrNilLoader = errors.New("herd: nil loader")

	// ErrLoadFailed is the class of every loader failure a Cache reports:
	// each such error is a [*LoadError], in every process, and
	// errors.Is(err, ErrLoadFailed) holds for it. Use errors.As with a
	// *LoadError for the key, the cause's text and whether the loader ran
	// in another process, and errors.Is or errors.As for the loader's own
	// error in the process that ran it.
	ErrLoadFailed = errors.New("herd: load failed")

	// ErrValueTooLarge is returned by [Cache.Set], and by Get when the
	// loader returns a value, above [Options.MaxValueBytes]. Such a value
	// is never stored. A loader's is a failed load: every caller of that
	// rebuild, in every process, gets a [*LoadError] that unwraps to
	// ErrValueTooLarge.
	ErrValueTooLarge = errors.New("herd: value too large")

	// ErrNotShared is what [Fill.Abort] is given when the value the caller
	// built must not be shared or stored (an HTTP response for one user,
	// say). The callers waiting on that rebuild, in every process, get an
	// error wrapping it and build the value themselves. [Cache.Begin] also
	// returns it, wrapping [ErrPass], while the key carries a pass mark.
	ErrNotShared = errors.New("herd: value not shared")

	// ErrPass is wrapped, with [ErrNotShared], in the error [Cache.Begin]
	// returns while the key carries a pass mark left by [Fill.Pass]: the
	// caller builds its own value at once, without a lease and without
	// waiting for anyone, until the mark expires.
	ErrPass = errors.New("herd: key marked pass")

	// ErrUnavailable wraps the Redis error a Cache with
	// [Options.FailClosed] returns when Redis cannot be reached or its
	// circuit breaker is open. Without FailClosed the Cache fails open and
	// loads locally instead. [Cache.Peek], which has no loader, returns it
	// in that case whatever FailClosed says.
	ErrUnavailable = errors.New("herd: redis unavailable")

	// ErrNoQuorum is returned by [Redlock] calls when fewer than a quorum
	// (N/2+1) of its masters answered in time, joined with the masters'
	// errors: TryAcquire and Acquire (which then holds nothing: what it
	// took is released), [RedlockLease.Extend] (the lease is left as it
	// was; Lost closes when its validity runs out) and
	// [RedlockLease.Release] (the masters that did not answer keep the
	// lease until it expires). It also wraps an acquire that a quorum
	// granted only after the lease's validity was spent.
	ErrNoQuorum = errors.New("herd: no quorum of Redis masters")

	// ErrNotReplicated is returned when a write that advances a fence (a
	// lease acquire, Set, Invalidate, InvalidateSoft, a rebuild's commit) or a lease
	// extend ran on the master but fewer replicas than required
	// acknowledged it within the replica timeout (see
	// [LockerOptions.ReplicaAcks]). The write may be lost by a failover or
	// may survive: a Set or Invalidate can be retried; a lease is not
	// handed out.
	ErrNotReplicated = errors.New("herd: write not acknowledged by enough replicas")

	// ErrInvalidTag is returned, at once and without touching Redis, for
	// a tag herd cannot record: an empty one, one longer than
	// [MaxTagBytes], or more than [MaxTags] distinct tags for one value
	// (by [Cache.Set] and [SetValue] with tags, [Cache.InvalidateTag],
	// [SetTags] and [Fill.SetTags]). A value whose loader or builder was
	// told it is not stored: its callers still get it.
	ErrInvalidTag = errors.New("herd: invalid tag")

	// ErrTagFull means a tag's index holds [Options.MaxTagEntries] keys
	// already, so one more value with that tag cannot be recorded. It is
	// returned by [Cache.Set] with tags, which then writes nothing; a
	// rebuild in the same case returns its value to its callers without
	// storing it (counted in [Stats].CommitErrors). Entries leave an index
	// when they expire.
	ErrTagFull = errors.New("herd: tag index full")

	// ErrClosed is returned by calls made on a [Locker] or [Cache] after
	// its Close: TryAcquire, Acquire (also one waiting when Close is
	// called), Get, [Fetch], Begin, Peek, Set, Invalidate,
	// InvalidateSoft and InvalidateTag. A [Lease] handed
	// out before Close can still be extended and released. Every call on a
	// [Redlock] or its leases after the Redlock's Close returns it too.
	ErrClosed = sentinel.ErrClosed // "herd: closed"

	// ErrInvalidJob is returned by [Job.Run] and [RunJob], at once and
	// without touching the lock or the store, for a nil func, a nil Lock or
	// Done, a period of zero or less, or an empty name (then joined with
	// [ErrInvalidKey]). The error says which.
	ErrInvalidJob = errors.New("herd: invalid job")
)

// LoadError is the error every caller of a rebuild gets when its loader
// failed (returned an error, panicked, returned a value above
// [Options.MaxValueBytes], or ran past [Options.LoadTimeout]), in the
// leader's process and in every other: Get, [Fetch], GetMany's per-key
// errors in a [*ManyError], [Cache.Begin] (when a [Fill] was aborted),
// loads without a lease (Redis unreachable), and followers that learnt
// of the failure from the failure marker because they missed the wake-up
// message. Find it with errors.As; errors.Is(err, [ErrLoadFailed]) holds
// for it.
//
// In the process that ran the loader, Err is the loader's error and
// LoadError unwraps to it, so errors.Is(err, errDB) holds there. In the
// other processes the loader's error is not there to compare with:
// Remote is set, Msg is its text as the leader reported it (cut to
// 1 KiB, at a character boundary), and Err is nil, except for a panic,
// which is a [*PanicError] with Remote set everywhere, and a value too
// large, which is [ErrValueTooLarge] everywhere. The same text reaches a
// waiting caller of another flight of the same process (a Get waiting on
// a Begin's Fill), through Redis, with Remote set.
//
// A loader that returns [NoShare](err) keeps err in its own process: the
// callers there get it; the callers elsewhere do not (see NoShare).
type LoadError struct {
	Key    string // the key whose load failed
	Msg    string // the cause's text, without the key
	Remote bool   // the loader ran in another process (or another flight)
	Err    error  // the loader's error; nil when Remote, but for a panic or a value too large
}

// Error says the key and the cause once:
//
//	herd: load failed: "user:404": db: connection reset
//	herd: load failed in another process: "user:404": db: connection reset
func (e *LoadError) Error() string {
	where := ""
	if e.Remote {
		where = " in another process"
	}
	return fmt.Sprintf("herd: load failed%s: %q: %s", where, e.Key, e.Msg)
}

// Is reports whether target is [ErrLoadFailed].
func (e *LoadError) Is(target error) bool { return target == ErrLoadFailed }

// Unwrap returns the loader's error (nil in another process, but for a
// panic's [*PanicError] and [ErrValueTooLarge]).
func (e *LoadError) Unwrap() error { return e.Err }

// notSharedText is the cause a follower reports when the failed loader's
// error was marked with [NoShare] and the follower's retry failed too.
const notSharedText = "the rebuilding process did not share its error (herd.NoShare)"

// NoShare marks err, returned by a [LoadFunc] or a [ManyLoadFunc] (or
// given to [Fill.Abort]), as an error for this process only: one that
// says nothing about the source as the other processes see it (a local
// resource ran out, this instance's credentials were refused, this
// instance's replica lags). A ManyLoadFunc may mark the error of the
// whole call, one key's error in a [*ManyError], or the *ManyError
// itself, which marks every key's error in it. The callers of that
// rebuild in this process get it as usual, in a [*LoadError] that
// unwraps to err; NoShare([ErrNotFound]) is such an error too (errors.Is
// ErrNotFound holds there), and stores no negative entry.
// The callers waiting on the rebuild in other processes do not get it:
// they retry once with a new leader (one of them, cluster-wide, takes the
// lease and loads; the others wait for it), as [Options.RetryFailedLoad]
// does for any failure, whatever that option says. If the retry fails
// too they get its error, or, if that one is not shared either, a
// LoadError with Remote set that says so. A wave of callers thus calls a
// source that keeps failing at most twice. Begin's followers do not
// retry (see [Cache.Begin]); they get that LoadError at once. A
// background refresh that fails with a NoShare error backs refreshes off
// as any failed refresh does, for every process ([Options.RefreshBackoff]):
// the stale value stays servable meanwhile, and the refresh is not retried
// elsewhere at once (no caller waits on it).
//
// NoShare differs from [ErrNotShared], which is about a value: waiters
// told ErrNotShared build their own value, each of them, unbounded.
// NoShare(nil) is nil.
func NoShare(err error) error {
	if err == nil {
		return nil
	}
	return &noShareError{err}
}

// noShareError is the mark NoShare puts on an error; it is transparent.
type noShareError struct{ err error }

func (e *noShareError) Error() string { return e.err.Error() }
func (e *noShareError) Unwrap() error { return e.err }

// isNoShare reports whether err carries NoShare's mark.
func isNoShare(err error) bool {
	var ns *noShareError
	return errors.As(err, &ns)
}

// newLoadError is the error the callers of a rebuild of key get in the
// process whose loader failed with cause.
func newLoadError(key string, cause error) *LoadError {
	return &LoadError{Key: key, Msg: cause.Error(), Err: cause}
}

// PanicError is the error every caller of a flight gets when its loader
// panicked (inside a [*LoadError]; get it with errors.As). The panic
// is recovered: the process does not crash, and the key's lease is
// released at once.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the loader goroutine's stack at the panic
	// Remote is set when the loader ran in another process: Value is then
	// the text of the panic value that process reported (cut to 1 KiB)
	// and Stack is empty.
	Remote bool
}

// Error returns the panic value and the stack.
func (p *PanicError) Error() string {
	if p.Remote {
		return fmt.Sprintf("herd: loader panicked in another process: %v", p.Value)
	}
	return fmt.Sprintf("herd: loader panicked: %v\n\n%s", p.Value, p.Stack)
}

// Unwrap returns the panic value when it is an error, so errors.Is sees
// through a panic(err).
func (p *PanicError) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}

// errGoexit is reported when a loader calls runtime.Goexit.
var errGoexit = errors.New("herd: loader called runtime.Goexit")
