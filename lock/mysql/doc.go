// Package mysql is herd's lock in MySQL or MariaDB, and the fenced write
// that makes a lock safe for correctness: [Locker] implements [herd.Lock]
// with leases of type *[Lease], and [FencedTable] refuses the late write
// of a holder whose lock has passed to another.
//
// It is a module of its own, github.com/herdkit/herd/lock/mysql, so that
// herd's core does not depend on go-sql-driver/mysql:
//
//	go get github.com/herdkit/herd/lock/mysql
//
//	import herdmysql "github.com/herdkit/herd/lock/mysql"
//
// # The lock
//
//	cfg, err := mysql.ParseDSN("app:secret@tcp(db:3306)/app")
//	...
//	locks := herdmysql.New(cfg, nil)
//	defer locks.Close()
//	lease, err := locks.TryAcquire(ctx, "nightly-report", 30*time.Second)
//	if errors.Is(err, herd.ErrLeaseHeld) {
//		return nil // another instance runs it
//	}
//
// A lease is a named lock, GET_LOCK(name, 0), held by a connection the
// lease keeps for itself (a *sql.Conn of the Locker's own pool). The lock
// is bound to that session: the server frees it when the session ends,
// whatever ends it: Release (RELEASE_LOCK), a crash of the holder, KILL,
// a server restart, or the session's idle limit. It is not transactional:
// a COMMIT or ROLLBACK on the connection does not touch it, and the
// Locker runs no transaction on it.
//
// The server's lock names are at most 64 characters, and they are
// server-wide (not per database). A herd key, of any bytes and 1 to
// [herd.MaxLockKeyBytes] (8 KiB) of them ([herd.ErrInvalidKey] at once
// otherwise: the bound is herd's, the same for every lock backend), is
// hashed to a fixed name: "herd:" and the first 192 bits of its
// SHA-256 in hex (53 characters). Two keys share a server lock only if
// their hashes collide; other code that takes named locks on the server
// shares the namespace, and should not use the "herd:" prefix.
//
// # The lease length
//
// The Locker sets the lease session's wait_timeout, the server's idle
// limit, to the lease length, and every Extend sets it again: a holder
// that stops talking to the server (paused, frozen, cut off) has its
// connection closed by the server, and its lock freed, once it has been
// silent that long, as a Redis lease expires. wait_timeout is a whole
// number of seconds, so the server's limit is the lease length rounded up
// to the next second (at least 1s): the server frees a lease of 300ms
// 1s after the holder's last statement, one of 1.5s after 2s. The
// lease's own Deadline is exact (the
// acquire's start plus ttl, less 1% + 2ms for clock drift), and a holder
// that is alive at its deadline releases the lock itself then, so the
// rounding only lengthens the time a frozen holder keeps others waiting.
// Every statement on the connection restarts the server's idle limit,
// the lease's periodic checks included, so the server frees the lock at
// the latest the rounded lease length after the holder's last contact. A
// lease is between 10ms and 365 days (wait_timeout's maximum); other
// lengths are [herd.ErrInvalidTTL].
//
// # Tokens
//
// Each lease's token comes from the fence table of the same database (one
// row per lock name, created if missing), advanced on the lease's
// connection right after GET_LOCK succeeded:
//
//	INSERT ... ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, <server clock in µs>))
//
// so tokens of a key strictly increase from one holder to the next, and
// they are as durable as the database's commits (with
// innodb_flush_log_at_trx_commit other than 1, a crash of the server can
// lose the last ones; the clock floor keeps the next tokens above them
// while the server's clock is right).
//
// # Waiting
//
// MySQL has no LISTEN/NOTIFY, and needs none: a waiting Acquire runs
// GET_LOCK with a timeout on its own connection, and the server grants
// the lock to one of its waiters the moment the holder releases it or its
// session ends, within a round trip. The wait is re-issued every
// [Options.WaitChunk] (10s by default) while it goes on. When the
// caller's context ends, or [Locker.Close] is called, the Locker ends the
// server's wait with KILL QUERY from another connection (the driver's own
// cancellation would only close the client's side, and the server would
// go on waiting, and take the lock for a moment). KILL QUERY needs no
// privilege for the user's own sessions, which these are.
//
// Acquire returns as soon as the KILL has ended the wait, and after 250ms
// at the most: when the server or the network does not answer (a link
// gone silent, dropping packets without a reset), neither the KILL nor
// the GET_LOCK's reply gets through, and the call does not wait for
// them. The wait is then left behind, never handed to a caller: the KILL
// is sent again until the GET_LOCK returns (at the latest at its own
// deadline, WaitChunk and 30s, or at Close, which closes its connection
// at once), and its connection is closed, not reused. The server may
// meanwhile grant that session the lock, if the holder releases it
// while the KILL cannot get through: nobody holds that lock as a lease,
// and the server frees it when it sees the connection close (on a link
// that stays silent, only when its TCP connection times out). On a link
// that answers, a cancelled Acquire has left nothing behind when it
// returns.
//
// # When Lost closes
//
// A lease checks its connection every [Options.Check] (1s by default)
// with one statement, IS_USED_LOCK(name) = CONNECTION_ID(), and closes
// Lost when it fails or returns false: within Check and a round trip of
// the session's end (KILL, wait_timeout, a restart, a broken
// connection). When the network goes silent the check waits, and Lost
// closes at the lease's deadline, which is before the server can free the
// lock. A lease that is lost while its connection is still up (its
// deadline passed, or KeepAlive reached its cap) is unlocked at once, so
// the next holder does not wait for wait_timeout.
//
// # Failure modes
//
//   - Connection loss: the server frees the lock when it sees the
//     connection close, or at wait_timeout when it does not; the holder's
//     Lost closes at its next check or at its deadline.
//   - Server restart: every named lock is gone, and every lease's Lost
//     closes at its next check. The fence table survives, so the next
//     tokens are higher.
//   - Failover to a replica: named locks are not replicated. A promoted
//     replica knows no lock, and a new holder can take one that the old
//     primary's holder still believes it holds until its next check; the
//     fence table's rows may lag too, which the clock floor of the tokens
//     covers while clocks are right. Use [FencedTable] (or any check of
//     the token where the data lives) for correctness, and keep clients
//     on one server: a proxy that sends statements of one connection to
//     different servers cannot carry a session lock. In a Galera or Group
//     Replication cluster, too, a named lock is held on one node only:
//     every Locker of a key must connect to the same node.
//   - A link that goes silent before a wait began (during an attempt's
//     GET_LOCK(name, 0) or the token's statement): those
//     statements wait as the driver does, bounded by the caller's context
//     and the DSN's readTimeout and writeTimeout. Set them (or pass a
//     context with a deadline): without them a statement on a link that
//     drops packets waits for the operating system's TCP timeout, which
//     takes minutes.
//   - A frozen holder: the server frees its lock after its lease length
//     rounded up to a second; when it resumes, its Lost closes at the
//     next check, and its late writes carry an old token.
//
// # Fenced writes
//
// No lock stops a holder that paused past its lease from waking up and
// writing. [FencedTable] makes the write conditional in the database that
// owns the data:
//
//	UPDATE accounts SET balance = ?, fence = ? WHERE id = ? AND fence <= ?
//
// so the late write of an older token changes nothing, and is reported as
// [herd.ErrFenced] (with the row's fence and the token), distinct from
// [herd.ErrNotFound] for a missing row, with or without the
// clientFoundRows option. The same holding's repeated write, with the
// same token, is accepted, as [herd.FencedStore] accepts it:
// docs/locks.md ("Fencing tokens") has the rule, its reason, and what
// the tokens' values are. Use it with the token of any herd lock.
//
// The table is yours; it needs a unique key and a BIGINT fence column
// that starts at 0, in MySQL or MariaDB. For example:
//
//	CREATE TABLE accounts (
//	    id      BIGINT NOT NULL PRIMARY KEY,
//	    balance BIGINT NOT NULL,
//	    fence   BIGINT NOT NULL DEFAULT 0
//	) ENGINE=InnoDB;
//
// An existing table gets the column with
//
//	ALTER TABLE accounts ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
//
// and then:
//
//	err := herdmysql.FencedTable{Table: "accounts"}.Update(ctx, db, id, lease.Token(),
//		map[string]any{"balance": balance})
//	if errors.Is(err, herd.ErrFenced) {
//		return err // a newer holder has written this row: drop this result
//	}
//
// # Limits
//
//   - Each held lease holds one server connection (max_connections).
//   - Lock names are server-wide; keys whose hashes collide exclude each
//     other (never two holders; a false contention), with a chance of
//     about n²/2¹⁹³ for n keys in use.
//   - The server's limit on a silent holder is in whole seconds (above).
//   - With thread_handling=pool-of-threads the server enforces
//     wait_timeout less precisely.
//   - The Locker's user needs CREATE on the database unless the fence
//     table exists, and INSERT and UPDATE on it.
//   - Ending a cancelled wait takes a connection of the Locker's pool for
//     the KILL QUERY: when the server refuses new connections
//     (max_connections), Acquire still returns within 250ms, but the
//     server's wait ends only when its GET_LOCK does, within
//     [Options.WaitChunk], and a release in that time grants the lock to
//     the abandoned session until its connection closes.
//
// # Tests
//
// The tests need a MySQL or MariaDB server (HERD_MYSQL_DSN, default
// root@tcp(127.0.0.1:3306)/test), where they create a database with a
// random name and drop it at the end. Without a server they are skipped,
// unless HERD_REQUIRE_REDIS=1 (herd's CI variable for every server its
// tests need), which makes them fail.
package mysql
