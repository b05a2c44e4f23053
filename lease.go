package herd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/herdkit/herd/internal/lease"
)

// Lease is one holding of a lease acquired from a [Locker]. Its methods are
// safe for concurrent use. Release it when the protected work is done.
type Lease struct {
	locker *Locker
	key    string
	keys   keyFamily
	value  string // "<owner>:<fence>", the lease key's value in Redis
	token  uint64
	ttl    time.Duration
	life   lease.State // deadline, Lost, release and watchdog; released also when a script released the lease (finish)
}

// Token returns the lease's fencing token. Tokens of one key strictly
// increase from one lease to the next, across processes, counter expiry,
// Redis restarts and failovers (each token is at least the Redis clock in
// microseconds, and the acquire waited for the replicas). Pass it
// to the protected resource, which must reject a token lower than the
// highest it has seen and accept an equal one ([FencedStore] does that
// for a Redis key); [LeaseHandle] and docs/locks.md ("Fencing tokens")
// say why the values are so large.
func (l *Lease) Token() uint64 { return l.token }

// Key returns the user key the lease was acquired for.
func (l *Lease) Key() string { return l.key }

// Deadline returns the local time until which the lease is known valid:
// the acquire or last successful extend was sent before it by the lease
// length, less an allowance for clock drift.
func (l *Lease) Deadline() time.Time { return l.life.Deadline() }

// Lost returns a channel that is closed when the lease is known to be
// lost: its local validity ran out without a successful renewal, an
// extend found it taken or deleted, or [Lease.KeepAlive] reached its cap.
// Release does not close it. Once closed, the lease stays lost: stop the
// protected work and call Release.
func (l *Lease) Lost() <-chan struct{} { return l.life.Lost() }

// Extend sets the lease's remaining time to ttl, if it is still this
// owner's. It returns an error wrapping [ErrLeaseLost] when it is not, or
// once the lease is known lost or released; a Redis error, or
// [ErrNotReplicated] when too few replicas acknowledged the renewal, is
// returned wrapped and leaves the lease's local validity as it was (Lost
// closes when it runs out). ttl is checked as in [Locker.TryAcquire].
// After [Lease.KeepAlive] with a cap, Extend is held to the cap too: a ttl
// that would reach past it is shortened to end there, and with less than
// a millisecond left Extend returns an error wrapping [ErrLeaseLost].
// Extend keeps working after [Locker.Close].
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l == nil {
		return ErrLeaseLost
	}
	if err := checkLeaseTTL(ttl); err != nil {
		return err
	}
	_, err := leaseCall(l.locker, ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, l.extend(ctx, ttl)
	})
	return err
}

// leaseCall is leaveOnDone for a lease's round trip (Extend, Release): it
// runs on WithoutCancel(ctx), so it outlives a caller that left. When
// Close waits for it (tracked), Close also ends its context (see
// endWith). Once Close began the call runs in its caller's goroutine,
// untracked and not ended by Close: leases keep working after Close.
func leaseCall[T any](l *Locker, ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	tracked := false
	track := func() (func(), bool) {
		done, ok := l.track()
		tracked = ok // set before leaveOnDone starts the call's goroutine
		return done, ok
	}
	return leaveOnDone(ctx, track, func() (T, error) {
		cctx := context.WithoutCancel(ctx)
		if tracked {
			var stop func()
			cctx, stop = l.gate.Bound(cctx)
			defer stop()
		}
		return call(cctx)
	}, nil)
}

// extend is Extend without the range check, for the watchdog's capped
// last renewal, which may be shorter than a lease may be acquired for.
func (l *Lease) extend(ctx context.Context, ttl time.Duration) error {
	if l.life.Gone() {
		return fmt.Errorf("%w: %q", ErrLeaseLost, l.key)
	}
	ttl, left := l.life.Clamp(ttl, time.Millisecond)
	if !left {
		return fmt.Errorf("%w: %q: at its KeepAlive cap", ErrLeaseLost, l.key)
	}
	start := time.Now()
	cmd, werr := l.locker.cfg.repl.run(ctx, l.locker.rdb, l.keys.Fence, extendScript, []string{l.keys.Lease, l.keys.Fence},
		l.value, ttl.Milliseconds(), l.locker.fenceTTL(ttl).Milliseconds())
	ok, err := cmd.Int()
	if err == nil && ok == 1 && werr != nil {
		err = werr // renewed on the master only: a failover would not know it
	}
	if err != nil {
		l.locker.cfg.sig.lease(l.key, LeaseExtendFailed)
		return fmt.Errorf("herd: extend lease %q: %w", l.key, err)
	}
	if ok != 1 {
		l.locker.cfg.sig.lease(l.key, LeaseExtendFailed)
		l.markLost()
		return fmt.Errorf("%w: %q", ErrLeaseLost, l.key)
	}
	if !l.life.Renewed(start.Add(ttl - lease.Drift(ttl))) {
		return fmt.Errorf("%w: %q: validity ran out or the lease was released while extending", ErrLeaseLost, l.key)
	}
	l.locker.cfg.sig.lease(l.key, LeaseExtended)
	return nil
}

