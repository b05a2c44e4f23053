package herd

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// LoadFunc loads the value of a key from the source of truth. Its context
// belongs to no caller: it ends after [Options.LoadTimeout] or on
// [Cache.Close]. Return [ErrNotFound] (possibly wrapped) when the source
// has no value, to cache a negative entry. Any other error reaches the
// callers waiting on the rebuild as a [*LoadError]; wrap it with
// [NoShare] when it concerns only this process.
type LoadFunc func(ctx context.Context) ([]byte, error)

// Cache is a cache-aside helper that lets one caller in the whole cluster
// rebuild a missing key while the others wait for its value.
//
// Callers of a key in one process share one flight; across processes a
// short lease in Redis picks one leader, which runs the loader and writes
// the value, the wake-up and the lease release in one script. The others
// are woken by a pub/sub message that usually carries the value itself.
// The guarantees and failure modes are in docs/guarantees.md.
//
// A Cache is safe for concurrent use. Call [Cache.Close] to stop its
// goroutines and its pub/sub connection.
type Cache struct {
	rdb    redis.UniversalClient
	cfg    cacheConfig
	locker *Locker
	notify *notifier
	calib  *calibrator
	group  flightGroup // the local tier: one call per key in this process
	reads  readGroup   // hits' GETs shared per key in this process (sharedread.go)
	warm   warmKeys    // which keys skip the hit's GET (coldread.go)
	// readJobs hands a read to an idle reader goroutine (sharedread.go).
	readJobs  chan *readCall
	readStall time.Duration // readStall; tests lengthen it
	genWait   time.Duration // genWait; tests lengthen it
	local     chan struct{} // semaphore of MaxLocalLoads
	brk       breaker
	stats     counters
	sig       *signals // observer, classes and rate-limited logging, shared with locker

	masterReads bool // rdb may route GET to a replica: read values with getScript

	// repl is the write path's replica wait, the one the Cache's Locker
	// holds too: every write of the Cache's goes through it.
	repl *replicaWait

	ctx     context.Context // ends on Close; parent of all shared work
	cancel  context.CancelFunc
	mu      sync.RWMutex // guards closed against flights starting
	closed  bool
	closing atomic.Bool    // closed, for the hit path (which takes no lock)
	wg      sync.WaitGroup // running flights and background refreshes

	fillMu sync.Mutex
	fills  map[string]*localFill // Begin's fills running in this process, by key
	open   map[*Fill]struct{}    // every Fill not yet committed or aborted

	refreshMu  sync.Mutex
	refreshing map[string]struct{}  // keys with a background refresh in this process
	backingOff map[string]time.Time // keys whose refreshes back off, until when (learned from Redis)
	refreshSem chan struct{}        // bounds background refreshes

	// writes counts the Set and Invalidate calls of this Cache that
	// returned, per stripe of keys (see currency).
	writes [64]atomic.Uint64

	// tagsOn: this Cache has seen a tag, so its rebuilds read the purge
	// generation (see tags.go). genKey is its name.
	tagsOn         atomic.Bool
	genKey         string
	oneMaster      bool         // rdb is a client of one master (not a Cluster or a Ring)
	genPausedUntil atomic.Int64 // unix ns: reads of the generation pause until then (see genRead)
	tagHooks       *tagHooks    // tests only

	now  func() time.Time // the clock for freshness; tests inject a fake
	rand func() float64   // uniform in [0, 1) for XFetch; tests inject a seeded one

	near     *near  // the near cache (see near.go); nil when off
	nearChan string // the channel value-changing scripts publish on, near cache or not
}

