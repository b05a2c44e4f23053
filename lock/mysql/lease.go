package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/lease"
)

// Lease is one holding of a [Locker]'s lock: a named lock on a connection
// of its own. Its methods are safe for concurrent use. Release it when the
// protected work is done.
//
// While the lease is held, a goroutine of its own checks its connection
// every [Options.Check] (a second by default): one statement that the
// session is up and that IS_USED_LOCK names it as the holder. A check
// that fails (the server ended the session: KILL, wait_timeout, a
// restart; the connection broke) closes Lost, within Check and a round
// trip of the session's end. A connection that goes silent without
// closing (a cut network) makes the check wait; Lost then closes at the
// lease's deadline, before the server's wait_timeout frees the lock.
type Lease struct {
	locker   *Locker
	key      string
	lock     string // the server's lock name
	id       int64  // the session's CONNECTION_ID()
	idle     int64  // the session's wait_timeout before the lease
	token    uint64
	conn     *sql.Conn
	life     lease.State   // deadline, Lost, release and watchdog
	stop     chan struct{} // closed when the connection is ended: stops the checker
	checking chan struct{} // closed when the checker ends

	connMu sync.Mutex // serialises the statements on conn, and guards ended
	ended  bool       // conn is closed: no statement may start

	rel sync.Mutex // serialises Release: a second call sees the first's outcome
}

func newLease(l *Locker, a *attempt, key string, token uint64, ttl time.Duration, deadline time.Time) *Lease {
	lease := &Lease{
		locker:   l,
		key:      key,
		lock:     a.lock,
		id:       a.id,
		idle:     a.idle,
		token:    token,
		conn:     a.conn,
		stop:     make(chan struct{}),
		checking: make(chan struct{}),
	}
	lease.life.Init(ttl, a.start, deadline, nil, lease.lose)
	go lease.check(l.cfg.check)
	return lease
}

// Token returns the lease's fencing token, taken from the fence table
// while holding the lock: the larger of one more than the lock's last
// token and the server's clock in microseconds since 1970. Tokens of one
// key strictly increase from one holder to the next, across Lockers,
// processes and server restarts (the fence table is an InnoDB table: it
// lasts as long as the database's committed data does), and the clock
// keeps them increasing where the table lost its last rows, as long as
// the servers' clocks do. Pass it to the protected resource, which must
// reject a token lower than the highest it has seen ([FencedTable] does
// that for a row).
func (l *Lease) Token() uint64 { return l.token }

// Key returns the key the lease was acquired for.
func (l *Lease) Key() string { return l.key }

// ConnectionID returns the server's id of the lease's session
// (CONNECTION_ID()), as the server's process list shows it.
func (l *Lease) ConnectionID() int64 { return l.id }

// Deadline returns the local time until which the lease is known valid:
// the acquire or last successful extend was sent before it by the lease
// length, less an allowance for clock drift. The server frees the lock no
// sooner: its wait_timeout, the lease length rounded up to whole
// seconds, counts from the end of the last statement on the connection.
func (l *Lease) Deadline() time.Time { return l.life.Deadline() }

// Lost returns a channel that is closed when the lease is known to be
// lost: a check found its session ended or no longer holding the lock
// (see [Lease]), its deadline passed without a successful renewal, an
// extend failed on a broken connection, or [Lease.KeepAlive] reached its
// cap. A lease that is lost while its connection is still up is unlocked
// at once, so the next owner need not wait for the server's
// wait_timeout. Release does not close it. Once closed, the lease stays
// lost: stop the protected work and call Release.
func (l *Lease) Lost() <-chan struct{} { return l.life.Lost() }

// errEnded is what use returns once the connection ended.
var errEnded = errors.New("the lease's connection ended")

// use runs fn with the connection, one statement at a time.
func (l *Lease) use(fn func(*sql.Conn) error) error {
	l.connMu.Lock()
	defer l.connMu.Unlock()
	if l.ended {
		return errEnded
	}
	return fn(l.conn)
}

