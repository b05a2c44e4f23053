package herd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Hit is a value [Cache.Begin] found in Redis or received from the caller
// that built it.
type Hit struct {
	Value     []byte    // the caller's own copy
	Outcome   Outcome   // hit, stale, early-refresh, negative or follower
	WrittenAt time.Time // when the value was built (for an HTTP Age header)
	Expires   time.Time // the end of its fresh period
}

// Fill is a rebuild that the caller performs itself, returned by
// [Cache.Begin]: build the value, then call [Fill.Commit], or
// [Fill.Abort] if there is none ([Fill.Handover] if the caller gives up
// for a reason of its own). Exactly one of them takes effect;
// deferring Abort is safe. Until then the key's lease is held (and
// renewed) and other callers of the key, in this process and others,
// wait for the outcome.
type Fill struct {
	c      *Cache
	f      *flight
	lease  *Lease // nil when the rebuild is not leased (see Leased)
	start  time.Time
	writes uint64     // the key's local write count at start (see currency)
	local  *localFill // this process's waiters, when registered
	once   sync.Once
	ended  atomic.Bool // once has run: Commit, Abort, Handover, Pass or Close ended the Fill

	tagMu sync.Mutex
	tags  tagging // set by SetTags
}

// localFill lets callers of Begin in the same process wait for a Fill.
type localFill struct {
	waiters int // callers waiting on it (guarded by Cache.fillMu)
	done    chan struct{}
	hit     *Hit            // set before done is closed on Commit
	err     error           // set before done is closed on Abort
	cur     currency        // set before done is closed: for whom hit is current
	lost    <-chan struct{} // the builder's lease is lost (nil: unleased)
	refused error           // set before done is closed: the answer of callers hit is not current for (nil: look again)
}

// errYielded tells the callers waiting on a Fill that its builder gave it
// up without a failure (its caller left): they look up the key again.
var errYielded = errors.New("herd: the fill was given up")

