package mysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/lease"
	"github.com/herdkit/herd/internal/lockgate"
	"github.com/herdkit/herd/internal/lockopt"
)

// Options configures a [Locker]. A nil *Options, and every zero field,
// means the documented default. Invalid values make [New] panic: they are
// programming errors, not request-time conditions.
type Options struct {
	// Table is the fence table: one row per lock with the last token
	// handed out. The Locker creates it, if missing, before its first
	// acquire (its user then needs CREATE on the database), or it is
	// created beforehand as
	//	CREATE TABLE herd_lock_fence (name VARBINARY(64) NOT NULL PRIMARY KEY, token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB
	// Default: "herd_lock_fence" in the connection's database; a name
	// with a dot is taken as database.table.
	Table string

	// MaxWait bounds how long [Locker.Acquire] waits for a held lock, on
	// top of the caller's context. Default: three times the lease length.
	MaxWait time.Duration

	// WaitChunk is the longest single GET_LOCK wait of a waiting Acquire:
	// the server grants the lock to a waiter the moment it is released,
	// within that wait; when a wait of WaitChunk ends without the lock,
	// the next one starts at once. It bounds how long one statement runs
	// on a connection, nothing else. Default: 10s.
	WaitChunk time.Duration

	// Check is the interval of a held lease's check of its connection
	// (that the session is up and still owns the lock), which is what
	// closes Lost when the server ends the session: within Check and a
	// round trip. Default: 1s.
	Check time.Duration

	// IdleConns is how many idle connections the Locker keeps for its
	// attempts. A held lease has a connection of its own, outside this
	// count. Default: 2.
	IdleConns int
}

// config is Options with every default applied.
type config struct {
	table   string
	maxWait time.Duration
	chunk   time.Duration
	check   time.Duration
	idle    int
}

func (o *Options) resolve() config {
	var in Options
	if o != nil {
		in = *o
	}
	c := config{table: "herd_lock_fence", maxWait: in.MaxWait, chunk: 10 * time.Second, check: time.Second, idle: 2}
	if in.Table != "" {
		c.table = in.Table
	}
	lockopt.NonNegative("mysql", map[string]time.Duration{"MaxWait": in.MaxWait, "WaitChunk": in.WaitChunk, "Check": in.Check})
	if in.WaitChunk > 0 {
		if in.WaitChunk < time.Millisecond {
			panic(fmt.Sprintf("mysql: Options.WaitChunk is %v; it must be 0 (the default) or at least 1ms", in.WaitChunk))
		}
		c.chunk = in.WaitChunk
	}
	if in.Check > 0 {
		c.check = in.Check
	}
	c.idle = lockopt.Count("mysql", "IdleConns", in.IdleConns, c.idle)
	return c
}

// The lease lengths a Locker accepts: at least 10ms (1% + 2ms of every
// lease is the clock-drift allowance) and at most what the server's
// wait_timeout can hold (31536000 seconds, 365 days).
const (
	minLease = 10 * time.Millisecond
	maxLease = 31536000 * time.Second
)

// ttls checks a lease length against them.
var ttls = lockopt.TTLRange{Min: minLease, Max: maxLease, Lease: "a MySQL lease", Why: ", the server's wait_timeout limit"}

// waitTimeout is the session's wait_timeout for a lease of ttl: ttl in
// whole seconds, rounded up (the variable's unit), at least 1.
func waitTimeout(ttl time.Duration) int64 {
	return max(1, int64((ttl+time.Second-1)/time.Second))
}

