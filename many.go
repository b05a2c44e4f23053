package herd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
)

// Batch reads. GetMany reads every key's value in one round trip per
// master and answers the hits from it. Each missing key joins its flight
// in this process, the one a concurrent Get or GetMany of the key shares,
// or starts it. The flights one GetMany starts run together (runMany):
// their ACQUIREs go in one pipeline per master; the keys whose lease this
// process won are loaded by one call of the batch loader and committed in
// one pipeline per master; each key whose lease another process holds is
// waited for on its own, as Get waits. The loader never waits for a key
// that another process leads, so processes whose batches overlap never
// wait on each other.

// manyChunk bounds the keys of one MGET and of one loader call.
const manyChunk = 1000

// ManyLoadFunc loads the values of keys from the source of truth, in one
// call: the keys of a [Cache.GetMany] that this process leads. keys are
// distinct, in the order the caller gave them, and the slice is the
// loader's own.
//
// Return the value of each key that has one in the map (an empty value
// too). A key the map lacks has no value: like [ErrNotFound] from a
// [LoadFunc], it is remembered for [Options.NegativeTTL]. To fail some
// keys but not the others, return the others' values with a [*ManyError]
// (possibly wrapped) that holds an error for each key that failed (a nil
// *ManyError fails none); any other error fails every key of the call.
// Values of keys that were not asked for are ignored.
//
// Its context belongs to no caller, as a LoadFunc's does: it ends after
// [Options.LoadTimeout] or on [Cache.Close]. [SetExpiry] and [SetTags]
// called with it apply to every key of the call.
type ManyLoadFunc func(ctx context.Context, keys []string) (map[string][]byte, error)

// ManyError is the error of [Cache.GetMany] and [FetchMany] when some keys
// have no value because of an error: it holds each such key's error,
// which is what [Cache.Get] would have returned for the key. The keys
// that have a value, or were not found, are not in it.
//
// A [ManyLoadFunc] returns one to fail some of its keys.
//
// errors.Is and errors.As look at every key's error: errors.Is(err,
// ErrLoadFailed) reports whether the loader failed for any key.
type ManyError struct {
	Errs map[string]error // by key
}

// Error lists the failed keys (sorted, the first three) with their errors.
// A nil *ManyError has none.
func (e *ManyError) Error() string {
	keys := e.keys()
	var b strings.Builder
	if len(keys) == 1 {
		b.WriteString("herd: 1 key failed")
	} else {
		fmt.Fprintf(&b, "herd: %d keys failed", len(keys))
	}
	for i, k := range keys {
		if i == 3 {
			fmt.Fprintf(&b, "; and %d more", len(keys)-i)
			break
		}
		sep := "; "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%s%q: %s", sep, k, keyErrorText(k, e.Errs[k]))
	}
	return b.String()
}

// keyErrorText is key's error as ManyError lists it: a *LoadError of
// that key without its key, said once already ("load failed: cause",
// "load failed in another process: cause"), any other error as it is.
func keyErrorText(key string, err error) string {
	if le, ok := err.(*LoadError); ok && le != nil && le.Key == key {
		if le.Remote {
			return "load failed in another process: " + le.Msg
		}
		return "load failed: " + le.Msg
	}
	return fmt.Sprint(err)
}

// Unwrap returns every key's error, in the order of the keys.
func (e *ManyError) Unwrap() []error {
	keys := e.keys()
	errs := make([]error, 0, len(keys))
	for _, k := range keys {
		errs = append(errs, e.Errs[k])
	}
	return errs
}

