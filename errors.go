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
	// lease length or time-to-live that is zero or negative, or shorter than
	// the millisecond Redis counts in.
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
	// error wrapping it and build the value themselves.
	ErrNotShared = errors.New("herd: value not shared")

	// ErrUnavailable wraps the Redis error a Cache with
	// [Options.FailClosed] returns when Redis cannot be reached or its
	// circuit breaker is open. Without FailClosed the Cache fails open and
	// loads locally instead.
	ErrUnavailable = errors.New("herd: redis unavailable")

	// ErrNotReplicated is returned when a write that advances a fence (a
	// lease acquire, Set, Invalidate, a rebuild's commit) or a lease
	// extend ran on the master but fewer replicas than required
	// acknowledged it within the replica timeout (see
	// [LockerOptions.ReplicaAcks]). The write may be lost by a failover or
	// may survive: a Set or Invalidate can be retried; a lease is not
	// handed out.
	ErrNotReplicated = errors.New("herd: write not acknowledged by enough replicas")

	// ErrClosed is returned by calls made on a [Locker] or [Cache] after
	// its Close.
	ErrClosed = errors.New("herd: closed")
)

// PanicError is the error every caller of a flight gets when its loader
// panicked (wrapped in [ErrLoadFailed]; get it with errors.As). The panic
// is recovered: the process does not crash, and the key's lease is
// released at once.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the loader goroutine's stack at the panic
}

// Error returns the panic value and the stack.
func (p *PanicError) Error() string {
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
