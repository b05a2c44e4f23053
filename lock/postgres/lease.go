package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/lease"
	"github.com/jackc/pgx/v5"
)

// Lease is one holding of a [Locker]'s lock: a session-level advisory
// lock on a connection of its own. Its methods are safe for concurrent
// use. Release it when the protected work is done.
//
// While the lease is held, a goroutine of its own waits on its connection
// for the server to end the session, without sending anything (a query
// would restart the session's idle limit). The session's end is seen as
// soon as the client can tell: at once when PostgreSQL ends it
// (pg_terminate_backend, the idle limit, a restart or shutdown) or the
// connection is closed, and Lost is closed then; a connection that goes
// silent without closing (a cut network) is not seen, and Lost closes at
// the lease's deadline, before the server's idle limit frees the lock.
type Lease struct {
	locker   *Locker
	name     string
	key      int64
	token    uint64
	conn     *pgx.Conn
	watching chan struct{} // closed when the connection's watcher ends
	life     lease.State   // deadline, Lost, release and watchdog
	idle     atomic.Int64  // the longest idle limit (ns) sent for the session: how long after its last statement the server may keep it

	rel sync.Mutex // serialises Release: a second call sees the first's outcome

	mu        sync.Mutex // guards the fields below and the use of conn
	cond      *sync.Cond // signalled when busy or ended changes
	busy      bool       // a statement or the watcher has conn
	wanted    int        // statements waiting for conn
	stopWatch context.CancelFunc
	ended     bool // conn is closed or closing: no statement may start
}

func newLease(l *Locker, c *pgx.Conn, name string, key int64, token uint64, ttl time.Duration, start, deadline time.Time) *Lease {
	held := &Lease{
		locker:   l,
		name:     name,
		key:      key,
		token:    token,
		conn:     c,
		watching: make(chan struct{}),
	}
	held.cond = sync.NewCond(&held.mu)
	held.idle.Store(int64(ttl))
	held.life.Init(ttl, start, deadline, nil, held.lose)
	go held.watchConn()
	return held
}

// Token returns the lease's fencing token, taken from the fence table
// while holding the lock: the larger of one more than the name's last
// token and the server's clock in microseconds since 1970. Tokens of one
// name strictly increase from one holder to the next, across Lockers,
// processes and server restarts (the fence table is an ordinary table: it
// lasts as long as the database's committed data does), and the clock
// keeps them increasing where the table lost its rows, as long as the
// server's clock does. Pass it to the protected resource, which must
// reject a token lower than the highest it has seen ([FencedTable] does
// that for a row).
func (l *Lease) Token() uint64 { return l.token }

// Key returns the lock name the lease was acquired for.
func (l *Lease) Key() string { return l.name }

// Deadline returns the local time until which the lease is known valid:
// the acquire or last successful extend was sent before it by the lease
// length, less an allowance for clock drift. The server frees the lock no
// sooner: its idle limit counts from the end of that statement.
func (l *Lease) Deadline() time.Time { return l.life.Deadline() }

// Lost returns a channel that is closed when the lease is known to be
// lost: its connection ended (see [Lease]), its deadline passed without a
// successful renewal, an extend failed on a broken connection, or
// [Lease.KeepAlive] reached its cap. A lease that is lost while its
// connection is still up is unlocked at once, so the next owner need not
// wait for the server's idle limit. Release does not close it. Once
// closed, the lease stays lost: stop the protected work and call Release.
func (l *Lease) Lost() <-chan struct{} { return l.life.Lost() }

// errEnded is what use returns once the connection ended.
var errEnded = errors.New("the lease's connection ended")

// use runs fn with the connection, interrupting the watcher's wait.
func (l *Lease) use(fn func(*pgx.Conn) error) error {
	l.mu.Lock()
	l.wanted++
	if l.stopWatch != nil {
		l.stopWatch()
	}
	for l.busy && !l.ended {
		l.cond.Wait()
	}
	l.wanted--
	if l.ended {
		l.cond.Broadcast()
		l.mu.Unlock()
		return errEnded
	}
	l.busy = true
	l.mu.Unlock()
	err := fn(l.conn)
	l.mu.Lock()
	l.busy = false
	l.cond.Broadcast()
	l.mu.Unlock()
	return err
}

// watchConn waits on the connection, whenever no statement needs it, for
// the server to end the session: a read that nothing but the session's
// end (or a notification, which the lease's connection does not listen
// for) completes. A statement that needs the connection interrupts it.
func (l *Lease) watchConn() {
	defer close(l.watching)
	for {
		l.mu.Lock()
		for (l.busy || l.wanted > 0) && !l.ended {
			l.cond.Wait()
		}
		if l.ended {
			l.mu.Unlock()
			return
		}
		l.busy = true
		ctx, cancel := context.WithCancel(context.Background())
		l.stopWatch = cancel
		l.mu.Unlock()

		_, err := l.conn.WaitForNotification(ctx)
		interrupted := ctx.Err() != nil
		cancel()

		l.mu.Lock()
		l.stopWatch = nil
		if err != nil && !interrupted {
			// The session ended. Nobody else may use the connection now.
			l.ended = true
			l.busy = false
			l.cond.Broadcast()
			l.mu.Unlock()
			pid := l.conn.PgConn().PID()
			closeConn(l.conn)
			l.markLost()
			l.locker.hint(l.key, pid, time.Second)
			return
		}
		l.busy = false
		l.cond.Broadcast()
		l.mu.Unlock()
	}
}

