package herd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/herdkit/herd/internal/lease"
)

// The two-tier flight. Get puts the callers of a key in one process into
// one flight (flightGroup.DoChan; each caller leaves on its own context).
// The flight reads the value, and on a miss takes the key's lease: the
// winner leads (loads and commits), the others follow (wait for the
// leader's wake-up message). Everything here runs detached from callers,
// under c.ctx, which only Close cancels.

// flight is one rebuild attempt for a key in this process.
type flight struct {
	key     string
	keys    keyFamily
	ttl     time.Duration
	load    LoadFunc        // nil for Begin: the caller builds the value
	refresh LoadFunc        // what a stale or early hit refreshes with (nil: none)
	prepare func() LoadFunc // Begin: called in the caller's goroutine when a refresh starts
	outcome Outcome         // how the flight ended, for the callers
	env     envelope        // the envelope that answered the flight, if any

	// For Begin only: the caller's context bounds the follower's wait, and
	// a lease won while following is handed to the caller (claim) instead
	// of running a loader; unleased asks the caller to build the value
	// without a lease (the wait budget is spent).
	caller    context.Context
	claim     *Lease
	unleased  bool
	redisDown bool // the flight could not use Redis (see currency)

	// from is the context of the Get that started the flight, for the
	// Observer's Start hooks only: its values, never its cancellation
	// (the flight belongs to no caller). nil: Begin's caller, or none.
	from context.Context

	// awaited is the fence of the leader a follower waits for (from the
	// held ACQUIRE reply): its failure, by message or by the failure marker
	// a follower finds when it looks, ends the wait; failures of other
	// leaders do not. floor is the key's fence counter at the last
	// ACQUIRE that found the lease held: a wake-up carrying an envelope
	// with a lower fence predates a write (or a lease) that came before
	// that look, so it is ignored.
	awaited string
	floor   uint64

	// retried is the fence of the failed leader whose load this follower
	// retries (see Options.RetryFailedLoad and NoShare), or empty: then
	// the failure of any newer leader ends the wait, and it does not retry
	// again.
	retried string

	// Read-your-writes. seen is when the Redis command whose reply the
	// flight is deciding on was sent; heldAt is when the last ACQUIRE that
	// found the lease held was sent (a value announced after it was
	// written after it). cur says for which callers the answer is current.
	seen, heldAt time.Time
	cur          currency

	// gen is the purge generation read with the ACQUIRE of the lease the
	// flight holds, before its load began (see tags.go).
	gen generation

	// pre is the read of the Get that started the flight (see hit.go):
	// the flight starts from it instead of reading again. early is that
	// Get's early-refresh draw for pre's envelope, which served takes
	// instead of drawing again (two draws would square XFetch's
	// probability).
	pre   *preRead
	early bool

	// commits, when set, pipelines the flight's COMMIT with those of the
	// other keys a GetMany led (see commitBatch).
	commits *commitBatch
}

// origin is the context the Observer's Start hooks get for f.
func (f *flight) origin() context.Context {
	switch {
	case f.from != nil:
		return f.from
	case f.caller != nil:
		return f.caller
	}
	return context.Background()
}

// currency says which callers of a flight its answer may go to: only
// those it is known current for, so that a call that starts after a write
// returned is never answered with a value from before the write. A caller
// that may have seen a write the answer predates takes the next flight.
type currency struct {
	// from: the value was current in Redis at a moment after this
	// instant (the GET or the committing script was sent then; for a
	// fenced commit, the load began then). It answers callers that joined
	// at or before it.
	from time.Time
	// unchecked: a value loaded while Redis is unreachable (or that
	// became so before its commit), which no Redis command can check. It answers every caller unless a Set or
	// Invalidate of the key in this process returned after the load began
	// (writes counted the key's write count then); writes by other
	// processes cannot be seen without Redis. Every other value that
	// Redis did not confirm (a fenced or failed commit, a value not
	// stored, a load after the wait budget) is current from the load's
	// start.
	unchecked bool
	writes    uint64
}

// answers reports whether the answer goes to a caller that joined at
// joined, when the key's local write count was writes.
func (cur currency) answers(joined time.Time, writes uint64) bool {
	if cur.unchecked {
		return writes <= cur.writes
	}
	return !joined.After(cur.from)
}

