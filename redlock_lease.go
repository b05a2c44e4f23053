package herd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/herdkit/herd/internal/lease"
)

// RedlockLease is one holding of a [Redlock]. Its methods are safe for
// concurrent use. Release it when the protected work is done.
type RedlockLease struct {
	r     *Redlock
	key   string
	keys  keyFamily
	owner string // the lease key's value on every master
	token uint64
	ttl   time.Duration
	life  lease.State // deadline (on the Redlock's clock), Lost, release and watchdog
}

// Token returns the lease's quorum fencing token. Tokens of one key
// strictly increase from one holder to the next, across every master,
// although each master keeps its own counter: a token is one more than
// the highest counter a quorum reported, and a quorum was raised to it
// before the lease was granted (docs/design.md has the proof). Pass it to
// the protected resource, which must reject a token lower than the
// highest it has seen ([FencedStore] does that for a Redis key).
func (l *RedlockLease) Token() uint64 { return l.token }

// Key returns the user key the lease was acquired for.
func (l *RedlockLease) Key() string { return l.key }

// Deadline returns the local time until which the lease is known valid:
// the acquire or last successful extend started before it by the lease
// length, less an allowance for clock drift.
func (l *RedlockLease) Deadline() time.Time { return l.life.Deadline() }

// Lost returns a channel that is closed when the lease is known to be
// lost: its validity ran out without a successful renewal, an extend
// found it gone on too many masters for a quorum, or [RedlockLease.KeepAlive]
// reached its cap. Release does not close it. Once closed, the lease stays
// lost: stop the protected work and call Release.
func (l *RedlockLease) Lost() <-chan struct{} { return l.life.Lost() }

// Extend makes the lease last at least ttl from now on every master that
// still holds it for this owner, and succeeds when a quorum did so in time
// (the new validity counts from the start of the call, less the drift
// allowance). It never shortens the lease: a master whose lease has more
// than ttl left keeps it, and Deadline moves only forward. So an extend
// that fails, or whose request reaches a master late, leaves every
// master's lease and the local Deadline as they were.
//
// It returns [ErrClosed] after the Redlock's Close (before checking its
// arguments); an error wrapping [ErrInvalidTTL] for a ttl outside 10ms to
// 50 years, as [Redlock.TryAcquire]; an error wrapping [ErrLeaseLost], and
// closes Lost, when more than N−quorum masters say the lease is not this
// owner's (or it is already known lost or released); and an error
// wrapping [ErrNoQuorum] when too few masters answered, or a quorum
// answered only after the new validity was spent, leaving the lease as it
// was. After [RedlockLease.KeepAlive] with a cap, Extend is held to the
// cap: it asks for no more than what is left before the cap (the
// Deadline never passes it), and returns an error wrapping
// [ErrLeaseLost] when less than the shortest Redlock lease is left.
func (l *RedlockLease) Extend(ctx context.Context, ttl time.Duration) error {
	if l == nil {
		return ErrLeaseLost
	}
	r := l.r
	if err := r.enter(); err != nil {
		return err
	}
	defer r.leave()
	if err := checkRedlockTTL(ttl); err != nil {
		return err
	}
	if l.life.Gone() {
		return fmt.Errorf("%w: %q", ErrLeaseLost, l.key)
	}
	ttl, left := l.life.Clamp(ttl, redlockMinLease)
	if !left {
		return fmt.Errorf("%w: %q: at its KeepAlive cap", ErrLeaseLost, l.key)
	}
	start := r.now()
	replies := r.fanout(ctx, r.all, r.nodeTimeout(ttl), func(ctx context.Context, i int) nodeReply {
		return r.extendNode(ctx, i, l.keys, l.owner, ttl)
	})
	ok, refused, errs := tally(replies)
	deadline := start.Add(ttl - lease.Drift(ttl))
	now := r.now()
	if ok < r.quorum || !now.Before(deadline) {
		r.cfg.sig.lease(l.key, LeaseExtendFailed)
		if refused > len(r.nodes)-r.quorum {
			l.markLost()
			return fmt.Errorf("%w: %q: %d of %d masters no longer hold it", ErrLeaseLost, l.key, refused, len(r.nodes))
		}
		if ok < r.quorum {
			return withCauses(fmt.Errorf("%w: extend lease %q: %d of %d masters extended it, %d needed; the lease is as it was",
				ErrNoQuorum, l.key, ok, len(r.nodes), r.quorum), errs)
		}
		return fmt.Errorf("%w: extend lease %q: %d of %d masters confirmed it, but only after its new validity (%v) was spent; the lease is as it was",
			ErrNoQuorum, l.key, ok, len(r.nodes), ttl-lease.Drift(ttl))
	}
	l.life.Lock()
	gone := l.life.GoneLocked()
	if !gone && deadline.After(l.life.DeadlineLocked()) { // the masters never shorten it: neither does the deadline
		l.life.RenewedLocked(deadline, 0)
	}
	l.life.Unlock()
	if gone {
		return fmt.Errorf("%w: %q: validity ran out or the lease was released while extending", ErrLeaseLost, l.key)
	}
	r.cfg.sig.lease(l.key, LeaseExtended)
	return nil
}

