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
	"github.com/herdkit/herd/internal/wire"
)

// The two-tier flight. Get puts the callers of a key in one process into
// one flight (flightGroup.DoChan; each caller leaves on its own context).
// The flight reads the value, and on a miss takes the key's lease: the
// winner leads (loads and commits), the others follow (wait for the
// leader's wake-up message). Everything here runs detached from callers,
// under c.ctx, which only Close cancels.
//
// The flight is a state machine (see state and fly): each state is one
// method of flight that does its step and returns the next state, until
// stDone, when f.ans is the answer of every local caller.

// flight is one rebuild attempt for a key in this process.
type flight struct {
	// Set when the flight is made, read only after.
	c       *Cache
	key     string
	keys    keyFamily
	ttl     time.Duration
	load    LoadFunc        // nil for Begin (see begin): the caller builds the value
	refresh LoadFunc        // what a stale or early hit refreshes with (nil: none)
	prepare func() LoadFunc // Begin: called in the caller's goroutine when a refresh starts
	// caller is Begin's caller's context: it bounds the follower's wait
	// (nil for Get, whose flight belongs to no caller).
	caller context.Context
	// waitBy, for Begin with an explicit WaitTimeout, is when the
	// caller's budget ends, counted from its call: the waits for this
	// process's Fills have spent part of it already.
	waitBy time.Time
	// from is the context of the Get that started the flight, for the
	// Observer's Start hooks only: its values, never its cancellation
	// (the flight belongs to no caller). nil: Begin's caller, or none.
	from context.Context

	// pre is the read of the Get that started the flight (see hit.go):
	// read takes it (once) instead of reading again. early is that Get's
	// early-refresh draw for pre's envelope, which served takes (and
	// clears) instead of drawing again (two draws would square XFetch's
	// probability).
	pre   *preRead
	early bool
	// cold is set while the flight's first look is a cold read's ACQUIRE
	// (coldread.go), which counts the miss the skipped GET would have.
	cold bool
	// joins, for a cold read's flight, admits other cold reads until
	// the flight closes it (see "Cold joins"; nil: none may join).
	joins *coldGate
	// lookedAt is when the flight's last ACQUIRE was sent: a cold read
	// that joined later takes none of its answers (see Get).
	lookedAt time.Time

	// The answer, for the callers once the flight is stDone. outcome is
	// written in two places only: by enter, with the role of the state
	// the flight enters (leader, follower, fallback), and by served, with
	// what the envelope it serves is (hit, stale...), unless the flight
	// follows (a follower stays a follower). ans is written by the step
	// that ends the flight (done, served, heard); env by served and heard
	// (the envelope decided on; the one that answered the flight, if
	// any); cur by whoever writes ans from a value (see currency).
	outcome Outcome
	ans     answer
	env     envelope
	cur     currency

	// Written by acquired when the flight wins the key's lease, before its
	// load begins: the lease (Begin: handed to the caller, stClaim) and
	// the purge generation read with its ACQUIRE (see tags.go).
	lease *Lease
	gen   generation
	// Written by the steps that leave Redis behind: cause is the Redis
	// error that sent the flight to stDown (goDown); redisDown that the
	// flight could not use Redis (down; see currency); unleased asks
	// Begin's caller to build the value without a lease (local); spent is
	// the wait budget spent, for stFallback's error (timedOut, or Begin).
	cause     error
	redisDown bool
	unleased  bool
	spent     time.Duration

	// What the ACQUIREs told, written by acquired (and heard, retries).
	// awaited is the fence of the leader a follower waits for (from the
	// held ACQUIRE reply): its failure, by message or by the failure marker
	// a follower finds when it looks, ends the wait; failures of other
	// leaders do not. floor is the key's fence counter at the last
	// ACQUIRE that found the lease held: a wake-up carrying an envelope
	// with a lower fence predates a write (or a lease) that came before
	// that look, so it is ignored. pttl is the holder's remaining lease at
	// the last ACQUIRE.
	awaited string
	floor   uint64
	pttl    time.Duration
	// retried is the fence of the failed leader whose load this follower
	// retries (see Options.RetryFailedLoad and NoShare), or empty: then
	// the failure of any newer leader ends the wait, and it does not retry
	// again. Written by retries.
	retried string

	// Read-your-writes. seen is when the Redis command whose reply the
	// flight is deciding on was sent (written by read and acquired);
	// heldAt is when the last ACQUIRE that found the lease held was sent
	// (acquired; a value announced after it was written after it).
	seen, heldAt time.Time

	// wait is the follower's wait: follow creates it, Cache.follow and
	// looked update it, endWait ends it when the flight ends. nil until the
	// flight follows: wait != nil tells a follower's look from the
	// flight's first one.
	wait *waiting

	// commits, when set, pipelines the flight's COMMIT with those of the
	// other keys a GetMany led (see commitBatch). Set by leadMany, cleared
	// by runCommit or skipCommit.
	commits *commitBatch
}