// Begin looks up key for a caller that builds missing values itself, in
// its own goroutine: the HTTP middleware, which must run a handler in the
// request's goroutine. It returns one of:
//
//   - a *Hit: a fresh value, a stale one within its stale window, or the
//     value another caller just built. When a stale or early hit starts a
//     background refresh (under the key's lease, as for [Cache.Get]),
//     refresh, if not nil, is called first, while Begin's caller is still
//     waiting in Begin (never after Begin returned; then no refresh
//     starts), and the LoadFunc it returns runs in the background: refresh
//     must capture
//     everything the load needs from the caller, whose state (an HTTP
//     request's context values, say) may be gone by then;
//   - a *Fill: this caller must build the value and Commit or Abort it.
//     When [Fill.Leased] is false the rebuild is not leased (Redis is
//     unreachable, or the wait budget for another process's rebuild was
//     spent with Fallback LoadLocally): build it for this caller only.
//   - an error: [ErrNotFound] (a negative entry), a [*LoadError] (the
//     rebuild this caller waited on failed; calling Begin again makes a
//     new leader: Begin itself does not retry, whatever
//     [Options.RetryFailedLoad] says), [ErrNotShared] (that rebuild was not for sharing: build
//     it yourself; wrapping [ErrPass] too when the key carries a pass
//     mark, see [Fill.Pass]: build it yourself, nobody waits for it),
//     [ErrWaitTimeout], [ErrUnavailable], ctx.Err(), or the
//     argument errors of Get.
//
// A fresh value in Redis is found as Get finds it: through the shared
// read of the key (one GET for the concurrent callers of this process),
// in the caller's goroutine, before anything else. Callers in one process
// that do not find one while a Fill of theirs is running wait for that
// Fill. Unlike
// Get, each call's rebuild work is its own: the local tier is the Fill
// registry, not a single-flight.
//
// With the near cache on ([Options.Near]), Begin answers from process
// memory as Get does: a fresh copy is a *Hit (or ErrNotFound) with no
// Redis call, and a near miss joins the key's one fill of this process.
func (c *Cache) Begin(ctx context.Context, key string, ttl time.Duration, refresh func() LoadFunc) (*Hit, *Fill, error) {
	if err := checkTTL(ttl); err != nil {
		return nil, nil, err
	}
	if c.near != nil {
		if e, ok := c.nearCopy(key); ok {
			if err := ctx.Err(); err != nil {
				return nil, nil, err
			}
			c.stats.nearHits.Add(1)
			return c.nearBeginHit(ctx, key, e)
		}
	}
	keys, err := makeKeys(c.cfg.Prefix, key)
	if err != nil {
		return nil, nil, err
	}
	if c.closing.Load() {
		return nil, nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	joined, writes := time.Now(), c.writesOf(key)
	var pre *preRead
	if c.near == nil {
		// The hit path, as Get's: a fresh value in Redis answers in this
		// goroutine, through the shared read (which leaves when ctx ends
		// or Close begins: its GET is always a reader's).
		var env envelope
		var done bool
		if env, done, pre, err = c.hitEnv(ctx, key, keys.Value, false, readWires); done {
			if err != nil {
				return nil, nil, err
			}
			return &Hit{Value: env.Payload, Outcome: OutcomeHit, WrittenAt: env.WrittenAt, Expires: env.SoftExp}, nil, nil
		}
	}
	done, ok := c.track()
	if !ok {
		return nil, nil, ErrClosed
	}

	// The rest of the lookup runs in its own goroutine so that this
	// caller leaves as soon as ctx ends, however slow Redis is. A Fill it
	// wins after the caller left is given up at once (its lease goes to
	// another caller).
	type answer struct {
		hit  *Hit
		fill *Fill
		err  error
	}
	ch := make(chan answer, 1)
	var (
		mu   sync.Mutex
		gone bool // the caller left; guarded by mu
	)
	prepare := refresh
	if refresh != nil {
		// The caller's state is safe to read only while it waits here.
		prepare = func() LoadFunc {
			mu.Lock()
			defer mu.Unlock()
			if gone {
				return nil
			}
			return refresh()
		}
	}
	go func() {
		defer done()
		hit, fl, err := c.begin(ctx, key, keys, ttl, prepare, joined, writes, pre)
		mu.Lock()
		defer mu.Unlock()
		if gone {
			if fl != nil {
				fl.yield()
			}
			return
		}
		ch <- answer{hit, fl, err}
	}()
	select {
	case a := <-ch:
		return a.hit, a.fill, a.err
	case <-ctx.Done():
	case <-c.ctx.Done(): // Close: the lookup ends when its Redis call does
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case a := <-ch:
		if a.fill == nil {
			return a.hit, nil, a.err // it came at the same time: take it
		}
		a.fill.yield()
	default:
		gone = true
	}
	if ctx.Err() == nil {
		return nil, nil, ErrClosed
	}
	return nil, nil, ctx.Err()
}

// begin is Begin's lookup after the hit path. joined is when the caller
// arrived and writes the key's local write count then: a local Fill whose
// value may predate a write the caller saw is not its answer. pre is the
// hit path's read, for the flight.
func (c *Cache) begin(ctx context.Context, key string, keys keyFamily, ttl time.Duration, refresh func() LoadFunc, joined time.Time, writes uint64, pre *preRead) (*Hit, *Fill, error) {
	if c.near != nil {
		e, done, p, err := c.nearLook(ctx, key, keys.Value)
		switch {
		case done && err != nil:
			return nil, nil, err
		case done:
			return c.nearBeginHit(ctx, key, e)
		}
		pre = p // the flight starts from the fill's read, as Get's does
	}
	// An explicit WaitTimeout bounds the whole call, however many waits
	// it takes (Options.WaitTimeout: a hard bound).
	var waitBy time.Time
	if c.cfg.WaitTimeout > 0 {
		waitBy = joined.Add(c.cfg.WaitTimeout)
	}
	timedOut := false
	for round := 0; round < 3; round++ {
		hit, waited, err := c.waitLocalFill(ctx, key, joined, writes, waitBy)
		if !waited {
			break
		}
		pre = nil // read before a local Fill ended: the flight reads again
		if errors.Is(err, errYielded) {
			continue // its builder's caller left: look again
		}
		if errors.Is(err, ErrWaitTimeout) {
			timedOut = true // the budget is spent: Fallback applies
			break
		}
		c.reportLookup(key, OutcomeFollower) // waited for this process's Fill, whatever its end
		return hit, nil, err
	}
	f := &flight{c: c, key: key, keys: keys, ttl: ttl, prepare: refresh, caller: ctx, pre: pre, waitBy: waitBy}
	st := stRead
	if timedOut {
		f.spent, st = c.localWaitBudget(key), stFallback
	}
	a := f.fly(st)
	c.reportLookup(key, f.outcome)
	switch {
	case f.lease != nil || f.unleased:
		return nil, c.newFill(f, f.lease), nil
	case a.err != nil:
		return nil, nil, a.err
	}
	return &Hit{Value: bytes.Clone(a.val), Outcome: f.outcome, WrittenAt: f.env.WrittenAt, Expires: f.env.SoftExp}, nil, nil
}

// nearBeginHit is Begin's answer from a near copy e of key.
func (c *Cache) nearBeginHit(ctx context.Context, key string, e nearEntry) (*Hit, *Fill, error) {
	val, err := c.nearAnswer(ctx, key, e.val, e.negative)
	if err != nil {
		return nil, nil, err
	}
	return &Hit{Value: val, Outcome: OutcomeHit, WrittenAt: e.writtenAt, Expires: e.softExp}, nil, nil
}

// waitLocalFill waits for a Fill of key that a caller in this process is
// running. waited is false when there is none. A Fill that was given up,
// or whose value is not known current for a caller that joined at joined
// with the key's local write count writes (see currency), answers with
// errYielded: look again.
func (c *Cache) waitLocalFill(ctx context.Context, key string, joined time.Time, writes uint64, waitBy time.Time) (hit *Hit, waited bool, err error) {
	c.fillMu.Lock()
	lf := c.fills[key]
	if lf != nil {
		lf.waiters++
	}
	c.fillMu.Unlock()
	if lf == nil {
		return nil, false, nil
	}
	budget := c.localWaitBudget(key)
	if !waitBy.IsZero() {
		budget = max(time.Until(waitBy), 0) // what the caller's earlier waits left
	}
	limit := time.NewTimer(budget)
	defer limit.Stop()
	select {
	case <-ctx.Done():
		return nil, true, ctx.Err()
	case <-c.ctx.Done():
		return nil, true, ErrClosed
	case <-limit.C:
		c.stats.waitTimeouts.Add(1)
		return nil, true, fmt.Errorf("%w: %q: no value after waiting %v for this process's rebuild", ErrWaitTimeout, key, budget)
	case <-lf.lost:
		// The builder lost its lease (it ran past MaxHold, or Redis lost
		// it): another process may rebuild the key now. Stop waiting for
		// this Fill, and let later callers not wait for it either.
		c.fillMu.Lock()
		if c.fills[key] == lf {
			delete(c.fills, key)
		}
		c.fillMu.Unlock()
		return nil, true, errYielded
	case <-lf.done:
	}
	if lf.err != nil {
		return nil, true, lf.err
	}
	if !lf.cur.answers(joined, writes) {
		if lf.refused != nil {
			return nil, true, lf.refused
		}
		return nil, true, errYielded
	}
	h := *lf.hit
	h.Value = bytes.Clone(h.Value)
	h.Outcome = OutcomeFollower
	return &h, true, nil
}

// localWaitBudget is how long a caller waits for a Fill of its own
// process. The Fill is alive until it commits or aborts (its builder holds
// and renews the lease up to MaxHold): by default wait for it that long.
func (c *Cache) localWaitBudget(key string) time.Duration {
	if c.cfg.WaitTimeout > 0 {
		return c.cfg.WaitTimeout
	}
	return c.cfg.MaxHold + c.leaseFor(key)
}

func (c *Cache) newFill(f *flight, lease *Lease) *Fill {
	fl := &Fill{c: c, f: f, lease: lease, start: time.Now(), writes: c.writesOf(f.key)}
	if lease != nil {
		lease.KeepAlive(c.cfg.MaxHold)
	}
	c.fillMu.Lock()
	if c.fills[f.key] == nil {
		fl.local = &localFill{done: make(chan struct{})}
		if lease != nil {
			fl.local.lost = lease.Lost()
		}
		c.fills[f.key] = fl.local
	}
	c.open[fl] = struct{}{}
	c.fillMu.Unlock()
	return fl
}

// abortOpenFills ends the Fills still open at Close, so that their
// watchdogs stop and other processes take the keys over at once.
func (c *Cache) abortOpenFills() {
	c.fillMu.Lock()
	open := make([]*Fill, 0, len(c.open))
	for fl := range c.open {
		open = append(open, fl)
	}
	c.fillMu.Unlock()
	for _, fl := range open {
		fl.Abort(ErrClosed)
	}
}

// Leased reports whether this Fill holds the key's lease, that is whether
// Commit stores the value and wakes the other processes. An unleased Fill
// (Redis unreachable, or the wait budget spent) serves only this process.
func (fl *Fill) Leased() bool { return fl.lease != nil }

// Unavailable reports whether this Fill is unleased because Redis could
// not be reached (fail-open: the breaker is open, or the lookup failed),
// rather than because the wait for another process's rebuild was spent.
func (fl *Fill) Unavailable() bool { return fl.lease == nil && fl.f.redisDown }

// Commit stores val for ttl, servable stale for staleFor afterwards, if
// the Fill is leased and its fence is still current, and hands it to every
// caller waiting on the key. It runs under the Cache's own context, not a
// caller's: others wait for it. A failed or fenced write is counted in
// [Stats], logged, and not an error (the value still reaches the local
// waiters). A val above [Options.MaxValueBytes] is not stored: the
// waiters in this process still get it, those in other processes are told
// [ErrNotShared] and build it themselves, and Commit returns
// [ErrValueTooLarge]. A ttl outside [1ms, 50 years] or a staleFor over 50
// years aborts the Fill and returns [ErrInvalidTTL]. Calls after the first Commit or Abort do nothing and
// return nil.
func (fl *Fill) Commit(val []byte, ttl, staleFor time.Duration) error {
	if fl.ended.Load() {
		return nil // ended before: nothing to check, nothing to do
	}
	err := checkTTL(ttl)
	if err == nil && staleFor > maxTTL {
		err = fmt.Errorf("%w: staleFor %v (must be at most %v, 50 years)", ErrInvalidTTL, staleFor, maxTTL)
	}
	if err != nil {
		fl.Abort(err)
		return err
	}
	if len(val) > fl.c.cfg.MaxValueBytes {
		err := fmt.Errorf("%w: %d bytes, limit %d", ErrValueTooLarge, len(val), fl.c.cfg.MaxValueBytes)
		fl.once.Do(func() {
			fl.ended.Store(true)
			fl.unregister()
			fl.countLoad(fmt.Errorf("%w: %w", ErrNotShared, err))
			cur := fl.unleasedCurrency()
			if fl.lease != nil {
				fl.lease.finish()
				if sent, current := fl.c.releaseDetached(fl.f, fl.lease, failMessage(failNotShared, fl.lease, err.Error()), 0); current {
					cur = currency{from: sent} // no write since the lease: the value is current
				}
			}
			now := fl.c.now()
			// Callers for whom the value may predate a write they saw
			// build it themselves, as the other processes' callers do.
			if fl.local != nil {
				fl.local.refused = fmt.Errorf("%w: %q: %w", ErrNotShared, fl.f.key, err)
			}
			fl.resolve(&Hit{Value: val, Outcome: OutcomeFollower, WrittenAt: now, Expires: now.Add(ttl)}, nil, cur)
		})
		return err
	}
	fl.once.Do(func() {
		fl.ended.Store(true)
		fl.unregister()
		c := fl.c
		delta := time.Since(fl.start)
		env := c.newEnvelope(0, val, c.jitter(ttl), max(staleFor, 0), delta)
		fl.countLoad(nil)
		cur := fl.unleasedCurrency()
		if fl.lease != nil {
			fl.lease.finish()
			c.observeLoad(fl.f, fl.lease.token, delta, nil)
			env.Fence = fl.lease.token
			cur = c.commit(fl.f, fl.lease, env, fl.start, fl.writes, fl.tagging())
		}
		fl.resolve(&Hit{Value: val, Outcome: OutcomeFollower, WrittenAt: env.WrittenAt, Expires: env.SoftExp}, nil, cur)
	})
	return nil
}

// Abort ends the Fill without a value. The lease is released at once and
// the waiting callers are told: with a cause wrapping [ErrNotShared] they
// get ErrNotShared and build the value themselves; with a *PanicError or
// any other cause they get a [*LoadError] (Remote in other processes;
// with a cause marked [NoShare], one that says it was not shared);
// calling Begin again makes one of them the new leader. A nil cause counts as a
// plain failure. Calls after the first Commit or Abort do nothing.
func (fl *Fill) Abort(cause error) {
	fl.once.Do(func() {
		fl.ended.Store(true)
		fl.unregister()
		c := fl.c
		if cause == nil {
			cause = errors.New("aborted")
		}
		err, kind, text := cause, byte(failNotShared), cause.Error()
		if !errors.Is(cause, ErrNotShared) {
			err, kind, text = loadFailure(fl.f.key, cause)
		}
		fl.countLoad(cause)
		if fl.lease != nil && errors.Is(cause, ErrClosed) {
			// This process is shutting down: hand the rebuild over.
			fl.lease.finish()
			c.releaseDetached(fl.f, fl.lease, msgReleased, 0)
		} else if fl.lease != nil {
			fl.lease.finish()
			c.releaseDetached(fl.f, fl.lease, failMessage(kind, fl.lease, text), 0)
		}
		fl.resolve(nil, err, currency{})
	})
}

// Pass ends the Fill as Abort does with a cause wrapping [ErrNotShared]
// (the waiting callers, in every process, build the value themselves),
// and leaves a pass mark on the key for ttl: until it expires, or a Set or
// Invalidate of the key replaces it, every [Cache.Begin] of the key
// returns at once, with an error wrapping ErrNotShared and [ErrPass],
// without taking the lease or waiting for anyone. Use it when the value
// will not be shareable next time either (the HTTP middleware's
// hit-for-miss): callers then build their own values side by side
// instead of queueing behind each other's rebuilds. The mark is written
// like a value (fenced by a newer lease, Set or Invalidate) and costs a
// lookup what a hit costs, one GET; [Cache.Get] reads it as a miss. A nil
// cause is ErrNotShared. An unleased Fill (see [Fill.Leased]) leaves no
// mark. A ttl outside [1ms, 50 years] leaves none either and returns
// [ErrInvalidTTL]. Calls after the first Commit, Abort, Handover or Pass
// do nothing and return nil.
func (fl *Fill) Pass(cause error, ttl time.Duration) error {
	switch {
	case cause == nil:
		cause = ErrNotShared
	case !errors.Is(cause, ErrNotShared):
		cause = fmt.Errorf("%w: %w", ErrNotShared, cause)
	}
	if fl.ended.Load() {
		return nil // ended before: nothing to check, nothing to do
	}
	if err := checkTTL(ttl); err != nil {
		fl.Abort(cause)
		return err
	}
	if fl.lease == nil {
		fl.Abort(cause)
		return nil
	}
	fl.once.Do(func() {
		fl.ended.Store(true)
		fl.unregister()
		c := fl.c
		fl.countLoad(cause)
		fl.lease.finish()
		why := cutText(cause.Error(), maxFailText)
		// No Δ: a response that is not shared says nothing of how long a
		// rebuild of the key takes.
		env := c.newEnvelope(fl.lease.token, []byte(why), ttl, 0, 0)
		env.Pass = true
		c.commit(fl.f, fl.lease, env, fl.start, fl.writes, tagging{}) // a mark carries no tags
		fl.resolve(nil, cause, currency{})
	})
	return nil
}

// countLoad counts the Fill's end as one load (leased or local) with its
// result: nil, a cause wrapping ErrNotShared (not shared, no failure),
// ErrClosed (the process is shutting down, no failure) or a failure.
func (fl *Fill) countLoad(cause error) {
	c := fl.c
	c.sig.load(fl.f.key, time.Since(fl.start), cause, fl.lease != nil)
	if fl.lease != nil {
		c.stats.loads.Add(1)
	} else {
		c.stats.localLoads.Add(1)
	}
	if cause != nil && !errors.Is(cause, ErrClosed) {
		c.countFailedLoad(cause)
	}
}

// unleasedCurrency is the currency of a value this Fill built that Redis
// did not confirm: checked by nothing when Redis was unreachable, current
// from the build's start otherwise.
func (fl *Fill) unleasedCurrency() currency {
	if fl.f.redisDown {
		return currency{unchecked: true, writes: fl.writes}
	}
	return currency{from: fl.start}
}

// yield gives the Fill up without a failure, when the caller it was
// returned to has left: the lease goes at once to a caller waiting in
// another process (they are told it was released, not that it failed),
// and the callers waiting in this process look the key up again. Nothing
// counts as a failed load.
func (fl *Fill) yield() {
	fl.once.Do(func() {
		fl.ended.Store(true)
		fl.unregister()
		if fl.lease != nil {
			fl.lease.finish()
			fl.c.releaseDetached(fl.f, fl.lease, msgReleased, 0)
		}
		fl.resolve(nil, errYielded, currency{})
	})
}

// Handover ends the Fill without a value and without a failure: the
// caller building it gave up for a reason of its own (an HTTP client that
// went away), not because the value cannot be built. The lease is
// released at once, so a caller waiting in another process takes the
// rebuild over, and the callers of [Cache.Begin] waiting in this process
// look again (one of them leads) instead of getting an error. Nothing is
// counted as a load error, and no Load is reported to the Observer.
// Calls after the first Commit, Abort or Handover do nothing.
func (fl *Fill) Handover() { fl.yield() }

// resolve hands the outcome to this process's waiters.
func (fl *Fill) resolve(hit *Hit, err error, cur currency) {
	fl.unregister()
	if fl.local == nil {
		return
	}
	fl.local.hit, fl.local.err, fl.local.cur = hit, err, cur
	close(fl.local.done)
}

// unregister takes the Fill out of the local registry. Commit and Abort
// call it before they tell other processes, so that a caller of this
// process woken by that message does not find the finished Fill and wait
// on it again.
func (fl *Fill) unregister() {
	c := fl.c
	c.fillMu.Lock()
	delete(c.open, fl)
	if fl.local != nil && c.fills[fl.f.key] == fl.local {
		delete(c.fills, fl.f.key)
	}
	c.fillMu.Unlock()
}