// flightResult is what a flight hands to singleflight, with or without an
// error.
type flightResult struct {
	val     []byte
	outcome Outcome
	cur     currency
	led     atomic.Bool // a caller has reported the flight's OutcomeLeader
}

// lookupOutcome is the outcome one caller of the flight reports to
// Observer.Lookup: a rebuild's callers in this process report one leader
// (the first to take the answer) and followers, so that leaders count
// loads, not callers.
func (r *flightResult) lookupOutcome(shared bool) Outcome {
	if r.outcome == OutcomeLeader && shared && r.led.Swap(true) {
		return OutcomeFollower
	}
	return r.outcome
}

// answers reports whether a flight's answer goes to a caller that joined
// it at joined with the key's local write count writes: errors always do
// (they are not values), values and ErrNotFound as cur says.
func (r *flightResult) answers(joined time.Time, writes uint64, err error) bool {
	if err != nil && !errors.Is(err, ErrNotFound) {
		return true
	}
	return r.cur.answers(joined, writes)
}

// run runs the flight: it returns the value or the error every local
// caller gets, with the outcome recorded in f.
func (c *Cache) run(f *flight) (val []byte, err error) {
	defer func() {
		// The loader's panics are recovered in runLoader; this is for
		// herd's own bugs, which must not crash the process either (x/sync
		// re-panics in a goroutine when a DoChan caller waits).
		if r := recover(); r != nil {
			val, err = nil, newLoadError(f.key, &PanicError{Value: r, Stack: debug.Stack()})
		}
	}()
	if !c.brk.allow() {
		return c.redisDown(f, errBreakerOpen)
	}
	var env envelope
	var ok bool
	if pre := f.pre; pre != nil {
		// The caller that started the flight has just read the key.
		f.seen, env, ok, err = pre.sent, pre.env, pre.ok, pre.err
		f.early = pre.due
	} else {
		env, ok, err = c.read(f)
	}
	if err != nil {
		return c.redisDown(f, err)
	}
	if ok {
		if v, err, done := c.served(f, env); done {
			return v, err
		}
	}
	c.stats.misses.Add(1)
	lease, v, done, pttl, err := c.acquire(f)
	switch {
	case done:
		return v, err
	case lease != nil && f.load == nil:
		c.stats.leads.Add(1)
		f.outcome, f.claim = OutcomeLeader, lease // Begin: the caller builds the value
		return nil, nil
	case lease != nil:
		f.outcome = OutcomeLeader
		return c.lead(f, lease, false)
	case errors.Is(err, ErrLeaseHeld):
		f.outcome = OutcomeFollower
		c.sig.lease(f.key, LeaseContended)
		return c.follow(f, pttl)
	default:
		return c.redisDown(f, err)
	}
}

// acquire takes the key's lease, unless a usable value landed since the
// flight looked (then done is set and val, err are the answer). On
// ErrLeaseHeld pttl is the holder's remaining time.
func (c *Cache) acquire(f *flight) (lease *Lease, val []byte, done bool, pttl time.Duration, err error) {
	ttl := c.leaseFor(f.key)
	var (
		sent time.Time
		gr   genRead
		r    attempted
	)
	for i := range 3 {
		sent, gr = time.Now(), c.newGenRead()
		aw := awaiting{fence: f.awaited, after: f.retried}
		if i == 2 {
			aw = awaiting{} // bounded: the markers have answered twice
		}
		r, err = c.locker.attempt(c.ctx, f.key, f.keys, ttl, modeMiss, nil, aw, gr.side())
		if r.failure == "" {
			break
		}
		// The leader this follower waited for failed (or, after a retry,
		// a newer one did), and the message did not reach it: the failure
		// marker tells. Unless it retries, that ends the flight.
		if v, ferr, done := c.onNotice(f, notice{payload: r.failure}); done {
			return nil, v, true, 0, ferr
		}
	}
	if r.holder != "" {
		f.awaited = r.holder
	}
	if errors.Is(err, ErrLeaseHeld) {
		f.heldAt = sent
		f.floor = max(f.floor, r.counter)
	}
	if err == nil && r.lease == nil {
		f.seen = sent
		if env, ok := decodeEnvelope(r.value); ok {
			if v, err, done := c.served(f, env); done {
				return nil, v, true, 0, err
			}
		}
		// An expired or unreadable value is there: rebuild over it.
		r.lease, r.pttl, err = c.locker.try(c.ctx, f.key, f.keys, ttl)
	}
	if err != nil && !errors.Is(err, ErrLeaseHeld) {
		c.redisFailed(err)
	}
	if r.lease != nil {
		f.gen = c.genResult(gr) // before the load begins
	}
	return r.lease, nil, false, r.pttl, err
}

