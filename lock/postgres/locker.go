package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/lease"
	"github.com/herdkit/herd/internal/lockgate"
	"github.com/herdkit/herd/internal/lockopt"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// Options configures a [Locker]. A nil *Options, and every zero field,
// means the documented default. Invalid values make [New] panic: they are
// programming errors, not request-time conditions.
type Options struct {
	// Table is the fence table: one row per lock name with the last token
	// handed out. The Locker creates it, if missing, before its first
	// acquire (its role then needs CREATE on the schema), or it is created
	// beforehand as
	//	CREATE TABLE herd_lock_fence (name bytea PRIMARY KEY, token bigint NOT NULL)
	// Default:
	// "herd_lock_fence" in the connection's search path; a name with a
	// dot is taken as schema.table.
	Table string

	// Channel is the LISTEN/NOTIFY channel on which releases are
	// announced to waiting Acquires, across every Locker of the database.
	// Lockers that share a fence table must share the channel. Default:
	// "herd_lock".
	Channel string

	// MaxWait bounds how long [Locker.Acquire] waits for a held lock, on
	// top of the caller's context. Default: three times the lease length.
	MaxWait time.Duration

	// PollMin and PollMax bound the fallback re-check of a waiting
	// Acquire, for the releases no notification announces (a holder
	// whose process died, or that was paused until its lease ran out) and
	// for the time the Locker's listening connection is down: the first
	// re-check after a failed attempt comes after about PollMin, each
	// further one after twice as long (with jitter), up to PollMax; a
	// notification starts the sequence again. Defaults: 50ms and 1s.
	PollMin, PollMax time.Duration

	// IdleConns is how many idle connections the Locker keeps for its
	// attempts. A held lease has a connection of its own, outside this
	// count. Default: 2.
	IdleConns int
}

// config is Options with every default applied.
type config struct {
	table, channel   string
	maxWait          time.Duration
	pollMin, pollMax time.Duration
	idle             int
}

func (o *Options) resolve() config {
	var in Options
	if o != nil {
		in = *o
	}
	c := config{table: "herd_lock_fence", channel: "herd_lock", maxWait: in.MaxWait,
		pollMin: 50 * time.Millisecond, pollMax: time.Second, idle: 2}
	if in.Table != "" {
		c.table = in.Table
	}
	if in.Channel != "" {
		c.channel = in.Channel
	}
	lockopt.NonNegative("postgres", map[string]time.Duration{"MaxWait": in.MaxWait, "PollMin": in.PollMin, "PollMax": in.PollMax})
	if in.PollMin > 0 {
		c.pollMin = in.PollMin
	}
	if in.PollMax > 0 {
		c.pollMax = in.PollMax
	}
	if c.pollMax < c.pollMin {
		panic(fmt.Sprintf("postgres: Options.PollMax (%v) is below PollMin (%v)", c.pollMax, c.pollMin))
	}
	c.idle = lockopt.Count("postgres", "IdleConns", in.IdleConns, c.idle)
	return c
}

// The lease lengths a Locker accepts: at least 10ms (1% + 2ms of every
// lease is the clock-drift allowance) and at most what PostgreSQL's
// idle_session_timeout can hold (2^31−1 ms, about 24.8 days).
const (
	minLease = 10 * time.Millisecond
	maxLease = (1<<31 - 1) * time.Millisecond
)

// ttls checks a lease length against them.
var ttls = lockopt.TTLRange{Min: minLease, Max: maxLease, Lease: "a PostgreSQL lease", Why: ", PostgreSQL's idle_session_timeout limit"}

// Locker is a lock in PostgreSQL: each lease is a session-level advisory
// lock (pg_try_advisory_lock) held by a connection of its own, with a
// fencing token from the fence table of the same database. It implements
// [herd.Lock] with leases of type *[Lease].
//
// The lease length is enforced by the server: the lease's connection runs
// with idle_session_timeout set to it, so a holder that sends nothing for
// that long (its process paused or cut off) has its session ended by
// PostgreSQL, which frees the lock. Extend sets the timeout again, which
// also restarts it. A holder that crashes frees the lock as soon as the
// server sees its connection close.
//
// A lock name is hashed (SHA-256, the first 64 bits) to the advisory lock
// key, so two names whose hashes collide exclude each other: neither can
// be held while the other is, although their tokens stay separate. With n
// names in use the chance of any collision is about n²/2⁶⁵ (for a million
// names, 3 in 100 million). Other code that takes advisory locks in the
// same database shares the key space.
//
// A Locker is safe for concurrent use. Call [Locker.Close] when done.
type Locker struct {
	conf *pgx.ConnConfig // a copy, for the Locker's own connections
	cfg  config
	ln   *listener

	idle chan *pgx.Conn // connections for attempts, none of them holding a lock

	tableMu chan struct{} // a semaphore of one: guards tableOK, waited for with the caller's context
	tableOK bool          // the fence table exists

	gate lockgate.Gate // the running calls, and Close

	beforeUnlock func(*pgx.Conn) // a test's hook, run before a lease's unlock statement
}