// New returns a Cache on rdb: a *redis.Client, a *redis.ClusterClient, a
// *redis.Ring or a failover client. A nil opt means the defaults of [Options]. It panics on
// a nil client or an invalid option.
//
// Bound every Redis call with the client's own ReadTimeout and
// WriteTimeout (or ContextTimeoutEnabled): the Cache relies on them to
// notice a slow or vanished Redis.
//
// The Cache reads its values from masters only: a replica may still hold
// a value that Set or Invalidate replaced on its master, and serving it
// would break read-your-writes. When rdb is a *redis.ClusterClient that
// routes read-only commands to replicas (ClusterOptions.ReadOnly,
// RouteByLatency or RouteRandomly, and the cluster client of
// NewFailoverClusterClient with ReplicaOnly, RouteByLatency or
// RouteRandomly), New detects it and the Cache reads each value with a
// one-line script, which the client sends to the master: the client's
// other commands still go where it routes them. The cost: those reads no
// longer offload masters; on a real redis-server the script takes about
// 2µs of server time against 0.25µs for GET, with 12 allocations instead
// of 7 in the client, and a round trip about a tenth longer. A failover
// *redis.Client with ReplicaOnly cannot be detected (its options keep no
// trace of it); it sends every command, writes included, to a replica, so
// herd's writes fail with READONLY and the Cache treats Redis as
// unavailable: do not use one. [FencedStore.Get] is a plain read and
// follows the client's routing.
func New(rdb redis.UniversalClient, opt *Options) *Cache {
	if rdb == nil {
		panic("herd: New with a nil Redis client")
	}
	cfg := opt.resolve()
	locker := NewLocker(rdb, &LockerOptions{Prefix: cfg.Prefix, PollMin: cfg.PollMin, PollMax: cfg.PollMax,
		Observer: cfg.Observer, KeyClass: cfg.classLabel, Logger: cfg.Logger,
		ReplicaAcks: cfg.ReplicaAcks, ReplicaTimeout: cfg.ReplicaTimeout})
	// A master that cannot be counted costs the Cache its replica wait
	// (logged once), not every miss its coalescing (see replicaWait).
	repl := locker.cfg.repl
	repl.owner, repl.strict = "Options", false
	repl.warn = func(msg string, args ...any) { locker.cfg.sig.logRare(slog.LevelWarn, msg, args...) }
	c := &Cache{
		rdb:    rdb,
		cfg:    cfg,
		locker: locker,
		notify: locker.notify,
		repl:   repl,
		sig:    locker.cfg.sig,
		calib:  newCalibrator(cfg.calib),
		local:  make(chan struct{}, cfg.MaxLocalLoads),
		brk:    breaker{threshold: cfg.BreakerThreshold, cooldown: cfg.BreakerCooldown},

		masterReads: readsReplicas(rdb),

		fills:      make(map[string]*localFill),
		open:       make(map[*Fill]struct{}),
		refreshing: make(map[string]struct{}),
		backingOff: make(map[string]time.Time),
		refreshSem: make(chan struct{}, cfg.MaxRefreshes),
		genKey:     genKey(cfg.Prefix),
		nearChan:   nearChannel(cfg.Prefix),
		oneMaster:  isOneMaster(rdb),
		now:        time.Now,
		rand:       rand.Float64,
		readJobs:   make(chan *readCall),
		readStall:  readStall,
		genWait:    genWait,
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if cfg.near.on {
		c.near = c.newNear(cfg.near)
		c.joinNearPeers()
	}
	return c
}

// Get returns the value of key, calling load to build it when it is
// missing. Only one caller in the whole cluster runs load for a missing
// key at a time; the others get its value. The value is stored for ttl.
//
// Get returns at once with an error for an empty key ([ErrInvalidKey]), a
// ttl under a millisecond or over 50 years ([ErrInvalidTTL]: herd does not
// coalesce without storing), a nil load ([ErrNilLoader]) or a closed Cache
// ([ErrClosed]). It returns ctx.Err() when ctx
// ends first; the rebuild goes on for the other callers. With a ctx that
// can end, a hit's GET is sent by a reader goroutine (or shared with other
// callers of the key) and Get returns as soon as ctx ends or Close begins.
// With one that cannot (Background, WithoutCancel), or with
// [Options.InlineHits], a caller that sends its own GET (fewer than two
// of the key's reads are on the wire in this process) sends it from its
// goroutine and waits for it, bounded only by the client's ReadTimeout
// and WriteTimeout, Close included. A loader error
// or panic reaches every caller of that rebuild, in every process, as a
// [*LoadError] (errors.Is [ErrLoadFailed]; see there for what it holds
// where, and [Options.RetryFailedLoad] and [NoShare] for a retry by the
// callers that waited on it); [ErrNotFound] from the loader is returned as is and
// remembered for [Options.NegativeTTL]. A value over
// [Options.MaxValueBytes] is [ErrValueTooLarge]. When Redis is
// unreachable Get loads locally, or with [Options.FailClosed] returns
// [ErrUnavailable]. The returned slice is the caller's own.
func (c *Cache) Get(ctx context.Context, key string, ttl time.Duration, load LoadFunc) ([]byte, error) {
	if load == nil {
		return nil, ErrNilLoader
	}
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	if c.near != nil {
		if a, ok := c.nearHit(ctx, key); ok {
			return a.val, a.err
		}
	}
	vkey, err := valueKey(c.cfg.Prefix, key)
	if err != nil {
		return nil, err
	}
	if c.closing.Load() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// A caller that joins a flight whose answer may predate a write it
	// has seen returned takes the next flight instead (read-your-writes),
	// and checks that one too: a flight that starts after this caller
	// joined may still answer from the GET of the caller that started it
	// (see hit.go), sent before this one joined and delivered late. Each
	// such GET starts one flight at most (its caller takes that answer),
	// so the rounds end.
	joined, writes := time.Now(), c.writesOf(key)
	val, done, pre, err := c.lookup(ctx, key, vkey)
	if done {
		return val, err
	}
	for {
		var gate *coldGate // a cold read's flight: which other cold reads may join it
		run := func(pre *preRead) func() (any, error) {
			return func() (any, error) {
				done, ok := c.track()
				if !ok {
					return &flightResult{}, ErrClosed
				}
				defer done()
				if pre != nil && pre.unknown {
					c.warm.found(false) // once per flight, not per caller
				}
				keys, _ := makeKeys(c.cfg.Prefix, key) // valid: valueKey was
				f := &flight{c: c, key: key, keys: keys, ttl: ttl, load: load, refresh: load, pre: pre, from: ctx, joins: gate}
				a := f.fly(stRead)
				return &flightResult{val: a.val, outcome: f.outcome, cur: f.cur, looked: f.lookedAt}, a.err
			}
		}
		var ch <-chan singleflight.Result
		coldJoined := false // this caller joined a cold flight another cold read started
		if pre == coldLook {
			// A cold read starts the key's flight, or joins one that
			// another cold read started while a look that can answer this
			// caller is still to come (flight.go, "Cold joins"), or reads
			// after all: another flight may answer from a read older than a
			// write this caller saw return, or keep it waiting for a load
			// that such a write has made moot.
			gate = new(coldGate)
			var started bool
			if ch, started = c.group.StartChan(key, gate, run(pre)); ch == nil {
				if val, done, pre, err = c.hit(ctx, key, vkey, true); done {
					return val, err
				}
				continue
			}
			coldJoined = !started
		} else {
			ch = c.group.DoChan(key, run(pre))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.ctx.Done():
			return nil, ErrClosed // Close: the flight ends when its Redis call does
		case r := <-ch:
			if coldJoined && (errors.Is(r.Err, errColdRejoin) || r.Val.(*flightResult).looked.Before(joined)) {
				// A cold flight that sent no look after this caller joined
				// it answers what Redis held before this caller began, or
				// that it could not tell: read the key now.
				if val, done, pre, err = c.hit(ctx, key, vkey, true); done {
					return val, err
				}
				continue
			}
			res := r.Val.(*flightResult)
			if !res.answers(joined, writes, r.Err) {
				if pre == coldLook {
					// A cold read's answer that is not current for it: read
					// now, rather than in another cold flight, which could
					// end the same way for the callers that join it.
					if val, done, pre, err = c.hit(ctx, key, vkey, true); done {
						return val, err
					}
				}
				continue
			}
			c.warm.mark(warmID(vkey)) // the next Get of key reads it first
			recordOutcome(ctx, res.outcome)
			c.reportLookup(key, res.lookupOutcome(r.Shared))
			if r.Err != nil {
				return nil, r.Err
			}
			val := res.val
			if r.Shared {
				// Every caller of a shared flight gets its own copy; nobody
				// gets the original, so no caller sees another's writes.
				val = bytes.Clone(val)
			}
			return val, nil
		}
	}
}

// Fetch is [Cache.Get] for a typed value, encoded with [Options.Codec]
// (JSON by default). Errors are those of Get, plus a wrapped codec error
// when the value cannot be encoded or the stored bytes cannot be decoded
// into T.
func Fetch[T any](ctx context.Context, c *Cache, key string, ttl time.Duration, load func(context.Context) (T, error)) (T, error) {
	var zero T
	if load == nil {
		return zero, ErrNilLoader
	}
	b, err := c.Get(ctx, key, ttl, func(ctx context.Context) ([]byte, error) {
		v, err := load(ctx)
		if err != nil {
			return nil, err
		}
		b, err := c.cfg.Codec.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("herd: encode %q: %w", key, err)
		}
		return b, nil
	})
	if err != nil {
		return zero, err
	}
	var v T
	if err := c.cfg.Codec.Unmarshal(b, &v); err != nil {
		return zero, fmt.Errorf("herd: decode %q: %w", key, err)
	}
	return v, nil
}