// end stops the watcher and closes the connection, after unlocking the
// lock and announcing it when unlock is set and the connection is up. It
// reports whether that unlock ran and freed the lock. Only the first call
// does anything.
func (l *Lease) end(ctx context.Context, unlock bool) (bool, error) {
	var freed bool
	var err error
	if unlock {
		err = l.use(func(c *pgx.Conn) error {
			if h := l.locker.beforeUnlock; h != nil {
				h(c)
			}
			return c.QueryRow(ctx, "SELECT pg_advisory_unlock($1), pg_notify($2, $3)",
				l.key, l.locker.cfg.channel, strconv.FormatInt(l.key, 10)).Scan(&freed, nil)
		})
	}
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		<-l.watching
		return freed, err
	}
	l.ended = true
	if l.stopWatch != nil {
		l.stopWatch()
	}
	for l.busy {
		l.cond.Wait()
	}
	l.cond.Broadcast()
	l.mu.Unlock()
	<-l.watching
	closeConn(l.conn)
	return freed, err
}

// lose marks the lease lost and ends it, unlocking it first when its
// connection is up: its deadline passed (expired) or KeepAlive's cap was
// reached. When that unlock does not free the lock (the session ended
// first: the server's idle limit fired before the client's deadline, a
// restart), the server frees it with the session and nobody announces it,
// so lose announces it as the watcher does for a session that ends.
func (l *Lease) lose() {
	if !l.markLost() {
		return
	}
	pid := l.conn.PgConn().PID()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if freed, err := l.end(ctx, true); !freed || err != nil {
		// The session may also be up but silent (a cut network): the
		// server frees the lock once its idle limit passes, a drift
		// allowance after this deadline, and hint waits for that.
		l.locker.hint(l.key, pid, time.Second+min(lease.Drift(time.Duration(l.idle.Load())), hintMaxWait))
	}
}

// markLost closes Lost; it reports whether this call did, with the lease
// not released.
func (l *Lease) markLost() bool { return l.life.Lose() }

// Extend sets the lease's remaining time to ttl: it sets the session's
// idle limit to ttl, which also restarts it, and moves Deadline to ttl
// (less the drift allowance) after the call's start. It returns an error
// wrapping [herd.ErrLeaseLost] when the lease is known lost or released,
// or its connection turns out to have ended (Lost is then closed), and
// ctx's error, without touching the lease, when ctx has ended before the
// call. Once its statement is sent, Extend does not stop for ctx (a
// statement interrupted on a lease's connection would end the session,
// and the lease): it is bounded by the lease's deadline instead. ttl is
// checked as in [Locker.TryAcquire]. Extend keeps working after
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
		return fmt.Errorf("%w: %q", herd.ErrLeaseLost, l.name)
	}
	ttl, left := l.life.Clamp(ttl, time.Millisecond) // an Extend after KeepAlive ends at its cap
	if !left {
		return fmt.Errorf("%w: %q: at its KeepAlive cap", herd.ErrLeaseLost, l.name)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("herd: extend lease %q: %w", l.name, err)
	}
	start := time.Now()
	qctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	var closed bool // read while the statement has the connection: lose's unlock may use it next
	for old := l.idle.Load(); int64(ttl) > old && !l.idle.CompareAndSwap(old, int64(ttl)); old = l.idle.Load() {
	}
	err := l.use(func(c *pgx.Conn) error {
		_, err := c.Exec(qctx, "SELECT set_config('idle_session_timeout', $1, false)", strconv.FormatInt(ttl.Milliseconds(), 10))
		closed = err != nil && c.IsClosed()
		return err
	})
	if err != nil {
		if errors.Is(err, errEnded) || closed {
			l.lose()
			return fmt.Errorf("%w: %q: %w", herd.ErrLeaseLost, l.name, err)
		}
		return fmt.Errorf("herd: extend lease %q: %w", l.name, err)
	}
	if !l.life.Renewed(start.Add(ttl - lease.Drift(ttl))) {
		return fmt.Errorf("%w: %q: its deadline passed or it was released while extending", herd.ErrLeaseLost, l.name)
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
// A renewal that fails on a live connection (a statement error) is
// retried until the lease's deadline; then [Lease.Lost] is closed. The
// watchdog goroutine ends with the lease and Release waits for it.
// Calling KeepAlive again, or after the lease ended, does nothing.
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

// Release stops the watchdog, if any, unlocks the lock and announces the
// release to the waiters of every Locker (one statement), and closes the
// lease's connection. It returns an error wrapping [herd.ErrLeaseLost]
// when the lease was already lost: its connection ended, so the server
// had freed the lock and another owner may hold it now, which Release
// leaves alone (a session can only unlock its own locks). Release does not
// stop for ctx (an interrupted statement would end the session anyway):
// its statement is bounded by 5 seconds. When it fails, closing the
// connection still frees the lock, and the error is returned wrapped,
// with ErrLeaseLost. Release is nil-safe, and
// releasing again after a successful Release returns nil. It keeps
// working after [Locker.Close].
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
	if lost {
		_, _ = l.end(ctx, false)
		return fmt.Errorf("%w: %q: it was lost before release", herd.ErrLeaseLost, l.name)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	ok, err := l.end(ctx, true)
	switch {
	case err != nil:
		return fmt.Errorf("%w: release lease %q: %w (its connection is closed, which frees the lock)", herd.ErrLeaseLost, l.name, err)
	case !ok:
		return fmt.Errorf("%w: %q: the session no longer held it", herd.ErrLeaseLost, l.name)
	}
	l.life.Freed()
	return nil
}

// Lease satisfies herd's lease interface.
var _ herd.LeaseHandle = (*Lease)(nil)
