package herd

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdkit/herd/internal/lease"
	"github.com/herdkit/herd/internal/wire"
	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// The near cache: an opt-in copy of fresh values in process memory, in
// front of the flight (Get: near cache → local flight → Redis GET →
// lease). docs/design.md ("Near cache") has the staleness proof; this is
// the mechanism.
//
//   - Every script that changes a value (COMMIT, SET, INVALIDATE, SOFT,
//     and so the leaders' and refreshes' commits, Fill.Commit, Fill.Pass,
//     Set, Invalidate, InvalidateSoft and a tag purge's invalidations)
//     also PUBLISHes, with
//     classic PUBLISH, "<T><fence>" on the channel "<prefix>:near" (T the
//     key's hash tag, fence the write's). Every Cache publishes, whether
//     or not its own near cache is on.
//   - A Cache with the near cache on holds one pub/sub connection per
//     master (one for a single server or a failover client, one per master
//     of a Cluster, re-read every second, one per live shard of a Ring),
//     subscribed to that channel, and PINGs on each every Staleness/4. A
//     message drops the key's near copy; the PONG of a PING sent at s
//     proves every message that master published before s was handled
//     (Redis answers a connection in order, and the receive loop handles
//     what it reads in order).
//   - A near hit is served only while, for every connection, the last
//     PONG handled answers a PING sent within the last Staleness. So a
//     write acknowledged before now − Staleness has been applied.
//   - A connection lost (an error, a second subscribe confirmation: a
//     reconnect behind herd's back, a silent server) flushes the whole
//     near cache; serving resumes after the new SUBSCRIBE is confirmed and
//     a PING sent after it is answered.
//   - A fill (a near miss, one per key per process) reads the key's
//     stripe sequence and the flush epoch before its GET, and inserts only
//     if neither moved; the check and the insert run under the store's
//     lock for the key (otter's Compute), as does a message's drop, so a
//     message that came during the GET always wins.

// NearOptions configures the near cache (see [Options.Near]). The zero
// value leaves it off; setting MaxEntries or MaxBytes turns it on.
// Negative values, or both bounds, make [New] panic.
type NearOptions struct {
	// MaxEntries bounds the near cache by the number of values it holds.
	MaxEntries int

	// MaxBytes bounds the near cache by the bytes it holds: each value's
	// payload and key plus 160 bytes of bookkeeping. Use MaxEntries or
	// MaxBytes, not both.
	MaxBytes int64

	// MaxAge caps how long a value is served from process memory after it
	// was read from Redis, whatever the invalidations. A value is never
	// served past its own fresh period either. Default: 1s.
	MaxAge time.Duration

	// Staleness is the bound on how late a near hit can be: a near hit
	// never returns a value that a write acknowledged more than Staleness
	// before the hit replaced (a write made through herd, by any process
	// sharing the Redis and the prefix). The near cache PINGs each of its
	// pub/sub connections every Staleness/4 and serves only while every
	// connection answered a PING sent within the last Staleness; otherwise
	// Get reads Redis. At least 10ms. Default: 250ms.
	Staleness time.Duration
}

const (
	defaultNearMaxAge    = time.Second
	defaultNearStaleness = 250 * time.Millisecond
	minNearStaleness     = 10 * time.Millisecond
	// nearEntryOverhead is what MaxBytes counts for an entry on top of its
	// payload and key: the entry's fields (the 32-byte ID among them), the
	// store's node and the ID's place in the reverse index.
	nearEntryOverhead = 160
	// nearStripes is the number of invalidation sequences; keys share one
	// by hash. A message for a key only refuses the fills in flight of the
	// keys of its stripe (they read again next time).
	nearStripes = 1024
	// nearTopologyEvery is how often the masters of a Cluster and the live
	// shards of a Ring are re-read.
	nearTopologyEvery = time.Second
	// nearRefreshWindow: with EarlyRefresh, a near copy ends this many
	// β·Δ before the value's fresh period, so that the reads in which XFetch
	// may start the refresh go to Redis.
	nearRefreshWindow = 3
)

// nearConfig is NearOptions with the defaults applied.
type nearConfig struct {
	on         bool
	maxEntries int
	maxBytes   int64
	maxAge     time.Duration
	staleness  time.Duration
}