// Locker is a lock in MySQL or MariaDB: each lease is a named lock
// (GET_LOCK) held by a connection of its own, with a fencing token from
// the fence table of the same database. It implements [herd.Lock] with
// leases of type *[Lease].
//
// The lease length is enforced by the server: the lease's session runs
// with wait_timeout set to the lease length in whole seconds, rounded up,
// so a holder that sends nothing for that long (its process paused or cut
// off) has its connection closed by the server, which frees the lock.
// Extend sets the timeout again, and every statement on the connection
// (the lease's own checks among them) restarts it. A holder that crashes
// frees the lock as soon as the server sees its connection close.
//
// A lock name is hashed (SHA-256, the first 192 bits, in hex) into the
// server's lock name, which is limited to 64 characters: "herd:" and 48
// hex digits. Two names share a server lock only if their hashes collide
// (about n²/2¹⁹³ for n names); other code that takes named locks on the
// server shares the namespace, which is server-wide, not per database.
//
// A Locker is safe for concurrent use. Call [Locker.Close] when done.
type Locker struct {
	db  *sql.DB
	cfg config

	tableMu chan struct{} // a semaphore of one: guards tableOK, waited for with the caller's context
	tableOK bool          // the fence table exists

	gate lockgate.Gate // the running calls, and Close

	// The goroutines of the waits: each waiting GET_LOCK runs in one, and
	// each wait whose Acquire left before its GET_LOCK returned (a stray)
	// has one more that KILLs it and closes its connection. Added to
	// only inside a call, so that Close's Wait, after the calls', sees
	// every one.
	strays   sync.WaitGroup
	cut      context.Context // cancelled by Close once the calls have ended: ends the GET_LOCK and KILL statements still running
	cutStray context.CancelFunc
}

// New returns a Locker whose connections are opened with a copy of cfg
// (for example from mysql.ParseDSN). It opens no connection until it is
// used: each attempt takes an idle connection of the Locker's or dials
// one, and each held lease keeps its connection until it ends. A nil opt
// means the defaults of [Options]. New panics on a nil cfg or an invalid
// option.
//
// In its copy the Locker turns on MultiStatements (its own statements
// only: it never sends caller input but the hashed lock name) and turns
// off ReadTimeout and WriteTimeout: each of its statements is bounded by
// a context instead, and a read timeout would cut a GET_LOCK wait short
// on the client while the server went on waiting.
func New(cfg *mysql.Config, opt *Options) *Locker {
	if cfg == nil {
		panic("mysql: New with a nil *mysql.Config")
	}
	c := opt.resolve()
	conf := cfg.Clone()
	conf.MultiStatements = true
	conf.ReadTimeout, conf.WriteTimeout = 0, 0
	conn, err := mysql.NewConnector(conf)
	if err != nil {
		panic(fmt.Sprintf("mysql: New: %v", err))
	}
	l := &Locker{db: sql.OpenDB(conn), cfg: c, tableMu: make(chan struct{}, 1)}
	l.db.SetMaxIdleConns(c.idle)
	l.gate.Init()
	l.cut, l.cutStray = context.WithCancel(context.Background())
	return l
}

// Close stops the Locker: TryAcquire and Acquire called after it return
// [herd.ErrClosed], an Acquire still waiting returns it at once (its
// GET_LOCK is ended with KILL QUERY, as for a context's end), and the
// idle connections are closed. The waits that cancelled Acquires left
// behind (see [Locker.Acquire]) end too: their connections are closed
// without waiting for the server, which frees whatever lock they were
// granted when it sees the close. Close returns once every call and
// every such wait has ended: within 250ms and a round trip or so. Leases
// already handed out are not released by Close: each keeps its own
// connection, and its Extend, KeepAlive and Release keep working, so a
// holder can finish its work and give the lock back. Close is idempotent.
func (l *Locker) Close() error {
	if !l.gate.Close() {
		return nil
	}
	l.cutStray()
	l.strays.Wait()
	return l.db.Close()
}

// lockName is the server's lock name of a herd key: fixed length, hex
// digits only, so it is safe to write into a statement as a literal and
// fits the servers' limit of 64 characters.
func lockName(key string) string {
	sum := sha256.Sum256([]byte("herd-lock:" + key))
	return "herd:" + hex.EncodeToString(sum[:24])
}

