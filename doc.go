// Package herd stops cache stampedes across a whole fleet of service
// instances that share a Redis.
//
// When a hot key is missing or expiring, every instance of a service sees
// the miss at once and, unprotected, every one of them rebuilds it from
// the database. With herd one request in the whole cluster rebuilds the
// value; every other request, in every process, waits and receives the
// new value the moment it is written, by notification rather than polling.
//
// Two tiers do it: a local single-flight, so each process sends at most
// one rebuild of a key to Redis at a time, and a short lease in Redis per
// key, so one process in the cluster rebuilds. A hit is one GET, shared
// by the concurrent callers of a key in a process (docs/measured.md has
// what it costs beside a plain GET). The lease length is calibrated from the measured rebuild
// time and renewed by a watchdog while the rebuild runs, and the lease's
// fence keeps a rebuild that started before a write from storing its
// older value after it.
//
// The same lease is also a lock of its own ([Locker], [Redlock], and the
// backends behind [Lock]), and package github.com/herdkit/herd/middleware
// puts the cache in front of net/http and chi handlers.
//
// # Cache-aside
//
//	c := herd.New(rdb, nil) // rdb: *redis.Client, *redis.ClusterClient, *redis.Ring, ...
//	defer c.Close()
//
//	u, err := herd.Fetch(ctx, c, "user:42", time.Minute, func(ctx context.Context) (User, error) {
//		return db.LoadUser(ctx, 42) // return herd.ErrNotFound for a missing user
//	})
//
// [Fetch] caches typed values (JSON by default, [Options.Codec] to
// change it); [Cache.Get] is the same for bytes. Only one caller in the
// cluster runs the loader per miss; the others get its value, or its
// error. A loader's [ErrNotFound] is cached as a negative entry. After
// writing to the source, call [Cache.Set], [SetValue] or
// [Cache.Invalidate]: each advances the key's fence, so no rebuild in
// flight can overwrite the new state with an older one.
//
// The Example functions of [Cache.Get], [Fetch], [Cache.InvalidateSoft],
// [Cache.Peek], [Cache.InvalidateTag], [LoadError], [WithOutcome],
// [Locker.TryAcquire], [Redlock] and [Job.Run] run against an embedded
// Redis. docs/cache-aside.md explains hits, misses,
// writes, loader errors, freshness, batch reads, tag purges and the near
// cache, with their options.
//
// # Guarantees
//
// In brief: docs/guarantees.md states each one, under the same number,
// with its conditions and costs, and the claims table of docs/design.md
// names the tests that break when one does.
//
//  1. One rebuild per key per cluster while Redis is healthy and the
//     rebuild finishes within its lease (renewed up to [Options.MaxHold]);
//     a stalled leader is taken over and its late write is fenced.
//  2. No caller waits forever: every wait is bounded by the caller's
//     context and the wait budget ([Options.WaitTimeout]), then
//     [Options.Fallback] applies.
//  3. One caller's cancellation never fails another: the shared rebuild
//     runs detached, under [Options.LoadTimeout].
//  4. A loader's error or panic reaches every waiter, in every process, as
//     a [*LoadError] (docs/cache-aside.md: what it holds in each process).
//  5. Redis down is not an outage: the Cache fails open to local loads
//     behind a circuit breaker, or returns [ErrUnavailable] with
//     [Options.FailClosed] (README.md, "Redis down", has the client
//     settings and the figures).
//  6. Bad input gets an error, never a panic; invalid options make [New]
//     and [NewLocker] panic, naming the field and its range.
//  7. Read your writes: a call that starts after a [Cache.Set] or
//     [Cache.Invalidate] of its key returned never gets an older value, in
//     any process, while Redis keeps its writes; with [Options.Near],
//     another process's writes once [NearOptions.Staleness] has passed
//     (docs/design.md, "Read your writes", has how).
//
// What herd does when a leader dies, pub/sub drops, a reply is lost, Redis
// is slow or a master fails over, and what it needs of Redis Cluster, a
// Ring, replicas and Redis versions: docs/guarantees.md ("Failure
// behaviour", "Redis deployments"). herd makes duplicate rebuilds rare,
// not impossible: where a duplicate run would corrupt data, fence the
// write itself (docs/guarantees.md, "When not to use herd").
//
// # Main types
//
// The cache:
//
//   - [Cache], made by [New] with [Options]: [Cache.Get] and [Fetch];
//     [Cache.GetMany] and [FetchMany] for many keys in one round trip per
//     master; [Cache.Set], [SetValue], [Cache.Invalidate],
//     [Cache.InvalidateSoft] (keep serving the old value, marked stale,
//     while one rebuild runs) and [Cache.InvalidateTag] (with [SetTags]);
//     [Cache.Peek] (a read without a loader); [Cache.Begin] and [Fill]
//     for callers that build the value themselves, as the HTTP middleware
//     does; [Cache.Stats] and [Cache.Inspect].
//   - [NearOptions]: a near cache in process memory in front of Redis.
//   - [Observer]: metrics and traces, turned into Prometheus metrics by
//     package github.com/herdkit/herd/prometheus and into OpenTelemetry
//     by github.com/herdkit/herd/otel (docs/operations.md).
//
// The locks (docs/lease.md; which one to pick: docs/locks.md):
//
//   - [Locker] and its [Lease]: the short lease in one Redis, with a
//     fencing token ([Lease.Token]).
//   - [Redlock] and its [RedlockLease]: a lease granted by a majority of
//     N independent Redis masters, with a quorum fencing token.
//   - [Lock] and [LeaseHandle]: the surface of every lock backend, and
//     [AnyLock] to hold any of them in one variable. Backends whose drivers
//     the core does not import are modules of their own: PostgreSQL,
//     MySQL, etcd and ZooKeeper under github.com/herdkit/herd/lock/
//     (postgres, mysql, etcd, zookeeper); package github.com/herdkit/herd/locktest is the suite
//     every backend passes.
//   - [FencedStore]: a Redis record that refuses a write whose token is
//     lower than the highest it has seen.
//   - [RunJob] and [Job]: a job at most once per period across the fleet.
//
// HTTP: package github.com/herdkit/herd/middleware (docs/middleware.md,
// docs/security.md). The herd command, github.com/herdkit/herd/cmd/herd,
// inspects herd's keys in Redis and runs a caching reverse proxy.
//
// # Errors
//
// Errors are sentinels compared with [errors.Is], and two types found
// with [errors.As]: a loader's failure is a [*LoadError] in every process
// (a panic a [*PanicError] inside it), and GetMany's per-key errors come
// in a [*ManyError].
//
// # Documentation
//
// The pages below are in the docs directory of the repository,
// https://github.com/herdkit/herd:
//
//   - docs/cache-aside.md: Get, Fetch, writes, freshness, loader errors,
//     batch reads, tag purges, the near cache.
//   - docs/middleware.md: the HTTP middleware; docs/security.md: its threat
//     model; docs/http-conformance.md: its score on the HTTP cache tests.
//   - docs/lease.md: the lease on its own, jobs once per period, Redlock,
//     the lock backends; docs/locks.md: which lock to pick, and fencing.
//   - docs/guarantees.md: the guarantees, failure behaviour, failover,
//     Redis Cluster, Ring, replicas and versions, keys.
//   - docs/options.md: where each option is explained, and tuning.
//   - docs/operations.md: metrics, traces, the dashboard, inspecting keys.
//   - docs/faults.md: the fault, soak and failover suites and their results.
//   - docs/measured.md, docs/bench.md and docs/scale.md: the figures, the
//     stampede benchmark, one hot key at a million reads a second.
//   - docs/design.md: how it works inside, with the claims table;
//     docs/modules.md: the nested modules.
package herd
