package herd

import (
	"context"
	cryptorand "crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/herdkit/herd/internal/lease"
	"github.com/herdkit/herd/internal/lockgate"
	"github.com/redis/go-redis/v9"
)

// Locker hands out short leases in Redis: mutual exclusion per key across
// every process that shares the Redis, with a fencing token per lease.
//
// A lease is a Redis key set with SET NX PX to a random 128-bit owner id;
// acquiring it also increments the key's fence counter, in the same
// script, and the new value is the lease's fencing token. Extend and
// Release compare the owner id in a script, so a holder whose lease lapsed
// can never extend or delete the next holder's lease.
//
// A Locker is safe for concurrent use. Its zero value is not usable; call
// [NewLocker]. Call [Locker.Close] when done to stop its pub/sub
// connection.
type Locker struct {
	rdb    redis.UniversalClient
	cfg    lockerConfig
	notify *notifier

	// gate registers the calls whose callers left (see leaveOnDone), which
	// Close waits for. Its Root ends on Close: callers waiting in
	// TryAcquire or Acquire leave.
	gate lockgate.Gate
}

// track registers a call that may outlive its caller; it reports false
// once Close began (the call then runs in its caller's goroutine).
func (l *Locker) track() (done func(), ok bool) {
	if l.gate.Enter() != nil {
		return nil, false
	}
	return l.gate.Leave, true
}

// NewLocker returns a Locker that keeps its leases in rdb, which may be a
// *redis.Client, a *redis.ClusterClient, a *redis.Ring or a failover
// client. A nil opt
// means the defaults of [LockerOptions]. It panics on an invalid option.
func NewLocker(rdb redis.UniversalClient, opt *LockerOptions) *Locker {
	if rdb == nil {
		panic("herd: NewLocker with a nil Redis client")
	}
	l := &Locker{rdb: rdb, cfg: opt.resolve(), notify: newNotifier(rdb)}
	l.cfg.repl.fitReadTimeout(rdb)
	l.gate.Init()
	return l
}

// Close stops the Locker's pub/sub connection. Later calls to TryAcquire
// and Acquire return [ErrClosed], and an Acquire still waiting returns
// it at once. Leases already handed out are not released by Close: they
// stay their holders', whose [Lease.Extend], [Lease.KeepAlive] and
// [Lease.Release] keep working after Close (one script each, without the
// pub/sub connection), so a holder can finish its work and give the lease
// back. Release every lease before Close; a watchdog left running ends
// only with its lease. Close is idempotent.
func (l *Locker) Close() error {
	// The calls whose callers left: each ends with its reply, or the
	// client's timeouts. A later Close waits for them too.
	if !l.gate.Close() {
		l.gate.Wait()
	}
	return l.notify.Close()
}

// isClosed reports whether Close was called.
func (l *Locker) isClosed() bool { return l.gate.Root().Err() != nil }

// TryAcquire takes the lease on key for ttl, in one round trip, or fails at
// once with an error that wraps [ErrLeaseHeld] when another owner holds
// it. Any string of 1 to [MaxLockKeyBytes] bytes is a valid key
// ([ErrInvalidKey] otherwise, see [CheckLockKey]); ttl must be between
// 10ms and 50 years ([ErrInvalidTTL]): herd counts a lease valid for ttl
// less 1% + 2ms of clock-drift allowance, and a shorter lease would be
// spent before the reply arrived. After [Locker.Close] it returns
// [ErrClosed].
//
// The lease ends after ttl unless extended ([Lease.Extend],
// [Lease.KeepAlive]); release it with [Lease.Release] when done.
//
// On a master that has had replicas, the lease is handed out only once
// they acknowledged it ([LockerOptions.ReplicaAcks]); otherwise
// TryAcquire returns an error wrapping [ErrNotReplicated] (fail-closed).
//
// TryAcquire is safe under client retries: if go-redis re-sends the
// command because the reply was lost after the server ran it, the retry
// recognises the lease as this caller's and reports it acquired.
func (l *Locker) TryAcquire(ctx context.Context, key string, ttl time.Duration) (*Lease, error) {
	keys, err := l.prepare(key, ttl)
	if err != nil {
		return nil, err
	}
	lease, _, err := l.tryCtx(ctx, key, keys, ttl)
	if errors.Is(err, ErrLeaseHeld) {
		l.cfg.sig.lease(key, LeaseContended)
	}
	return lease, err
}

