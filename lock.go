package herd

import (
	"context"
	"time"
)

// Lock is the surface every lock backend offers: [Locker] (one Redis) is a
// Lock[*Lease] and [Redlock] (a majority of independent Redis masters) is a
// Lock[*RedlockLease]. Code written against Lock works with either; which
// one to pick is discussed in the package documentation ("Which lock").
//
// TryAcquire fails at once, with an error wrapping [ErrLeaseHeld], when
// another owner holds key; Acquire waits for it, bounded by ctx and by the
// backend's wait limit. Close frees the backend's resources; what a call
// after it does is the backend's (a Redlock returns [ErrClosed] for every
// call). The guarantees differ by backend too: see each one's
// documentation.
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
//     ([FencedStore]).
//   - Key is the user key the lease was acquired for.
//   - Deadline is the local time until which the lease is known valid.
//   - Lost is closed when the lease is known lost.
//   - Extend renews the lease for ttl ([ErrLeaseLost] when it is not this
//     owner's any more). A [Lease] gets exactly ttl left; a [RedlockLease]
//     at least ttl, never less than it had, so a failed extend cannot cut
//     it short.
//   - KeepAlive renews it in the background until Release, loss, or
//     maxHold after the acquire.
//   - Release gives it back.
type LeaseHandle interface {
	Token() uint64
	Key() string
	Deadline() time.Time
	Lost() <-chan struct{}
	Extend(ctx context.Context, ttl time.Duration) error
	KeepAlive(maxHold time.Duration)
	Release(ctx context.Context) error
}

// Both backends satisfy the interfaces.
var (
	_ LeaseHandle         = (*Lease)(nil)
	_ LeaseHandle         = (*RedlockLease)(nil)
	_ Lock[*Lease]        = (*Locker)(nil)
	_ Lock[*RedlockLease] = (*Redlock)(nil)
)