// check is the checker loop: every interval, a statement that the session
// holds the lock.
func (l *Lease) check(interval time.Duration) {
	defer close(l.checking)
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-timer.C:
		}
		var ours sql.NullBool
		err := l.use(func(c *sql.Conn) error {
			ctx, cancel := context.WithDeadline(context.Background(), l.Deadline())
			defer cancel()
			return c.QueryRowContext(ctx, "SELECT IS_USED_LOCK('"+l.lock+"') = CONNECTION_ID()").Scan(&ours)
		})
		switch {
		case errors.Is(err, errEnded):
			return
		case err != nil || !ours.Bool:
			// The session ended (or, with a server that lost the lock
			// some other way, does not hold it): nothing to unlock.
			l.markLost()
			_, _ = l.end(context.Background(), false)
			return
		}
		timer.Reset(interval)
	}
}

// end ends the lease's use of the connection, after unlocking the lock
// when unlock is set and the connection is up. It reports whether that
// unlock freed the lock: the connection then goes back to the Locker's
// pool, with its wait_timeout as it was (one statement with the unlock);
// otherwise it is closed. Only the first call does anything; later ones
// return errEnded.
func (l *Lease) end(ctx context.Context, unlock bool) (bool, error) {
	l.connMu.Lock()
	defer l.connMu.Unlock()
	if l.ended {
		return false, errEnded
	}
	l.ended = true
	close(l.stop)
	var freed sql.NullInt64
	var err error
	if unlock {
		// 1: released; 0: another session holds it; NULL: nobody does.
		err = l.conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK('"+l.lock+"'); "+
			"SET SESSION wait_timeout = "+strconv.FormatInt(l.idle, 10)).Scan(&freed)
	}
	if err == nil && freed.Int64 == 1 {
		l.locker.putBack(l.conn)
		return true, nil
	}
	discard(l.conn)
	return false, err
}

// lose marks the lease lost and ends it, unlocking it first when its
// connection is up: its deadline passed (expired) or KeepAlive's cap was
// reached.
func (l *Lease) lose() {
	if !l.markLost() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = l.end(ctx, true)
}

// markLost closes Lost; it reports whether this call did, with the lease
// not released.
func (l *Lease) markLost() bool { return l.life.Lose() }

// Extend sets the lease's remaining time to ttl: it sets the session's
// wait_timeout to ttl rounded up to whole seconds, which also restarts
// it, and moves Deadline to ttl (less the drift allowance) after the
// call's start. It returns an error wrapping [herd.ErrLeaseLost] when the
// lease is known lost or released, or its connection turns out to have
// ended (Lost is then closed), and ctx's error, without touching the
// lease, when ctx has ended before the call. Once its statement is sent,
// Extend does not stop for ctx (the driver would close the connection,
// and end the lease): it is bounded by the lease's deadline instead. ttl
// is checked as in [Locker.TryAcquire]. Extend keeps working after
// [Locker.Close].
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
// renewal, which may be shorter than a lease may be acquired for.
func (l *Lease) extend(ctx context.Context, ttl time.Duration) error {
	deadline := l.life.Deadline()
	if l.life.Gone() {
		return fmt.Errorf("%w: %q", herd.ErrLeaseLost, l.key)
	}
	ttl, left := l.life.Clamp(ttl, time.Millisecond) // an Extend after KeepAlive ends at its cap
	if !left {
		return fmt.Errorf("%w: %q: at its KeepAlive cap", herd.ErrLeaseLost, l.key)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("herd: extend lease %q: %w", l.key, err)
	}
	start := time.Now()
	qctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	err := l.use(func(c *sql.Conn) error {
		_, err := c.ExecContext(qctx, "SET SESSION wait_timeout = "+strconv.FormatInt(waitTimeout(ttl), 10))
		return err
	})
	if err != nil {
		// Any failure of this statement is the connection's: it either
		// ended before, or the driver closed it on the error.
		l.lose()
		return fmt.Errorf("%w: %q: %w", herd.ErrLeaseLost, l.key, err)
	}
	if !l.life.Renewed(start.Add(ttl - lease.Drift(ttl))) {
		return fmt.Errorf("%w: %q: its deadline passed or it was released while extending", herd.ErrLeaseLost, l.key)
	}
	return nil
}