// read GETs and decodes the key's envelope. ok is false on a miss,
// including bytes that are not an intact envelope (counted as corrupt).
// err is an infrastructure error, already recorded by the breaker.
func (c *Cache) read(f *flight) (env envelope, ok bool, err error) {
	f.seen = time.Now()
	b, err := c.readValue(c.ctx, f.keys.value)
	if err != nil && isInfraError(err) {
		c.redisFailed(err)
		return envelope{}, false, err
	}
	c.redisAnswered()
	if err != nil {
		return envelope{}, false, nil // redis.Nil or a wrong-type reply: a miss
	}
	env, ok = decodeEnvelope(b)
	if !ok {
		c.countCorrupt(f.key, len(b))
	}
	return env, ok, nil
}

// served decides whether env answers the flight: a fresh value (which may
// also start an early refresh) or a stale one within StaleFor (which starts
// a refresh). done is false when the envelope is past both.
func (c *Cache) served(f *flight, env envelope) (val []byte, err error, done bool) {
	now := c.now()
	early := f.early // drawn for the first envelope only
	f.early = false
	f.env = env
	f.cur = currency{from: f.seen}
	c.observeDelta(f, env.fence, env.delta)
	follower := f.outcome == OutcomeFollower
	if follower {
		// A follower that finds the value while waiting stays a follower,
		// and its read is not a hit: it counts as a follow.
		defer func() { f.outcome = OutcomeFollower }()
	}
	if env.pass {
		// A pass mark (Fill.Pass) answers Begin; Get rebuilds over it.
		if f.load != nil || !now.Before(env.softExp) {
			return nil, nil, false
		}
		if follower {
			// It waited on the rebuild that passed: told as its waiters are.
			return nil, fmt.Errorf("%w: %q: %s", ErrNotShared, f.key, env.payload), true
		}
		f.outcome = OutcomePass
		c.stats.passes.Add(1)
		return nil, passError(f.key), true
	}
	switch {
	case now.Before(env.softExp):
		switch {
		case early || c.xfetchDue(env, now):
			f.outcome = OutcomeEarlyRefresh
			c.stats.earlyRefreshes.Add(1)
			c.refreshAsync(f, env)
		case env.negative:
			f.outcome = OutcomeNegative
		default:
			f.outcome = OutcomeHit
		}
		if env.negative {
			if !follower {
				c.stats.negativeHits.Add(1)
			}
			return nil, ErrNotFound, true
		}
		if !follower {
			c.stats.hits.Add(1)
		}
		return env.payload, nil, true
	case now.Before(env.staleExp):
		f.outcome = OutcomeStale
		c.stats.staleServed.Add(1)
		c.refreshAsync(f, env)
		if env.negative {
			return nil, ErrNotFound, true
		}
		return env.payload, nil, true
	}
	return nil, nil, false
}

// passError is what Begin returns for a key that carries a pass mark.
// countFailedLoad counts a load that gave no value: a value not for
// sharing (ErrNotShared) is no failure and is counted apart.
func (c *Cache) countFailedLoad(err error) {
	if errors.Is(err, ErrNotShared) {
		c.stats.notShared.Add(1)
	} else {
		c.stats.loadErrors.Add(1)
	}
}

func passError(key string) error {
	return fmt.Errorf("%w: %q: %w", ErrNotShared, key, ErrPass)
}

// leaseFor is the lease length for a rebuild of key.
func (c *Cache) leaseFor(key string) time.Duration {
	return c.calib.Lease(c.cfg.KeyClass(key))
}

// lead runs the loader under the lease, then commits: value, wake-up and
// release in one script. A failure releases the lease at once and tells
// the followers, so they do not wait out the lease.
func (c *Cache) lead(f *flight, lease *Lease, refresh bool) ([]byte, error) {
	c.stats.leads.Add(1)
	lease.KeepAlive(c.cfg.MaxHold)
	values, traced := c.sig.startLoad(f, lease)
	ld := loaded{start: time.Now(), writes: c.writesOf(f.key), exp: &expiry{ttl: f.ttl, staleFor: c.cfg.StaleFor, c: c}, traced: traced}
	ld.val, ld.err = c.runLoader(values, f.load, c.loadBudget(), ld.exp)
	ld.delta = time.Since(ld.start)
	return c.settle(f, lease, refresh, ld)
}