// SetValue is [Cache.Set] for a typed value: v is encoded with
// [Options.Codec] (JSON by default), the codec [Fetch] decodes with, so a
// write-through reads back with Fetch[T]. Tags, if given, are as for Set:
// [Cache.InvalidateTag] of any of them deletes the value. Errors: those of
// Set, or a wrapped codec error when v cannot be encoded; then nothing is
// written.
func SetValue[T any](ctx context.Context, c *Cache, key string, v T, ttl time.Duration, tags ...string) error {
	b, err := c.cfg.Codec.Marshal(v)
	if err != nil {
		return fmt.Errorf("herd: encode %q: %w", key, err)
	}
	return c.Set(ctx, key, b, ttl, tags...)
}

// writeMarkerTTL is how long Redis remembers that a Set or Invalidate ran,
// so that a retry of it (go-redis resends a script whose reply was lost) is
// a no-op instead of undoing a newer write. It is far longer than any
// go-redis retry sequence; each marker is one small key.
const writeMarkerTTL = time.Minute

// Set stores val under key for ttl, in one round trip. It advances the
// key's fence first, so a rebuild that started before Set can never
// overwrite val, and wakes callers waiting on the key. Errors: those of
// Get's arguments, [ErrValueTooLarge], [ErrClosed] after Close,
// [ErrNotReplicated] (the master stored it, too few replicas acknowledged:
// it may be lost by a failover), or the wrapped Redis error. When ctx ends
// first, Set returns at once with an error wrapping ctx.Err(); the write
// may still land.
//
// With tags (see [SetTags]), [Cache.InvalidateTag] of any of them deletes
// the value: the key is recorded in each tag's index before the value is
// written, one pipelined round trip more. Tagged, Set also returns
// [ErrInvalidTag], [ErrTagFull] or the wrapped Redis error of recording a
// tag; then nothing is written. With no tags, Set does not touch any tag
// index.
func (c *Cache) Set(ctx context.Context, key string, val []byte, ttl time.Duration, tags ...string) error {
	if len(tags) == 0 {
		return c.set(ctx, key, val, ttl, nil)
	}
	t, err := checkTags(tags)
	if err != nil {
		return fmt.Errorf("herd: set %q: %w", key, err)
	}
	return c.set(ctx, key, val, ttl, t)
}