// answer is what a flight answers its local callers: a value, or an error
// (ErrNotFound included).
type answer struct {
	val []byte
	err error
}

// state is a step of the flight. Each state's method (see step) returns
// the next; a follower's look (after follow) runs stRead, which goes
// straight to stAcquire, and goes back to stWait unless it ends the flight.
type state uint8

const (
	stRead     state = iota // GET the key, or take the read of the Get that started the flight
	stServe                 // decide on the envelope read: answer, or go on to the lease
	stAcquire               // ACQUIRE the lease: lead, claim or follow (or answer from a value that landed)
	stLead                  // won: load under the lease and commit (Get)
	stClaim                 // won: hand the lease to Begin's caller, who builds the value
	stFollow                // held: subscribe to the key's wake-up, then look again
	stWait                  // wait for a wake-up, a poll or the budget, then look again
	stFallback              // the wait budget is spent: Options.Fallback
	stDown                  // Redis is unreachable: fail closed, or open (stLocal)
	stLocal                 // load without a lease, unstored (Begin: build it unleased)
	stDone                  // the flight ended: f.ans is its answer
)

// role is the outcome entering st gives the flight, if any.
func (st state) role() (Outcome, bool) {
	switch st {
	case stLead, stClaim:
		return OutcomeLeader, true
	case stFollow:
		return OutcomeFollower, true
	case stFallback, stDown:
		return OutcomeFallback, true
	}
	return OutcomeUnknown, false
}

// fly runs the flight from st until it ends, and returns its answer, with
// the outcome in f. Get's flight starts at stRead; Begin's may start at
// stFallback, GetMany's followers at stFollow.
func (f *flight) fly(st state) (a answer) {
	defer func() {
		// The loader's panics are recovered in runLoader; this is for
		// herd's own bugs, which must not crash the process either (x/sync
		// re-panics in a goroutine when a DoChan caller waits).
		if r := recover(); r != nil {
			a = answer{err: newLoadError(f.key, &PanicError{Value: r, Stack: debug.Stack()})}
		}
	}()
	defer f.endWait()
	for st != stDone {
		st = f.step(st)
	}
	return f.ans
}

// step enters st and runs it.
func (f *flight) step(st state) state {
	f.enter(st)
	switch st {
	case stRead:
		return f.read()
	case stServe:
		return f.serve()
	case stAcquire:
		return f.acquire()
	case stLead:
		return f.lead()
	case stClaim:
		return f.claim()
	case stFollow:
		return f.follow()
	case stWait:
		return f.c.follow(f)
	case stFallback:
		return f.fallback()
	case stDown:
		return f.down()
	case stLocal:
		return f.local()
	}
	panic(fmt.Sprintf("herd: flight in state %d", st))
}

// enter records the role st gives the flight (see role). GetMany's batch
// calls it for the states it runs for many keys at once.
func (f *flight) enter(st state) {
	if o, ok := st.role(); ok {
		f.outcome = o
	}
}

// done ends the flight with val and err.
func (f *flight) done(val []byte, err error) state {
	f.ans = answer{val, err}
	return stDone
}

// begin reports whether f is Begin's flight: without a loader, a lease
// it wins goes to the caller (stClaim), and so does a rebuild without one
// (stLocal).
func (f *flight) begin() bool { return f.load == nil }

// goDown sends the flight to stDown for cause.
func (f *flight) goDown(cause error) state {
	f.cause = cause
	return stDown
}