// loaded is the outcome of a leader's load: its value or error, when it
// began (start, when the key's local write count was writes), how long it
// took, and what the loader set with SetExpiry and SetTags.
type loaded struct {
	val    []byte
	err    error
	start  time.Time
	writes uint64
	delta  time.Duration
	exp    *expiry
	traced func(error) // ends the StartLoad step, if any
}

// settle ends a leader's load ld under lease: it commits the value (or a
// negative entry), or releases the lease and tells the followers of the
// failure, and returns what the flight's callers get.
func (c *Cache) settle(f *flight, lease *Lease, refresh bool, ld loaded) ([]byte, error) {
	val, err, start, writes, delta, exp := ld.val, ld.err, ld.start, ld.writes, ld.delta, ld.exp
	lease.finish()
	if err == nil && len(val) > c.cfg.MaxValueBytes {
		// A failed load, to the Observer as in Stats.
		err = fmt.Errorf("%w: the loader returned %d bytes, limit %d", ErrValueTooLarge, len(val), c.cfg.MaxValueBytes)
	}
	c.stats.loads.Add(1)
	c.sig.load(f.key, delta, err, true)
	if ld.traced != nil {
		ld.traced(err)
	}
	c.observeLoad(f, lease.token, delta, err)

	// A not-found marked NoShare is this process's own: no negative
	// entry, and the other processes' callers retry, as for any NoShare.
	notFound := errors.Is(err, ErrNotFound) && !isNoShare(err)
	switch {
	case err == nil:
		ttl, staleFor := exp.get()
		f.cur = c.commit(f, lease, c.newEnvelope(lease.token, val, c.jitter(ttl), staleFor, delta), start, writes, exp.tagging())
		return val, nil
	case notFound && c.cfg.NegativeTTL > 0:
		env := c.newEnvelope(lease.token, nil, c.cfg.NegativeTTL, c.cfg.StaleFor, delta)
		env.negative = true
		f.cur = c.commit(f, lease, env, start, writes, exp.tagging())
		return nil, ErrNotFound
	}
	f.cur = currency{from: start} // a not-found that is not stored

	if errors.Is(err, ErrClosed) {
		// This process is shutting down: hand the rebuild to another
		// process at once instead of failing its waiters.
		c.releaseDetached(f, lease, msgReleased, 0)
		return nil, ErrClosed
	}
	var msg string
	if notFound {
		msg = failMessage(failNotFound, lease, err.Error())
	} else {
		c.countFailedLoad(err)
		var kind byte
		var text string
		err, kind, text = loadFailure(f.key, err)
		msg = failMessage(kind, lease, text)
	}
	if refresh {
		// Stale-if-error: the stale value stays servable until its hard
		// TTL; refreshes back off cluster-wide so the failing source is
		// not called on every hit.
		c.releaseDetached(f, lease, msg, c.cfg.RefreshBackoff)
		c.stats.refreshErrors.Add(1) // after the backoff is in Redis
		c.sig.refresh(f.key, RefreshFailed)
		c.log(slog.LevelWarn, "herd: refresh failed; serving the stale value while refreshes back off", "key", f.key, "err", err)
	} else if sent, current := c.releaseDetached(f, lease, msg, 0); current {
		f.cur = currency{from: sent} // no write since the lease: the not-found is current
	}
	if notFound {
		return nil, ErrNotFound
	}
	return nil, err
}

// releaseDetached releases the lease after a load that produced no value,
// waking the followers with msg (a failure message becomes a plain release
// when the key's fence moved on: see release.lua). It runs even while
// Close cancels c.ctx, bounded by its own timeout. current reports that
// the fence was still the lease's when the script, sent at sent, ran.
func (c *Cache) releaseDetached(f *flight, lease *Lease, msg string, backoff time.Duration) (sent time.Time, current bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), time.Second)
	defer cancel()
	var marker time.Duration
	if msg != "" && msg[0] == msgFailed {
		// Long enough for a follower that missed the message to look
		// again: its next poll, or its subscription's confirmation.
		marker = max(lease.ttl, 2*c.cfg.PollMax)
	}
	sent = time.Now()
	n, err := lease.releaseFailed(ctx, msg, backoff, c.cfg.RefreshBackoffMax, marker)
	if err != nil {
		c.redisFailed(err)
		c.log(slog.LevelWarn, "herd: could not release the lease after a load without value; followers wait for it to expire", "key", f.key, "err", err)
	}
	return sent, n == 2
}