func (o NearOptions) resolve() nearConfig {
	if o.MaxEntries < 0 {
		panic(fmt.Sprintf("herd: Options.Near.MaxEntries is negative (%d)", o.MaxEntries))
	}
	if o.MaxBytes < 0 {
		panic(fmt.Sprintf("herd: Options.Near.MaxBytes is negative (%d)", o.MaxBytes))
	}
	if o.MaxEntries > 0 && o.MaxBytes > 0 {
		panic("herd: Options.Near: set MaxEntries or MaxBytes, not both")
	}
	checkOption("Options.Near.MaxAge", o.MaxAge, time.Millisecond)
	checkOption("Options.Near.Staleness", o.Staleness, minNearStaleness)
	on := o.MaxEntries > 0 || o.MaxBytes > 0
	if !on && (o.MaxAge != 0 || o.Staleness != 0) {
		panic("herd: Options.Near.MaxAge or Staleness set without MaxEntries or MaxBytes (the near cache is off)")
	}
	cfg := nearConfig{on: on, maxEntries: o.MaxEntries, maxBytes: o.MaxBytes, maxAge: o.MaxAge, staleness: o.Staleness}
	setDefault(&cfg.maxAge, defaultNearMaxAge)
	setDefault(&cfg.staleness, defaultNearStaleness)
	return cfg
}

// nearChannel is the channel every value-changing script publishes on.
func nearChannel(prefix string) string { return prefix + ":near" }

// nearID is a key's identity in the messages: the SHA-256 its hash tag T
// encodes. The store is keyed by the key itself, so that a near hit does
// not hash it; the reverse index (near.rev) finds the key of a message.
type nearID = [sha256.Size]byte

func nearIDOf(key string) nearID { return sha256.Sum256([]byte(key)) }

// nearTagLen is the length of a hash tag T: unpadded base64url of 32 bytes.
const nearTagLen = 43

// nearIDOfTag decodes a hash tag T.
func nearIDOfTag(t string) (id nearID, ok bool) {
	if len(t) != nearTagLen {
		return id, false
	}
	var buf [nearTagLen]byte
	n, err := base64.RawURLEncoding.Decode(id[:], append(buf[:0], t...))
	return id, err == nil && n == sha256.Size
}

func nearStripe(id nearID) int { return int(uint16(id[0])|uint16(id[1])<<8) % nearStripes }

// nearEntry is one value in process memory. It is never modified: a
// caller gets a copy of val.
type nearEntry struct {
	id       nearID // the key's ID, for the reverse index
	val      []byte
	fence    uint64
	expires  time.Time // by the Cache's clock: MaxAge after the read, or the end of the fresh period
	deadline int64     // the same instant as a mono() reading: a step of the wall clock does not move it
	negative bool
	epoch    uint64 // the flush epoch it was read in

	writtenAt, softExp time.Time // the value's, for Begin's Hit
}

// near is a Cache's near cache.
type near struct {
	c       *Cache
	cfg     nearConfig
	channel string
	store   *otter.Cache[string, nearEntry]
	fills   singleflight.Group

	// rev is the reverse index of the store, per stripe of IDs: the key
	// of every ID the store holds, for the messages, which carry IDs. It
	// is written only under the lock of the store's bucket of the key (in
	// insert's Compute and in the store's atomic deletion handler), and
	// its locks are never held while calling the store.
	rev [nearStripes]nearRev

	seq   [nearStripes]atomic.Uint64 // per stripe: drops (messages, own writes)
	epoch atomic.Uint64              // whole-cache flushes
	live  atomic.Bool                // every connection's subscription is confirmed
	until atomic.Int64               // mono(): near hits may be served before it (0: not serving)
	base  time.Time                  // origin of mono

	hooks atomic.Pointer[nearHooks] // tests only
	tasks chan func()               // otter's maintenance, run by one goroutine

	ctx    context.Context // ends on close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex // guards the fields below and each nearConn's state
	closed bool
	conns  map[string]*nearConn
}

// nearRev is one stripe of the reverse index.
type nearRev struct {
	mu sync.Mutex
	m  map[nearID]string
}

func (n *near) revAdd(id nearID, key string) {
	r := &n.rev[nearStripe(id)]
	r.mu.Lock()
	if r.m == nil {
		r.m = make(map[nearID]string)
	}
	r.m[id] = key
	r.mu.Unlock()
}

func (n *near) revDel(id nearID, key string) {
	r := &n.rev[nearStripe(id)]
	r.mu.Lock()
	if k, ok := r.m[id]; ok && k == key {
		delete(r.m, id)
	}
	r.mu.Unlock()
}