// TryAcquire takes the lock on key for ttl, or fails at once with an
// error wrapping [herd.ErrLeaseHeld] when another owner holds it. It takes
// two round trips when it wins (GET_LOCK, then the session's wait_timeout
// and the token in one multi-statement) and one when the lock is held,
// plus a connect when the Locker has no idle connection left (the winner
// keeps its connection until Release); the Locker's first attempt also creates the
// fence table if it is missing. Any string of 1 to [herd.MaxLockKeyBytes]
// bytes is a valid key ([herd.ErrInvalidKey] otherwise, before any
// request); ttl must be between 10ms and 365 days
// ([herd.ErrInvalidTTL]). A database error is returned wrapped, and after
// [Locker.Close] it returns [herd.ErrClosed]. A context that ends during
// the call closes the attempt's connection, which frees whatever the
// attempt took.
func (l *Locker) TryAcquire(ctx context.Context, key string, ttl time.Duration) (*Lease, error) {
	if err := l.gate.Enter(); err != nil {
		return nil, err
	}
	defer l.gate.Leave()
	if err := ttls.Prepare(key, ttl); err != nil {
		return nil, err
	}
	ctx, cancel := l.gate.Bound(ctx)
	defer cancel()
	a, err := l.attempt(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	if a.lease != nil {
		return a.lease, nil
	}
	l.putBack(a.conn)
	return nil, fmt.Errorf("%w: %q", herd.ErrLeaseHeld, key)
}

// Acquire takes the lock on key for ttl, waiting while another owner
// holds it. The wait is the server's own: GET_LOCK with a timeout on the
// attempt's connection, which the server ends, granting the lock, the
// moment the holder releases it or its session ends (for a holder that
// went silent, when its wait_timeout runs out). Waiters are not queued
// in order: the server picks one. Each GET_LOCK waits up to
// [Options.WaitChunk] and is re-issued at once while the wait goes on.
// (MySQL, unlike MariaDB, takes GET_LOCK's timeout in whole seconds:
// there each wait is rounded up, and MaxWait can be overrun by up to a
// second.)
//
// The wait is bounded by ctx and by [Options.MaxWait]: when ctx ends, the
// Locker ends the GET_LOCK with KILL QUERY from another connection (one
// round trip, plus a connect if no idle connection is left), and Acquire
// returns when the GET_LOCK has ended, or after 250ms if it has not (a
// server or network that does not answer), with an error that joins
// [herd.ErrLeaseHeld] and ctx.Err(). A GET_LOCK whose reply has not come
// 250ms after its own timeout is left behind the same way: when that
// ends MaxWait the error wraps [herd.ErrWaitTimeout], else it says the
// server or the link does not answer. A wait that outlives its Acquire is
// left behind, never to be handed to a caller: the KILL is sent again
// until its GET_LOCK returns (at its own deadline, WaitChunk and 30s, at
// the latest, or at [Locker.Close]), and its connection is then closed,
// not reused, which frees a lock the server granted it meanwhile. When
// MaxWait runs out the error wraps [herd.ErrWaitTimeout] and
// ErrLeaseHeld. A database error ends the wait at once and is returned
// wrapped. Key and ttl are checked as in [Locker.TryAcquire]. After
// [Locker.Close], and when Close ends its wait, it returns
// [herd.ErrClosed].
func (l *Locker) Acquire(ctx context.Context, key string, ttl time.Duration) (*Lease, error) {
	if err := l.gate.Enter(); err != nil {
		return nil, err
	}
	defer l.gate.Leave()
	if err := ttls.Prepare(key, ttl); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("herd: acquire %q: %w", key, err)
	}
	bctx, cancel := l.gate.Bound(ctx)
	defer cancel()
	a, err := l.attempt(bctx, key, ttl)
	if err != nil {
		return nil, l.gate.AcquireErr(ctx, key, err)
	}
	if a.lease != nil {
		return a.lease, nil
	}

	maxWait := l.cfg.maxWait
	if maxWait == 0 {
		maxWait = 3 * ttl
	}
	until := time.Now().Add(maxWait)
	for {
		left := time.Until(until)
		if left <= 0 {
			l.putBack(a.conn)
			return nil, fmt.Errorf("%w after %v: %w", herd.ErrWaitTimeout, maxWait, herd.ErrLeaseHeld)
		}
		lease, won, err := l.wait(bctx, a, key, ttl, min(left, l.cfg.chunk))
		if errors.Is(err, errSilent) && !time.Now().Before(until) {
			// MaxWait ran out while the server or the link was silent.
			return nil, fmt.Errorf("%w after %v: %w (%w)", herd.ErrWaitTimeout, maxWait, herd.ErrLeaseHeld, err)
		}
		if err != nil {
			return nil, l.gate.AcquireErr(ctx, key, err)
		}
		if won {
			return lease, nil
		}
	}
}