// New returns a Locker whose connections are opened with conf (for
// example pgx.ParseConfig(url), or pool.Config().ConnConfig of a pgxpool).
// It opens no connection until it is used: each attempt takes an idle
// connection of the Locker's or dials one, each held lease keeps its
// connection until it ends, and the first Acquire that waits opens the
// connection that LISTENs for releases. A nil opt means the defaults of
// [Options]. New panics on a nil conf or an invalid option.
//
// The Locker sets its connections' context handler to pgconn's deadline
// handler (a cancelled context interrupts the read, with no cancel request
// that could reach a later statement).
func New(conf *pgx.ConnConfig, opt *Options) *Locker {
	if conf == nil {
		panic("postgres: New with a nil *pgx.ConnConfig")
	}
	cfg := opt.resolve()
	l := &Locker{conf: conf.Copy(), cfg: cfg, tableMu: make(chan struct{}, 1)}
	l.conf.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	l.idle = make(chan *pgx.Conn, l.cfg.idle)
	l.gate.Init()
	l.ln = newListener(l)
	return l
}

// Close stops the Locker: TryAcquire and Acquire called after it return
// [herd.ErrClosed], an Acquire still waiting returns it at once, and the
// listening connection and the idle connections are closed. Leases
// already handed out are not released by Close: each keeps its own
// connection, and its Extend, KeepAlive and Release keep working, so a
// holder can finish its work and give the lock back. Close is idempotent.
func (l *Locker) Close() error {
	if !l.gate.Close() {
		return nil
	}
	l.ln.wait()
	for {
		select {
		case c := <-l.idle:
			closeConn(c)
		default:
			return nil
		}
	}
}

// closeConn closes c, bounded in time (the Terminate message is one write).
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// conn returns an idle connection, or dials one.
func (l *Locker) conn(ctx context.Context) (*pgx.Conn, error) {
	for {
		select {
		case c := <-l.idle:
			if c.IsClosed() {
				continue
			}
			return c, nil
		default:
			return pgx.ConnectConfig(ctx, l.conf)
		}
	}
}

// putBack returns c, which holds no lock, to the idle connections, or
// closes it.
func (l *Locker) putBack(c *pgx.Conn) {
	if c.IsClosed() {
		return
	}
	if l.gate.Root().Err() == nil {
		select {
		case l.idle <- c:
			return
		default:
		}
	}
	closeConn(c)
}