// Acquire takes the lease on key for ttl, waiting while another owner
// holds it. The wait is woken by the holder's release (pub/sub), with
// jittered polling as the fallback for lost notifications and holders
// whose lease simply expires. It is bounded by ctx and by
// [LockerOptions.MaxWait]: when ctx ends the error joins [ErrLeaseHeld]
// and ctx.Err(); when MaxWait runs out it wraps [ErrWaitTimeout] and
// [ErrLeaseHeld]. A Redis error ends the wait at once and is returned
// wrapped. Key and ttl are checked as in [Locker.TryAcquire]. After
// [Locker.Close], and when Close ends its wait, it returns [ErrClosed].
func (l *Locker) Acquire(ctx context.Context, key string, ttl time.Duration) (*Lease, error) {
	keys, err := l.prepare(key, ttl)
	if err != nil {
		return nil, err
	}
	got, pttl, err := l.tryCtx(ctx, key, keys, ttl)
	if got != nil || !errors.Is(err, ErrLeaseHeld) {
		return got, err
	}
	l.cfg.sig.lease(key, LeaseContended) // once per wait

	maxWait := l.cfg.maxWait
	if maxWait == 0 {
		maxWait = 3 * ttl
	}
	limit := time.NewTimer(maxWait)
	defer limit.Stop()

	// Subscribe before trying again: a release that happens between the
	// failed try and the subscription is then seen by the next try, and
	// every later one arrives as a message.
	var wake <-chan notice
	sub, live, serr := l.notify.Subscribe(ctx, keys.Channel)
	if sub != nil {
		defer sub.Release()
		wake = sub.C
	}
	if errors.Is(serr, ErrClosed) {
		return nil, serr
	}
	if serr != nil && ctx.Err() != nil {
		// subscribe gave up when ctx ended.
		return nil, errors.Join(ErrLeaseHeld, ctx.Err())
	}

	backoff := l.cfg.pollMin
	poll := time.NewTimer(0)
	defer poll.Stop()
	if !live && serr == nil {
		// The subscription's confirmation will wake us; until then, poll,
		// and look again just after the holder's lease ends if sooner.
		wait := backoff
		if pttl > 0 && pttl+time.Millisecond < wait {
			wait = pttl + time.Millisecond
		}
		poll.Reset(wait)
	}
	for {
		select {
		case <-ctx.Done():
			return nil, errors.Join(ErrLeaseHeld, ctx.Err())
		case <-l.gate.Root().Done():
			return nil, fmt.Errorf("%w: acquire %q", ErrClosed, key)
		case <-limit.C:
			return nil, fmt.Errorf("%w after %v: %w", ErrWaitTimeout, maxWait, ErrLeaseHeld)
		case <-wake:
		case <-poll.C:
		}
		got, pttl, err = l.tryCtx(ctx, key, keys, ttl)
		if err != nil && ctx.Err() != nil {
			return nil, errors.Join(ErrLeaseHeld, ctx.Err())
		}
		if got != nil || !errors.Is(err, ErrLeaseHeld) {
			return got, err
		}
		wait := lease.Jitter(backoff)
		if pttl > 0 && pttl+time.Millisecond < wait {
			// The holder's lease ends sooner: look again just after.
			wait = pttl + time.Millisecond
		}
		backoff = min(2*backoff, l.cfg.pollMax)
		poll.Reset(wait) // Go 1.23+ timers: no stale fire after Reset
	}
}

// prepare validates the arguments and maps the key.
func (l *Locker) prepare(key string, ttl time.Duration) (keyFamily, error) {
	if l.isClosed() {
		return keyFamily{}, ErrClosed
	}
	if err := CheckLockKey(key); err != nil {
		return keyFamily{}, err
	}
	if err := checkLeaseTTL(ttl); err != nil {
		return keyFamily{}, err
	}
	return makeKeys(l.cfg.prefix, key)
}

// try runs the ACQUIRE script once. On ErrLeaseHeld it also returns the
// holder's remaining time (0 when unknown).
func (l *Locker) try(ctx context.Context, key string, keys keyFamily, ttl time.Duration) (*Lease, time.Duration, error) {
	r, err := l.attempt(ctx, key, keys, ttl, "", nil, awaiting{}, nil)
	return r.lease, r.pttl, err
}