// revKey returns the key of id, if the store holds it.
func (n *near) revKey(id nearID) (string, bool) {
	r := &n.rev[nearStripe(id)]
	r.mu.Lock()
	k, ok := r.m[id]
	r.mu.Unlock()
	return k, ok
}

// nearHooks let tests hold the subscriber at chosen points.
type nearHooks struct {
	receive     func(addr string, gen uint64, msg any, err error) // after a read of session gen, before it is handled
	resubscribe func(addr string)                                 // before a connection subscribes again after a loss
	applied     func(id nearID, fence uint64)                     // after a message dropped a key
	beforeFill  func(key string)                                  // a fill read Redis and is about to insert
	joined      func(key string)                                  // a near miss joined (or started) its key's fill
}

func (c *Cache) newNear(cfg nearConfig) *near {
	n := &near{c: c, cfg: cfg, channel: nearChannel(c.cfg.Prefix), base: time.Now(),
		conns: make(map[string]*nearConn), tasks: make(chan func(), 64)}
	opt := &otter.Options[string, nearEntry]{
		// One goroutine of the near cache runs otter's maintenance, and
		// the caller when it is busy: no goroutine outlives Close.
		Executor: n.execute,
		// Every deletion but a replacement (insert's own write, which
		// keeps the ID) leaves the reverse index with the entry.
		OnAtomicDeletion: func(e otter.DeletionEvent[string, nearEntry]) {
			if e.Cause != otter.CauseReplacement {
				n.revDel(e.Value.id, e.Key)
			}
		},
	}
	if cfg.maxEntries > 0 {
		opt.MaximumSize = cfg.maxEntries
	} else {
		opt.MaximumWeight = uint64(cfg.maxBytes)
		opt.Weigher = func(key string, e nearEntry) uint32 {
			return uint32(min(len(e.val)+len(key)+nearEntryOverhead, math.MaxUint32))
		}
	}
	n.store = otter.Must(opt)
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.wg.Add(1)
	go n.maintain()
	n.start()
	return n
}

// execute is otter's executor.
func (n *near) execute(fn func()) {
	select {
	case n.tasks <- fn:
	default:
		fn()
	}
}

func (n *near) maintain() {
	defer n.wg.Done()
	for {
		select {
		case fn := <-n.tasks:
			fn()
		case <-n.ctx.Done():
			for {
				select {
				case fn := <-n.tasks:
					fn()
				default:
					return
				}
			}
		}
	}
}

// mono is the monotonic time since the near cache started, in ns, > 0.
func (n *near) mono() int64 { return int64(time.Since(n.base)) + 1 }

// serving reports whether near hits may be served at mono (a mono()
// reading).
func (n *near) serving(mono int64) bool { return mono < n.until.Load() }

// nearSnap is what a fill reads before its GET.
type nearSnap struct {
	seq, epoch uint64
	live       bool
}

func (n *near) snapshot(id nearID) nearSnap {
	// epoch first: a flush bumps it before clearing, a drop bumps seq.
	e := n.epoch.Load()
	return nearSnap{seq: n.seq[nearStripe(id)].Load(), epoch: e, live: n.live.Load()}
}

// insert stores e (whose id is key's) unless the key's stripe saw a drop
// or the cache a flush since snap, or a subscription is down. It reports
// whether it stored.
func (n *near) insert(key string, e nearEntry, snap nearSnap) bool {
	st := nearStripe(e.id)
	stored := false
	n.store.Compute(key, func(old nearEntry, found bool) (nearEntry, otter.ComputeOp) {
		// The key goes into the reverse index before the sequence is
		// checked: a drop raises the sequence before it reads the index,
		// so either this check sees the raise or the drop finds the key
		// (and waits for this bucket's lock to delete the entry).
		n.revAdd(e.id, key)
		if !snap.live || n.seq[st].Load() != snap.seq || n.epoch.Load() != snap.epoch || !n.live.Load() {
			if !found {
				n.revDel(e.id, key)
			}
			return old, otter.CancelOp
		}
		stored = true
		return e, otter.WriteOp
	})
	return stored
}

// drop removes the near copy of the key whose ID is id, and refuses the
// fills in flight of its stripe. A message (fence > 0) leaves a copy of
// the very write it announces: the fill read it before the message came.
//
// The stripe's sequence is raised before the reverse index is read (see
// insert for the other half): no copy read before the drop stays.
func (n *near) drop(id nearID, fence uint64) {
	n.seq[nearStripe(id)].Add(1)
	key, ok := n.revKey(id)
	if !ok {
		return
	}
	n.store.Compute(key, func(old nearEntry, found bool) (nearEntry, otter.ComputeOp) {
		switch {
		case !found || old.id != id:
			return old, otter.CancelOp
		case fence != 0 && old.fence == fence:
			return old, otter.CancelOp
		}
		return old, otter.InvalidateOp
	})
}

