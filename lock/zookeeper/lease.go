package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/lease"
)

// Lease is one holding of a [Locker]'s lock: the lowest node of the
// lock's queue, an ephemeral node of a session of its own. Its methods
// are safe for concurrent use. Release it when the protected work is done.
//
// The lease watches its node and its session: Lost closes when the node
// is deleted by someone else, when the session's connection is lost (zk
// reports it disconnected: the server ended the session, restarted, or
// fell silent for two thirds of the session timeout), and when the
// lease's own deadline passes without a renewal. Once lost, the lease
// closes its session, so the server deletes the node at once when it can
// hear it, and at the session's expiry otherwise.
type Lease struct {
	locker   *Locker
	s        *session
	name     string
	node     string
	token    uint64
	version  int32
	timeout  time.Duration // the session's, fixed at the acquire
	stop     chan struct{} // closed by Release: the node watcher ends
	watching chan struct{} // closed when the node watcher ends

	rel sync.Mutex // serialises Release: a second call sees the first's outcome

	// life's deadline is the lease's own end: Lost closes then. Its lock
	// also guards valid.
	life  lease.State
	valid time.Time // the session's known validity (see Deadline)
}

func newLease(a *attempt, token uint64, version int32, ev <-chan zk.Event, start time.Time) (*Lease, error) {
	_, timeout, _ := a.s.info()
	l := &Lease{
		locker:   a.l,
		s:        a.s,
		name:     a.name,
		node:     a.node,
		token:    token,
		version:  version,
		timeout:  timeout,
		stop:     make(chan struct{}),
		watching: make(chan struct{}),
	}
	end := start.Add(a.ttl - lease.Drift(a.ttl))
	if time.Until(end) <= 0 {
		return nil, fmt.Errorf("%w: %q: the acquire's reply came after the lease's validity", herd.ErrLeaseHeld, a.name)
	}
	l.life.Lock()
	l.valid = start.Add(timeout - lease.Drift(timeout))
	l.life.Unlock()
	l.life.Init(a.ttl, start, end, nil, l.lose)
	if !a.s.hold(l.connLost) {
		l.life.StopExpiry()
		return nil, zk.ErrConnectionClosed
	}
	go l.watchNode(ev)
	return l, nil
}

// abandon ends a lease that its Acquire could not hand out (its context
// ended at the last moment): its session is closed, which frees the lock.
func (l *Lease) abandon() {
	l.life.Release()
	close(l.stop)
	l.s.close()
	<-l.watching
}

// Token returns the lease's fencing token: the czxid of its node, the
// ZooKeeper transaction id that created it. Transaction ids are unique
// and increase with every write the ensemble commits, across leaders and
// restarts; the holders of a name take the lock in the order of their
// nodes' sequence numbers, which the server assigns in the same order as
// the creating transactions, so each holder's token is higher than the
// one before. Pass it to the protected resource, which must reject a
// token lower than the highest it has seen.
func (l *Lease) Token() uint64 { return l.token }

// Key returns the lock name the lease was acquired for.
func (l *Lease) Key() string { return l.name }

// Node returns the path of the lease's znode.
func (l *Lease) Node() string { return l.node }

// Deadline returns the local time until which the lease is known valid,
// even if this process stops: the start of the acquire (of the call, or,
// for an Acquire that waited, of its last look at the queue) or of the
// last successful renewal (a request the server answered on the lease's
// session), plus the lesser of the lease length and the session timeout,
// less an allowance for clock drift (1% + 2ms). The server cannot expire
// the session sooner. An Extend for longer than the session timeout moves
// the lease's own end, when Lost closes, past Deadline: the session still
// ends a lease length after the holder stops talking to the server.
func (l *Lease) Deadline() time.Time {
	l.life.Lock()
	defer l.life.Unlock()
	if end := l.life.DeadlineLocked(); !l.valid.Before(end) {
		return end
	}
	return l.valid
}

// Lost returns a channel that is closed when the lease is known to be
// lost, or can no longer be known held: its node was deleted (by the
// server, when the session ended, or by anyone else), its session's
// connection was lost, its own deadline passed without a renewal, a
// renewal found it gone, or [Lease.KeepAlive] reached its cap. Release
// does not close it. Once closed, the lease stays lost: stop the
// protected work and call Release.
func (l *Lease) Lost() <-chan struct{} { return l.life.Lost() }

// markLost closes Lost; it reports whether this call did, with the lease
// not released.
func (l *Lease) markLost() bool { return l.life.Lose() }

// lose marks the lease lost and closes its session, which deletes the
// node: its deadline passed or KeepAlive's cap was reached.
func (l *Lease) lose() {
	if l.markLost() {
		l.s.close()
	}
}

// connLost is the session's loss handler, on zk's goroutine.
func (l *Lease) connLost() {
	if l.markLost() {
		go l.s.close()
	}
}

// watchNode waits for the watch on the lease's node: a deletion (or the
// watch's end with the session) loses the lease; a change of its data
// sets the watch again.
func (l *Lease) watchNode(ev <-chan zk.Event) {
	defer close(l.watching)
	for {
		select {
		case <-l.stop:
			return
		case e := <-ev:
			if e.Type == zk.EventNodeDataChanged {
				ok, _, next, err := l.s.conn.ExistsW(l.node)
				if err == nil && ok {
					ev = next
					continue
				}
			}
			if !l.life.Released() {
				l.connLost()
			}
			return
		}
	}
}

