// Package etcd is herd's lock in etcd: [Locker] implements [herd.Lock]
// with leases of type *[Lease], on an etcd v3 cluster through the
// caller's go.etcd.io/etcd/client/v3 client.
//
// It is a module of its own, github.com/herdkit/herd/lock/etcd, so that
// herd's core does not depend on the etcd client:
//
//	go get github.com/herdkit/herd/lock/etcd
//
//	import herdetcd "github.com/herdkit/herd/lock/etcd"
//
// # The lock
//
//	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"etcd-1:2379", "etcd-2:2379", "etcd-3:2379"}})
//	...
//	locks := herdetcd.New(cli, nil)
//	defer locks.Close()
//	lease, err := locks.TryAcquire(ctx, "nightly-report", 30*time.Second)
//	if errors.Is(err, herd.ErrLeaseHeld) {
//		return nil // another instance runs it
//	}
//	defer lease.Release(ctx)
//	lease.KeepAlive(10 * time.Minute)
//
// Each holding, and each Acquire waiting for one, is a key of its own
// under the lock's prefix ([Options.Prefix], then the escaped lock name),
// attached to an etcd lease of its own, granted with the herd lease
// length. The holder is the key with the lowest create revision: waiters
// queue in the order they arrived, as with etcd's concurrency.Mutex. A
// waiter watches only the key just before its own, so a release wakes
// exactly one waiter, which checks (one round trip) that it now heads the
// queue; a waiter that gives up revokes its etcd lease, which deletes its
// key, and the waiter behind it moves up to watch the key before it. A
// re-check every [Options.Recheck] (5s by default) covers a missed watch
// event. TryAcquire never queues: it puts its key only if the lock's
// range is empty, in one transaction, and otherwise fails at once with
// [herd.ErrLeaseHeld].
//
// An etcd lease lives while it is renewed, and its keys go with it. One
// etcd lease per holding, rather than one per Locker as etcd's
// concurrency.Session has, is what lets each holding have its own length,
// be extended, run out when not renewed and be lost alone.
//
// # Guarantees
//
// etcd is a CP system: every change (a grant, a put, a delete, a renewal)
// is acknowledged only once a majority of the cluster's members has
// committed it to their Raft logs, and the Locker's reads are
// linearizable. So two holders of one lock never both have their
// acquires acknowledged, whatever member each client talks to, and a
// member cut off from the majority can neither grant, renew nor hand out
// a lock (its requests fail or time out, [Options.Timeout]).
//
// The token ([Lease.Token]) is the create revision of the holder's key:
// etcd's revision is one counter for the whole cluster, advanced by every
// change and as durable as the committed log, and each holder's key was
// created after the key of the holder before it, so tokens of one lock
// strictly increase from one holder to the next, across Lockers,
// processes, server restarts and leader changes. They are not
// consecutive. Extend keeps the token, even when it moves the key to a
// new etcd lease.
//
// # The lease length
//
// etcd lease TTLs are whole seconds. A herd ttl must be between 1s and
// clientv3.MaxLeaseTTL seconds (9,000,000,000s, 2,500,000h), or it is
// [herd.ErrInvalidTTL]; the server gets it rounded up to the next whole
// second (1.5s is an etcd lease of 2s), while the lease's Deadline keeps
// the ttl asked for, less 1% + 2ms for clock drift, counted from the
// request's start. The server frees a lock no sooner than the holder's
// Deadline, since it counts the TTL from the request's arrival.
//
// etcd raises a TTL below its minimum to that minimum without saying so:
// 1.5 election timeouts, rounded up to whole seconds, which is 2s for
// etcd's default election timeout of 1s. A 1s herd lease on such a
// cluster still has its 1s Deadline, and Lost closes then, but a holder
// that crashes keeps the lock for 2s.
//
// Extend(ttl) renews the etcd lease when ttl rounds to its TTL (a
// keep-alive, then a check that the key is still the lease's), and
// otherwise moves the key to a new etcd lease of ttl's TTL, in a
// transaction that checks the key is still the lease's, and revokes the
// old one. KeepAlive(maxHold) renews between a third and a half of the
// lease length; etcd cannot shorten an etcd lease, so at the cap the
// lease is revoked (Lost closes then), rather than given a last, shorter
// renewal.
//
// # When Lost closes
//
// A held lease watches its own key. Lost closes as soon as the watch
// delivers the key's deletion: within milliseconds of a revoke (from any
// client) or of the server expiring the etcd lease (etcd sweeps expired
// leases every half second), while the client's watch stream is up. At
// the latest it closes at the lease's Deadline, the grant's or last
// successful renewal's start plus the lease length less the drift
// allowance, which comes before the server can free the lock: that is
// the bound when the client cannot reach the cluster. A renewal that
// finds the etcd lease gone closes it too. A lease lost at its Deadline
// or at KeepAlive's cap is revoked at once, when etcd answers, so the
// next holder need not wait for the server's TTL.
//
// # Failure modes
//
//   - A member restarts, or the leader changes: etcd keeps its keys and
//     leases, and a new leader gives every etcd lease its full TTL again
//     (plus an election timeout) when it takes over. A holder whose
//     renewals reach the cluster again before its Deadline keeps the
//     lock, and its waiters keep their places (their watches resume).
//     An Acquire whose join of the queue loses its reply to the restart
//     returns that error instead (its etcd lease is revoked, so it leaves
//     no key in the queue).
//     A holder that gave up meanwhile (Lost closed at its Deadline, its
//     revoke unanswered) holds the lock on the server until that new TTL
//     runs out; then the next waiter takes it, with a higher token.
//   - A partition: a client on a minority side (or with no route to the
//     cluster) cannot renew, and its Lost closes at the Deadline; the
//     majority side expires the etcd lease once its TTL since the last
//     renewal it committed has passed, which is after that Deadline, and
//     hands the lock on. A member cut off from the leader ends its
//     watches (they require a leader), and waiters re-check when it has
//     one again.
//   - A holder that pauses or stalls past its lease (a GC pause, a
//     frozen VM): its renewals stop, the server expires its etcd lease,
//     the next waiter takes the lock, and the paused holder may still
//     write when it wakes. No lock prevents that: pass the token to the
//     resource and make the write conditional on it (herd.FencedStore,
//     or lock/postgres's FencedTable).
//   - The cluster is down or unreachable: TryAcquire and Acquire fail
//     with the client's error once [Options.Timeout] has passed (the
//     client waits for a connection rather than fail at once), never
//     with ErrLeaseHeld.
//
// # Limits
//
//   - Each holding and each waiting Acquire is one etcd lease, one key
//     and one watch (a waiter's of its predecessor, a holder's of its
//     own key), on the client's shared watch stream.
//   - [Locker.Close] does not release leases: they use the caller's
//     client and keep working until it is closed.
//   - Lockers that share locks must share [Options.Prefix]. Another
//     program writing under the prefix can break the queue.
//   - A lock name is 1 to [herd.MaxLockKeyBytes] (8 KiB) bytes long, any
//     bytes; an empty or a longer one is [herd.ErrInvalidKey] at once. A
//     request holds the escaped name (up to three bytes for one) a few
//     times, so a name at the bound makes a request of under 100 KiB,
//     far below the client's 2 MiB and the server's 1.5 MiB
//     (--max-request-bytes), which a name of about 512 KiB would exceed
//     (gRPC's ResourceExhausted).
//   - The etcd server must be v3.4 or later (the tests run against 3.4,
//     with the v3.7 client).
//
// # Tests
//
// The tests start their own etcd servers (package etcdtest: HERD_ETCD_BIN,
// else /usr/bin/etcd, else etcd on the PATH), on free loopback ports with
// temporary data directories, and the pause test writes through
// lock/postgres's FencedTable in a PostgreSQL database (HERD_PG_URL,
// default postgres://postgres@127.0.0.1:5432/postgres) with a random
// name, which it drops at the end. Without etcd, or without PostgreSQL
// for the pause test, they are skipped, unless HERD_REQUIRE_REDIS=1
// (herd's CI variable for every server its tests need), which makes them
// fail.
package etcd