// set is Set, recording the key in the index of each of tags (valid,
// see checkTags) first.
func (c *Cache) set(ctx context.Context, key string, val []byte, ttl time.Duration, tags []string) error {
	if c.isClosed() {
		return ErrClosed
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	if len(val) > c.cfg.MaxValueBytes {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrValueTooLarge, len(val), c.cfg.MaxValueBytes)
	}
	keys, err := makeKeys(c.cfg.Prefix, key)
	if err != nil {
		return err
	}
	ttl = c.jitter(ttl)
	env := c.newEnvelope(0, val, ttl, c.cfg.StaleFor, 0).Encode()
	if len(tags) > 0 {
		c.useTags()
	}
	err = c.untilDone(ctx, key, func() error {
		hard := ttl + c.cfg.StaleFor
		if len(tags) > 0 {
			// The index must cover the value from before it is written
			// until after it expires: the value's PX counts from now.
			deadline := time.Now().Add(hard)
			if _, err := c.recordTags(ctx, keys.Hash(), tags, hard, nil, c.cfg.MaxTagEntries); err != nil {
				return err
			}
			hard = max(time.Until(deadline), time.Millisecond)
		}
		cmd, werr := c.repl.run(ctx, c.rdb, keys.Fence, setScript, []string{keys.Value, keys.Fence, keys.Writes + newOwner()},
			env, hard.Milliseconds(), c.fenceTTL(ttl).Milliseconds(),
			c.notify.PublishCmd(ctx), keys.Channel, c.cfg.NotifyMaxBytes, writeMarkerTTL.Milliseconds(), c.nearChan, keys.Hash())
		if err := cmd.Err(); err != nil {
			return err
		}
		return werr
	})
	if err != nil {
		return fmt.Errorf("herd: set %q: %w", key, err)
	}
	c.warm.mark(warmID(keys.Value)) // it is in Redis: the next Get reads it
	return nil
}

