package herd

import (
	"errors"
	"fmt"
)

// Sentinel errors. Compare with [errors.Is]: herd wraps them with context
// (the key, the Redis error) and sometimes joins them with a context error.
var (
	// ErrInvalidKey is returned, at once and without touching Redis, for an
	// empty key. Any other string, binary included, is a valid key.
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
	ErrLeaseHeld = errors.New("herd: lease held by another owner")

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
	// until it expires. [FencedStore.Get] returns it for an absent record.
	ErrNotFound = errors.New("herd: not found")

	// ErrNilLoader is returned, at once, by [Cache.Get] and [Fetch] when
	// the loader is nil.
	ErrNilLoader = errors.New("herd: nil loader")

	// ErrLoadFailed wraps every loader failure a Cache reports: the error
	// the loader returned, a [*PanicError], or, for callers in other
	// processes that waited on the failed rebuild, the leader's error text.
	// Use [errors.Is] for the class and errors.As or errors.Is for the
	// loader's own error (in the leader's process).
	ErrLoadFailed = errors.New("herd: load failed")

	// ErrValueTooLarge is returned by [Cache.Set], and by Get when the
	// loader returns a value, above [Options.MaxValueBytes]. Such a value
	// is never stored.
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
	// (by [Cache.SetTagged], [Cache.InvalidateTag], [SetTags] and
	// [Fill.SetTags]). A value whose loader or builder was told it is not
	// stored: its callers still get it.
	ErrInvalidTag = errors.New("herd: invalid tag")

	// ErrTagFull means a tag's index holds [Options.MaxTagEntries] keys
	// already, so one more value with that tag cannot be recorded. It is
	// returned by [Cache.SetTagged], which then writes nothing; a rebuild
	// in the same case returns its value to its callers without storing
	// it (counted in [Stats].CommitErrors). Entries leave an index when
	// they expire.
	ErrTagFull = errors.New("herd: tag index full")

	// ErrClosed is returned by calls made on a [Locker] or [Cache] after
	// its Close: TryAcquire, Acquire (also one waiting when Close is
	// called), Get, [Fetch], Begin, Peek, Set, SetTagged, Invalidate,
	// InvalidateSoft and InvalidateTag. A [Lease] handed
	// out before Close can still be extended and released. Every call on a
	// [Redlock] or its leases after the Redlock's Close returns it too.
	ErrClosed = errors.New("herd: closed")

	// ErrInvalidJob is returned by [Job.Run] and [Once], at once and
	// without touching the lock or the store, for a nil func, a nil Lock or
	// Done, a period of zero or less, or an empty name (then joined with
	// [ErrInvalidKey]). The error says which.
	ErrInvalidJob = errors.New("herd: invalid job")
)

// PanicError is the error every caller of a flight gets when its loader
// panicked (wrapped in [ErrLoadFailed]; get it with errors.As). The panic
// is recovered: the process does not crash, and the key's lease is
// released at once.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the loader goroutine's stack at the panic
	// Remote is set when the loader ran in another process: Value is then
	// the text that process reported (its error text, cut to 1 KiB) and
	// Stack is empty.
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