func (e *ManyError) keys() []string {
	if e == nil {
		return nil
	}
	keys := make([]string, 0, len(e.Errs))
	for k, err := range e.Errs {
		if err != nil {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// GetMany returns the values of keys, calling load for those that are
// missing. It is [Cache.Get] for a set of keys, with the same guarantees
// for each key, at the cost of one round trip per Redis master for the
// hits and one call of load for the misses this process rebuilds.
//
// GetMany reads every value in one round trip per master (an MGET of up
// to 1000 keys per command on a single master or a Ring shard; on a
// Cluster, where each key has its own slot, a pipeline of reads per
// master) and serves fresh values, and stale ones within
// [Options.StaleFor] while one refresh runs, as Get does. A missing key
// shares the flight of a concurrent Get or GetMany of it in this process.
// Across processes each missing key has its own lease: load is called
// once, with the missing keys whose lease this process won, and the keys
// whose lease another process holds are waited for one by one, as Get
// waits: load never waits for them, so processes with overlapping
// batches cannot wait on each other. A key that this process takes over
// later (its leader died or gave up), or that it loads after its wait
// budget ran out, is loaded alone: load is called with that one key. A
// call with more than 1000 missing keys to rebuild calls load once per
// 1000. Refreshes of stale values call load with one key each. A lease
// whose ACQUIRE reply comes back after the lease's validity (a Redis or a
// client too slow to take a batch's leases within one lease) is given
// back, and its key is followed and then taken over alone, like a key
// another process leads: still one load per key, not one call.
//
// The result holds the value of each key that has one. A key that was
// not found (load omitted it or returned [ErrNotFound] for it, now or
// within [Options.NegativeTTL]) is absent, without an error. The error is
// nil when every key has a value or was not found; otherwise it is a
// [*ManyError] holding the error of each key that failed, and the result
// still holds the others' values: an empty key ([ErrInvalidKey]), a
// loader failure (a [*LoadError]), [ErrValueTooLarge], [ErrUnavailable]
// with [Options.FailClosed] when Redis is unreachable (without it the
// missing keys are loaded locally, once, as Get fails open), ctx.Err()
// for the keys still waiting when ctx ends (their rebuilds go on for the
// other callers), or [ErrClosed] when Close is called meanwhile. A key
// given twice is read once and is in the result once; an empty keys is an
// empty result.
//
// GetMany returns at once, without a result, [ErrNilLoader] for a nil
// load, [ErrInvalidTTL] for a ttl outside [1ms, 50 years] and [ErrClosed]
// after Close. The returned slices are the caller's own.
func (c *Cache) GetMany(ctx context.Context, keys []string, ttl time.Duration, load ManyLoadFunc) (map[string][]byte, error) {
	if load == nil {
		return nil, ErrNilLoader
	}
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	if c.isClosed() {
		return nil, ErrClosed
	}
	m := &manyCall{c: c, ttl: ttl, load: load, joined: time.Now(), vals: make(map[string][]byte, len(keys))}
	m.prepare(keys)
	if len(m.todo) > 0 {
		m.read(ctx)
	}
	if len(m.todo) > 0 {
		m.fly(ctx)
	}
	if len(m.errs) > 0 {
		return m.vals, &ManyError{Errs: m.errs}
	}
	return m.vals, nil
}

// FetchMany is [Cache.GetMany] for typed values, encoded with
// [Options.Codec] (JSON by default). load returns the values it found, as
// a [ManyLoadFunc] does, and may fail some keys with a [*ManyError]. The
// errors are those of GetMany; a value that cannot be encoded, or stored
// bytes that cannot be decoded into T, fail that key only, with a wrapped
// codec error.
func FetchMany[T any](ctx context.Context, c *Cache, keys []string, ttl time.Duration, load func(ctx context.Context, keys []string) (map[string]T, error)) (map[string]T, error) {
	if load == nil {
		return nil, ErrNilLoader
	}
	raw, err := c.GetMany(ctx, keys, ttl, func(ctx context.Context, keys []string) (map[string][]byte, error) {
		vals, err := load(ctx, keys)
		var me *ManyError
		if err != nil && !errors.As(err, &me) {
			return nil, err
		}
		out := make(map[string][]byte, len(vals))
		failed := make(map[string]error)
		if me != nil {
			maps.Copy(failed, me.Errs)
		}
		for k, v := range vals {
			if failed[k] != nil {
				continue
			}
			b, err := c.cfg.Codec.Marshal(v)
			if err != nil {
				failed[k] = fmt.Errorf("herd: encode %q: %w", k, err)
				continue
			}
			out[k] = b
		}
		if len(failed) > 0 {
			return out, &ManyError{Errs: failed}
		}
		return out, nil
	})
	var me *ManyError
	if err != nil && !errors.As(err, &me) {
		return nil, err
	}
	errs := make(map[string]error)
	if me != nil {
		maps.Copy(errs, me.Errs)
	}
	vals := make(map[string]T, len(raw))
	for k, b := range raw {
		var v T
		if err := c.cfg.Codec.Unmarshal(b, &v); err != nil {
			errs[k] = fmt.Errorf("herd: decode %q: %w", k, err)
			continue
		}
		vals[k] = v
	}
	if len(errs) > 0 {
		return vals, &ManyError{Errs: errs}
	}
	return vals, nil
}

// manyCall is one GetMany call, in its caller's goroutine: the keys not
// answered yet, and the answers.
type manyCall struct {
	c      *Cache
	ttl    time.Duration
	load   ManyLoadFunc
	joined time.Time // when the call began (read-your-writes, see currency)
	todo   []*manyKey
	vals   map[string][]byte
	errs   map[string]error
}

// manyKey is one key of a GetMany.
type manyKey struct {
	idx    int // its place among the caller's distinct keys
	key    string
	vkey   string    // its value's Redis name
	keys   keyFamily // its Redis names, once it needs a flight (see family)
	writes uint64    // the key's local write count when the call began
	down   error     // its value could not be read: Redis is unreachable
	done   bool      // answered
}

// prepare drops duplicates and fails invalid keys.
func (m *manyCall) prepare(keys []string) {
	seen := make(map[string]struct{}, len(keys))
	all := make([]manyKey, len(keys)) // one allocation for every key
	m.todo = make([]*manyKey, 0, len(keys))
	for _, k := range keys {
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		vkey, err := valueKey(m.c.cfg.Prefix, k)
		if err != nil {
			m.fail(k, err)
			continue
		}
		mk := &all[len(m.todo)]
		*mk = manyKey{idx: len(m.todo), key: k, vkey: vkey, writes: m.c.writesOf(k)}
		m.todo = append(m.todo, mk)
	}
}

// answer records the answer for key: a value, nothing (not found) or an
// error.
func (m *manyCall) answer(key string, val []byte, err error) {
	switch {
	case err == nil:
		m.vals[key] = val
	case errors.Is(err, ErrNotFound):
	default:
		m.fail(key, err)
	}
}

func (m *manyCall) fail(key string, err error) {
	if m.errs == nil {
		m.errs = make(map[string]error)
	}
	m.errs[key] = err
}

// newFlight returns a flight of k. A takeover, a fallback or a refresh
// of the key loads it alone.
func (m *manyCall) newFlight(k *manyKey) *flight {
	f := new(flight)
	m.initFlight(f, k)
	return f
}

// initFlight makes f a new flight of k (see newFlight).
func (m *manyCall) initFlight(f *flight, k *manyKey) {
	if k.keys.Value == "" {
		k.keys, _ = makeKeys(m.c.cfg.Prefix, k.key) // valid: prepare checked it
	}
	one := m.load.one(k.key)
	*f = flight{c: m.c, key: k.key, keys: k.keys, ttl: m.ttl, load: one, refresh: one}
}

// one is load for a single key: what a flight of that key alone calls.
func (load ManyLoadFunc) one(key string) LoadFunc {
	return func(ctx context.Context) ([]byte, error) {
		vals, err := load(ctx, []string{key})
		return pick(vals, err, key)
	}
}

// pick returns key's answer in what a ManyLoadFunc returned. A nil
// *ManyError (a typed nil in a non-nil error, as a loader that returns
// its *ManyError variable unset gives) fails no key. A *ManyError marked
// with NoShare marks each key's error with it. A panic in the error's
// own methods (errors.As calls its As and Unwrap; the key's error's
// Error is called here) is that key's error, a *PanicError, as the
// loader's own panic would be: its lease is released with it like any
// failed key's.
func pick(vals map[string][]byte, err error, key string) (val []byte, kerr error) {
	if err != nil {
		defer func() {
			if r := recover(); r != nil {
				val, kerr = nil, &PanicError{Value: r, Stack: debug.Stack()}
			}
		}()
		var me *ManyError
		if !errors.As(err, &me) {
			return nil, err
		}
		if me != nil && me.Errs[key] != nil {
			kerr = me.Errs[key]
			_ = kerr.Error() // as runLoaderOf does for a LoadFunc's error
			if isNoShare(err) && !isNoShare(kerr) {
				kerr = NoShare(kerr)
			}
			return nil, kerr
		}
	}
	if v, ok := vals[key]; ok {
		return v, nil
	}
	return nil, ErrNotFound
}

// fly puts every key not answered yet into its flight, and waits for the
// flights' answers. A key whose flight began before a write that this
// process saw returned takes the next flight (see Get).
func (m *manyCall) fly(ctx context.Context) {
	c := m.c
	type keyResult struct {
		k *manyKey
		r singleflight.Result
	}
	for len(m.todo) > 0 {
		results := make(chan keyResult, len(m.todo))
		var mine []*member
		for _, k := range m.todo {
			call, started := c.group.join(k.key, func(r singleflight.Result) { results <- keyResult{k, r} })
			if started {
				mine = append(mine, &member{f: m.newFlight(k), call: call, down: k.down})
			}
		}
		c.startMany(m.load, mine)
		var again []*manyKey
		for range m.todo {
			var kr keyResult
			select {
			case <-ctx.Done():
				m.leave(ctx.Err())
				return
			case <-c.ctx.Done():
				m.leave(ErrClosed) // Close: the flights end when their Redis calls do
				return
			case kr = <-results:
			}
			res := kr.r.Val.(*flightResult)
			if !res.answers(m.joined, kr.k.writes, kr.r.Err) {
				// Every round: a Get's flight that a key joins may answer
				// from that Get's own earlier GET (see Get).
				again = append(again, kr.k)
				continue
			}
			kr.k.done = true
			c.reportLookup(kr.k.key, res.lookupOutcome(kr.r.Shared))
			val := res.val
			if kr.r.Shared {
				val = bytes.Clone(val) // as in Get: every caller its own copy
			}
			m.answer(kr.k.key, val, kr.r.Err)
		}
		// The next round's keys in the caller's order, not in the order
		// their flights ended: the loader gets them so.
		slices.SortFunc(again, func(a, b *manyKey) int { return a.idx - b.idx })
		m.todo = again
	}
}

// leave fails every key not answered yet with err.
func (m *manyCall) leave(err error) {
	for _, k := range m.todo {
		if !k.done {
			m.fail(k.key, err)
		}
	}
	m.todo = nil
}

// member is a flight that a GetMany started: its runMany finishes it.
type member struct {
	f    *flight
	call *flightCall
	down error       // Redis is unreachable: load it without a lease
	done atomic.Bool // finished
}

// finishMember ends m's flight with a, once.
func (c *Cache) finishMember(m *member, a answer) {
	if m.done.Swap(true) {
		return
	}
	c.group.finish(m.f.key, m.call, &flightResult{val: a.val, outcome: m.f.outcome, cur: m.f.cur}, a.err)
}

// startMany runs the flights ms, up to manyChunk at a time, detached from
// the caller: each chunk is one runMany.
func (c *Cache) startMany(load ManyLoadFunc, ms []*member) {
	for chunk := range slices.Chunk(ms, manyChunk) {
		done, ok := c.track()
		if !ok {
			for _, m := range chunk {
				c.finishMember(m, answer{err: ErrClosed})
			}
			continue
		}
		go func() {
			defer done()
			c.runMany(load, chunk)
		}()
	}
}

// runMany runs the flights ms together: one pipeline of ACQUIREs per
// master; then the keys it won are loaded with one call of load, and
// every key whose lease another process holds is followed on its own.
// Keys that cannot reach Redis are loaded without a lease, with one more
// call of load. Every flight of ms is finished when runMany returns,
// except the followed ones, which finish when their waits end.
func (c *Cache) runMany(load ManyLoadFunc, ms []*member) {
	defer func() {
		// herd's own bugs must not leave callers waiting (or crash).
		if r := recover(); r != nil {
			pe := &PanicError{Value: r, Stack: debug.Stack()}
			for _, m := range ms {
				c.finishMember(m, answer{err: newLoadError(m.f.key, pe)})
			}
		}
	}()
	var up, down []*member
	var cause error
	for _, m := range ms {
		if m.down != nil {
			down, cause = append(down, m), m.down
		} else {
			up = append(up, m)
		}
	}
	if len(up) > 0 && !c.brk.allow() {
		down, up, cause = append(down, up...), nil, errBreakerOpen
	}
	var led []*member
	if len(up) > 0 {
		var failed []*member
		var err error
		led, failed, err = c.acquireMany(up)
		if len(failed) > 0 {
			down, cause = append(down, failed...), err
		}
	}
	var wg sync.WaitGroup
	if len(down) > 0 {
		wg.Go(func() { c.loadManyLocal(load, down, cause) })
	}
	if len(led) > 0 {
		c.leadMany(load, led)
	}
	wg.Wait()
}

// acquireMany takes the leases of ms in one pipeline per master (the
// ACQUIRE of Get's flight, in the same mode), and takes each key's reply
// through the flight's own step (flight.acquired). It finishes the
// flights whose value landed meanwhile, starts a follow for each key whose
// lease another process holds, and returns the keys it leads, and those
// that could not reach Redis with the error. What differs from Get's
// stAcquire is what a batch must do once for all its keys: the purge
// generation is read once before the pipeline, and the breaker hears one
// verdict for the batch.
func (c *Cache) acquireMany(ms []*member) (led, failed []*member, cause error) {
	gr := c.newGenRead()
	if side := gr.side(); side != nil {
		_ = c.rdb.Process(c.ctx, side) // on one master: read before the ACQUIREs are sent
	}
	calls := make([]*scriptCall, len(ms))
	owners := make([]string, len(ms))
	ttls := make([]time.Duration, len(ms))
	for i, m := range ms {
		ttls[i] = c.leaseFor(m.f.key)
		c.repl.prime(c.ctx, c.rdb, m.f.keys.Fence)
		calls[i], owners[i] = c.locker.acquireCall(m.f.keys, ttls[i], modeMiss, nil, awaiting{})
	}
	sent := time.Now()
	c.repl.runBatch(c.ctx, c.rdb, acquireScript, calls)
	gen := c.genResult(gr) // before any load begins
	answered := false
	for i, m := range ms {
		f := m.f
		c.stats.misses.Add(1)
		// The lease's validity counts from when its own pipeline was sent
		// (after a replica count or a NOSCRIPT round trip that runBatch
		// may have made first), not from before the batch.
		start := sent
		if calls[i].sent.After(start) {
			start = calls[i].sent
		}
		r, err := c.locker.parseAcquire(c.ctx, f.key, f.keys, ttls[i], owners[i], start, calls[i])
		switch f.acquired(r, err, sent, ttls[i]) {
		case stDone: // a value landed since the read
			answered = true
			c.finishMember(m, f.ans)
		case stLead:
			answered = true
			f.gen = gen
			f.enter(stLead)
			led = append(led, m)
		case stFollow:
			answered = true
			f.enter(stFollow)
			c.sig.lease(f.key, LeaseContended)
			c.followMember(m)
		default: // stDown (a batch never claims: it is no Begin)
			failed, cause = append(failed, m), f.cause
		}
	}
	// One verdict for the batch, as for its read: an answer if Redis
	// answered any ACQUIRE (failures of some keys' masters must not count
	// as so many consecutive failures and open the breaker mid-batch).
	switch {
	case answered:
		c.redisAnswered()
	case cause != nil:
		c.redisFailed(cause)
	}
	return led, failed, cause
}

// followMember runs m's flight from stFollow in its own goroutine: it
// waits for the other process that holds m's lease, as Get's follower
// does (and leads alone if it takes the lease over), and finishes m's
// flight.
func (c *Cache) followMember(m *member) {
	done, ok := c.track()
	if !ok {
		c.finishMember(m, answer{err: ErrClosed})
		return
	}
	go func() {
		defer done()
		c.finishMember(m, m.f.fly(stFollow))
	}()
}

// leadMany loads the keys of led, whose leases this process holds, with
// one call of load, then settles each key as Get's leader does: the
// COMMITs (values and negative entries) go in one pipeline per master.
// It is Get's stLead (Cache.lead) for many keys: one load instead of one
// per key is the point of a batch, so this step is the batch's own; the
// settling after it is the flight's (settle).
func (c *Cache) leadMany(load ManyLoadFunc, led []*member) {
	keys := make([]string, len(led))
	writes := make([]uint64, len(led))
	for i, m := range led {
		keys[i] = m.f.key
		writes[i] = c.writesOf(m.f.key)
		c.stats.leads.Add(1)
		m.f.lease.KeepAlive(c.cfg.MaxHold)
	}
	exp := &expiry{ttl: led[0].f.ttl, staleFor: c.cfg.StaleFor, c: c}
	start := time.Now()
	vals, err := runLoaderOf(c, nil, func(ctx context.Context) (map[string][]byte, error) {
		return load(ctx, keys)
	}, c.loadBudget(), exp)
	delta := time.Since(start)
	var commits *commitBatch
	if !exp.tagging().any() {
		// A value with tags is indexed first, and its PX counts from then:
		// it is committed alone, without waiting for the others.
		commits = &commitBatch{c: c, left: len(led), done: make(chan struct{})}
	}
	var wg sync.WaitGroup
	for i, m := range led {
		v, kerr := pick(vals, err, m.f.key)
		m.f.commits = commits
		ld := loaded{val: v, err: kerr, start: start, writes: writes[i], delta: delta, exp: exp}
		wg.Go(func() {
			out, oerr := guarded(m.f.key, func() ([]byte, error) {
				defer m.f.skipCommit()
				return c.settle(m.f, m.f.lease, false, ld)
			})
			c.finishMember(m, answer{out, oerr})
		})
	}
	wg.Wait()
}

// loadManyLocal loads ms, which cannot use Redis (cause), as Get's
// flight does then: each key takes the flight's stDown step, which fails
// it closed (ErrUnavailable) or sends it to stLocal; the keys in stLocal
// are loaded with one call of load (the batch's own stLocal: one load for
// many keys), without a lease and without storing the values.
func (c *Cache) loadManyLocal(load ManyLoadFunc, ms []*member, cause error) {
	finishAll := func(err error) {
		for _, m := range ms {
			c.finishMember(m, answer{err: err})
		}
	}
	if c.ctx.Err() != nil {
		finishAll(ErrClosed)
		return
	}
	local := ms[:0:0]
	for _, m := range ms {
		m.f.cause = cause // the batch's
		if m.f.step(stDown) == stDone {
			c.finishMember(m, m.f.ans)
		} else {
			local = append(local, m)
		}
	}
	ms = local
	if len(ms) == 0 {
		return
	}
	keys := make([]string, len(ms))
	for i, m := range ms {
		keys[i] = m.f.key
	}
	release, err := c.localSlot(keys[0])
	if err != nil {
		finishAll(err)
		return
	}
	defer release()
	start := time.Now()
	for _, m := range ms {
		c.stats.localLoads.Add(1)
		c.localStart(m.f, start)
	}
	vals, err := runLoaderOf(c, nil, func(ctx context.Context) (map[string][]byte, error) {
		return load(ctx, keys)
	}, c.loadBudget(), &expiry{})
	d := time.Since(start)
	for _, m := range ms {
		v, kerr := pick(vals, err, m.f.key)
		c.sig.load(m.f.key, d, kerr, false)
		out, oerr := c.localResult(m.f, v, kerr)
		c.finishMember(m, answer{out, oerr})
	}
}

// guarded runs fn for key, turning a panic (a bug of herd's) into an
// error.
func guarded(key string, fn func() ([]byte, error)) (val []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			val, err = nil, newLoadError(key, &PanicError{Value: r, Stack: debug.Stack()})
		}
	}()
	return fn()
}