// lockKey is the advisory lock key of a lock name.
func lockKey(name string) int64 {
	sum := sha256.Sum256([]byte("herd-lock:" + name))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// maxRowName is the longest name kept as it is in the fence table; a
// btree index entry holds at most about 2.7KB.
const maxRowName = 1024

// rowName is the fence table's key of a lock name: the name itself, or,
// for a name longer than maxRowName, "herd-sha256:" and its SHA-256. Two
// names that share a row (a short name spelled as another's digest) share
// a counter, which still increases from one holder of each to the next.
func rowName(name string) []byte {
	if len(name) <= maxRowName {
		return []byte(name)
	}
	sum := sha256.Sum256([]byte(name))
	return append([]byte("herd-sha256:"), sum[:]...)
}

// TryAcquire takes the lock on name for ttl, or fails at once with an
// error wrapping [herd.ErrLeaseHeld] when another owner holds it. It takes
// two round trips when it wins (the advisory lock, then the token and the
// session's idle limit) and one when the lock is held, plus a connect
// when the Locker has no idle connection left (the winner keeps its
// connection); the Locker's first attempt also creates the fence table if
// it is missing. Any string of 1 to [herd.MaxLockKeyBytes] bytes is a
// valid name ([herd.ErrInvalidKey] otherwise, before any request); ttl
// must be between 10ms and 2^31−1 ms ([herd.ErrInvalidTTL]). A database
// error is returned wrapped, and after [Locker.Close] it returns
// [herd.ErrClosed]. A context that ends during the call ends the
// attempt's connection, which frees whatever the attempt took.
func (l *Locker) TryAcquire(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	if err := l.gate.Enter(); err != nil {
		return nil, err
	}
	defer l.gate.Leave()
	if err := ttls.Prepare(name, ttl); err != nil {
		return nil, err
	}
	ctx, cancel := l.gate.Bound(ctx)
	defer cancel()
	return l.try(ctx, name, lockKey(name), ttl)
}

// Acquire takes the lock on name for ttl, waiting while another owner
// holds it. The wait is woken by the holder's release, which NOTIFYs the
// Locker's channel; a bounded re-check ([Options.PollMin] to
// [Options.PollMax]) covers releases that nobody announces. It is bounded
// by ctx and by [Options.MaxWait]: when ctx ends the error joins
// [herd.ErrLeaseHeld] and ctx.Err(); when MaxWait runs out it wraps
// [herd.ErrWaitTimeout] and ErrLeaseHeld. A database error ends the wait
// at once and is returned wrapped. Name and ttl are checked as in
// [Locker.TryAcquire]. After [Locker.Close], and when Close ends its
// wait, it returns [herd.ErrClosed].
func (l *Locker) Acquire(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	if err := l.gate.Enter(); err != nil {
		return nil, err
	}
	defer l.gate.Leave()
	if err := ttls.Prepare(name, ttl); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("herd: acquire %q: %w", name, err)
	}
	key := lockKey(name)
	bctx, cancel := l.gate.Bound(ctx)
	defer cancel()
	got, err := l.try(bctx, name, key, ttl)
	if got != nil || !errors.Is(err, herd.ErrLeaseHeld) {
		return got, l.gate.AcquireErr(ctx, name, err)
	}

	maxWait := l.cfg.maxWait
	if maxWait == 0 {
		maxWait = 3 * ttl
	}
	limit := time.NewTimer(maxWait)
	defer limit.Stop()
	// Subscribe, then try again at once: a release between the first
	// attempt and the subscription is seen by that attempt, every later
	// one arrives as a notification (or, while the listening connection
	// is not up, through the wake-up the listener sends when it is).
	sub := l.ln.subscribe(key)
	defer sub.release()
	backoff := l.cfg.pollMin
	poll := time.NewTimer(0)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, errors.Join(herd.ErrLeaseHeld, ctx.Err())
		case <-l.gate.Root().Done():
			return nil, fmt.Errorf("%w: acquire %q", herd.ErrClosed, name)
		case <-limit.C:
			return nil, fmt.Errorf("%w after %v: %w", herd.ErrWaitTimeout, maxWait, herd.ErrLeaseHeld)
		case <-sub.c:
			backoff = l.cfg.pollMin
		case <-poll.C:
		}
		got, err = l.try(bctx, name, key, ttl)
		if got != nil || !errors.Is(err, herd.ErrLeaseHeld) {
			return got, l.gate.AcquireErr(ctx, name, err)
		}
		poll.Reset(lease.Jitter(backoff))
		backoff = min(2*backoff, l.cfg.pollMax)
	}
}

// try runs one attempt: the advisory lock on a connection of its own,
// then, when won, the token and the session's idle limit.
func (l *Locker) try(ctx context.Context, name string, key int64, ttl time.Duration) (*Lease, error) {
	if err := l.ensureTable(ctx); err != nil {
		return nil, err
	}
	c, err := l.conn(ctx)
	if err != nil {
		return nil, l.callErr(ctx, name, fmt.Errorf("connect: %w", err))
	}
	start := time.Now()
	var won bool
	if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&won); err != nil {
		closeConn(c) // the lock may have been taken: ending the session frees it
		return nil, l.callErr(ctx, name, err)
	}
	if !won {
		l.putBack(c)
		return nil, fmt.Errorf("%w: %q", herd.ErrLeaseHeld, name)
	}
	var token int64
	err = c.QueryRow(ctx, l.tokenSQL(), rowName(name), strconv.FormatInt(ttl.Milliseconds(), 10)).Scan(&token, nil)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		// The fence table was dropped since the Locker created it:
		// create it again, on this connection (which holds the lock),
		// and take the token once more.
		if _, err = c.Exec(ctx, l.tableDDL()); err == nil {
			err = c.QueryRow(ctx, l.tokenSQL(), rowName(name), strconv.FormatInt(ttl.Milliseconds(), 10)).Scan(&token, nil)
		}
	}
	if err != nil {
		closeConn(c)
		return nil, l.callErr(ctx, name, fmt.Errorf("take the token: %w", err))
	}
	deadline := start.Add(ttl - lease.Drift(ttl))
	if time.Until(deadline) <= 0 {
		closeConn(c)
		return nil, fmt.Errorf("%w: %q: the acquire's reply came after the lease's validity", herd.ErrLeaseHeld, name)
	}
	return newLease(l, c, name, key, uint64(token), ttl, start, deadline), nil
}