// flush drops every near copy.
func (n *near) flush() {
	n.epoch.Add(1)
	n.store.InvalidateAll()
	n.c.stats.nearFlushes.Add(1)
}

// apply handles a message "<T><fence>".
func (n *near) apply(payload string) {
	if len(payload) <= nearTagLen {
		return
	}
	id, ok := nearIDOfTag(payload[:nearTagLen])
	if !ok {
		return
	}
	fence, err := strconv.ParseUint(payload[nearTagLen:], 10, 64)
	if err != nil {
		return
	}
	n.drop(id, fence)
	n.c.stats.nearInvalidations.Add(1)
	if h := n.hooks.Load(); h != nil && h.applied != nil {
		h.applied(id, fence)
	}
}

// nearPeers holds, per prefix, the Caches of this process whose near
// cache is on: a write by any Cache of the process (near cache on or off)
// drops their copies of the key and counts in their write counts before
// it returns, as it does in its own Cache (a Cache with another Redis
// and the same prefix only loses a copy).
var nearPeers struct {
	mu sync.RWMutex
	m  map[string]map[*Cache]struct{}
}

func (c *Cache) joinNearPeers() {
	nearPeers.mu.Lock()
	defer nearPeers.mu.Unlock()
	if nearPeers.m == nil {
		nearPeers.m = make(map[string]map[*Cache]struct{})
	}
	set := nearPeers.m[c.cfg.Prefix]
	if set == nil {
		set = make(map[*Cache]struct{})
		nearPeers.m[c.cfg.Prefix] = set
	}
	set[c] = struct{}{}
}

func (c *Cache) leaveNearPeers() {
	nearPeers.mu.Lock()
	defer nearPeers.mu.Unlock()
	if set := nearPeers.m[c.cfg.Prefix]; set != nil {
		delete(set, c)
		if len(set) == 0 {
			delete(nearPeers.m, c.cfg.Prefix)
		}
	}
}

// eachNearPeer calls fn for every other Cache of this process with the
// near cache on and c's prefix.
func (c *Cache) eachNearPeer(fn func(p *Cache)) {
	nearPeers.mu.RLock()
	defer nearPeers.mu.RUnlock()
	for p := range nearPeers.m[c.cfg.Prefix] {
		if p != c {
			fn(p)
		}
	}
}

// nearWrote drops this process's near copies of key after a write of it
// by this Cache (see wrote): its own, and those of every other Cache of
// the process with the prefix, which also counts the write in its write
// count as its own (see currency).
func (c *Cache) nearWrote(key string) {
	id, st := nearIDOf(key), stripe(key)
	if c.near != nil {
		c.near.drop(id, 0)
	}
	c.eachNearPeer(func(p *Cache) {
		p.writes[st].Add(1)
		p.near.drop(id, 0)
	})
}

// nearWroteAll flushes this process's near caches of the prefix after a
// write that may have touched any key (a tag purge).
func (c *Cache) nearWroteAll() {
	if c.near != nil {
		c.near.flush()
	}
	c.eachNearPeer(func(p *Cache) {
		for i := range p.writes {
			p.writes[i].Add(1)
		}
		p.near.flush()
	})
}

// nearResult is a fill's answer.
type nearResult struct {
	e      nearEntry // the value read (e.val aliases the stored entry: copy before handing it out)
	ok     bool      // a fresh value or negative entry was read
	pre    *preRead  // otherwise, the read for the flight (nil: none was made)
	sent   int64     // mono() when the GET was sent
	writes uint64    // the key's local write count before the GET (see currency)
	seq    uint64    // the key's stripe sequence before the GET
}

// nearHit answers Get from process memory, before anything else of Get:
// ok is false when there is no copy to serve (or the near cache is not
// serving).
func (c *Cache) nearHit(ctx context.Context, key string) (a answer, ok bool) {
	e, ok := c.nearCopy(key)
	if !ok {
		return answer{}, false
	}
	if err := ctx.Err(); err != nil {
		return answer{err: err}, true
	}
	c.stats.nearHits.Add(1)
	a.val, a.err = c.nearAnswer(ctx, key, e.val, e.negative)
	return a, true
}