// attempt is an attempt's connection, its server id, and the lease when
// it won.
type attempt struct {
	conn  *sql.Conn
	id    int64 // CONNECTION_ID()
	idle  int64 // the session's wait_timeout before the lease
	maria bool  // the server is MariaDB (GET_LOCK takes a fractional timeout)
	lock  string
	start time.Time
	lease *Lease
}

// attempt takes a connection and tries the lock on it without waiting.
// When it fails with a nil error, the caller owns a.conn (putBack).
func (l *Locker) attempt(ctx context.Context, key string, ttl time.Duration) (*attempt, error) {
	if err := l.ensureTable(ctx); err != nil {
		return nil, err
	}
	c, err := l.db.Conn(ctx)
	if err != nil {
		return nil, l.callErr(ctx, key, fmt.Errorf("connect: %w", err))
	}
	a := &attempt{conn: c, lock: lockName(key), start: time.Now()}
	var won sql.NullInt64
	if err := c.QueryRowContext(ctx, "SELECT GET_LOCK('"+a.lock+"', 0), CONNECTION_ID(), @@SESSION.wait_timeout, VERSION() LIKE '%MariaDB%'").
		Scan(&won, &a.id, &a.idle, &a.maria); err != nil {
		discard(c) // the lock may have been taken: ending the session frees it
		return nil, l.callErr(ctx, key, err)
	}
	if won.Int64 != 1 {
		return a, nil
	}
	a.lease, err = l.finish(ctx, a, key, ttl)
	return a, err
}

// killWait is how long an Acquire whose context ended waits for the KILL
// QUERY to end its GET_LOCK before it leaves the wait behind: many round
// trips to a server that answers, short of a wait on one that does not.
const killWait = 250 * time.Millisecond

// errSilent is the cause of a wait whose GET_LOCK did not return killWait
// after its own timeout: the server or the link does not answer.
var errSilent = errors.New("herd: GET_LOCK did not return after its timeout: the server or the link does not answer")

// killEvery is the interval at which the KILL QUERY of a wait is sent
// again until its GET_LOCK has returned.
const killEvery = 50 * time.Millisecond

// wait waits up to d for the lock on a's connection. It returns the lease
// when it won, won false when d ran out (a.conn is still the caller's),
// or an error (a.conn is put back, closed, or left to a stray wait that
// closes it).
func (l *Locker) wait(ctx context.Context, a *attempt, key string, ttl, d time.Duration) (*Lease, bool, error) {
	// The statement runs in a goroutine of its own, so that the caller
	// can leave when ctx ends (see stray). It ignores ctx (the driver
	// would close the connection, and the server would go on waiting for
	// the lock); ctx's end kills it from another connection instead. Its
	// own deadline only bounds a network that stopped answering.
	ended := make(chan waitResult, 1)
	l.strays.Add(1)
	go func() {
		defer l.strays.Done()
		qctx, cancel := context.WithTimeout(l.cut, d+30*time.Second)
		defer cancel()
		var r waitResult
		r.err = a.conn.QueryRowContext(qctx, "SELECT GET_LOCK('"+a.lock+"', "+seconds(d, a.maria)+")").Scan(&r.won)
		ended <- r
	}()
	// The server ends the GET_LOCK at its timeout (MySQL's in whole
	// seconds); a reply that does not come killWait after it will not
	// come soon: the wait is left behind as for a cancelled ctx, so that
	// MaxWait bounds the Acquire on a silent link too.
	serverWait := d
	if !a.maria {
		serverWait = time.Duration(waitTimeout(d)) * time.Second
	}
	late := time.NewTimer(serverWait + killWait)
	defer late.Stop()
	var r waitResult
	select {
	case r = <-ended:
	case <-ctx.Done():
		l.stray(a, ended)
		return nil, false, ctx.Err()
	case <-late.C:
		l.stray(a, ended)
		return nil, false, fmt.Errorf("acquire %q: %w", key, errSilent)
	}
	switch {
	case r.err != nil:
		discard(a.conn)
		return nil, false, l.callErr(ctx, key, r.err)
	case r.won.Int64 == 1 && ctx.Err() != nil:
		// Granted just as the wait was cut short: give it back.
		l.unlockAndPutBack(a)
		return nil, false, ctx.Err()
	case r.won.Int64 == 1:
		lease, err := l.finish(ctx, a, key, ttl)
		return lease, err == nil, err
	case !r.won.Valid:
		discard(a.conn)
		return nil, false, fmt.Errorf("herd: acquire %q: GET_LOCK returned NULL (the session was interrupted)", key)
	case ctx.Err() != nil:
		l.putBack(a.conn)
		return nil, false, ctx.Err()
	}
	return nil, false, nil
}

