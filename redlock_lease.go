package herd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// RedlockLease is one holding of a [Redlock]. Its methods are safe for
// concurrent use. Release it when the protected work is done.
type RedlockLease struct {
	r        *Redlock
	key      string
	keys     keyFamily
	owner    string // the lease key's value on every master
	token    uint64
	ttl      time.Duration
	acquired time.Time
	lost     chan struct{}

	mu       sync.Mutex // guards the fields below
	deadline time.Time  // local end of validity; Lost closes then
	expiry   *time.Timer
	isLost   bool
	released bool // Release was called
	freed    bool // a Release succeeded: later ones return nil without Redis
	watch    *watchdog
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
func (l *RedlockLease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Lost returns a channel that is closed when the lease is known to be
// lost: its validity ran out without a successful renewal, an extend
// found it gone on too many masters for a quorum, or [RedlockLease.KeepAlive]
// reached its cap. Release does not close it. Once closed, the lease stays
// lost: stop the protected work and call Release.
func (l *RedlockLease) Lost() <-chan struct{} { return l.lost }

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
// was.
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
	l.mu.Lock()
	gone := l.isLost || l.released
	l.mu.Unlock()
	if gone {
		return fmt.Errorf("%w: %q", ErrLeaseLost, l.key)
	}
	start := r.now()
	replies := r.fanout(ctx, r.all, r.nodeTimeout(ttl), func(ctx context.Context, i int) nodeReply {
		return r.extendNode(ctx, i, l.keys, l.owner, ttl)
	})
	ok, refused, errs := tally(replies)
	deadline := start.Add(ttl - drift(ttl))
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
			ErrNoQuorum, l.key, ok, len(r.nodes), ttl-drift(ttl))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isLost || l.released {
		return fmt.Errorf("%w: %q: validity ran out or the lease was released while extending", ErrLeaseLost, l.key)
	}
	if deadline.After(l.deadline) { // the masters never shorten it: neither does the deadline
		l.deadline = deadline
		l.expiry.Reset(deadline.Sub(now))
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
func (l *RedlockLease) KeepAlive(maxHold time.Duration) {
	if l == nil {
		return
	}
	if err := l.r.enter(); err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isLost || l.released || l.watch != nil {
		l.r.leave()
		return
	}
	ctx, cancel := context.WithCancel(l.r.root)
	w := &watchdog{ctx: ctx, cancel: cancel, done: make(chan struct{})}
	l.watch = w
	var capAt time.Time
	if maxHold > 0 {
		capAt = l.acquired.Add(maxHold)
		if capAt.Before(l.deadline) {
			// The holding ends at the cap: Lost closes then, though the
			// masters' keys (never shortened) live to the lease's end.
			l.deadline = capAt
			l.expiry.Reset(capAt.Sub(l.r.now()))
		}
	}
	go func() {
		defer l.r.leave()
		l.renew(w, capAt)
	}()
}

// renew is the watchdog loop.
func (l *RedlockLease) renew(w *watchdog, capAt time.Time) {
	defer close(w.done)
	timer := time.NewTimer(l.ttl)
	defer timer.Stop()
	retry := min(max(l.ttl/20, time.Millisecond), 50*time.Millisecond)
	wait := func(d time.Duration) bool {
		timer.Reset(d)
		select {
		case <-w.ctx.Done():
			return false
		case <-l.lost:
			return false
		case <-timer.C:
			return true
		}
	}
	for {
		if !wait(l.ttl/3 + rand.N(l.ttl/6+1)) {
			return
		}
		ext := l.ttl
		if !capAt.IsZero() {
			ext = min(ext, capAt.Sub(l.r.now()))
			if ext < redlockMinLease {
				return // at the cap: the lease runs out by itself.
			}
		}
		for {
			ctx, cancel := context.WithDeadline(w.ctx, l.Deadline())
			err := l.Extend(ctx, ext)
			cancel()
			if err == nil {
				break
			}
			if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrClosed) || !l.r.now().Before(l.Deadline()) {
				return
			}
			if !wait(jitter(retry)) { // no quorum this time: try again while valid
				return
			}
		}
		if ext < l.ttl {
			return // the capped, final renewal
		}
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
	l.mu.Lock()
	l.released = true
	freed := l.freed
	if l.expiry != nil {
		l.expiry.Stop()
	}
	l.mu.Unlock()
	if freed {
		return nil
	}
	l.stopWatchdog()
	replies := r.fanout(ctx, r.all, r.nodeTimeout(l.ttl), func(ctx context.Context, i int) nodeReply {
		return r.releaseNode(ctx, i, l.keys, l.owner)
	})
	ok, refused, errs := tally(replies)
	switch {
	case ok >= r.quorum:
		l.mu.Lock()
		l.freed = true
		l.mu.Unlock()
		return nil
	case refused > len(r.nodes)-r.quorum:
		return fmt.Errorf("%w: %q: it expired or passed to another owner before release (%d of %d masters)", ErrLeaseLost, l.key, refused, len(r.nodes))
	}
	return withCauses(fmt.Errorf("%w: release lease %q: %d of %d masters released it, %d needed",
		ErrNoQuorum, l.key, ok, len(r.nodes), r.quorum), errs)
}

// stopWatchdog stops the KeepAlive goroutine, if any, and waits for it.
func (l *RedlockLease) stopWatchdog() {
	l.mu.Lock()
	w := l.watch
	l.watch = nil
	l.mu.Unlock()
	if w != nil {
		w.cancel()
		<-w.done
	}
}

// finish stops the lease's local timers without touching Redis (tests,
// and Release after Close).
func (l *RedlockLease) finish() {
	l.stopWatchdog()
	l.mu.Lock()
	l.released = true
	if l.expiry != nil {
		l.expiry.Stop()
	}
	l.mu.Unlock()
}

func (l *RedlockLease) markLost() {
	l.mu.Lock()
	first := !l.isLost && !l.released
	if !l.isLost {
		l.isLost = true
		close(l.lost)
		if l.expiry != nil {
			l.expiry.Stop()
		}
	}
	l.mu.Unlock()
	if first {
		sig := l.r.cfg.sig
		sig.lease(l.key, LeaseLost)
		sig.logRare(slog.LevelWarn, "herd: redlock lease lost: its validity ran out or a quorum no longer holds it; stop the protected work", "key", l.key, "token", l.token)
	}
}
