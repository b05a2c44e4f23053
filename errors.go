package herd

import "errors"

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

	// ErrNotFound is returned by [FencedStore.Get] when no value is stored
	// under the key.
	ErrNotFound = errors.New("herd: not found")

	// ErrClosed is returned by calls made on a [Locker] after its Close.
	ErrClosed = errors.New("herd: closed")
)