// tryCtx is try for a caller that leaves as soon as ctx ends (see
// leaveOnDone): a lease won after it left is released at once.
func (l *Locker) tryCtx(ctx context.Context, key string, keys keyFamily, ttl time.Duration) (*Lease, time.Duration, error) {
	type tried struct {
		lease *Lease
		pttl  time.Duration
	}
	if err := ctx.Err(); err != nil {
		// Ended already: no ACQUIRE (raced against ctx, its reply could
		// otherwise win and hand out a lease to a caller that left).
		return nil, 0, fmt.Errorf("%w: acquire %q: %w", ErrLeaseHeld, key, err)
	}
	// The caller also leaves when the Locker closes.
	cctx, stop := l.gate.Bound(ctx)
	defer stop()
	r, err := leaveOnDone(cctx, l.track, func() (tried, error) {
		// The round trip outlives a caller that left (a lease it wins is
		// released below), but not the Locker's Close (see endWith).
		ictx, stop := l.gate.Bound(context.WithoutCancel(ctx))
		defer stop()
		lease, pttl, err := l.try(ictx, key, keys, ttl)
		return tried{lease, pttl}, err
	}, func(r tried, _ error) {
		if r.lease != nil {
			rctx, cancel := context.WithTimeout(context.Background(), ttl)
			defer cancel()
			_ = r.lease.Release(rctx)
		}
	})
	if err != nil && ctx.Err() == nil && l.gate.Root().Err() != nil {
		return nil, 0, fmt.Errorf("%w: acquire %q", ErrClosed, key)
	}
	if err != nil && ctx.Err() != nil && r.lease == nil && !errors.Is(err, ErrLeaseHeld) {
		return nil, 0, fmt.Errorf("%w: acquire %q: %w", ErrLeaseHeld, key, err)
	}
	return r.lease, r.pttl, err
}

// Modes of attempt for the Cache.
const (
	modeMiss    = "miss"    // do not acquire when a value exists: return it
	modeRefresh = "refresh" // do not acquire when the value changed or refreshes back off
)

// attempted is the outcome of one ACQUIRE.
type attempted struct {
	lease   *Lease        // acquired
	pttl    time.Duration // the holder's remaining lease, or the backoff left
	holder  string        // the holder's fence, when held
	value   []byte        // a value landed since the caller looked (no lease)
	backoff bool          // refreshes are backing off (no lease)
	failure string        // modeMiss: the awaited leader's failure message (no lease)
	counter uint64        // held: the key's fence counter when the holder was seen
}

// awaiting says which failure markers an ACQUIRE in miss mode reports
// (see acquire.lua): that of the leader a follower waits for (fence), and,
// once the follower retried a failed load, that of any leader newer than
// the failed one (after), when the lease is free.
type awaiting struct{ fence, after string }

// attempt runs ACQUIRE once. The Cache's modes close the race in which a
// rebuild commits between a caller's GET and its ACQUIRE: modeMiss does
// not acquire when the key holds any value and returns it; modeRefresh
// does not acquire when the value is no longer the envelope whose fence
// bytes are seen, or while failed refreshes back off. Neither is an
// error; ErrLeaseHeld is. side, if not nil, is a read sent in the same
// round trip (the Cache's purge generation, see tags.go).
func (l *Locker) attempt(ctx context.Context, key string, keys keyFamily, ttl time.Duration, mode string, seen []byte, awaited awaiting, side redis.Cmder) (attempted, error) {
	l.cfg.repl.prime(ctx, l.rdb, keys.Fence) // its round trip must not count against the lease
	start := time.Now()
	call, owner := l.acquireCall(keys, ttl, mode, seen, awaited)
	call.cmd, call.werr = l.cfg.repl.runWith(ctx, l.rdb, keys.Fence, side, acquireScript, call.keys, call.args...)
	return l.parseAcquire(ctx, key, keys, ttl, owner, start, call)
}

// acquireCall builds the ACQUIRE of keys' lease for a new owner (see
// attempt), to be run alone or in a batch (see runBatch).
func (l *Locker) acquireCall(keys keyFamily, ttl time.Duration, mode string, seen []byte, awaited awaiting) (call *scriptCall, owner string) {
	owner = newOwner()
	names := []string{keys.Lease, keys.Fence}
	args := []any{owner, ttl.Milliseconds(), l.fenceTTL(ttl).Milliseconds()}
	if mode != "" {
		names = append(names, keys.Value, keys.Backoff, keys.Failed)
		args = append(args, mode, seen, awaited.fence, awaited.after)
	}
	return &scriptCall{route: keys.Fence, keys: names, args: args}, owner
}