// nearCopy returns the near copy of key that may be served now, if any
// (e.val aliases the store: copy it).
func (c *Cache) nearCopy(key string) (e nearEntry, ok bool) {
	n := c.near
	mono := n.mono()
	if key == "" || !n.serving(mono) || c.closing.Load() {
		return e, false
	}
	e, found := n.store.GetIfPresent(key)
	return e, found && n.usable(e, mono)
}

// usable reports whether e may be served at mono (a mono() reading of
// now): read in the current flush epoch, and neither past its expiry by
// the Cache's clock nor past its deadline on the monotonic clock (MaxAge
// and the fresh period are durations from the read, whatever the wall
// clock does meanwhile).
func (n *near) usable(e nearEntry, mono int64) bool {
	return e.epoch == n.epoch.Load() && mono < e.deadline && n.c.now().Before(e.expires)
}

// nearGet is a near miss: it joins or starts the key's fill and answers
// with it. done is false when Get must go on: then pre, if not nil, is
// the fill's read, which the flight starts from, as it does from a hit's
// (see hit.go); with pre nil, Get reads itself (the near cache is not
// serving, or the fill's read is not current for this caller).
func (c *Cache) nearGet(ctx context.Context, key, vkey string) (val []byte, done bool, pre *preRead, err error) {
	e, done, pre, err := c.nearLook(ctx, key, vkey)
	if !done || err != nil {
		return nil, done, pre, err
	}
	val, err = c.nearAnswer(ctx, key, e.val, e.negative)
	return val, true, nil, err
}

// nearLook is nearGet's lookup: with done and no err, e is the answer,
// counted as a near hit but not yet as a lookup (e.val aliases the store:
// copy it).
func (c *Cache) nearLook(ctx context.Context, key, vkey string) (e nearEntry, done bool, pre *preRead, err error) {
	n := c.near
	mono := n.mono()
	if !n.serving(mono) {
		c.stats.nearBypassed.Add(1)
		return e, false, nil, nil
	}
	id := c.nearIDOfValueKey(vkey)
	if e, ok := n.store.GetIfPresent(key); ok && n.usable(e, mono) {
		// A fill that ended since nearHit looked.
		c.stats.nearHits.Add(1)
		return e, true, nil, nil
	}
	c.stats.nearMisses.Add(1)
	// What this caller knows of when it joins: the key's write count, and
	// the drops of its stripe (messages, this process's writes and
	// commits) it could have seen.
	entered, writes, dropped := n.mono(), c.writesOf(key), n.seq[nearStripe(id)].Load()
	ch := n.fills.DoChan(key, func() (any, error) { return c.nearFill(key, vkey, id), nil })
	if h := n.hooks.Load(); h != nil && h.joined != nil {
		h.joined(key)
	}
	select {
	case <-ctx.Done():
		return e, true, nil, ctx.Err()
	case <-c.ctx.Done():
		return e, true, nil, ErrClosed
	case r := <-ch:
		res := r.Val.(*nearResult)
		if res.writes != writes {
			// A write of this process returned after the GET may have
			// been sent: read again.
			return e, false, nil, nil
		}
		if !res.ok {
			if res.sent < entered {
				return e, false, nil, nil // the flight would not take it for this caller
			}
			return e, false, res.pre, nil
		}
		if entered-res.sent > int64(n.cfg.staleness) {
			// Joined later than Staleness after the GET was sent: a
			// write another process made in between may be missing.
			return e, false, nil, nil
		}
		if res.seq < dropped {
			// The fill's read predates a drop of the key's stripe that
			// came before this caller: a commit of this process (which
			// the write count does not show) or a message. The fill's
			// insert was refused; so is its answer.
			return e, false, nil, nil
		}
		if !n.usable(res.e, n.mono()) {
			// A flush (a lost subscription) came, or the fresh period or
			// MaxAge ended, since the fill judged the value: the fill may
			// have been held up between its GET and its return.
			return e, false, nil, nil
		}
		return res.e, true, nil, nil
	}
}

// nearAnswer is a near hit's or a fill's answer to one caller.
func (c *Cache) nearAnswer(ctx context.Context, key string, val []byte, negative bool) ([]byte, error) {
	o := OutcomeHit
	if negative {
		o = OutcomeNegative
	}
	recordOutcome(ctx, o)
	c.reportLookup(key, o)
	if negative {
		return nil, ErrNotFound
	}
	// make and copy, not bytes.Clone: one allocation of exactly len(val),
	// without append's growth path.
	out := make([]byte, len(val))
	copy(out, val)
	return out, nil
}