// KeepAlive starts a watchdog that renews the lease, each time for the
// length it was acquired with, at a random point between a third and a
// half of that length, until Release, until the lease is lost, or until
// maxHold after the acquire. maxHold is not an interval but an absolute
// cap on the whole holding: the last renewal before it is shortened so
// that the lease ends at the cap, and a stuck holder cannot keep the lock
// for ever. A maxHold of zero or less means no cap.
//
// A renewal that fails loses the lease (its statement can only fail on a
// broken connection): [Lease.Lost] is closed. The watchdog goroutine ends
// with the lease and Release waits for it. Calling KeepAlive again, or
// after the lease ended, does nothing.
//
// After KeepAlive with a cap, an Extend is held to the cap as well: it
// never moves the lease, or its Deadline, past it.
func (l *Lease) KeepAlive(maxHold time.Duration) {
	if l == nil {
		return
	}
	l.life.KeepAlive(context.Background(), maxHold, func(ctx context.Context, capAt time.Time) {
		l.life.Renew(ctx, capAt, lease.Renewal{Extend: l.extend, Final: lostErr})
	})
}

// lostErr reports whether a renewal's error is the lease's loss.
func lostErr(err error) bool { return errors.Is(err, herd.ErrLeaseLost) }

// releaseTimeout bounds Release's statement.
const releaseTimeout = 5 * time.Second

// Release stops the watchdog, if any, unlocks the lock (RELEASE_LOCK,
// which frees only a lock of this session: it returns 0 for another
// session's and NULL for a lock nobody holds), and, in the same
// statement, sets the session's wait_timeout back to what it was before
// the lease; the connection then goes back to the Locker's idle
// connections (or is closed when they are full, or the Locker is). A
// waiting Acquire anywhere is granted the lock by the server at once. It returns an error wrapping [herd.ErrLeaseLost] when
// the lease was already lost (its session ended, so the server had freed
// the lock and another owner may hold it now, which Release leaves
// alone) or when RELEASE_LOCK found the session no longer holding it.
// Release does not stop for ctx (the driver would close the connection
// anyway): its statement is bounded by 5 seconds. When it fails, closing
// the connection still frees the lock, and the error is returned wrapped,
// with ErrLeaseLost. Release is nil-safe, and releasing again after a
// successful Release returns nil. It keeps working after [Locker.Close].
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return nil
	}
	l.rel.Lock()
	defer l.rel.Unlock()
	freed, lost, _ := l.life.Release()
	if freed {
		return nil
	}
	l.life.StopWatchdog()
	defer func() { <-l.checking }()
	if lost {
		_, _ = l.end(ctx, false)
		return fmt.Errorf("%w: %q: it was lost before release", herd.ErrLeaseLost, l.key)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	ok, err := l.end(ctx, true)
	switch {
	case errors.Is(err, errEnded):
		return fmt.Errorf("%w: %q: its connection had ended", herd.ErrLeaseLost, l.key)
	case err != nil:
		return fmt.Errorf("%w: release lease %q: %w (its connection is closed, which frees the lock)", herd.ErrLeaseLost, l.key, err)
	case !ok:
		return fmt.Errorf("%w: %q: the session no longer held it", herd.ErrLeaseLost, l.key)
	}
	l.life.Freed()
	return nil
}

// Lease satisfies herd's lease interface.
var _ herd.LeaseHandle = (*Lease)(nil)