// KeepAlive starts a watchdog that renews the lease, each time for the
// length it was acquired with, at a random point between a third and a
// half of that length, until Release, until the lease is lost, or until
// maxHold after the acquire. maxHold is not an interval but an absolute
// cap on the whole holding, counted from the acquire: the last renewal
// before it is shortened so that the lease ends at the cap, and a stuck
// holder cannot keep it forever. A cap that comes before the lease as
// acquired would end is kept too: Deadline becomes the cap (Lost closes
// at it) and the watchdog shortens the lease in Redis to it at once; when
// the cap has already passed (KeepAlive called late) or that renewal
// failed, the watchdog deletes the lease in Redis at the cap, so that no
// other owner is kept out past it. A maxHold of zero or less means no cap.
//
// A Redis error during a renewal is retried until the lease's validity
// runs out; then [Lease.Lost] is closed. The watchdog goroutine ends with
// the lease and Release waits for it. Calling KeepAlive again, or after
// the lease ended, does nothing.
//
// After KeepAlive with a cap, an Extend is held to the cap as well: it
// never moves the lease, or its Deadline, past it.
func (l *Lease) KeepAlive(maxHold time.Duration) {
	if l == nil {
		return
	}
	l.life.KeepAlive(context.Background(), maxHold, l.renew)
}

// renew is the watchdog loop. When the holding ended at the cap without
// a renewal that shortened the lease in Redis to it (KeepAlive came after
// the cap, or the capped renewal failed), it deletes the key, so that it
// does not keep other owners out to the lease's own end.
func (l *Lease) renew(ctx context.Context, capAt time.Time) {
	capped := l.life.Renew(ctx, capAt, lease.Renewal{
		Extend: l.extend,
		Final: func(err error) bool {
			return errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrInvalidTTL)
		},
		Prompt: true,
	})
	if !capAt.IsZero() && !capped && ctx.Err() == nil && time.Until(capAt) < time.Millisecond {
		l.endAtCap(ctx)
	}
}

// endAtCap deletes the lease in Redis, if it is still this owner's, once
// its KeepAlive cap has ended the holding.
func (l *Lease) endAtCap(ctx context.Context) {
	if ok, err := l.releaseWith(ctx, msgReleased); err == nil && ok > 0 {
		l.life.Freed()
	}
}

// Release stops the watchdog, if any, and deletes the lease if it is still
// this owner's, waking waiters in every process. It returns an error
// wrapping [ErrLeaseLost] when the lease had already passed to someone
// else or expired (the other holder's lease is left alone), and a wrapped
// Redis error when Redis could not be reached. Release is nil-safe, and
// releasing twice is not an error. It keeps working after [Locker.Close].
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return nil
	}
	if freed, _, _ := l.life.Release(); freed {
		return nil // released before: the key may belong to someone else now
	}
	l.life.StopWatchdog()
	ok, err := leaseCall(l.locker, ctx, func(ctx context.Context) (int, error) {
		return l.releaseWith(ctx, msgReleased)
	})
	if err != nil {
		return fmt.Errorf("herd: release lease %q: %w", l.key, err)
	}
	if ok == 0 {
		return fmt.Errorf("%w: %q: it expired or passed to another owner before release", ErrLeaseLost, l.key)
	}
	l.life.Freed()
	return nil
}

// releaseWith runs the RELEASE script, publishing msg to the key's waiters
// when the lease was still ours. It reports 2 when released now with the
// key's fence still this lease's, 1 when released otherwise (now or by an
// earlier try of the same call) and 0 when the lease was not ours.
func (l *Lease) releaseWith(ctx context.Context, msg string) (int, error) {
	return l.releaseFailed(ctx, msg, 0, 0, 0)
}

// releaseFailed is releaseWith for a load that failed: when the lease was
// ours it also, with base > 0, starts or lengthens the key's refresh
// backoff (base doubled per consecutive failure, at most cap), and, with
// marker > 0, leaves msg as the key's failure marker for that long.
func (l *Lease) releaseFailed(ctx context.Context, msg string, base, cap, marker time.Duration) (int, error) {
	n := l.locker.notify
	names := []string{l.keys.Lease, l.keys.Fence}
	args := []any{l.value, n.PublishCmd(ctx), l.keys.Channel, msg}
	if base > 0 || marker > 0 {
		names = append(names, l.keys.Backoff, l.keys.Failed)
		args = append(args, base.Milliseconds(), cap.Milliseconds(), marker.Milliseconds())
	}
	cmd, _ := l.locker.cfg.repl.run(ctx, l.locker.rdb, l.keys.Fence, releaseScript, names, args...)
	return cmd.Int()
}

// markLost closes Lost; the first loss of a lease not released is
// signalled and logged.
func (l *Lease) markLost() {
	if l.life.Lose() {
		sig := l.locker.cfg.sig
		sig.lease(l.key, LeaseLost)
		sig.logRare(slog.LevelWarn, "herd: lease lost: its validity ran out or another owner has it; stop the protected work", "key", l.key, "token", l.token)
	}
}

// finish ends the leader's local bookkeeping of a lease that a script is
// about to release: the watchdog stops and the expiry timer is disarmed.
func (l *Lease) finish() { l.life.Finish() }