// nearFill reads key from Redis for the near cache, and stores it there
// when it is fresh. It runs detached from the callers (they wait on the
// fill with their own contexts), bounded by the client's timeouts.
// Anything but a fresh value or negative entry goes to the flight, as the
// hit path's read does (see hit.go).
func (c *Cache) nearFill(key, vkey string, id nearID) (res *nearResult) {
	res = &nearResult{}
	done, ok := c.track()
	if !ok {
		return res
	}
	defer done()
	defer func() {
		if r := recover(); r != nil {
			res = &nearResult{} // herd's own bug: Get goes on without the near cache
		}
	}()
	n := c.near
	snap := n.snapshot(id)
	res.writes, res.seq = c.writesOf(key), snap.seq
	if !snap.live || c.brk.troubled.Load() {
		return res // the flight asks the breaker
	}
	sent := time.Now()
	res.sent = n.mono()
	b, err := c.readValue(c.ctx, vkey)
	switch {
	case err == nil:
	case c.ctx.Err() != nil:
		return res
	case isInfraError(err):
		c.redisFailed(err)
		res.pre = &preRead{sent: sent, err: err}
		return res
	}
	c.redisAnswered()
	res.pre = &preRead{sent: sent}
	if err != nil {
		return res // redis.Nil or a wrong-type reply: a miss
	}
	env, ok := wire.DecodeEnvelope(b)
	if !ok {
		c.countCorrupt(key, len(b))
		return res
	}
	res.pre.env, res.pre.ok = env, true
	e, ok := c.nearEntryOf(id, env, snap)
	if !ok {
		return res // stale, a pass mark, or where XFetch may refresh: the flight decides
	}
	c.calib.observeRebuild(vkey, key, c.cfg.classLabel, env.Fence, env.Delta)
	if env.Negative {
		c.stats.negativeHits.Add(1)
	} else {
		c.stats.hits.Add(1)
	}
	if h := n.hooks.Load(); h != nil && h.beforeFill != nil {
		h.beforeFill(key)
	}
	n.insert(key, e, snap)
	res.e, res.ok, res.pre = e, true, nil
	return res
}

// nearEntryOf is the near copy of env, just read for the key whose ID is
// id after snap was taken: it lives MaxAge from now, and never past the
// value's fresh period (less the early-refresh window). ok is false for
// a value that must not be copied: a pass mark, or one past that end.
func (c *Cache) nearEntryOf(id nearID, env envelope, snap nearSnap) (e nearEntry, ok bool) {
	n := c.near
	now := c.now()
	exp := now.Add(n.cfg.maxAge)
	soft := env.SoftExp
	if c.cfg.EarlyRefresh > 0 && !env.Negative {
		soft = soft.Add(-time.Duration(nearRefreshWindow * c.cfg.EarlyRefresh * float64(env.Delta)))
	}
	if soft.Before(exp) {
		exp = soft
	}
	if env.Pass || !now.Before(exp) {
		return e, false
	}
	deadline := n.mono() + int64(exp.Sub(now))
	return nearEntry{id: id, val: env.Payload, fence: env.Fence, expires: exp, deadline: deadline, negative: env.Negative, epoch: snap.epoch,
		writtenAt: env.WrittenAt, softExp: env.SoftExp}, true
}

// nearIDOfValueKey is the ID of the key whose value's Redis name is vkey
// (P:{T}:v).
func (c *Cache) nearIDOfValueKey(vkey string) nearID {
	id, _ := nearIDOfTag(vkey[len(c.cfg.Prefix)+2 : len(c.cfg.Prefix)+2+nearTagLen])
	return id
}