// read reads the key: a value goes to stServe, a miss to stAcquire, and
// Redis down (or an open breaker) to stDown. Only the first look GETs,
// and only after a Get's hit path read (its read is taken) or for Begin:
// a cold read's first look and every follower's look go to stAcquire,
// whose reply carries the value when there is one.
func (f *flight) read() state {
	c := f.c
	if f.wait == nil && !c.brk.allow() {
		f.joins.close(true) // no look at all (see Get)
		return f.goDown(errBreakerOpen)
	}
	switch {
	case f.pre == coldLook:
		// A cold read (coldread.go): the ACQUIRE reads the value.
		f.pre, f.cold = nil, true
		return stAcquire
	case f.wait != nil:
		// A follower's look: its ACQUIRE answers from a value that landed,
		// takes a free lease over or finds it held, in one round trip.
		return stAcquire
	}
	var env envelope
	var ok bool
	var err error
	if pre := f.pre; pre != nil {
		// The caller that started the flight has just read the key.
		f.pre = nil
		f.seen, env, ok, err = pre.sent, pre.env, pre.ok, pre.err
		f.early = pre.due
	} else {
		env, ok, err = c.read(f)
	}
	switch {
	case err != nil:
		return f.goDown(err)
	case ok:
		f.env = env
		return stServe
	}
	return f.miss()
}

// serve answers from the envelope read (see served), or goes on to the
// lease.
func (f *flight) serve() state {
	if f.served(f.env) {
		return stDone
	}
	return f.miss()
}

// miss goes on to the lease; the first look counts a miss.
func (f *flight) miss() state {
	if f.wait == nil {
		f.c.stats.misses.Add(1)
	}
	return stAcquire
}

// acquire takes the key's lease (see acquired). The first look follows
// when it is held, or goes down when Redis fails; a follower's look
// takes a free lease over, or waits on.
func (f *flight) acquire() state {
	c := f.c
	ttl := c.leaseFor(f.key)
	var (
		sent time.Time
		gr   genRead
		r    attempted
		err  error
	)
	if f.wait != nil {
		f.joins.close(false) // a follower's look: it answers only who joined before it
	}
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
		if f.heard(notice{Payload: r.failure}) {
			return stDone
		}
	}
	f.lookedAt = sent
	landed := err == nil && r.lease == nil // a value is there
	st := f.acquired(r, err, sent, ttl)
	if f.wait == nil && st != stFollow {
		// No later look will answer the cold reads that joined while this
		// one was on the wire: they read the key now ("Cold joins").
		f.joins.close(true)
	}
	if f.cold {
		// The first look of a cold read: it stands for the GET it skipped.
		f.cold = false
		if err == nil || errors.Is(err, ErrLeaseHeld) {
			c.warm.found(landed)
		}
		if st == stLead || st == stClaim || st == stFollow {
			c.stats.misses.Add(1)
		}
	}
	switch st {
	case stDown:
		if f.cause != nil {
			c.redisFailed(f.cause)
		}
	case stLead, stClaim:
		c.redisAnswered()
		f.gen = c.genResult(gr) // before the load begins
	default:
		// Redis replied (acquired sends every other error to stDown): the
		// breaker counts consecutive errors only.
		c.redisAnswered()
	}
	if f.wait == nil {
		if st == stFollow {
			c.sig.lease(f.key, LeaseContended)
		}
		return st
	}
	switch st { // a follower's look
	case stLead, stClaim:
		c.stats.takeovers.Add(1)
		c.sig.lease(f.key, LeaseTakenOver)
		f.wait.end = WaitTakeover
	case stFollow, stDown:
		return f.looked(f.pttl)
	}
	return st
}

// Cold joins. Cold reads that join a cold read's flight (Get,
// StartChan) may have come after its first ACQUIRE was sent, so only a
// later look answers them: the look its subscription's confirmation
// starts, when that ACQUIRE found the lease held. The flight's gate
// closes before that look is sent (later cold reads read the key
// instead), and when the first ACQUIRE did anything but follow (a value
// found, the lease won, Redis failing, the breaker open): the joiners are
// then sent away at once to read the key themselves, rather than kept
// waiting for a load that a write they saw return may have made moot. A
// joiner whose flight ends without a look sent after it joined (a budget
// spent before the confirmation, a wake-up message merged with it) reads
// the key too: lookedAt.

