package herd

import (
	"context"
	"time"
)

// Lock is the surface every lock backend offers. In this module [Locker]
// (one Redis) is a Lock[*Lease] and [Redlock] (a majority of independent
// Redis masters) is a Lock[*RedlockLease]; backends with drivers of their
// own live in nested modules (github.com/herdkit/herd/lock/postgres is a
// Lock[*postgres.Lease]). The type parameter keeps each backend's concrete
// lease type, so no backend's API changes to satisfy Lock; [AnyLock] turns
// any of them into a Lock[LeaseHandle] for code that holds one backend or
// another in a single variable, so that moving a job from one backend to
// another changes only the constructor.
//
// The behaviour below is what every backend promises, and what the
// conformance suite in package github.com/herdkit/herd/locktest checks;
// the guarantees beyond it (what a failover, a restart or a partition
// does to a lock) differ by backend: see each one's documentation and the
// package documentation ("Which lock").
//
//   - TryAcquire takes the lock on key for ttl, or fails at once. When
//     another owner holds it, the error wraps [ErrLeaseHeld]. An empty key
//     is [ErrInvalidKey] and a ttl outside the backend's range
//     [ErrInvalidTTL].
//   - Acquire waits while another owner holds the lock, woken by the
//     backend's notification of a release ([Locker]: Redis pub/sub;
//     [Redlock]: Redis pub/sub on each master, any master's release a
//     hint to try the quorum again; a PostgreSQL lock: LISTEN/NOTIFY),
//     with a bounded re-check as the fallback for lost notifications and
//     holders that never release. The wait is bounded by ctx (the error
//     then joins [ErrLeaseHeld] and ctx.Err(), and the call returns at
//     once) and by the backend's wait limit ([ErrWaitTimeout] and
//     ErrLeaseHeld).
//   - Close frees the backend's resources. TryAcquire and Acquire called
//     after it return [ErrClosed], and an Acquire waiting when Close is
//     called returns ErrClosed at once. Whether leases handed out before
//     Close keep working is the backend's to say.
type Lock[L LeaseHandle] interface {
	TryAcquire(ctx context.Context, key string, ttl time.Duration) (L, error)
	Acquire(ctx context.Context, key string, ttl time.Duration) (L, error)
	Close() error
}

// LeaseHandle is one holding of a lock, whatever the backend. Every
// implementation's methods are safe for concurrent use, and Release is
// nil-safe.
//
//   - Token is the fencing token: tokens of one key strictly increase from
//     one holding to the next. Pass it to the protected resource, which
//     must reject a token lower than the highest it has seen
//     ([FencedStore], or a conditional write in the database that owns
//     the data).
//   - Key is the user key the lease was acquired for.
//   - Deadline is the local time until which the lease is known valid.
//   - Lost is closed when the lease is known lost: its validity ran out
//     without a renewal, a renewal found it gone, or the backend saw it
//     end (a PostgreSQL lock's connection closing). Release does not
//     close it.
//   - Extend renews the lease for ttl ([ErrLeaseLost] when it is not this
//     owner's any more). A [Lease] gets exactly ttl left; a [RedlockLease]
//     at least ttl, never less than it had, so a failed extend cannot cut
//     it short.
//   - KeepAlive renews the lease in the background, at a point between a
//     third and a half of its length each time, until Release, until the
//     lease is lost, or until maxHold after the acquire. maxHold is not an
//     interval: it is an absolute cap on the whole holding, counted from
//     the acquire, so that a holder stuck in its work cannot keep the lock
//     for ever (zero or less: no cap).
//   - Release gives the lease back, if it is still this owner's: it never
//     frees a lock that passed to another owner, and returns an error
//     wrapping [ErrLeaseLost] in that case. Releasing again after a
//     successful Release returns nil.
type LeaseHandle interface {
	Token() uint64
	Key() string
	Deadline() time.Time
	Lost() <-chan struct{}
	Extend(ctx context.Context, ttl time.Duration) error
	KeepAlive(maxHold time.Duration)
	Release(ctx context.Context) error
}

// AnyLock returns l as a Lock[LeaseHandle]: the same lock, whose
// TryAcquire and Acquire return the backend's lease as a [LeaseHandle]
// (a nil LeaseHandle, not a typed nil, when they fail). Use it where one
// variable, field or parameter holds whichever backend the program was
// configured with:
//
//	var locks herd.Lock[herd.LeaseHandle] = herd.AnyLock(herd.NewLocker(rdb, nil))
func AnyLock[L LeaseHandle](l Lock[L]) Lock[LeaseHandle] {
	if a, ok := any(l).(Lock[LeaseHandle]); ok {
		return a
	}
	return anyLock[L]{l}
}

// anyLock is the Lock[LeaseHandle] that AnyLock returns.
type anyLock[L LeaseHandle] struct{ l Lock[L] }

func (a anyLock[L]) TryAcquire(ctx context.Context, key string, ttl time.Duration) (LeaseHandle, error) {
	return handle(a.l.TryAcquire(ctx, key, ttl))
}

func (a anyLock[L]) Acquire(ctx context.Context, key string, ttl time.Duration) (LeaseHandle, error) {
	return handle(a.l.Acquire(ctx, key, ttl))
}

func (a anyLock[L]) Close() error { return a.l.Close() }

// handle converts a backend's result, so that a failed call's typed nil
// pointer does not become a non-nil LeaseHandle.
func handle[L LeaseHandle](l L, err error) (LeaseHandle, error) {
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Both backends of this module satisfy the interfaces.
var (
	_ LeaseHandle         = (*Lease)(nil)
	_ LeaseHandle         = (*RedlockLease)(nil)
	_ Lock[*Lease]        = (*Locker)(nil)
	_ Lock[*RedlockLease] = (*Redlock)(nil)
)
