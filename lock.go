package herd

import (
	"context"
	"fmt"
	"time"
)

// MaxLockKeyBytes is the longest lock key, in bytes, that every [Lock]
// backend accepts; a longer key, like the empty one, is [ErrInvalidKey].
// It is far below every server's request limit even where a backend
// escapes each byte of the key as three (etcd keys and ZooKeeper paths:
// a lock's etcd request stays under 100 KiB, against etcd's 1.5 MiB, and
// its ZooKeeper path about 24 KiB, against jute.maxbuffer's 1 MiB), and
// equal to the default bound on the middleware's cache keys, so that
// such a key is also a valid lock key.
const MaxLockKeyBytes = 8 << 10

// lockKeyQuote is how much of a key above MaxLockKeyBytes its error
// quotes, in bytes.
const lockKeyQuote = 32

// CheckLockKey returns nil for a valid lock key, and otherwise an error
// wrapping [ErrInvalidKey] that says why: the key is empty, or longer than
// [MaxLockKeyBytes]. For a long key the error gives its length and quotes
// no more than its first 32 bytes (not cut inside a UTF-8 sequence), so
// that it stays short whatever the caller passed. Every [Lock] backend
// checks its keys with it before it sends anything; a Lock of your own
// should too.
func CheckLockKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty lock key", ErrInvalidKey)
	case len(key) > MaxLockKeyBytes:
		return fmt.Errorf("%w: a lock key of %d bytes, limit %d (it starts %q)",
			ErrInvalidKey, len(key), MaxLockKeyBytes, cutText(key, lockKeyQuote))
	}
	return nil
}

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
// page docs/locks.md.
//
//   - TryAcquire takes the lock on key for ttl, or fails at once. When
//     another owner holds it, the error wraps [ErrLeaseHeld]. Any string
//     of 1 to [MaxLockKeyBytes] bytes is a valid key, binary included; an
//     empty or a longer one is [ErrInvalidKey] (the check of
//     [CheckLockKey], before any request), and a ttl outside the
//     backend's range [ErrInvalidTTL].
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
//   - Token is the fencing token: unique to one holding, and tokens of
//     one key strictly increase from one holding to the next. Pass it to
//     the protected resource, which must reject a token lower than the
//     highest it has seen and accept an equal one, the same holding
//     writing again ([FencedStore], the FencedTable of lock/postgres and
//     lock/mysql, or a conditional write in the database that owns the
//     data). The values are large: herd's Redis locks and the database
//     locks floor a per-key counter by the server's clock in microseconds
//     since 1970 (1796190371175265), so that a counter lost in a restart
//     or a failover does not hand out lower tokens again; etcd and
//     ZooKeeper use the store's revision or transaction id. Compare them,
//     never read a time out of them. docs/locks.md ("Fencing tokens")
//     has the table and the reasons.
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