// follow waits for another process's rebuild of the key: subscribe, look
// again (the value may have landed before the subscription), then wait for
// the wake-up message, a poll, or the budget.
func (c *Cache) follow(f *flight, pttl time.Duration) (val []byte, err error) {
	c.stats.waits.Add(1)
	start := time.Now()
	end := WaitPolled
	traced := c.sig.startWait(f)
	defer func() {
		c.sig.wait(f.key, time.Since(start), end)
		if traced != nil {
			traced(end)
		}
	}()
	subCtx := c.ctx
	if f.caller != nil {
		subCtx = f.caller // Begin: the subscription waits no longer than its caller
	}
	sub, _, serr := c.notify.subscribe(subCtx, f.keys.channel)
	if errors.Is(serr, ErrClosed) {
		return nil, ErrClosed
	}
	var wake <-chan notice
	if sub != nil {
		defer sub.release()
		wake = sub.C
	}
	notified := serr == nil // pub/sub works (or will once confirmed)

	if v, done, p, err := c.check(f); done {
		if f.claim != nil || f.outcome == OutcomeLeader {
			end = WaitTakeover
		}
		return v, err
	} else if p > 0 {
		pttl = p
	}
	var callerDone <-chan struct{}
	if f.caller != nil {
		callerDone = f.caller.Done()
	}

	// The budget: WaitTimeout when set. By default, twice the lease,
	// renewed for as long as a live holder keeps its lease (it renews it
	// while it rebuilds, up to MaxHold), so a slow rebuild is waited for
	// rather than duplicated; up to MaxHold plus one lease per holder.
	budget := c.cfg.WaitTimeout
	renewing := budget == 0
	if renewing {
		budget = 2 * c.leaseFor(f.key)
	}
	// The cap counts from when the current holder was first seen: a new
	// holder (a takeover, a hand-over) may renew up to MaxHold again.
	hardEnd, hardFor := start.Add(c.cfg.MaxHold+c.leaseFor(f.key)), f.awaited
	limit := time.NewTimer(budget)
	defer limit.Stop()

	// With pub/sub, polling is a safety net: look when the holder's lease
	// would run out (to take over a dead leader) and every PollMax.
	// Without it, poll from the expected rebuild time with backoff.
	backoff := c.cfg.PollMax
	if !notified {
		est, _ := c.calib.Tail(c.cfg.KeyClass(f.key))
		backoff = min(max(est/2, c.cfg.PollMin), c.cfg.PollMax)
	}
	next := func() time.Duration {
		d := lease.Jitter(backoff)
		if pttl > 0 && pttl+time.Millisecond < d {
			d = pttl + time.Millisecond
		}
		if !notified {
			backoff = min(2*backoff, c.cfg.PollMax)
		}
		return d
	}
	poll := time.NewTimer(next())
	defer poll.Stop()

	for {
		select {
		case <-c.ctx.Done():
			end = WaitCancelled
			return nil, ErrClosed
		case <-callerDone:
			end = WaitCancelled
			return nil, f.caller.Err()
		case <-limit.C:
			if left := time.Until(hardEnd); renewing && left > 0 {
				v, done, p, err := c.check(f)
				if done {
					if f.claim != nil || f.outcome == OutcomeLeader {
						end = WaitTakeover
					}
					return v, err
				}
				if p > 0 { // a holder keeps its lease: it is rebuilding
					pttl = p
					if f.awaited != hardFor {
						hardEnd, hardFor = time.Now().Add(c.cfg.MaxHold+c.leaseFor(f.key)), f.awaited
					}
					limit.Reset(min(budget, time.Until(hardEnd)))
					continue
				}
			}
			c.stats.waitTimeouts.Add(1)
			end = WaitTimeout
			return c.fallback(f, time.Since(start).Round(time.Millisecond))
		case nt := <-wake:
			if v, err, done := c.onNotice(f, nt); done {
				c.stats.notified.Add(1)
				end = WaitNotified
				return v, err
			}
			end = WaitNotified // a wake-up that made it look again
		case <-poll.C:
			c.stats.polled.Add(1)
			end = WaitPolled
		}
		v, done, p, err := c.check(f)
		if done {
			if f.claim != nil || f.outcome == OutcomeLeader {
				end = WaitTakeover
			}
			return v, err
		}
		pttl = p
		poll.Reset(next())
	}
}