// close stops the subscriber goroutines and empties the near cache. Near
// hits stop at once.
func (n *near) close() {
	if n == nil {
		return
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	n.recomputeLocked()
	n.mu.Unlock()
	n.c.leaveNearPeers()
	n.cancel()
	n.wg.Wait()
	n.epoch.Add(1)
	n.store.InvalidateAll()
}

// recomputeLocked derives live and until from the connections. Under mu.
func (n *near) recomputeLocked() {
	live := !n.closed && len(n.conns) > 0
	low := int64(math.MaxInt64)
	for _, cn := range n.conns {
		if !cn.confirmed {
			live = false
		}
		low = min(low, cn.lastAck)
	}
	n.live.Store(live)
	if !live || low == 0 {
		n.until.Store(0)
		return
	}
	n.until.Store(low + int64(n.cfg.staleness))
}

// start starts the subscribers for rdb's masters.
func (n *near) start() {
	switch rdb := n.c.rdb.(type) {
	case *redis.ClusterClient:
		n.wg.Add(1)
		go n.watchTopology(func(ctx context.Context) (map[string]*redis.Client, error) {
			var mu sync.Mutex
			found := make(map[string]*redis.Client)
			err := rdb.ForEachMaster(ctx, func(_ context.Context, cl *redis.Client) error {
				mu.Lock()
				found[cl.Options().Addr] = cl
				mu.Unlock()
				return nil
			})
			return found, err
		})
	case *redis.Ring:
		n.wg.Add(1)
		go n.watchTopology(func(ctx context.Context) (map[string]*redis.Client, error) {
			var mu sync.Mutex
			found := make(map[string]*redis.Client)
			err := rdb.ForEachShard(ctx, func(_ context.Context, cl *redis.Client) error {
				mu.Lock()
				found[cl.Options().Addr] = cl
				mu.Unlock()
				return nil
			})
			return found, err
		})
	default:
		n.mu.Lock()
		n.addConnLocked("", func() *redis.PubSub { return rdb.Subscribe(context.Background()) })
		n.mu.Unlock()
	}
}

// watchTopology keeps one connection per master (or live shard), as
// discover reports them, re-read every nearTopologyEvery. A change
// flushes the near cache: a write on a master it had no connection to
// may have reached it only through the cluster bus.
func (n *near) watchTopology(discover func(context.Context) (map[string]*redis.Client, error)) {
	defer n.wg.Done()
	wait := time.Duration(0)
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(wait):
		}
		ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
		found, err := discover(ctx)
		cancel()
		if err != nil || len(found) == 0 {
			// Keep what we have: its connections fail on their own if the
			// masters are gone. Retry soon while none is known.
			n.mu.Lock()
			none := len(n.conns) == 0
			n.mu.Unlock()
			wait = nearTopologyEvery
			if none {
				wait = 100 * time.Millisecond
			}
			continue
		}
		wait = nearTopologyEvery
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return
		}
		had := len(n.conns) > 0
		changed := false
		for addr, cl := range found {
			if n.conns[addr] == nil {
				n.addConnLocked(addr, func() *redis.PubSub { return cl.Subscribe(context.Background()) })
				changed = true
			}
		}
		for addr, cn := range n.conns {
			if found[addr] == nil {
				cn.cancel()
				delete(n.conns, addr)
				changed = true
			}
		}
		if changed {
			n.recomputeLocked()
		}
		n.mu.Unlock()
		if changed && had {
			n.flush()
		}
	}
}

// nearConn is one subscriber connection and its heartbeat.
type nearConn struct {
	n      *near
	addr   string
	newPS  func() *redis.PubSub
	ctx    context.Context
	cancel context.CancelFunc

	// Under n.mu.
	gen       uint64 // the current session; confirm, ack and lost of an older one are ignored
	ended     bool   // the current session was lost: a late confirmation does not revive it
	confirmed bool   // the current session's SUBSCRIBE was confirmed
	lastAck   int64  // mono() of the PING whose PONG was handled last in this session; 0: none
}

func (n *near) addConnLocked(addr string, newPS func() *redis.PubSub) {
	cn := &nearConn{n: n, addr: addr, newPS: newPS}
	cn.ctx, cn.cancel = context.WithCancel(n.ctx)
	n.conns[addr] = cn
	n.recomputeLocked()
	n.wg.Add(1)
	go cn.run()
}

// run runs sessions until the connection is stopped, backing off after
// sessions that never got confirmed.
func (cn *nearConn) run() {
	defer cn.n.wg.Done()
	backoff := time.Duration(0)
	for i := 0; ; i++ {
		if i > 0 {
			if backoff > 0 {
				select {
				case <-cn.ctx.Done():
					return
				case <-time.After(lease.Jitter(backoff)):
				}
			}
			if h := cn.n.hooks.Load(); h != nil && h.resubscribe != nil {
				h.resubscribe(cn.addr)
			}
		}
		if cn.ctx.Err() != nil {
			return
		}
		if cn.session() {
			backoff = 0
		} else {
			backoff = min(max(2*backoff, 50*time.Millisecond), 2*time.Second)
		}
	}
}