// Invalidate deletes key's value and advances its fence, in one round
// trip: a rebuild in flight when Invalidate runs cannot write its value
// afterwards (the stale-set race that memcache leases close); the next Get
// loads again. Errors: [ErrInvalidKey], [ErrClosed] after Close,
// [ErrNotReplicated] (as for Set) or the wrapped Redis error. When ctx
// ends first, Invalidate returns at once with an error wrapping ctx.Err();
// the write may still land.
func (c *Cache) Invalidate(ctx context.Context, key string) error {
	if c.isClosed() {
		return ErrClosed
	}
	keys, err := makeKeys(c.cfg.Prefix, key)
	if err != nil {
		return err
	}
	err = c.untilDone(ctx, key, func() error {
		cmd, werr := c.repl.run(ctx, c.rdb, keys.Fence, invalidateScript, []string{keys.Value, keys.Fence, keys.Writes + newOwner()},
			c.fenceTTL(time.Hour).Milliseconds(), writeMarkerTTL.Milliseconds(), c.nearChan, keys.Hash())
		if err := cmd.Err(); err != nil {
			return err
		}
		return werr
	})
	if err != nil {
		return fmt.Errorf("herd: invalidate %q: %w", key, err)
	}
	return nil
}

// untilDone runs write, a Set or Invalidate of key, and returns its error,
// or ctx.Err() as soon as ctx ends: go-redis does not give up a command
// it has sent when its context is cancelled. The write may then still
// land. Either way the key's local write count is raised before untilDone
// returns, and again when the write ends (see currency).
func (c *Cache) untilDone(ctx context.Context, key string, write func() error) error {
	_, err := leaveOnDone(ctx, c.track, func() (struct{}, error) {
		err := write()
		c.wrote(key) // even on an error: the write may have run
		return struct{}{}, err
	}, nil)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		c.wrote(key) // the caller left: the write may still land after it
	}
	return err
}

// track registers work that may outlive its caller (see leaveOnDone);
// Close waits for it. It reports false once Close began.
func (c *Cache) track() (done func(), ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return nil, false
	}
	c.wg.Add(1)
	return c.wg.Done, true
}

// writesOf returns the count of this Cache's returned writes of key's
// stripe; wrote adds one (see currency). Keys share a stripe by hash: a
// write of another key of the stripe only costs a caller a round trip.
func (c *Cache) writesOf(key string) uint64 { return c.writes[stripe(key)].Load() }
func (c *Cache) wrote(key string) {
	c.writes[stripe(key)].Add(1)
	c.nearWrote(key) // this process's near copy goes before the write returns
}

var stripeSeed = maphash.MakeSeed()

func stripe(key string) int { return int(maphash.String(stripeSeed, key) % 64) }

// Close cancels the rebuilds in flight (their loaders' contexts end), waits
// for them, aborts the Fills still open (their leases go to other
// processes at once), and stops the pub/sub connections (the near
// cache, when on, stops serving first). A rebuild whose loader had
// returned a value is still committed, so its value is stored and its
// lease released. Callers still
// waiting in Get, Fetch, Begin or Peek return [ErrClosed] at once, but
// for a Get or Peek whose ctx cannot end (or any, with
// [Options.InlineHits]) and whose GET is under way: it returns when that
// GET does (see [Cache.Get]), and Close does not wait for it. A Redis
// command sent from the Cache's own goroutines cannot be taken back: Close waits for it, for up to
// the client's ReadTimeout and WriteTimeout (keep them short). Every later call
// of Get, [Fetch], Begin, Peek, Set, Invalidate and InvalidateSoft returns [ErrClosed], without
// touching Redis. A Fill that Close aborted has given its lease back: its
// Commit and Abort do nothing and return nil. Close is idempotent. It does
// not close the Redis client.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.closing.Store(true)
	c.mu.Unlock()
	c.near.close() // near hits stop before anything else
	c.abortOpenFills()
	c.cancel()
	c.wg.Wait()
	c.abortOpenFills() // Fills that a Begin already running made meanwhile
	return c.locker.Close()
}