// waitResult is what a waiting GET_LOCK returned: 1 granted, 0 timed
// out, NULL killed.
type waitResult struct {
	won sql.NullInt64
	err error
}

// stray ends the wait of a, whose caller's context ended while its
// GET_LOCK was running (ended receives the statement's result): it sends
// KILL QUERY, and again every killEvery until the GET_LOCK has returned
// (a KILL that reaches the server before the GET_LOCK does does nothing
// to a session between statements), then closes the connection. The
// connection is not reused: a KILL still on its way could hit its next
// statement, and a GET_LOCK granted meanwhile leaves a lock on it, which
// the close frees. stray waits up to killWait for all that, so that on a
// server that answers the caller leaves nothing behind; past it the wait
// goes on in a goroutine of its own, which Close ends.
func (l *Locker) stray(a *attempt, ended <-chan waitResult) {
	over := make(chan struct{})
	l.strays.Add(1)
	go func() {
		defer l.strays.Done()
		defer close(over)
		again := time.NewTicker(killEvery)
		defer again.Stop()
		for {
			l.kill(a.id)
			select {
			case <-ended:
				discard(a.conn)
				return
			case <-again.C:
			}
		}
	}()
	timer := time.NewTimer(killWait)
	defer timer.Stop()
	select {
	case <-over:
	case <-timer.C:
	}
}

// seconds formats d as GET_LOCK's timeout: seconds with microseconds for
// MariaDB, which honours them; whole seconds rounded up, at least 1, for
// MySQL, which takes the timeout as an integer (0.3 would be no wait at
// all).
func seconds(d time.Duration, maria bool) string {
	if maria {
		return strconv.FormatFloat(d.Seconds(), 'f', 6, 64)
	}
	return strconv.FormatInt(waitTimeout(d), 10)
}

// kill ends the statement running on the session id (KILL QUERY, from a
// connection of the pool). An error is ignored: the statement may have
// ended already, and its own deadline bounds it otherwise. Close ends a
// KILL still running.
func (l *Locker) kill(id int64) {
	ctx, cancel := context.WithTimeout(l.cut, 5*time.Second)
	defer cancel()
	_, _ = l.db.ExecContext(ctx, "KILL QUERY "+strconv.FormatInt(id, 10))
}

// unlockAndPutBack releases a lock a's connection holds and returns the
// connection to the pool, or closes it when that fails or takes longer
// than killWait (a cancelled Acquire waits no longer).
func (l *Locker) unlockAndPutBack(a *attempt) {
	ctx, cancel := context.WithTimeout(context.Background(), killWait)
	defer cancel()
	if _, err := a.conn.ExecContext(ctx, "DO RELEASE_LOCK('"+a.lock+"')"); err != nil {
		discard(a.conn)
		return
	}
	l.putBack(a.conn)
}