// acquired is the step after an ACQUIRE sent at sent returned r and err,
// for Get's flight (acquire) and GetMany's batch (acquireMany) alike. It
// records the holder; a value that landed since the flight looked
// answers it (stDone), an expired or unreadable one is rebuilt over.
// Then: won, stLead (Begin: stClaim) with f.lease; held, stFollow with
// f.pttl; otherwise stDown with f.cause (not yet reported to the breaker:
// the caller does, as a batch does once for all its keys).
func (f *flight) acquired(r attempted, err error, sent time.Time, ttl time.Duration) state {
	c := f.c
	if r.holder != "" {
		f.awaited = r.holder
	}
	if errors.Is(err, ErrLeaseHeld) {
		f.heldAt = sent
		f.floor = max(f.floor, r.counter)
	}
	if err == nil && r.lease == nil {
		f.seen = sent
		env, ok := wire.DecodeEnvelope(r.value)
		if ok && f.served(env) {
			return stDone
		}
		if !ok && (f.cold || f.wait != nil) {
			c.countCorrupt(f.key, len(r.value)) // no GET of this look saw it
		}
		// An expired or unreadable value is there: rebuild over it.
		r.lease, r.pttl, err = c.locker.try(c.ctx, f.key, f.keys, ttl)
		if r.lease != nil && c.servedSince(f, r.lease) {
			return stDone
		}
	}
	f.pttl = r.pttl
	switch {
	case r.lease != nil && f.begin():
		f.lease = r.lease
		return stClaim
	case r.lease != nil:
		f.lease = r.lease
		return stLead
	case errors.Is(err, ErrLeaseHeld):
		return stFollow
	}
	return f.goDown(err)
}

// servedSince reports whether a value committed after the ACQUIRE that
// found unusable bytes, and before lease was won over them, answers f:
// the holder the ACQUIRE saw may have committed in between, and then
// lease goes back at once instead of loading again. One GET, only on
// this path.
func (c *Cache) servedSince(f *flight, lease *Lease) bool {
	sent := time.Now()
	b, err := c.readValue(c.ctx, f.keys.Value)
	if err != nil {
		return false
	}
	env, ok := wire.DecodeEnvelope(b)
	if !ok || !c.now().Before(env.SoftExp) {
		return false
	}
	f.seen = sent
	if !f.served(env) {
		return false
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), c.leaseFor(f.key))
	defer cancel()
	_ = lease.Release(rctx)
	return true
}

// lead loads and commits under the lease (see Cache.lead).
func (f *flight) lead() state {
	return f.done(f.c.lead(f, f.lease, false))
}

// claim ends Begin's flight with the lease won: its caller builds the
// value (fill.go). A takeover is counted as such, not as a lead.
func (f *flight) claim() state {
	if f.wait == nil {
		f.c.stats.leads.Add(1)
	}
	return f.done(nil, nil)
}

// read GETs and decodes the key's envelope. ok is false on a miss,
// including bytes that are not an intact envelope (counted as corrupt).
// err is an infrastructure error, already recorded by the breaker.
func (c *Cache) read(f *flight) (env envelope, ok bool, err error) {
	f.seen = time.Now()
	b, err := c.readValue(c.ctx, f.keys.Value)
	if err != nil && isInfraError(err) {
		c.redisFailed(err)
		return envelope{}, false, err
	}
	c.redisAnswered()
	if err != nil {
		return envelope{}, false, nil // redis.Nil or a wrong-type reply: a miss
	}
	env, ok = wire.DecodeEnvelope(b)
	if !ok {
		c.countCorrupt(f.key, len(b))
	}
	return env, ok, nil
}