// readsReplicas reports whether rdb may send a read-only command such as
// GET to a replica. go-redis sets ClusterOptions.ReadOnly for
// RouteByLatency and RouteRandomly, and for a failover cluster client's
// ReplicaOnly; scripts (EVALSHA) are never read-only, so they go to the
// slot's master.
func readsReplicas(rdb redis.UniversalClient) bool {
	cc, ok := rdb.(*redis.ClusterClient)
	return ok && cc.Options().ReadOnly
}

// isOneMaster reports whether rdb talks to one master: every key of herd's
// is on it.
func isOneMaster(rdb redis.UniversalClient) bool {
	switch rdb.(type) {
	case *redis.ClusterClient, *redis.Ring:
		return false
	}
	return true
}

// readValue GETs a value key from its master.
func (c *Cache) readValue(ctx context.Context, key string) ([]byte, error) {
	if !c.masterReads {
		return c.rdb.Get(ctx, key).Bytes()
	}
	s, err := sendRead(ctx, c.rdb, getScript, []string{key}).Text()
	if err != nil {
		return nil, err
	}
	return []byte(s), nil
}

// isClosed reports whether Close was called.
func (c *Cache) isClosed() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.closed
}

// Stats returns the Cache's counters since New.
func (c *Cache) Stats() Stats { return c.stats.snapshot() }

// jitter shortens ttl by up to TTLJitter of it.
func (c *Cache) jitter(ttl time.Duration) time.Duration {
	if c.cfg.TTLJitter == 0 {
		return ttl
	}
	cut := time.Duration(float64(ttl) * c.cfg.TTLJitter * rand.Float64())
	return max(ttl-cut, time.Millisecond)
}

func (c *Cache) fenceTTL(ttl time.Duration) time.Duration { return c.locker.fenceTTL(ttl) }

func (c *Cache) log(level slog.Level, msg string, args ...any) {
	c.sig.logRare(level, msg, args...)
}

// Stats are a Cache's counters. Every field counts events since New.
//
// The lookup counters (Hits, NegativeHits, StaleServed, Passes, Misses)
// count lookups: each Get that finds a fresh value (or negative entry)
// with no early refresh due is one, since each sends its own GET; past
// that (an early refresh included), concurrent Get callers of a key in
// one process share one flight, which counts once, while each
// [Cache.Begin] call is its own. Follows is the exception: it counts
// callers, as [Observer.Lookup] reports them, not flights: every caller
// served by another caller's rebuild, whether it joined a flight in this
// process or its flight waited for another process (Waits counts those
// flights). A follower that finds the rebuilt value counts as a follow,
// not as a hit. docs/design.md ("Metrics: one name per count") maps each
// field to its Prometheus and OpenTelemetry series. Loads and LocalLoads
// count every run of a loader or [Fill], whatever its result; LoadErrors
// and NotShared count some of them.
type Stats struct {
	Hits         uint64 // a lookup found a fresh value in Redis
	NegativeHits uint64 // a lookup found a remembered ErrNotFound in Redis
	Misses       uint64 // no usable value: a rebuild was needed
	Corrupt      uint64 // bytes at a value key that are not an intact envelope (read as a miss)
	Loads        uint64 // loader runs and Fills under a lease (origin calls by a leader)
	LocalLoads   uint64 // loader runs and Fills without a lease (fail-open or fallback)
	LoadErrors   uint64 // loader runs and Fills that failed or panicked
	NotShared    uint64 // loads whose value was not for sharing (ErrNotShared, Fill.Pass, a Fill value above MaxValueBytes): no failure
	Passes       uint64 // Begin calls answered by a pass mark (Fill.Pass)
	Leads        uint64 // flights that won the lease
	Follows      uint64 // callers served by another caller's rebuild: they joined a flight in this process, or their flight waited (Lookup's OutcomeFollower)
	Waits        uint64 // flights that waited on another process's rebuild (Observer.Wait)
	Takeovers    uint64 // followers that won the lease after the leader released or lapsed
	LoadRetries  uint64 // follower flights that retried a failed load (Options.RetryFailedLoad, NoShare)
	Notified     uint64 // waits ended by a wake-up message
	Polled       uint64 // polls made while waiting
	WaitTimeouts uint64 // waits that spent their budget (Fallback applied)
	Fenced       uint64 // commits rejected because the fence moved on (duplicate or stale rebuild) or a tag of the value was purged after the rebuild began
	CommitErrors uint64 // commits that failed on a Redis error, or whose tags could not be recorded (the value was still returned)
	// CommitsUnreplicated counts commits the master stored (and woke the
	// waiters with) but too few replicas acknowledged within
	// ReplicaTimeout: a failover may lose them. Not in CommitErrors.
	CommitsUnreplicated uint64
	FailOpen            uint64 // flights that loaded locally because Redis was unreachable
	BreakerOpens        uint64 // times the circuit breaker opened

	StaleServed      uint64 // stale values served within StaleFor
	EarlyRefreshes   uint64 // fresh hits that started an early refresh (XFetch)
	Refreshes        uint64 // background refreshes that won the lease and ran the loader
	RefreshErrors    uint64 // background refreshes whose loader failed (stale-if-error)
	RefreshesDropped uint64 // background refreshes not started: the pool was full

	// The near cache (Options.Near). These count calls, not flights: a
	// near hit is a Get answered from process memory (its Outcome is
	// OutcomeHit or OutcomeNegative; it is not counted in Hits). A near
	// miss's fill is one GET per key per process; a fresh value it finds
	// counts as a Hit.
	NearHits          uint64 // Gets answered from the near cache
	NearMisses        uint64 // Gets that found no usable near copy (they joined or started the key's fill)
	NearBypassed      uint64 // Gets that skipped the near cache: a subscription unconfirmed, or a heartbeat older than Staleness
	NearInvalidations uint64 // invalidation messages handled (on a Cluster each master delivers every message)
	NearFlushes       uint64 // times the whole near cache was dropped (a lost connection, a topology change, a tag purge by this Cache, Close)
}