// callErr wraps a database error of name's attempt.
func (l *Locker) callErr(ctx context.Context, name string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("herd: acquire %q: %w", name, errors.Join(context.Cause(ctx), err))
	}
	return fmt.Errorf("herd: acquire %q: %w", name, err)
}

// tokenSQL advances name's row of the fence table and returns the new
// token, and sets the session's idle limit to the lease length, in one
// statement: $1 is the name, $2 the limit in milliseconds. The token is
// one more than the last, and never below the server's clock in
// microseconds, so that a fence table that lost its rows (deleted,
// dropped, restored from an older backup, or the last commits lost with
// synchronous_commit off) still hands out higher tokens.
func (l *Locker) tokenSQL() string {
	const clock = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
	t := tableIdent(l.cfg.table)
	return "WITH f AS (INSERT INTO " + t + " AS f (name, token) VALUES ($1, " + clock + ") " +
		"ON CONFLICT (name) DO UPDATE SET token = GREATEST(f.token + 1, " + clock + ") RETURNING token) " +
		"SELECT token, set_config('idle_session_timeout', $2, false) FROM f"
}

// tableIdent quotes a table name, a dot separating schema and table.
func tableIdent(name string) string {
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			return pgx.Identifier{name[:i], name[i+1:]}.Sanitize()
		}
	}
	return pgx.Identifier{name}.Sanitize()
}

// tableDDL creates the fence table if it is missing.
func (l *Locker) tableDDL() string {
	return "CREATE TABLE IF NOT EXISTS " + tableIdent(l.cfg.table) + " (name bytea PRIMARY KEY, token bigint NOT NULL)"
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
	c, err := l.conn(ctx)
	if err != nil {
		return fmt.Errorf("herd: create the fence table: connect: %w", err)
	}
	ddl := l.tableDDL()
	for try := 0; ; try++ {
		_, err = c.Exec(ctx, ddl)
		var pgErr *pgconn.PgError
		// Two sessions creating the table at once: one of them fails on
		// the catalog's unique index; the table exists then.
		if try == 0 && errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07") {
			continue
		}
		break
	}
	if err != nil {
		closeConn(c)
		return fmt.Errorf("herd: create the fence table %s: %w", l.cfg.table, err)
	}
	l.putBack(c)
	l.tableOK = true
	return nil
}

// hint announces, on a connection of the Locker's, that the lock on key
// may be free: a lease's connection ended without a release. It first
// waits, up to wait, until the server has ended that session (pid) and so
// freed its locks, so that a waiter woken by it finds the lock free. A
// lease keeps working after Close, so a closed Locker announces too, on a
// connection it closes after.
func (l *Locker) hint(key int64, pid uint32, wait time.Duration) {
	root := context.Background()
	if l.gate.Enter() == nil {
		defer l.gate.Leave()
		root = l.gate.Root()
	}
	ctx, cancel := context.WithTimeout(root, wait)
	defer cancel()
	c, err := l.conn(ctx)
	if err != nil {
		return
	}
	const q = "SELECT pg_notify($1, $2) FROM (SELECT 1) AS one " +
		"WHERE NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = $3)"
	backoff := time.Millisecond
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			l.putBack(c)
			return
		case <-timer.C:
		}
		tag, err := c.Exec(ctx, q, l.cfg.channel, strconv.FormatInt(key, 10), int64(pid))
		if err != nil {
			closeConn(c)
			return
		}
		if tag.RowsAffected() > 0 {
			l.putBack(c)
			return
		}
		timer.Reset(backoff)
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// hintMaxWait bounds how long past a lease's deadline hint waits for a
// silent session to end: a drift allowance, which is 1% of the lease.
const hintMaxWait = time.Minute

// Locker satisfies herd's lock interface.
var _ herd.Lock[*Lease] = (*Locker)(nil)