// parseAcquire reads the reply of an ACQUIRE that call ran for owner, sent
// at start (the lease's validity counts from then).
func (l *Locker) parseAcquire(ctx context.Context, key string, keys keyFamily, ttl time.Duration, owner string, start time.Time, call *scriptCall) (attempted, error) {
	cmd, werr := call.cmd, call.werr
	res, err := cmd.Slice()
	if err != nil {
		return attempted{}, fmt.Errorf("herd: acquire lease %q: %w", key, err)
	}
	ok, val, err := parsePair(res)
	if err != nil {
		return attempted{}, fmt.Errorf("herd: acquire lease %q: %w", key, err)
	}
	switch ok {
	case 2:
		return attempted{value: []byte(val)}, nil
	case 4:
		return attempted{failure: val}, nil
	case 0, 3:
		pttl, _ := strconv.ParseInt(val, 10, 64)
		if pttl == 0 {
			// PTTL counts whole milliseconds: 0 is a key that expires
			// within one, not an unknown time (that is -1). A waiter
			// told 0 would wait a full poll interval instead.
			pttl = 1
		}
		r := attempted{pttl: max(time.Duration(pttl)*time.Millisecond, 0), backoff: ok == 3}
		if r.backoff {
			return r, nil
		}
		if len(res) > 2 {
			r.holder, _ = res[2].(string)
		}
		if len(res) > 3 {
			c, _ := res[3].(string)
			r.counter, _ = strconv.ParseUint(c, 10, 64)
		}
		return r, fmt.Errorf("%w: %q", ErrLeaseHeld, key)
	}
	token, err := strconv.ParseUint(val, 10, 64)
	if err != nil {
		return attempted{}, fmt.Errorf("herd: acquire lease %q: %w: bad fence %.40q", key, errBadReply, val)
	}
	if werr != nil {
		// The master took the lease but too few replicas have it: a
		// failover could hand the same lease, and the same token, to
		// someone else. Fail closed, and give the lease back at once.
		gone := &Lease{locker: l, keys: keys, value: owner + ":" + val}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.repl.timeout)
		_, _ = gone.releaseWith(rctx, msgReleased)
		cancel()
		return attempted{}, fmt.Errorf("herd: acquire lease %q: %w", key, werr)
	}
	held := &Lease{
		locker: l,
		key:    key,
		keys:   keys,
		value:  owner + ":" + val,
		token:  token,
		ttl:    ttl,
	}
	deadline := start.Add(ttl - lease.Drift(ttl))
	if time.Until(deadline) <= 0 {
		// The reply came too late to be of use: the lease may already have
		// passed to someone else. Give it back and report it as held.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
		defer cancel()
		_, _ = leaseCall(l, rctx, func(ctx context.Context) (int, error) {
			return held.releaseWith(ctx, msgReleased)
		})
		return attempted{}, fmt.Errorf("%w: %q: the acquire reply came after the lease's validity", ErrLeaseHeld, key)
	}
	held.life.Init(ttl, start, deadline, nil, held.markLost)
	l.cfg.sig.lease(key, LeaseAcquired)
	return attempted{lease: held}, nil
}

func (l *Locker) fenceTTL(ttl time.Duration) time.Duration {
	return max(l.cfg.fenceTTL, 2*ttl)
}

// newOwner returns a random 128-bit owner id in hex.
func newOwner() string {
	var b [16]byte
	_, _ = cryptorand.Read(b[:]) // never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// parsePair reads a script's {status, value, ...} reply.
func parsePair(res []any) (int64, string, error) {
	if len(res) < 2 {
		return 0, "", fmt.Errorf("%w: %.200v", errBadReply, res)
	}
	ok, isInt := res[0].(int64)
	if !isInt {
		return 0, "", fmt.Errorf("%w: %.200v", errBadReply, res)
	}
	switch v := res[1].(type) {
	case string:
		return ok, v, nil
	case int64:
		return ok, strconv.FormatInt(v, 10), nil
	}
	return 0, "", fmt.Errorf("%w: %.200v", errBadReply, res)
}