// session is one pub/sub connection's life: SUBSCRIBE, then PINGs every
// Staleness/4 until an error, a silence or the stop. It reports whether
// the subscription was confirmed. Whatever ends it flushes the near cache.
func (cn *nearConn) session() (confirmed bool) {
	n := cn.n
	n.mu.Lock()
	cn.gen++
	gen := cn.gen
	cn.ended, cn.confirmed, cn.lastAck = false, false, 0
	n.mu.Unlock()
	ps := cn.newPS()
	start := n.mono()
	var wasConfirmed atomic.Bool
	var lostOnce sync.Once
	lost := func() { lostOnce.Do(func() { cn.lost(gen, wasConfirmed.Load()) }) }
	defer lost()
	if err := ps.Subscribe(cn.ctx, n.channel); err != nil {
		_ = ps.Close()
		return false
	}
	confirmedC := make(chan struct{}, 1)
	done := make(chan struct{})
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer close(done)
		defer lost()
		cn.receive(ps, gen, start, func() {
			wasConfirmed.Store(true)
			confirmedC <- struct{}{}
		})
	}()
	end := func() bool {
		lost()
		_ = ps.Close()
		<-done
		return wasConfirmed.Load()
	}
	interval := max(n.cfg.staleness/4, time.Millisecond)
	// A connection silent this long is dead: drop it and dial again.
	silent := max(4*n.cfg.staleness, time.Second)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	ping := func() bool {
		ctx, cancel := context.WithTimeout(cn.ctx, silent)
		defer cancel()
		return ps.Ping(ctx, strconv.FormatInt(n.mono(), 10)) == nil
	}
	for {
		select {
		case <-cn.ctx.Done():
			return end()
		case <-done:
			return end()
		case <-confirmedC:
			if !ping() {
				return end()
			}
		case <-tick.C:
			n.mu.Lock()
			heard := max(cn.lastAck, start)
			ok := cn.confirmed
			n.mu.Unlock()
			if n.mono()-heard > int64(silent) {
				return end()
			}
			if ok && !ping() {
				return end()
			}
		}
	}
}

// receive reads the session's connection until it fails or is closed.
func (cn *nearConn) receive(ps *redis.PubSub, gen uint64, start int64, onConfirm func()) {
	n := cn.n
	subscribed := false
	for {
		msg, err := ps.ReceiveTimeout(cn.ctx, 0)
		if h := n.hooks.Load(); h != nil && h.receive != nil {
			h.receive(cn.addr, gen, msg, err)
		}
		if err != nil {
			return
		}
		switch m := msg.(type) {
		case *redis.Message:
			if m.Channel == n.channel {
				n.apply(m.Payload)
			}
		case *redis.Pong:
			sent, err := strconv.ParseInt(m.Payload, 10, 64)
			if err == nil && subscribed && sent >= start {
				cn.ack(gen, sent)
			}
		case *redis.Subscription:
			if m.Channel != n.channel {
				continue
			}
			if m.Kind != "subscribe" || subscribed {
				// Unsubscribed, or subscribed again: go-redis reconnected
				// behind our back, and messages may be lost.
				return
			}
			subscribed = true
			if cn.confirm(gen) {
				onConfirm()
			}
		}
	}
}

// confirm records session gen's subscription confirmation, unless the
// session already ended. It reports whether it did.
func (cn *nearConn) confirm(gen uint64) bool {
	n := cn.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if cn.gen != gen || cn.ended {
		return false
	}
	cn.confirmed, cn.lastAck = true, 0
	n.recomputeLocked()
	return true
}

// ack records the PONG of a PING sent at sent, in session gen.
func (cn *nearConn) ack(gen uint64, sent int64) {
	n := cn.n
	n.mu.Lock()
	if cn.gen == gen && cn.confirmed && !cn.ended && sent > cn.lastAck {
		cn.lastAck = sent
		n.recomputeLocked()
	}
	n.mu.Unlock()
}

// lost ends the session's subscription: near hits stop, and, when it had
// been confirmed, everything near is dropped (messages may have been
// missed). A session never confirmed had no part in what is stored: the
// near cache has not been live since this connection's last loss.
func (cn *nearConn) lost(gen uint64, confirmed bool) {
	n := cn.n
	n.mu.Lock()
	if cn.gen == gen {
		cn.ended, cn.confirmed, cn.lastAck = true, false, 0
	}
	n.recomputeLocked()
	n.mu.Unlock()
	if confirmed {
		n.flush()
	}
}