// served reports whether env answers the flight (then f.ans is the
// answer): a fresh value (which may also start an early refresh) or a
// stale one within StaleFor (which starts a refresh); for Begin, a pass
// mark. It is false when the envelope is past both, or a pass mark for
// Get. A follower's read is no hit: its outcome stays follower, and it
// counts as a follow.
func (f *flight) served(env envelope) bool {
	c := f.c
	now := c.now()
	early := f.early // drawn for the first envelope only
	f.early = false
	f.env = env
	f.cur = currency{from: f.seen}
	c.observeDelta(f, env.Fence, env.Delta)
	follower := f.wait != nil
	var o Outcome
	var a answer
	switch fresh := now.Before(env.SoftExp); {
	case env.Pass:
		// A pass mark (Fill.Pass) answers Begin; Get rebuilds over it.
		if !f.begin() || !fresh {
			return false
		}
		if follower {
			// It waited on the rebuild that passed: told as its waiters are.
			f.ans = answer{err: fmt.Errorf("%w: %q: %s", ErrNotShared, f.key, env.Payload)}
			return true
		}
		o, a = OutcomePass, answer{err: passError(f.key)}
		c.stats.passes.Add(1)
	case fresh:
		switch {
		case early || c.xfetchDue(env, now):
			o = OutcomeEarlyRefresh
			c.stats.earlyRefreshes.Add(1)
			c.refreshAsync(f, env)
		case env.Negative:
			o = OutcomeNegative
		default:
			o = OutcomeHit
		}
		switch {
		case env.Negative && !follower:
			c.stats.negativeHits.Add(1)
		case !follower:
			c.stats.hits.Add(1)
		}
		a = envAnswer(env)
	case now.Before(env.StaleExp):
		o, a = OutcomeStale, envAnswer(env)
		c.stats.staleServed.Add(1)
		c.refreshAsync(f, env)
	default:
		return false
	}
	if !follower {
		f.outcome = o
	}
	f.ans = a
	return true
}

// envAnswer is the answer an envelope holds: its value, or ErrNotFound.
func envAnswer(env envelope) answer {
	if env.Negative {
		return answer{err: ErrNotFound}
	}
	return answer{val: env.Payload}
}

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
	looked  time.Time   // when the flight's last ACQUIRE was sent (zero: none)
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

// countFailedLoad counts a load that gave no value: a value not for
// sharing (ErrNotShared) is no failure and is counted apart.
func (c *Cache) countFailedLoad(err error) {
	if errors.Is(err, ErrNotShared) {
		c.stats.notShared.Add(1)
	} else {
		c.stats.loadErrors.Add(1)
	}
}

// passError is what Begin returns for a key that carries a pass mark.
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
		env.Negative = true
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

// waiting is a follower's wait for another process's rebuild of the key
// (see flight.follow). flight.follow creates it; Cache.follow and looked
// update it; endWait ends it.
type waiting struct {
	start      time.Time
	end        WaitEnd       // how the wait ended, as far as known
	traced     func(WaitEnd) // ends the StartWait step, if any
	sub        *subscription // the key's channel (nil: none)
	wake       <-chan notice
	notified   bool // pub/sub works (or will once confirmed)
	callerDone <-chan struct{}
	why        lookWhy       // why the look under way was made: what follows it
	pttl       time.Duration // the holder's remaining lease, as last seen

	// The budget: WaitTimeout when set. By default, twice the lease,
	// renewed for as long as a live holder keeps its lease (it renews it
	// while it rebuilds, up to MaxHold), so a slow rebuild is waited for
	// rather than duplicated; up to MaxHold plus one lease per holder.
	// The cap (hardEnd) counts from when the current holder (hardFor)
	// was first seen: a new holder (a takeover, a hand-over) may renew up
	// to MaxHold again.
	budget   time.Duration
	renewing bool
	hardEnd  time.Time
	hardFor  string
	limit    *time.Timer

	// With pub/sub, polling is a safety net: look when the holder's lease
	// would run out (to take over a dead leader) and every PollMax.
	// Without it, poll from the expected rebuild time with backoff.
	backoff time.Duration
	poll    *time.Timer
}

// lookWhy is why a follower looks at Redis again (see looked).
type lookWhy uint8

const (
	lookFirst lookWhy = iota // subscribed: the value may have landed before
	lookRenew                // the budget ran out: does a holder still rebuild?
	lookPoll                 // a poll, or a wake-up that did not answer
)

// follow starts waiting for another process's rebuild of the key: it
// subscribes, then looks again (the value may have landed before the
// subscription): once the server has confirmed the subscription, when
// the confirmation is still to come, else at once.
func (f *flight) follow() state {
	c := f.c
	c.stats.waits.Add(1)
	w := &waiting{start: time.Now(), end: WaitPolled, pttl: f.pttl, why: lookFirst}
	f.wait = w
	w.traced = c.sig.startWait(f)
	subCtx := c.ctx
	if f.caller != nil {
		subCtx = f.caller // Begin: the subscription waits no longer than its caller
	}
	sub, live, serr := c.notify.Subscribe(subCtx, f.keys.Channel)
	if errors.Is(serr, ErrClosed) {
		return f.done(nil, ErrClosed)
	}
	if sub != nil {
		w.sub, w.wake = sub, sub.C
	}
	w.notified = serr == nil
	if w.notified && !live {
		// The SUBSCRIBE is sent but not yet confirmed: a look now could
		// still miss a value that lands before the server has it. The
		// confirmation's notice makes the look that cannot miss it, so
		// the wait starts now, on what the failed ACQUIRE told, and that
		// notice is its first wake-up (one look, not one now and one at
		// the confirmation).
		f.arm()
		return stWait
	}
	return stRead
}

