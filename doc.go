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
// key, so one process in the cluster rebuilds. A hit costs what a plain
// GET costs. The lease length is calibrated from the
// measured rebuild time and renewed by a watchdog while the rebuild runs.
//
// # Cache-aside
//
//	c := herd.New(rdb, nil) // rdb: *redis.Client, *redis.ClusterClient, ...
//	defer c.Close()
//
//	b, err := c.Get(ctx, "user:42", time.Minute, func(ctx context.Context) ([]byte, error) {
//		return db.LoadUserJSON(ctx, 42) // return herd.ErrNotFound for a missing user
//	})
//
//	u, err := herd.Fetch(ctx, c, "user:42", time.Minute, func(ctx context.Context) (User, error) {
//		return db.LoadUser(ctx, 42)
//	})
//
// [Cache.Get] reads the key with one GET: a fresh value is the answer.
// Concurrent callers of a key in one process share their GETs: a caller
// joins a read that has not been sent yet, never one already on the wire
// (its reply could predate a write that returned before the caller
// started: see read-your-writes below), so a hot key costs each process
// about one GET per round trip, whatever its callers; they then share one
// flight from the miss on. A lone caller whose ctx cannot end sends the
// GET from its own goroutine; otherwise a reader goroutine kept for the
// purpose sends it and the caller leaves as soon as its ctx ends. On a miss it takes the key's
// lease (one script); the winner, the leader, runs the loader and then one
// script writes the value if the leader's fence is still current,
// publishes the wake-up (carrying the value when it is small) and releases
// the lease. A leader's miss is three round trips. The others, followers,
// subscribe to the key's channel (one shared pub/sub connection per Cache;
// one per master with sharded pub/sub on Redis Cluster 7+, one per shard
// on a Ring), look once more, and wait.
//
// [Cache.Set], [Cache.Invalidate] and [Cache.InvalidateSoft] advance the
// key's fence first, so a rebuild that started before them can never
// write its older value after them: the stale-set race that memcache
// leases close. Each write carries
// an id, so a retry of it (go-redis resends a script whose reply was lost)
// is a no-op rather than a second write over a newer one.
//
// # Guarantees
//
//  1. One rebuild per key per cluster while Redis is healthy and the
//     rebuild finishes within its lease (renewed by the watchdog up to
//     [Options.MaxHold]). When a leader stalls past its lease (a GC pause,
//     a lost network) another process takes over; the stalled leader's
//     write is then rejected by the fence, so an older value never
//     overwrites a newer one.
//  2. No caller waits forever: every wait is bounded by the caller's
//     context and by the wait budget; then [Options.Fallback] applies. By
//     default the budget follows the rebuild: a follower waits while the
//     holder of the lease keeps renewing it, up to [Options.MaxHold] plus
//     one lease, so a rebuild slower than its lease is not duplicated; an
//     explicit [Options.WaitTimeout] is a hard bound instead.
//  3. One caller's cancellation never fails another: the shared rebuild
//     runs detached from every caller, under [Options.LoadTimeout].
//  4. A loader's error or panic reaches every waiter, in every process, as
//     a [*LoadError] (errors.Is [ErrLoadFailed]; the key and the cause
//     once in its text; in the loader's process it unwraps to the
//     loader's error, in the others Remote is set; a panic as a
//     [*PanicError]: with its stack in the panicking process, with the
//     reported text and Remote set in the others), releases the lease at
//     once and wakes the other processes at once: by the wake-up message,
//     or, for a follower that missed it (pub/sub down), by a short-lived
//     failure marker it finds when it looks. A wave of callers calls a
//     failing source once, or, with [Options.RetryFailedLoad] (or an
//     error marked [NoShare]), at most twice: one follower retries under
//     a new lease, the others wait for it. Errors are not cached.
//     [ErrNotFound] is cached as a negative entry for [Options.NegativeTTL].
//  5. Redis down is not an outage: the Cache fails open to local
//     coalescing, loading with at most [Options.MaxLocalLoads] loaders at
//     once; a circuit breaker stops calling Redis after repeated errors and
//     probes until it answers again. [Options.FailClosed] returns
//     [ErrUnavailable] instead.
//  6. Bad input gets an error, never a panic: [ErrInvalidKey],
//     [ErrInvalidTTL] (a ttl outside 1ms to 50 years, a lease outside
//     10ms to 50 years), [ErrNilLoader], [ErrValueTooLarge]; every call
//     after Close gets [ErrClosed]. Invalid options make [New] and
//     [NewLocker] panic, naming the field and its range. Corrupt or
//     foreign bytes at a value key are a miss, counted and overwritten by
//     the next rebuild.
//  7. Read your writes: a [Cache.Get], [Fetch] or [Cache.Begin] that
//     starts after a [Cache.Set] or [Cache.Invalidate] of its key returned
//     is never answered with a value loaded or read before that write, in
//     any process, while Redis keeps its writes (see the failover notes).
//     A call that arrives while its process's lookup or rebuild of the key
//     is already under way takes that answer only when it is known to be
//     current after the call arrived (read or committed after it); else
//     it takes the next lookup, one more round trip, and checks that one
//     too (a lookup can start from the GET of the call that started it,
//     sent before this call arrived and answered late). Callers that
//     joined a rebuild before the write may still get its value. After a
//     [Cache.InvalidateSoft] such a call gets the old value only as a
//     stale hit ([OutcomeStale]: read after the write), or a value rebuilt
//     after it. [Cache.Peek] is one GET from the master: it sees every
//     write that returned before it started. Limit:
//     a value Redis could not check (Redis unreachable, a failed commit)
//     is held back only from callers after a write made in the same
//     process; another process's writes cannot be seen without Redis.
//     With the near cache on ([Options.Near]) a Get, Fetch, GetMany or
//     Begin keeps this
//     promise for the writes of its own process, and for another
//     process's once [NearOptions.Staleness] has passed since the write
//     returned (see "Near cache").
//
// # Failure behaviour
//
//   - A leader process dies or stalls: followers take over when its lease
//     lapses; a stalled leader's commit is fenced ([Stats].Fenced).
//   - The pub/sub connection drops (a network error, a killed client,
//     the server's pub/sub output-buffer limit): followers poll; the
//     connection comes back by itself and herd subscribes its channels
//     again (on Cluster, one SSUBSCRIBE per channel: one command of
//     several slots' channels would be refused), and the confirmation
//     makes waiters look again.
//   - A reply is lost after the server ran a command: go-redis re-sends
//     it, and the scripts recognise their own earlier run.
//   - A loader ignores its context: it is abandoned at its timeout (its
//     goroutine ends when it returns) and the lease is released.
//   - A slow Redis: WaitTimeout bounds the wait between looks, not each
//     Redis call a follower makes; with every reply slowed (but under the
//     client's ReadTimeout) a wait lasts several round trips longer. Pass
//     a context deadline for a hard bound: every call honours it at once.
//   - A lost ACQUIRE reply with go-redis retries turned off: the caller
//     fails open, and the lease it cannot know it holds blocks the key for
//     other processes for one lease. With retries (the default) the
//     retried ACQUIRE is recognised as the caller's own.
//   - Clocks: freshness is judged from the writer's clock; keep hosts in
//     NTP sync. Leases use Redis-side expiry and monotonic local time.
//   - A failover (Sentinel, or a Cluster replica promoted): every script
//     that advances a fence (acquire, commit, Set, Invalidate) and every
//     extend is followed, in the same round trip, by WAIT for the
//     replicas ([Options.ReplicaAcks], by default every replica the
//     master had in the last minute). A write herd reports done is on the
//     replicas, and
//     fencing tokens are max(counter + 1, the Redis clock in µs), so,
//     whenever the replica that is promoted had acknowledged the write,
//     no token is issued twice, a deposed holder's downstream write is
//     rejected and no acknowledged Set or Invalidate is undone. A write
//     too few replicas acknowledged is [ErrNotReplicated]: Set and
//     Invalidate return it (the write may or may not survive: retry), an
//     acquire hands out no lease, a miss fails open (or [ErrUnavailable]
//     with FailClosed). After a graceful or SIGSTOP failover the old
//     master stays a writable master for seconds, until the Sentinels
//     demote it; its writes are refused there, since its replicas have
//     left. What remains: reads served by a deposed master can be stale
//     (a value older than a write acknowledged by the new master), and no
//     fencing token can stop that. min-replicas-to-write 1 with
//     min-replicas-max-lag on the master shortens that window (a master
//     without a replica refuses writes after the lag); docs/faults.md has
//     the measured counts and the settings.
//
// Bound Redis calls with the client's ReadTimeout and WriteTimeout: the
// Cache relies on them to notice a slow or vanished Redis.
//
// # Freshness
//
// [Options.StaleFor] serves a value for that long after its ttl, at once,
// while one request in the cluster refreshes it in the background
// (stale-while-revalidate); if the refresh fails the stale value stays
// servable (stale-if-error) and refreshes back off cluster-wide.
// [Options.EarlyRefresh] (XFetch's β) refreshes hot keys shortly before
// they expire, with a probability that grows as expiry nears and with the
// key's rebuild time, which every envelope carries. A loader can choose
// its value's lifetime with [SetExpiry]. [WithOutcome] tells how a call
// was served.
//
// [Cache.InvalidateSoft] is an invalidation that keeps serving, the weak
// mode of rockscache and the stale-while-lease of memcache leases: the
// value is marked stale in Redis at once, for every process, and its
// fence advances. Gets then return the old value at once as a stale hit
// while one refresh, under the key's lease, rebuilds it; a rebuild that
// began before the invalidation is fenced and cannot end the stale
// period. The old value stays servable only as long as it was going to
// live (its hard TTL is kept, so a tag purge still reaches it): with
// StaleFor 0, what was left of its ttl. [Cache.Peek] reads a key without
// a loader: one GET, no lease, no refresh; with Redis down it returns
// [ErrUnavailable] rather than failing open.
//
// # Batch reads
//
//	vals, err := c.GetMany(ctx, []string{"user:1", "user:2", "user:3"}, time.Minute,
//		func(ctx context.Context, keys []string) (map[string][]byte, error) {
//			return db.LoadUsersJSON(ctx, keys) // the keys this process rebuilds
//		})
//
// [Cache.GetMany] and [FetchMany] are Get and Fetch for a set of keys,
// with Get's guarantees for each key. The values are read in one round
// trip per master: an MGET on a single master or a Ring shard; on a
// Cluster, where every key has its own slot, one pipeline of reads per
// master (of the one-line script, on a client that routes reads to
// replicas). Fresh and stale values are served from that read as Get
// serves them. Each missing key then goes into its flight in this
// process, which a concurrent Get or GetMany of the key shares, and takes
// its own lease: the leases of the keys are acquired in one pipeline per
// master, the loader ([ManyLoadFunc]) is called once with the keys whose
// lease this process won, and their values are committed in one pipeline
// per master. A key whose lease another process holds is waited for on
// its own, and the loader never waits for it: two processes whose batches
// overlap, each leading some keys and following the other's, cannot wait
// on each other. A key taken over later from a leader that died, loaded
// after its wait budget ran out, or refreshed in the background is loaded
// alone (the loader is called with that one key); more than 1000 missing
// keys to rebuild are loaded 1000 at a time. The result holds the value of
// each key that has one; a key not found is absent; every other failure
// is per key, in a [*ManyError] that errors.Is and errors.As see through,
// and a loader can fail single keys with one. When Redis is unreachable
// the missing keys are loaded once, locally (or fail with
// [ErrUnavailable] under FailClosed). A batch started after a Set or
// Invalidate of one of its keys returned never gets that key's older
// value. [Stats] counts a batch per key (Hits, Misses, Leads, Loads).
//
// # Near cache
//
// [Options.Near] keeps fresh values (and negative entries) in process
// memory, in front of Redis: a near hit costs no round trip. [Cache.Get],
// [Fetch], [Cache.GetMany], [FetchMany] and [Cache.Begin] (and so the
// HTTP middleware) use it; [Cache.Peek] does not (it promises every write
// that returned before it, in any process). The store is
// github.com/maypok86/otter/v2, bounded by [NearOptions.MaxEntries] or
// [NearOptions.MaxBytes]; each caller gets its own copy of the bytes. A
// near miss reads Redis once per key and process, whatever the number of
// callers, and keeps what it read only if it is fresh: a stale value, a
// value in the window where [Options.EarlyRefresh] may refresh it, a miss
// or a pass mark go to the flight as without the near cache.
//
// The bound. Every script that changes a value (a rebuild's or a
// refresh's commit, [Fill.Commit], [Fill.Pass], [Cache.Set],
// [Cache.Invalidate], [Cache.InvalidateSoft], the invalidations of
// [Cache.InvalidateTag]) also publishes the key and the write's fence on
// one channel of the prefix, in every process, near cache or not. A near
// cache subscribes on every master (every master of a Cluster, every live
// shard of a Ring), PINGs each of those connections every Staleness/4,
// and serves from memory only while every one of them has answered a PING
// sent within the last [NearOptions.Staleness] (250ms by default). Redis
// answers a connection in order, so the answer to a PING sent after a
// write was acknowledged comes after that write's message: a near hit
// never returns a value that a write through herd, by any process sharing
// the Redis and the prefix, replaced more than Staleness before the hit.
// Only this process's monotonic clock is involved, never another host's.
// This process's own writes (by any of its Caches with the same prefix,
// near cache on or off) drop its near copies before they return, and a
// near miss's read that a write may have overtaken is not kept: a near
// copy is never older than a write the process has seen return. A copy
// also ends with its value's fresh period and after [NearOptions.MaxAge]
// (1s by default), whatever the messages.
//
// When a subscription is lost (a network error, CLIENT KILL, a restart, a
// PING unanswered for max(4 × Staleness, 1s), a change of the masters) the
// whole near cache is flushed and stops serving; it serves again once the
// new SUBSCRIBE is confirmed and a PING sent after it is answered.
// Meanwhile Get reads Redis ([Stats].NearBypassed).
//
// Limits: writes that do not go through herd (a raw SET or DEL of herd's
// keys, FLUSHALL, another prefix, a herd version that does not publish,
// during a rolling upgrade) are not announced: MaxAge bounds them. After a
// failover that leaves the old master answering as a replica (Sentinel,
// CLUSTER FAILOVER) the new master's messages reach the near cache
// through replication or the cluster bus, later than the bound allows,
// until its connection to the old master fails; on a Cluster the masters
// are re-read every second and a change flushes; likewise a master added
// to a Cluster: until the near cache has re-read the masters (within a
// second) that master's messages reach it only through the cluster bus,
// not ordered with its PINGs. On a Ring the bound
// holds while every process's Ring has the same live shards. The costs:
// about one GET per write of a hot key per process that holds it, 4 PINGs
// per Staleness per master and process, on a Cluster a CLUSTER SLOTS per
// second per process and every message delivered once per master (a
// classic PUBLISH crosses the cluster bus), and in every Cache, near cache
// or not, the PUBLISH in each value-changing script. docs/design.md has
// the proof and the choice of pub/sub over client-side caching.
//
// # Tag purges
//
// A value can carry tags: [SetTags] in a loader, [Fill.SetTags] before a
// Commit, or [Cache.SetTagged]; the HTTP middleware tags a response with
// its Surrogate-Key and Cache-Tag fields. [Cache.InvalidateTag] then
// invalidates every value with a tag, in every process, with the
// guarantee of [Cache.Invalidate]: once it returns, no rebuild that began
// before it stores its value, whether or not its key was in the tag's
// index yet. Each tag has an index in Redis (its own slot, bounded by
// [Options.MaxTagEntries], expiring with its longest-lived value; keys
// tagged with [SetMintedTags] take at most half of it) of the
// keys whose values carry it, and remembers its last purge for two
// minutes; a tagged commit first records its key in each index, which
// refuses a rebuild that a purge of the tag came after (its value still
// goes to its callers, unstored, counted in [Stats].Fenced). A Cache
// reads the purge generation, in the round trip of each rebuild's
// ACQUIRE, once it has seen a tag: one that never uses tags pays nothing.
// Hits never pay for tags; a tagged value's commit is one pipelined round
// trip more, and a purge is one round trip per index page of 1000 keys
// and then the keys' invalidations, pipelined per master. Tags share one
// namespace per prefix: a purge of a tag removes the pages and the
// cache-aside values that carry it. A key stays in a tag's index until
// its value would have expired, so a purge may also invalidate a value
// rebuilt since without that tag: purges err on the side of too many.
// The guarantee holds while Redis keeps its writes: a failover that loses
// acknowledged writes (see [Options.ReplicaAcks]) or a Ring that moves a
// tag's index to another shard can lose index entries, and so can
// eviction: under a maxmemory-policy other than noeviction, Redis may
// evict a tag's index (a purge then misses its values) or its memory of
// a purge (a rebuild from before it is then stored). Fences survive
// eviction; tags do not.
//
// # Tuning
//
//   - Lease length: calibrated per key class ([Options.KeyClass]) as
//     LeaseFactor × a tail estimate of recent successful rebuild times
//     (this process's and, through the rebuild time in every value it
//     reads, other processes'), clamped to [MinLease, MaxLease];
//     DefaultLease for a class with too little recent data. Failed,
//     timed-out and panicked loads are not samples, one or two slow
//     rebuilds never move the lease, and old samples stop counting after
//     at most 146 later rebuilds of the class or 546 s, whichever comes
//     first ([Options.LeaseFactor] has the details). The watchdog renews
//     the lease while the rebuild runs, so it only needs to cover the time
//     a crashed leader blocks the key; MaxHold caps a stuck one.
//   - Wait budget: by default a follower waits twice the lease, renewed
//     while the lease is still held, up to MaxHold plus one lease; an
//     explicit [Options.WaitTimeout] is a hard bound, then
//     [Options.Fallback] applies. A WaitTimeout shorter than your rebuilds
//     turns waiters into local loads.
//   - StaleFor is the strongest tool: with it, hot keys never make
//     readers wait after the first load. EarlyRefresh (β around 1) helps
//     keys that are hot but not hot enough to be read while stale.
//   - Give the go-redis client short ReadTimeout and WriteTimeout: they
//     bound how long herd waits on a slow Redis before failing open.
//
// # Redis Cluster
//
// A key's names share one hash tag, so every script runs on one slot.
// Wake-ups use sharded pub/sub (SSUBSCRIBE, SPUBLISH) on Redis 7+, with
// one pub/sub connection per master, so a message reaches only the node
// that owns the key; on older servers plain pub/sub is used. Each Cache
// and Locker decides once, when it first publishes or waits, by asking
// one node whether it knows SPUBLISH (COMMAND INFO). A cluster whose
// masters run different versions (a rolling upgrade from 6.2 to 7) is
// therefore not supported: a process that asked a 7 node publishes with
// SPUBLISH, which fails its scripts on a 6.2 master, and processes that
// chose differently do not hear each other's wake-ups (their waiters
// fall back to polling). Restart every process once all masters run 7. A master that fails over loses its leases: at worst one
// extra rebuild per key, and the fence (seeded from the server clock)
// keeps a stale write out. A slot that migrates takes its channels'
// subscriptions with it: waiters on its keys poll until they next
// subscribe.
//
// # Redis Ring
//
// A *redis.Ring works too: a key's names and channel share its hash tag,
// so the Ring sends them to one shard, and herd keeps one pub/sub
// connection per shard. A Ring has no replication: a shard that goes down
// loses its leases, like a cluster master, and the Ring moves its keys to
// the other shards.
//
// Values are read from masters, never from replicas, which may lag behind
// a Set or Invalidate their master has already answered. The scripts
// always run on masters; a cluster client that routes read-only commands
// to replicas (ReadOnly, RouteByLatency, RouteRandomly, and
// NewFailoverClusterClient with ReplicaOnly, RouteByLatency or
// RouteRandomly) is detected by [New], and the Cache then reads each value
// with a one-line script instead of GET. The cost: those reads no longer
// offload masters; on a real redis-server the script takes about 2µs of
// server time against 0.25µs for GET, with 12 allocations instead of 7 in
// the client, and a round trip about a tenth longer. A failover
// *redis.Client with ReplicaOnly cannot be detected (its options keep no
// trace of it); it sends every command, writes included, to a replica,
// so herd's writes fail with READONLY and the Cache treats Redis as
// unavailable: do not use one. [FencedStore.Get] is a plain read and
// follows the client's routing.
//
// # Redis versions
//
// herd sends only commands of Redis 6.2 and earlier, and scripts that
// need no 7.0 feature, except sharded pub/sub, which it uses only where
// the cluster reports it (see Redis Cluster). Its scripts read TIME
// before they write, which needs the replication of script effects: the
// default since Redis 5 and the only mode since 7.0; a 6.2 server set to
// lua-replicate-commands no refuses those scripts. herd's tests run on
// redis-server 7.0, and on 7.0 with every command 7.0 added removed
// (rename-command), as an approximation of 6.2; 6.2 itself is not tested.
//
// # When not to use herd
//
// herd is an efficiency lock: it makes duplicate rebuilds rare, not
// impossible. A leader that stalls past its lease is taken over, and for a
// moment two rebuilds run; herd's fence keeps the older one from writing
// the cache, but not from having run. When a duplicate run would corrupt
// money or data, correctness needs fencing or conditional writes in the
// resource itself: pass [Lease.Token] to it, as [FencedStore] does. Ask
// first whether a lock is needed at all: a single writer, or idempotent
// work, needs none. And herd helps only where a miss is expensive and
// concurrent; a cheap or rarely shared value gains nothing from it.
//
// # The short lease
//
// [Locker] is the lease primitive, usable on its own, for example for a
// scheduled job that must not run twice at the same time:
//
//	locker := herd.NewLocker(rdb, nil)
//	defer locker.Close()
//	lease, err := locker.TryAcquire(ctx, "nightly-report", 30*time.Second)
//	if errors.Is(err, herd.ErrLeaseHeld) {
//		return nil // another instance runs it
//	}
//	if err != nil {
//		return err
//	}
//	defer lease.Release(context.WithoutCancel(ctx))
//	lease.KeepAlive(10 * time.Minute) // renew until done; 10 minutes caps the whole holding (not an interval)
//	select {
//	case <-lease.Lost():
//		return errors.New("lease lost; stopping")
//	case err := <-runJob(ctx, lease.Token()):
//		return err
//	}
//
// A lease is one Redis key set with SET NX PX to a random 128-bit owner id.
// The acquiring script also advances the key's fence counter to max(counter
// + 1, the Redis clock in microseconds) and returns it as the lease's
// fencing token ([Lease.Token]), so tokens of a key keep increasing across
// counter expiry, Redis restarts and a failover to a replica that missed
// the last tokens (given Redis hosts whose clocks do not go back by more
// than the time between two leases). With replicas, the acquire waits for
// them to acknowledge it ([LockerOptions.ReplicaAcks]) and fails with
// [ErrNotReplicated] otherwise. Extend and Release compare the
// owner id inside a script: a holder whose lease lapsed can never extend
// or delete the next holder's lease. [Lease.KeepAlive] renews at a random
// point between a third and a half of the lease length, up to an absolute
// cap, and [Lease.Lost] is closed when the lease is known lost.
//
// A lease alone cannot stop a holder that paused past its lease from
// writing after the next holder did. The protected resource must check the
// token: [FencedStore] is such a resource in Redis, accepting a write only
// when its token is at least the highest it has seen.
//
// # Jobs: once per period
//
// A lock stops overlapping runs of a scheduled job, not repeated ones:
// instances whose ticks are a little apart take the free lock in turn.
// [Once] and [Job] run a job at most once per period across the fleet, on
// any lock backend: under the lock they check a record of the last
// completed period ([FencedStore]), claim the period with the lease's
// token, run the job with [LeaseHandle.KeepAlive] and a ctx that ends when
// the lease is lost, and record the period with a fenced write, so that a
// holder that paused past its lease cannot record over a newer one. A
// failed job is not recorded and runs again at the next call. See [Job]
// for clock skew and the lost-lease cases.
//
// # Redlock
//
// [Redlock] is the same lock over N independent Redis masters (N odd, at
// least 3): a lease is held when a majority granted it, so it survives the
// loss, or the pause, of up to N/2 masters.
//
//	rl := herd.NewRedlock([]redis.UniversalClient{rdb1, rdb2, rdb3}, nil)
//	defer rl.Close()
//	lease, err := rl.TryAcquire(ctx, "nightly-report", 30*time.Second)
//
// It acquires on every master in parallel, each round bounded by
// [RedlockOptions.NodeTimeout], and holds only if a quorum granted it
// with validity left (the lease length less the time taken and a drift
// allowance); otherwise it releases everywhere at once. Too few masters
// answering is [ErrNoQuorum]; [ErrLeaseHeld] means a master reported
// another owner. A lease lasts 10ms to 50 years, and an extend never
// shortens it, so a failed extend leaves it as it was. [NewRedlock]
// rejects two clients for the same master address (it cannot see two
// addresses of one server). [RedlockLease.Token] is a quorum fencing
// token: a second round raises a quorum of the masters' counters to one
// more than the highest a quorum reported, so tokens strictly increase
// from one holder to the next although each master counts on its own. A
// master restarted without persistence must stay out for one maximum
// lease length before it rejoins, or a lock it forgot can be taken twice.
// The protocol and its proof are in docs/design.md.
//
// # One lock interface, several backends
//
// [Lock] is the surface every lock backend implements, and [LeaseHandle]
// that of its leases: TryAcquire fails at once with [ErrLeaseHeld] on a
// held lock; Acquire waits, woken by the backend's own release
// notification (a bounded re-check as the fallback), and returns at once
// when ctx ends or Close is called ([ErrClosed], as every call after
// Close); a lease has a fencing token that strictly increases per key,
// Lost, Extend, KeepAlive (whose argument caps the whole holding: it is
// not an interval), Deadline and an owner-checked Release. [Locker] is a
// Lock[*Lease] and [Redlock] a Lock[*RedlockLease]; backends whose drivers
// the core does not import are modules of their own, starting with
// github.com/herdkit/herd/lock/postgres (an advisory lock on a dedicated
// connection, tokens from a fence table, LISTEN/NOTIFY wake-ups, and
// FencedTable, the fenced SQL write). [AnyLock] gives them all the type
// Lock[LeaseHandle], so a program moves from one to another by changing
// its constructor. Package github.com/herdkit/herd/locktest is the
// conformance suite every backend runs. [FencedStore] takes the token of
// any of them.
//
// # Which lock
//
// [Locker] and [Redlock] both implement [Lock], and their leases
// [LeaseHandle]. Pick by what a second holder would cost:
//
//   - An efficiency lock (a duplicate run only wastes work: a cache
//     rebuild, a report made twice): a single Redis, [Locker]. It is one
//     round trip; a failover or a restart of that Redis can hand the lock
//     to a second owner for one lease.
//   - A lock that must survive a node loss: [Redlock], with up to N/2 of
//     its masters down or stalled, at the cost of two parallel round
//     trips per acquire, N masters to run, and the restart rule.
//   - Correctness (a duplicate run would corrupt data or money): no lock
//     is enough on its own, because a holder that pauses past its lease
//     (a GC pause, a stalled VM) wakes up still believing it holds it.
//     Pass the lease's token to the resource and have the resource refuse
//     lower tokens ([FencedStore], or a conditional write in your
//     database: FencedTable of github.com/herdkit/herd/lock/postgres),
//     whichever lock you use.
//   - One database and no new infrastructure: the PostgreSQL lock of
//     github.com/herdkit/herd/lock/postgres, or the MySQL/MariaDB lock of
//     github.com/herdkit/herd/lock/mysql, whose lease the server frees
//     when its session ends or stays silent for the lease length, with
//     tokens as durable as the database.
//   - Strong consistency (CP: every acquire and release committed by a
//     majority, no lock lost to a failover): etcd
//     (github.com/herdkit/herd/lock/etcd) or ZooKeeper
//     (github.com/herdkit/herd/lock/zookeeper), released with the
//     holder's session; still fence the writes, since a paused holder
//     wakes up believing it holds the lock.
//
// docs/locks.md compares the styles with measured latencies.
//
// # Keys
//
// Any string except the empty one is a valid key, including '{', '}', ':',
// newlines and binary. A key's Redis names are PREFIX:{T}:ROLE, where T is
// the base64url SHA-256 of the key: fixed length, no raw user bytes, and
// one hash tag for all of a key's names, so in Redis Cluster they share a
// slot and no key can pick or split it. A lock's key, in every backend,
// is also at most [MaxLockKeyBytes] long ([CheckLockKey]).
//
// Errors are sentinels compared with [errors.Is], and two types found
// with [errors.As]: a loader's failure is a [*LoadError] in every process
// (a panic a [*PanicError] inside it), and GetMany's per-key errors come
// in a [*ManyError].
package herd