// onNotice handles a wake-up message. done is false when the follower
// should look at Redis itself (a confirmation, a release without value, a
// value too large to send, or one it cannot decode).
func (c *Cache) onNotice(f *flight, nt notice) (val []byte, err error, done bool) {
	if nt.resub || nt.payload == "" {
		return nil, nil, false
	}
	switch nt.payload[0] {
	case msgValue:
		env, ok := decodeEnvelope([]byte(nt.payload[1:]))
		if !ok || env.fence < f.floor || (env.pass && f.load != nil) {
			// Unreadable, or an envelope older than the key's fence when
			// this follower last looked (a message queued before a newer
			// Set, Invalidate or lease), or a pass mark, which Get
			// rebuilds over: look at Redis instead.
			return nil, nil, false
		}
		if env.pass {
			// The leader passed (Fill.Pass): build it yourself.
			return nil, fmt.Errorf("%w: %q: %s", ErrNotShared, f.key, env.payload), true
		}
		f.env = env
		f.cur = currency{from: f.heldAt}
		c.observeDelta(f, env.fence, env.delta)
		if env.negative {
			return nil, ErrNotFound, true
		}
		return env.payload, nil, true
	case msgFailed:
		kind, fence, text := parseFailMessage(nt.payload)
		if !f.endedBy(fence) {
			return nil, nil, false // another leader's failure: look again
		}
		switch kind {
		case failNotFound:
			f.cur = currency{from: f.heldAt}
			return nil, ErrNotFound, true
		case failNotShared:
			// The text is the leader's error, which wraps ErrNotShared
			// too: say "value not shared" once.
			text = strings.TrimPrefix(text, ErrNotShared.Error()+": ")
			if text == ErrNotShared.Error() {
				return nil, fmt.Errorf("%w: %q", ErrNotShared, f.key), true
			}
			return nil, fmt.Errorf("%w: %q: %s", ErrNotShared, f.key, text), true
		}
		if c.retries(f, kind, fence) {
			return nil, nil, false // look again: take the lease, or follow who did
		}
		return nil, remoteLoadError(f.key, kind, text), true
	}
	return nil, nil, false
}

// endedBy reports whether the failure of the leader with the given fence
// ends f's wait: before a retry, the awaited leader's does, or a newer
// leader's (the awaited one is gone; a marker tells only of the last
// failure), and any if the follower does not know whom it awaits; after
// a retry, that of any leader newer than the one whose load it retries.
// An older leader's failure (a message queued before the awaited leader
// took the lease) does not.
func (f *flight) endedBy(fence string) bool {
	if fence == "" {
		return true
	}
	if f.retried != "" {
		return fenceAfter(fence, f.retried)
	}
	return f.awaited == "" || fence == f.awaited || fenceAfter(fence, f.awaited)
}

// fenceAfter reports whether fence a is newer than fence b (both decimal).
func fenceAfter(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return errA == nil && errB == nil && x > y
}

// retries decides whether the follower f retries the failed load of the
// leader with the given fence (one retry per flight, with a loader: see
// Options.RetryFailedLoad and NoShare). Only the failure of the leader it
// awaited is retried: a newer leader's failure means another follower
// retried already. When it does, f forgets the leader it awaited and
// remembers which one failed.
func (c *Cache) retries(f *flight, kind byte, fence string) bool {
	if f.retried != "" || f.load == nil || (kind != failNoShare && !c.cfg.RetryFailedLoad) {
		return false
	}
	if fence == "" || fence != f.awaited {
		return false
	}
	f.retried, f.awaited = fence, ""
	c.stats.loadRetries.Add(1)
	c.sig.loadRetry(f.key)
	return true
}