type counters struct {
	hits, negativeHits, misses, corrupt, loads, localLoads, loadErrors      atomic.Uint64
	notShared, passes                                                       atomic.Uint64
	leads, follows, waits, takeovers, notified, polled, waitTimeouts        atomic.Uint64
	fenced                                                                  atomic.Uint64
	commitErrors, failOpen, breakerOpens, loadRetries                       atomic.Uint64
	commitsUnreplicated                                                     atomic.Uint64
	staleServed, earlyRefreshes, refreshes, refreshErrors, refreshesDropped atomic.Uint64
	nearHits, nearMisses, nearBypassed, nearInvalidations, nearFlushes      atomic.Uint64
}

func (s *counters) snapshot() Stats {
	return Stats{
		Hits: s.hits.Load(), NegativeHits: s.negativeHits.Load(), Misses: s.misses.Load(),
		Corrupt: s.corrupt.Load(), Loads: s.loads.Load(), LocalLoads: s.localLoads.Load(),
		LoadErrors: s.loadErrors.Load(), NotShared: s.notShared.Load(), Passes: s.passes.Load(),
		Leads: s.leads.Load(), Follows: s.follows.Load(), Waits: s.waits.Load(),
		Takeovers: s.takeovers.Load(), LoadRetries: s.loadRetries.Load(), Notified: s.notified.Load(), Polled: s.polled.Load(),
		WaitTimeouts: s.waitTimeouts.Load(), Fenced: s.fenced.Load(), CommitErrors: s.commitErrors.Load(), CommitsUnreplicated: s.commitsUnreplicated.Load(),
		FailOpen: s.failOpen.Load(), BreakerOpens: s.breakerOpens.Load(),
		StaleServed: s.staleServed.Load(), EarlyRefreshes: s.earlyRefreshes.Load(),
		Refreshes: s.refreshes.Load(), RefreshErrors: s.refreshErrors.Load(),
		RefreshesDropped: s.refreshesDropped.Load(), NearHits: s.nearHits.Load(),
		NearMisses: s.nearMisses.Load(), NearBypassed: s.nearBypassed.Load(),
		NearInvalidations: s.nearInvalidations.Load(), NearFlushes: s.nearFlushes.Load(),
	}
}