// KeepAlive starts a watchdog that renews the lease, each time for the
// length it was acquired with, at a random point between a third and a
// half of that length, until Release, until the lease is lost, until the
// Redlock's Close, or until maxHold after the acquire: maxHold is not an
// interval but an absolute cap on the whole holding. No renewal takes
// the lease past the cap: the last one before it extends the lease only
// up to the cap, and none is made when less than 10ms is left to it.
// The holding ends at the cap even when the lease as acquired is longer:
// Deadline is then the cap and Lost closes at it. Renewals never shorten
// the lease in the masters ([RedlockLease.Extend]), so there the keys of
// such a lease live to its own end, at most one lease length past the
// cap: a holder stuck past the cap keeps others out that long, though it
// has been told (Lost) to stop. A maxHold of zero or less means no cap.
//
// A renewal that finds no quorum is retried until the lease's validity
// runs out; then [RedlockLease.Lost] is closed. Release waits for the
// watchdog to end. Calling KeepAlive again, after the lease ended or
// after Close, does nothing.
//
// After KeepAlive with a cap, an Extend is held to the cap as well: it
// never moves the lease, or its Deadline, past it.
func (l *RedlockLease) KeepAlive(maxHold time.Duration) {
	if l == nil {
		return
	}
	if err := l.r.enter(); err != nil {
		return
	}
	// The holding ends at a cap before the lease's end: Lost closes then,
	// though the masters' keys (never shortened) live to the lease's end.
	started := l.life.KeepAlive(l.r.gate.Root(), maxHold, func(ctx context.Context, capAt time.Time) {
		defer l.r.leave()
		l.life.Renew(ctx, capAt, lease.Renewal{
			Extend: l.Extend,
			Final: func(err error) bool {
				return errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrClosed)
			},
			Min: redlockMinLease,
		})
	})
	if !started {
		l.r.leave()
	}
}

// Release stops the watchdog, if any, and deletes the lease on every
// master where it is still this owner's, all at once. It returns nil when
// a quorum released it; an error wrapping [ErrLeaseLost] when more than
// N−quorum masters no longer held it (it expired or passed to another
// owner; their leases are left alone); an error wrapping [ErrNoQuorum]
// when too few masters answered (those that did not keep it until it
// expires); and [ErrClosed] after the Redlock's Close, also for a lease
// released before it (it then only stops the lease's local timers).
// Release is nil-safe, and releasing again after a successful Release
// returns nil.
func (l *RedlockLease) Release(ctx context.Context) error {
	if l == nil {
		return nil
	}
	r := l.r
	if err := r.enter(); err != nil {
		l.finish() // Close has ended the watchdog; stop the expiry timer
		return err
	}
	defer r.leave()
	if freed, _, _ := l.life.Release(); freed {
		return nil
	}
	l.life.StopWatchdog()
	replies := r.fanout(ctx, r.all, r.nodeTimeout(l.ttl), func(ctx context.Context, i int) nodeReply {
		return r.releaseNode(ctx, i, l.keys, l.owner)
	})
	ok, refused, errs := tally(replies)
	switch {
	case ok >= r.quorum:
		l.life.Freed()
		return nil
	case refused > len(r.nodes)-r.quorum:
		return fmt.Errorf("%w: %q: it expired or passed to another owner before release (%d of %d masters)", ErrLeaseLost, l.key, refused, len(r.nodes))
	}
	return withCauses(fmt.Errorf("%w: release lease %q: %d of %d masters released it, %d needed",
		ErrNoQuorum, l.key, ok, len(r.nodes), r.quorum), errs)
}

// finish stops the lease's local timers without touching Redis (tests,
// and Release after Close).
func (l *RedlockLease) finish() { l.life.Finish() }

func (l *RedlockLease) markLost() {
	if l.life.Lose() {
		sig := l.r.cfg.sig
		sig.lease(l.key, LeaseLost)
		sig.logRare(slog.LevelWarn, "herd: redlock lease lost: its validity ran out or a quorum no longer holds it; stop the protected work", "key", l.key, "token", l.token)
	}
}