// check looks at Redis: a usable value ends the wait; a free lease is
// taken and this process leads (a takeover). Otherwise it returns the
// holder's remaining lease time. Infrastructure errors are recorded and
// the wait goes on (the budget bounds it).
func (c *Cache) check(f *flight) (val []byte, done bool, pttl time.Duration, err error) {
	env, ok, rerr := c.read(f)
	if rerr != nil {
		return nil, false, 0, nil
	}
	if ok {
		if v, err, done := c.served(f, env); done {
			return v, true, 0, err
		}
	}
	lease, v, done, pttl, err := c.acquire(f)
	switch {
	case done:
		return v, true, 0, err
	case lease != nil:
		c.stats.takeovers.Add(1)
		c.sig.lease(f.key, LeaseTakenOver)
		f.outcome = OutcomeLeader
		if f.load == nil {
			f.claim = lease // Begin: the caller builds the value
			return nil, true, 0, nil
		}
		v, err := c.lead(f, lease, false)
		return v, true, 0, err
	}
	return nil, false, pttl, nil
}

// fallback applies Options.Fallback after a follower spent its budget.
func (c *Cache) fallback(f *flight, budget time.Duration) ([]byte, error) {
	f.outcome = OutcomeFallback
	timeout := fmt.Errorf("%w: %q: no value after waiting %v for another process's rebuild", ErrWaitTimeout, f.key, budget)
	switch c.cfg.Fallback {
	case ReturnError:
		return nil, timeout
	case ServeStale:
		f.cur = currency{from: time.Now()}
		b, err := c.readValue(c.ctx, f.keys.value)
		if err == nil {
			if env, ok := decodeEnvelope(b); ok && !env.pass {
				if env.negative {
					return nil, ErrNotFound
				}
				return env.payload, nil
			}
		}
		return nil, timeout
	}
	return c.loadLocal(f)
}

// redisDown handles a flight that cannot use Redis.
func (c *Cache) redisDown(f *flight, cause error) ([]byte, error) {
	f.outcome = OutcomeFallback
	f.redisDown = true
	if c.cfg.FailClosed {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
	c.stats.failOpen.Add(1)
	c.sig.failOpen(f.key)
	return c.loadLocal(f)
}

// loadLocal runs the loader without a lease and without storing the
// result, bounded by MaxLocalLoads concurrent runs in this process.
func (c *Cache) loadLocal(f *flight) ([]byte, error) {
	if f.load == nil {
		f.unleased = true // Begin: the caller builds it, unstored
		return nil, nil
	}
	release, err := c.localSlot(f.key)
	if err != nil {
		return nil, err
	}
	defer release()
	c.stats.localLoads.Add(1)
	values, traced := c.sig.startLoad(f, nil)
	start := time.Now()
	c.localStart(f, start)
	val, err := c.runLoader(values, f.load, c.loadBudget(), &expiry{})
	c.sig.load(f.key, time.Since(start), err, false)
	if traced != nil {
		traced(err)
	}
	return c.localResult(f, val, err)
}

// localSlot takes one of the MaxLocalLoads slots for a load of key
// without a lease, waiting up to LoadTimeout; release gives it back.
func (c *Cache) localSlot(key string) (release func(), err error) {
	wait := time.NewTimer(c.cfg.LoadTimeout)
	defer wait.Stop()
	select {
	case c.local <- struct{}{}:
		return func() { <-c.local }, nil
	case <-wait.C:
		return nil, fmt.Errorf("%w: %q: no local load slot within %v (MaxLocalLoads %d)", ErrWaitTimeout, key, c.cfg.LoadTimeout, c.cfg.MaxLocalLoads)
	case <-c.ctx.Done():
		return nil, ErrClosed
	}
}

// localStart sets the currency of a load without a lease that starts at
// start (see currency).
func (c *Cache) localStart(f *flight, start time.Time) {
	f.cur = currency{from: start}
	if f.redisDown {
		f.cur = currency{unchecked: true, writes: c.writesOf(f.key)}
	}
}

// localResult is what the callers of f get from a load without a lease
// that returned val and err.
func (c *Cache) localResult(f *flight, val []byte, err error) ([]byte, error) {
	switch {
	case err == nil && len(val) > c.cfg.MaxValueBytes:
		// A failed load, as a leader's (see settle).
		return nil, newLoadError(f.key, fmt.Errorf("%w: the loader returned %d bytes, limit %d", ErrValueTooLarge, len(val), c.cfg.MaxValueBytes))
	case errors.Is(err, ErrNotFound):
		return nil, ErrNotFound
	case err != nil:
		c.countFailedLoad(err)
		return nil, newLoadError(f.key, err)
	}
	return val, nil
}