// looked goes on with the wait after a look that neither answered the
// flight nor took the lease; p is the holder's remaining lease (0:
// unknown).
func (f *flight) looked(p time.Duration) state {
	c, w := f.c, f.wait
	switch w.why {
	case lookFirst:
		if p > 0 {
			w.pttl = p
		}
		f.arm()
	case lookRenew:
		if p == 0 {
			return f.timedOut()
		}
		// A holder keeps its lease: it is rebuilding.
		w.pttl = p
		if f.awaited != w.hardFor {
			w.hardEnd, w.hardFor = time.Now().Add(c.cfg.MaxHold+c.leaseFor(f.key)), f.awaited
		}
		w.limit.Reset(min(w.budget, time.Until(w.hardEnd)))
	case lookPoll:
		w.pttl = p
		w.poll.Reset(f.nextPoll())
	}
	return stWait
}

// arm sets the wait's budget and poll timers, after its first look.
func (f *flight) arm() {
	c, w := f.c, f.wait
	if f.caller != nil {
		w.callerDone = f.caller.Done()
	}
	w.budget = c.cfg.WaitTimeout
	w.renewing = w.budget == 0
	switch {
	case w.renewing:
		w.budget = 2 * c.leaseFor(f.key)
	case !f.waitBy.IsZero():
		w.budget = max(time.Until(f.waitBy), 0) // what the caller's earlier waits left
	}
	w.hardEnd, w.hardFor = w.start.Add(c.cfg.MaxHold+c.leaseFor(f.key)), f.awaited
	w.limit = time.NewTimer(w.budget)
	w.backoff = c.cfg.PollMax
	if !w.notified {
		est, _ := c.calib.Tail(c.cfg.KeyClass(f.key))
		w.backoff = min(max(est/2, c.cfg.PollMin), c.cfg.PollMax)
	}
	w.poll = time.NewTimer(f.nextPoll())
}

// nextPoll is the time until the wait's next poll.
func (f *flight) nextPoll() time.Duration {
	w := f.wait
	d := lease.Jitter(w.backoff)
	if w.pttl > 0 && w.pttl+time.Millisecond < d {
		d = w.pttl + time.Millisecond
	}
	if !w.notified {
		w.backoff = min(2*w.backoff, f.c.cfg.PollMax)
	}
	return d
}

// follow is stWait: it waits for a wake-up message, a poll or the
// budget, and then looks again (stRead), unless the message answers the
// flight or the wait ends. It is a method of Cache, not of flight, so
// that a waiting follower's stack shows herd.(*Cache).follow, as it
// always has: the middleware's tests find the waiting callers so.
func (c *Cache) follow(f *flight) state {
	w := f.wait
	select {
	case <-c.ctx.Done():
		w.end = WaitCancelled
		return f.done(nil, ErrClosed)
	case <-w.callerDone:
		w.end = WaitCancelled
		return f.done(nil, f.caller.Err())
	case <-w.limit.C:
		if w.renewing && time.Until(w.hardEnd) > 0 {
			w.why = lookRenew
			return stRead
		}
		return f.timedOut()
	case nt := <-w.wake:
		w.end = WaitNotified // a wake-up that answers, or made it look again
		if f.heard(nt) {
			c.stats.notified.Add(1)
			return stDone
		}
	case <-w.poll.C:
		c.stats.polled.Add(1)
		w.end = WaitPolled
	}
	w.why = lookPoll
	return stRead
}

// timedOut ends a wait whose budget is spent: Options.Fallback applies.
func (f *flight) timedOut() state {
	w := f.wait
	f.c.stats.waitTimeouts.Add(1)
	w.end = WaitTimeout
	f.spent = time.Since(w.start).Round(time.Millisecond)
	return stFallback
}

