// Package zookeeper is herd's lock in ZooKeeper: [Locker] implements
// [herd.Lock] with leases of type *[Lease], on the lock recipe of
// ZooKeeper's documentation, with the lease length enforced by the server
// as a session timeout and the fencing token taken from the ensemble's
// transaction ids.
//
// It is a module of its own, github.com/herdkit/herd/lock/zookeeper, so
// that herd's core does not depend on a ZooKeeper client
// (github.com/go-zookeeper/zk):
//
//	go get github.com/herdkit/herd/lock/zookeeper
//
//	import herdzk "github.com/herdkit/herd/lock/zookeeper"
//
// # The lock
//
//	locks := herdzk.New([]string{"zk1:2181", "zk2:2181", "zk3:2181"}, nil)
//	defer locks.Close()
//	lease, err := locks.TryAcquire(ctx, "nightly-report", 30*time.Second)
//	if errors.Is(err, herd.ErrLeaseHeld) {
//		return nil // another instance runs it
//	}
//
// Each lock name has a parent node under [Options.Root] (default
// /herd/lock; the name is one path component, with bytes outside
// [A-Za-z0-9_:@=-] written as %XX), a container node that the server
// removes some time after its last child. An attempt creates an
// ephemeral sequential child, _c_<guid>-lock-<sequence>, and lists the
// children: the lowest sequence holds the lock. TryAcquire deletes its
// node again and fails with [herd.ErrLeaseHeld] when it is not the
// lowest. Acquire sets a watch on the node just before its own, and only
// that one, so a release wakes exactly one waiter (no herd effect); a
// waiter that gives up (its context, MaxWait, Close) closes its session,
// which deletes its node, before it returns. A create whose reply is lost
// with the connection may have been applied: the attempt then finds its
// node by its GUID once zk has reconnected, instead of queueing a second
// node behind its own orphan.
//
// # Sessions and the lease length
//
// Every attempt, and the lease it becomes, has a ZooKeeper session of its
// own, opened with the lease length as its session timeout. The server
// ends a session it has not heard from for that long (the client library
// pings every third of it while the process runs) and deletes its
// ephemeral node, so the lock is freed a lease length after its holder
// stopped talking to the server: a crash, a pause (GC, SIGSTOP, a frozen
// VM), a cut network. While the holder runs, its lease also has a local
// end, a lease length after the acquire or the last [Lease.Extend]: at
// that end, unless renewed, it is lost and its session is closed, which
// frees the lock at once.
//
// The server accepts session timeouts between its minSessionTimeout and
// maxSessionTimeout, by default 2 and 20 ticks (4s to 40s with the
// default tickTime of 2s), and answers any other request with the nearest
// bound. A Locker does not accept that: a lease length the server does
// not grant exactly (whole milliseconds) is [herd.ErrInvalidTTL], whose
// message names the bound, and the Locker remembers the bounds it learned
// to reject later attempts at once. Configure the servers' range for the
// lease lengths you use (zoo.cfg: tickTime, minSessionTimeout,
// maxSessionTimeout).
//
// The session timeout is fixed when the session opens. [Lease.Extend]
// moves the lease's local end by the ttl it is given, but a holder that
// stops talking to the server still loses the lock a session timeout (the
// acquire's lease length) later, which is what [Lease.Deadline] reports:
// the start of the last request the server answered on the session plus
// the lesser of the two, less 1% + 2ms for clock drift. The server cannot
// expire the session before it.
//
// Idle sessions (no node) are kept, up to [Options.IdleSessions] per
// Locker, for later attempts with the same lease length: an uncontended
// acquire on an idle session is three round trips (create, children,
// exists with a watch on its node), one of them a write, and Release is
// one (delete).
//
// # Tokens
//
// A lease's token is its node's czxid: the id of the transaction that
// created it. ZooKeeper orders every write of the ensemble in one
// sequence of transaction ids (epoch in the high 32 bits, counter in the
// low), unique and increasing across leader elections and restarts. The
// parent assigns sequence numbers in that same order, and holders take
// the lock in sequence order, so each holder of a name has a higher
// token than the one before (a server that lists the children has
// applied the attempt's own create, so it sees every node created before
// it). Tokens are as durable as the ensemble's transaction log: wiping
// every server's data directory starts them again at zero.
//
// # When Lost closes
//
//   - The node is deleted by anyone else, or by the server when the
//     session ends: its watch fires, within milliseconds.
//   - The session's connection is lost: zk reports it disconnected when
//     the server closes it (the session expired or was closed from
//     elsewhere, the server restarted, lost its quorum, shut down),
//     within milliseconds, or when the server has been silent for two
//     thirds of the session timeout. That is before the server can
//     expire the session (a session timeout after the last ping it
//     heard), as long as the server answered that ping within a third of
//     the timeout. A lease does not survive a lost connection, even one
//     zk could re-establish within the session: from the loss on, the
//     client cannot know whether its session still holds the lock. The
//     lease closes its session; the server deletes the node when it
//     hears the close, or when the session expires.
//   - The lease's local end passes without a renewal, or
//     [Lease.KeepAlive] reaches its cap; its session is closed then,
//     which frees the lock at once.
//
// # Guarantees and failure modes
//
// ZooKeeper is a CP system: a create or delete is acknowledged once a
// majority of the ensemble has logged it (fsync by default), and a
// server that loses contact with the majority stops serving its clients.
// So one holder at a time per name, while the ensemble has a quorum and
// the holder does not run past its [Lease.Deadline] without checking.
//
//   - Holder crashes: its session ends when the server sees the
//     connection close (at once) or at the session timeout.
//   - Holder pauses or is cut off: the server expires its session after
//     the lease length and a waiter takes the lock. A holder that wakes
//     up may not have noticed yet: pass the token to the protected
//     resource, which must refuse a lower one than it has seen
//     (github.com/herdkit/herd/lock/postgres's FencedTable, or
//     [herd.FencedStore]).
//   - A server restarts or the leader fails over: the leases connected to
//     it are lost at once (their connections drop); the ensemble keeps
//     their sessions until they expire, a session timeout later, and then
//     the next holder takes the lock. Waiters keep their place if zk
//     reconnects within their session timeout, and queue again otherwise.
//   - No quorum: nothing can be acquired or released; Acquire waits,
//     bounded by its context and MaxWait; TryAcquire fails with the
//     connection error.
//
// # Limits
//
//   - Each lease and each waiting Acquire holds a session and a TCP
//     connection to one server: ZooKeeper's maxClientCnxns (60 per client
//     address by default) bounds them per host. The client library
//     allocates about 3MB of buffers per session.
//   - A session per attempt costs a session create and, unless the
//     session is kept idle, a session close: two more writes to the
//     ensemble's log.
//   - The lease length is limited to the servers' session timeouts, in
//     whole milliseconds. A short one is fragile: zk gives up on a
//     connection that has been silent for two thirds of the session
//     timeout, so a lease of 300ms is lost whenever a ping's answer takes
//     200ms (a loaded host, a GC pause, a slow fsync on the server).
//     Prefer seconds.
//   - A lock name is 1 to [herd.MaxLockKeyBytes] (8 KiB) bytes long, any
//     bytes; an empty or a longer one is [herd.ErrInvalidKey] at once.
//     Escaped, a name at the bound is a path of about 24 KiB at most:
//     under the 128 KiB to which zk cuts the watches it sets again after
//     a reconnect, and far below the server's jute.maxbuffer (1 MiB by
//     default), above which the server drops the connection.
//   - A connection loss loses every lease on it, even when ZooKeeper keeps
//     the session: a ZooKeeper server's restart ends the leases of its
//     clients.
//
// # Tests
//
// The tests start their own standalone ZooKeeper servers with package
// [github.com/herdkit/herd/lock/zookeeper/zktest] (java and
// /usr/share/java/zookeeper.jar, see there), and the pause scenario uses a
// PostgreSQL server (HERD_PG_URL, default
// postgres://postgres@127.0.0.1:5432/postgres) for its fenced write, in a
// database it creates and drops. Without them they are skipped, unless
// HERD_REQUIRE_REDIS=1 (herd's CI variable for every server its tests
// need), which makes them fail.
package zookeeper
