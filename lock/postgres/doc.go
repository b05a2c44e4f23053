// Package postgres is herd's lock in PostgreSQL, and the fenced write
// that makes a lock safe for correctness: [Locker] implements [herd.Lock]
// with leases of type *[Lease], and [FencedTable] refuses the late write
// of a holder whose lock has passed to another.
//
// It is a module of its own, github.com/herdkit/herd/lock/postgres, so
// that herd's core does not depend on pgx:
//
//	go get github.com/herdkit/herd/lock/postgres
//
//	import herdpg "github.com/herdkit/herd/lock/postgres"
//
// # The lock
//
//	conf, err := pgx.ParseConfig("postgres://app@db/app")
//	...
//	locks := herdpg.New(conf, nil)
//	defer locks.Close()
//	lease, err := locks.TryAcquire(ctx, "nightly-report", 30*time.Second)
//	if errors.Is(err, herd.ErrLeaseHeld) {
//		return nil // another instance runs it
//	}
//
// A lease is a session-level advisory lock, pg_try_advisory_lock on the
// 64-bit hash of the lock name, held by a connection the lease keeps for
// itself. PostgreSQL frees it when that session ends, whatever ends it:
// Release, a crash of the holder, pg_terminate_backend, a server restart,
// or the session's idle limit. The Locker sets that limit
// (idle_session_timeout, PostgreSQL 14 and later) to the lease length, and
// every Extend sets it again, so a holder that stops talking to the server
// (paused, frozen, cut off) loses the lock once its lease has run out, as
// a Redis lease expires.
//
// Each lease's token comes from the fence table of the same database (one
// row per name, keyed by the name itself, or by its SHA-256 for a name
// longer than 1KB, which a btree index could not hold; advanced with INSERT ... ON CONFLICT DO UPDATE ...
// RETURNING on the lease's connection while it holds the lock), and is
// never below the server's clock in microseconds since 1970:
//
//	... DO UPDATE SET token = GREATEST(token + 1, <server clock in µs>)
//
// so tokens of a name strictly increase from one holder to the next, and
// the clock floor keeps them increasing where the table lost its last
// rows (deleted or dropped, which the next acquire repairs; restored from
// an older backup; the last commits lost in a crash with
// synchronous_commit off) as long as the server's clock is right.
//
// Acquire waits with LISTEN/NOTIFY: a Release unlocks and NOTIFYs in one
// statement, and a Locker's one listening connection wakes its waiters on
// that key. A bounded re-check with backoff ([Options.PollMin] to
// [Options.PollMax], 50ms to 1s by default) covers the releases that
// nobody announces: a holder whose process died (when the holder's
// process saw its connection end, or a lease that ran out found its
// session already ended, it announces it too), and the time the
// listening connection is down.
//
// # When Lost closes
//
// A lease watches its connection, without sending anything, and closes
// Lost as soon as the client can tell that the session ended: within
// milliseconds when the server ends it (pg_terminate_backend, the idle
// limit, a restart) on a network that delivers the server's last message
// or the connection's close. Otherwise (a network that goes silent) Lost
// closes at the lease's deadline, the acquire or last renewal's start plus
// the lease length less 1% + 2ms, which is before the server's idle limit
// can free the lock. A lease that is lost while its connection is still
// up (its deadline passed, or KeepAlive reached its cap) is unlocked at
// once, so the next holder does not wait for the idle limit.
//
// # Fenced writes
//
// No lock stops a holder that paused past its lease from waking up and
// writing. [FencedTable] makes the write conditional in the database that
// owns the data:
//
//	UPDATE accounts SET balance = $3, fence = $2 WHERE id = $1 AND fence <= $2
//
// so the late write of an older token changes nothing, and is reported as
// [herd.ErrFenced] (with the row's fence and the token), distinct from
// [herd.ErrNotFound] for a missing row. The same holding's repeated
// write, with the same token, is accepted, as [herd.FencedStore] accepts
// it: docs/locks.md ("Fencing tokens") has the rule, its reason, and what
// the tokens' values are. Use it with the token of any herd lock.
//
// The table is yours; it needs a unique key and a bigint fence column
// that starts at 0. For example:
//
//	CREATE TABLE accounts (
//	    id      bigint PRIMARY KEY,
//	    balance bigint NOT NULL,
//	    fence   bigint NOT NULL DEFAULT 0
//	);
//
// An existing table gets the column with
//
//	ALTER TABLE accounts ADD COLUMN fence bigint NOT NULL DEFAULT 0;
//
// and then:
//
//	err := herdpg.FencedTable{Table: "accounts"}.Update(ctx, pool, id, lease.Token(),
//		map[string]any{"balance": balance})
//	if errors.Is(err, herd.ErrFenced) {
//		return err // a newer holder has written this row: drop this result
//	}
//
// # Limits
//
//   - Each held lease holds one server connection (max_connections).
//   - A lock name's 64-bit hash is the advisory key, shared with any
//     other code taking advisory locks in the database: names whose
//     hashes collide exclude each other (never two holders; a false
//     contention), with a chance of about n²/2⁶⁵ for n names in use.
//   - A lock name is 1 to [herd.MaxLockKeyBytes] (8 KiB) bytes long, any
//     bytes; an empty or a longer one is [herd.ErrInvalidKey] at once.
//     PostgreSQL itself would take longer names (it gets only their
//     hashes and, in the fence table, a name or its SHA-256): the bound
//     is herd's, the same for every lock backend.
//   - The lease length is at most 2^31−1 ms (about 24.8 days), the limit
//     of idle_session_timeout.
//   - A connection pooler in transaction mode (PgBouncer) cannot carry a
//     session-level lock: connect the Locker to PostgreSQL itself or to a
//     pooler in session mode.
//
// # Tests
//
// The tests need a PostgreSQL server (HERD_PG_URL, default
// postgres://postgres@127.0.0.1:5432/postgres), where they create a
// database with a random name and drop it at the end. Without a server
// they are skipped, unless HERD_REQUIRE_REDIS=1 (herd's CI variable for
// every server its tests need), which makes them fail.
package postgres