// endWait ends the follower's wait, if the flight waited, once it ended.
func (f *flight) endWait() {
	w := f.wait
	if w == nil {
		return
	}
	if w.poll != nil {
		w.poll.Stop()
	}
	if w.limit != nil {
		w.limit.Stop()
	}
	if w.sub != nil {
		w.sub.Release()
	}
	f.c.sig.wait(f.key, time.Since(w.start), w.end)
	if w.traced != nil {
		w.traced(w.end)
	}
}

// heard reports whether a wake-up message answers the flight (then f.ans
// is the answer). It is false when the follower should look at Redis
// itself (a confirmation, a release without value, a value too large to
// send, or one it cannot decode).
func (f *flight) heard(nt notice) bool {
	if nt.Resub || nt.Payload == "" {
		return false
	}
	switch nt.Payload[0] {
	case msgValue:
		env, ok := wire.DecodeEnvelope([]byte(nt.Payload[1:]))
		if !ok || env.Fence < f.floor || (env.Pass && !f.begin()) {
			// Unreadable, or an envelope older than the key's fence when
			// this follower last looked (a message queued before a newer
			// Set, Invalidate or lease), or a pass mark, which Get
			// rebuilds over: look at Redis instead.
			return false
		}
		if env.Pass {
			// The leader passed (Fill.Pass): build it yourself.
			f.ans = answer{err: fmt.Errorf("%w: %q: %s", ErrNotShared, f.key, env.Payload)}
			return true
		}
		f.env = env
		f.cur = currency{from: f.heldAt}
		f.c.observeDelta(f, env.Fence, env.Delta)
		f.ans = envAnswer(env)
		return true
	case msgFailed:
		kind, fence, text := parseFailMessage(nt.Payload)
		if !f.endedBy(fence) {
			return false // another leader's failure: look again
		}
		switch kind {
		case failNotFound:
			f.cur = currency{from: f.heldAt}
			f.ans = answer{err: ErrNotFound}
		case failNotShared:
			// The text is the leader's error, which wraps ErrNotShared
			// too: say "value not shared" once.
			text = strings.TrimPrefix(text, ErrNotShared.Error()+": ")
			if text == ErrNotShared.Error() {
				f.ans = answer{err: fmt.Errorf("%w: %q", ErrNotShared, f.key)}
			} else {
				f.ans = answer{err: fmt.Errorf("%w: %q: %s", ErrNotShared, f.key, text)}
			}
		default:
			if f.c.retries(f, kind, fence) {
				return false // look again: take the lease, or follow who did
			}
			f.ans = answer{err: remoteLoadError(f.key, kind, text)}
		}
		return true
	}
	return false
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
	if f.retried != "" || f.begin() || (kind != failNoShare && !c.cfg.RetryFailedLoad) {
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

// fallback applies Options.Fallback after a follower spent its budget
// (f.spent).
func (f *flight) fallback() state {
	c := f.c
	timeout := fmt.Errorf("%w: %q: no value after waiting %v for another process's rebuild", ErrWaitTimeout, f.key, f.spent)
	switch c.cfg.Fallback {
	case ReturnError:
		return f.done(nil, timeout)
	case ServeStale:
		f.cur = currency{from: time.Now()}
		b, err := c.readValue(c.ctx, f.keys.Value)
		if err == nil {
			if env, ok := wire.DecodeEnvelope(b); ok && !env.Pass {
				a := envAnswer(env)
				return f.done(a.val, a.err)
			}
		}
		return f.done(nil, timeout)
	}
	return stLocal
}

// down handles a flight that cannot use Redis (f.cause): it fails closed,
// or open (stLocal).
func (f *flight) down() state {
	c := f.c
	f.redisDown = true
	if c.cfg.FailClosed {
		return f.done(nil, fmt.Errorf("%w: %w", ErrUnavailable, f.cause))
	}
	c.stats.failOpen.Add(1)
	c.sig.failOpen(f.key)
	return stLocal
}

// local rebuilds the value without a lease and without storing it: with
// the loader (see loadLocal), or, for Begin, by the caller (an unleased
// Fill).
func (f *flight) local() state {
	if f.begin() {
		f.unleased = true
		return f.done(nil, nil)
	}
	return f.done(f.c.loadLocal(f))
}

// loadLocal runs the loader without a lease and without storing the
// result, bounded by MaxLocalLoads concurrent runs in this process.
func (c *Cache) loadLocal(f *flight) ([]byte, error) {
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