// finish turns a's won lock into a lease: the session's wait_timeout and
// the token, in one round trip. autocommit is set too, so that the token
// is committed whatever the DSN or the server's default say. On failure
// it closes the connection, which frees the lock.
func (l *Locker) finish(ctx context.Context, a *attempt, key string, ttl time.Duration) (*Lease, error) {
	// The lease counts from this statement's start: the server's idle
	// limit of ttl starts after it, and a GET_LOCK that waited for the
	// lock may have been granted long after the wait began.
	a.start = time.Now()
	q := "SET SESSION autocommit = 1, wait_timeout = " + strconv.FormatInt(waitTimeout(ttl), 10) + "; " + l.tokenSQL(a.lock)
	res, err := a.conn.ExecContext(ctx, q)
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) && myErr.Number == 1146 {
		// The fence table was dropped since the Locker created it:
		// create it again, on this connection (which holds the lock),
		// and take the token once more.
		if _, err = a.conn.ExecContext(ctx, l.tableDDL()); err == nil {
			res, err = a.conn.ExecContext(ctx, q)
		}
	}
	var token int64
	if err == nil {
		token, err = res.LastInsertId()
	}
	if err == nil && token <= 0 {
		err = fmt.Errorf("the fence table returned token %d", token)
	}
	if err != nil {
		discard(a.conn)
		return nil, l.callErr(ctx, key, fmt.Errorf("take the token: %w", err))
	}
	deadline := a.start.Add(ttl - lease.Drift(ttl))
	if time.Until(deadline) <= 0 {
		discard(a.conn)
		return nil, fmt.Errorf("%w: %q: the acquire's reply came after the lease's validity", herd.ErrLeaseHeld, key)
	}
	return newLease(l, a, key, uint64(token), ttl, deadline), nil
}

// tokenSQL advances lock's row of the fence table and leaves the new
// token as the statement's LAST_INSERT_ID: one more than the last, and
// never below the server's clock in microseconds, so that a fence table
// that lost its rows (restored from an older backup, a replica promoted
// before it had the last ones) still hands out higher tokens.
func (l *Locker) tokenSQL(lock string) string {
	const clock = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED)"
	return "INSERT INTO " + tableIdent(l.cfg.table) + " (name, token) VALUES ('" + lock + "', LAST_INSERT_ID(" + clock + ")) " +
		"ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, " + clock + "))"
}

// tableIdent quotes a table name, a dot separating database and table.
func tableIdent(name string) string {
	if db, table, ok := strings.Cut(name, "."); ok {
		return ident(db) + "." + ident(table)
	}
	return ident(name)
}

// ident quotes an identifier with backticks.
func ident(s string) string {
	return "`" + strings.ReplaceAll(s, "`", "``") + "`"
}

// tableDDL creates the fence table if it is missing.
func (l *Locker) tableDDL() string {
	return "CREATE TABLE IF NOT EXISTS " + tableIdent(l.cfg.table) +
		" (name VARBINARY(64) NOT NULL PRIMARY KEY, token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
}

// ensureTable creates the fence table if it is missing, once per Locker
// (again after a failure).
func (l *Locker) ensureTable(ctx context.Context) error {
	select {
	case l.tableMu <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("herd: create the fence table: %w", context.Cause(ctx))
	}
	defer func() { <-l.tableMu }()
	if l.tableOK {
		return nil
	}
	if _, err := l.db.ExecContext(ctx, l.tableDDL()); err != nil {
		return fmt.Errorf("herd: create the fence table %s: %w", l.cfg.table, err)
	}
	l.tableOK = true
	return nil
}

// putBack returns c, which holds no lock, to the pool.
func (l *Locker) putBack(c *sql.Conn) { _ = c.Close() }

// discard closes c's connection instead of returning it to the pool: the
// server ends the session, and frees its locks.
func discard(c *sql.Conn) {
	_ = c.Raw(func(any) error { return driver.ErrBadConn })
	_ = c.Close()
}

// callErr wraps a database error of key's attempt.
func (l *Locker) callErr(ctx context.Context, key string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("herd: acquire %q: %w", key, errors.Join(context.Cause(ctx), err))
	}
	return fmt.Errorf("herd: acquire %q: %w", key, err)
}

// Locker satisfies herd's lock interface.
var _ herd.Lock[*Lease] = (*Locker)(nil)