// Extend sets the lease's remaining time to ttl: one exists on the
// lease's node, which checks that the node is still there and still its
// session's, moves the lease's end to ttl after the call's start, and
// Deadline as that method says. It returns an error wrapping
// [herd.ErrLeaseLost] when the lease is known lost or released, or the
// check finds it gone (Lost is then closed), and ctx's error, without
// touching the lease, when ctx has ended before the call. The request is
// not interrupted by ctx; it is bounded by the session's connection,
// which zk gives up after two thirds of the session timeout (the lease is
// lost then). ttl is checked as in [Locker.TryAcquire] but for the
// server's range: the session timeout stays what it was at the acquire.
// Extend keeps working after [Locker.Close].
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l == nil {
		return herd.ErrLeaseLost
	}
	if err := ttls.Check(ttl); err != nil {
		return err
	}
	return l.extend(ctx, ttl)
}

// extend is Extend without the range check, for KeepAlive's capped last
// renewal.
func (l *Lease) extend(ctx context.Context, ttl time.Duration) error {
	if l.life.Gone() {
		return fmt.Errorf("%w: %q", herd.ErrLeaseLost, l.name)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("herd: extend lease %q: %w", l.name, err)
	}
	start := time.Now()
	ok, stat, err := l.s.conn.Exists(l.node)
	id, _, _ := l.s.info()
	switch {
	case err != nil && !isConnErr(err):
		return fmt.Errorf("herd: extend lease %q: %w", l.name, err)
	case err != nil:
		l.lose()
		return fmt.Errorf("%w: %q: %w", herd.ErrLeaseLost, l.name, err)
	case !ok || stat.EphemeralOwner != id || uint64(stat.Czxid) != l.token:
		l.lose()
		return fmt.Errorf("%w: %q: its node is gone", herd.ErrLeaseLost, l.name)
	}
	l.life.Lock()
	defer l.life.Unlock()
	if !l.life.RenewedLocked(start.Add(ttl-lease.Drift(ttl)), 0) {
		return fmt.Errorf("%w: %q: it was lost or released while extending", herd.ErrLeaseLost, l.name)
	}
	l.valid = start.Add(l.timeout - lease.Drift(l.timeout))
	return nil
}

// KeepAlive starts a watchdog that renews the lease, each time for the
// length it was acquired with, at a random point between a third and a
// half of that length, until Release, until the lease is lost, or until
// maxHold after the acquire. maxHold is not an interval but an absolute
// cap on the whole holding: the last renewal before it is shortened so
// that the lease ends at the cap (its session is then closed, which frees
// the lock at once), and a stuck holder cannot keep the lock for ever. A
// maxHold of zero or less means no cap.
//
// A renewal that fails with a server error is retried until the lease's
// deadline; a lost connection loses the lease. The watchdog goroutine
// ends with the lease and Release waits for it. Calling KeepAlive again,
// or after the lease ended, does nothing.
//
// After KeepAlive with a cap, an Extend is held to the cap as well: it
// never moves the lease, or its Deadline, past it.
func (l *Lease) KeepAlive(maxHold time.Duration) {
	if l == nil {
		return
	}
	// A cap before the lease's end ends it there, even before the first
	// renewal is due.
	l.life.KeepAlive(context.Background(), maxHold, func(ctx context.Context, capAt time.Time) {
		l.life.Renew(ctx, capAt, lease.Renewal{Extend: l.extend, Final: lostErr, Valid: l.Deadline})
	})
}

// lostErr reports whether a renewal's error is the lease's loss.
func lostErr(err error) bool { return errors.Is(err, herd.ErrLeaseLost) }

// Release stops the watchdog, if any, and deletes the lease's node with
// its version: only this lease's node, whose name carries the attempt's
// GUID, so it never frees a lock that passed to another owner. The
// deletion wakes the next waiter, through its watch. The session, which
// then holds nothing, is kept by the Locker for a later attempt, or
// closed. Release returns an error wrapping [herd.ErrLeaseLost] when the
// lease was already lost (its session is closed then; the server deletes
// the node, if it is still there, at the session's expiry) or the node is
// gone. The request does not stop for ctx; it is bounded by the session's
// connection. Release is nil-safe, and releasing again after a
// successful Release returns nil. It keeps working after [Locker.Close].
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return nil
	}
	l.rel.Lock()
	defer l.rel.Unlock()
	freed, lost, first := l.life.Release()
	if freed {
		return nil
	}
	l.life.StopWatchdog()
	if lost {
		if first {
			close(l.stop)
		}
		l.s.close()
		<-l.watching
		return fmt.Errorf("%w: %q: it was lost before release", herd.ErrLeaseLost, l.name)
	}
	l.s.unhold()
	err := l.s.conn.Delete(l.node, l.version)
	if first {
		close(l.stop)
	}
	<-l.watching
	if err != nil {
		l.s.close()
		if errors.Is(err, zk.ErrNoNode) {
			return fmt.Errorf("%w: %q: its node is gone", herd.ErrLeaseLost, l.name)
		}
		return fmt.Errorf("%w: release lease %q: %w (its session is closed, which frees the lock)", herd.ErrLeaseLost, l.name, err)
	}
	l.life.Freed()
	l.locker.putBack(l.s)
	return nil
}

// Lease satisfies herd's lease interface.
var _ herd.LeaseHandle = (*Lease)(nil)
