package herd

import (
	"context"
	cryptorand "crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/herdkit/herd/internal/lease"
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

	closeOnce sync.Once
	done      chan struct{} // closed by Close

	callMu sync.Mutex      // guards closed against calls starting
	closed bool            // Close began
	calls  sync.WaitGroup  // calls whose callers left (see leaveOnDone)
	ctx    context.Context // ends on Close: callers waiting in TryAcquire or Acquire leave
	cancel context.CancelFunc
}

// track registers a call that may outlive its caller; it reports false
// once Close began (the call then runs in its caller's goroutine).
func (l *Locker) track() (done func(), ok bool) {
	l.callMu.Lock()
	defer l.callMu.Unlock()
	if l.closed {
		return nil, false
	}
	l.calls.Add(1)
	return l.calls.Done, true
}

// NewLocker returns a Locker that keeps its leases in rdb, which may be a
// *redis.Client, a *redis.ClusterClient, a *redis.Ring or a failover
// client. A nil opt
// means the defaults of [LockerOptions]. It panics on an invalid option.
func NewLocker(rdb redis.UniversalClient, opt *LockerOptions) *Locker {
	if rdb == nil {
		panic("herd: NewLocker with a nil Redis client")
	}
	l := &Locker{rdb: rdb, cfg: opt.resolve(), notify: newNotifier(rdb), done: make(chan struct{})}
	l.cfg.repl.fitReadTimeout(rdb)
	l.ctx, l.cancel = context.WithCancel(context.Background())
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
	l.closeOnce.Do(func() { close(l.done) })
	l.callMu.Lock()
	l.closed = true
	l.callMu.Unlock()
	l.cancel()
	l.calls.Wait() // calls whose callers left: each ends with its reply, or the client's timeouts
	return l.notify.close()
}

// isClosed reports whether Close was called.
func (l *Locker) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

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
	sub, live, serr := l.notify.subscribe(ctx, keys.channel)
	if sub != nil {
		defer sub.release()
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
		case <-l.done:
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
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.ctx, cancel)()
	r, err := leaveOnDone(cctx, l.track, func() (tried, error) {
		// The round trip outlives a caller that left (a lease it wins is
		// released below), but not the Locker's Close (see endWith).
		ictx, stop := endWith(context.WithoutCancel(ctx), l.ctx)
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
	if err != nil && ctx.Err() == nil && l.ctx.Err() != nil {
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
	l.cfg.repl.prime(ctx, l.rdb, keys.fence) // its round trip must not count against the lease
	start := time.Now()
	call, owner := l.acquireCall(keys, ttl, mode, seen, awaited)
	call.cmd, call.werr = l.cfg.repl.runWith(ctx, l.rdb, keys.fence, side, acquireScript, call.keys, call.args...)
	return l.parseAcquire(ctx, key, keys, ttl, owner, start, call)
}

// acquireCall builds the ACQUIRE of keys' lease for a new owner (see
// attempt), to be run alone or in a batch (see runBatch).
func (l *Locker) acquireCall(keys keyFamily, ttl time.Duration, mode string, seen []byte, awaited awaiting) (call *scriptCall, owner string) {
	owner = newOwner()
	names := []string{keys.lease, keys.fence}
	args := []any{owner, ttl.Milliseconds(), l.fenceTTL(ttl).Milliseconds()}
	if mode != "" {
		names = append(names, keys.value, keys.backoff, keys.failed)
		args = append(args, mode, seen, awaited.fence, awaited.after)
	}
	return &scriptCall{route: keys.fence, keys: names, args: args}, owner
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

// Lease is one holding of a lease acquired from a [Locker]. Its methods are
// safe for concurrent use. Release it when the protected work is done.
type Lease struct {
	locker *Locker
	key    string
	keys   keyFamily
	value  string // "<owner>:<fence>", the lease key's value in Redis
	token  uint64
	ttl    time.Duration
	life   lease.State // deadline, Lost, release and watchdog; released also when a script released the lease (finish)
}

// Token returns the lease's fencing token. Tokens of one key strictly
// increase from one lease to the next, across processes, counter expiry,
// Redis restarts and failovers (each token is at least the Redis clock in
// microseconds, and the acquire waited for the replicas). Pass it
// to the protected resource, which must reject a token lower than the
// highest it has seen and accept an equal one ([FencedStore] does that
// for a Redis key); [LeaseHandle] and docs/locks.md ("Fencing tokens")
// say why the values are so large.
func (l *Lease) Token() uint64 { return l.token }

// Key returns the user key the lease was acquired for.
func (l *Lease) Key() string { return l.key }

// Deadline returns the local time until which the lease is known valid:
// the acquire or last successful extend was sent before it by the lease
// length, less an allowance for clock drift.
func (l *Lease) Deadline() time.Time { return l.life.Deadline() }

// Lost returns a channel that is closed when the lease is known to be
// lost: its local validity ran out without a successful renewal, an
// extend found it taken or deleted, or [Lease.KeepAlive] reached its cap.
// Release does not close it. Once closed, the lease stays lost: stop the
// protected work and call Release.
func (l *Lease) Lost() <-chan struct{} { return l.life.Lost() }

// Extend sets the lease's remaining time to ttl, if it is still this
// owner's. It returns an error wrapping [ErrLeaseLost] when it is not, or
// once the lease is known lost or released; a Redis error, or
// [ErrNotReplicated] when too few replicas acknowledged the renewal, is
// returned wrapped and leaves the lease's local validity as it was (Lost
// closes when it runs out). ttl is checked as in [Locker.TryAcquire].
// Extend keeps working after [Locker.Close].
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l == nil {
		return ErrLeaseLost
	}
	if err := checkLeaseTTL(ttl); err != nil {
		return err
	}
	_, err := leaseCall(l.locker, ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, l.extend(ctx, ttl)
	})
	return err
}

// leaseCall is leaveOnDone for a lease's round trip (Extend, Release): it
// runs on WithoutCancel(ctx), so it outlives a caller that left. When
// Close waits for it (tracked), Close also ends its context (see
// endWith). Once Close began the call runs in its caller's goroutine,
// untracked and not ended by Close: leases keep working after Close.
func leaseCall[T any](l *Locker, ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	tracked := false
	track := func() (func(), bool) {
		done, ok := l.track()
		tracked = ok // set before leaveOnDone starts the call's goroutine
		return done, ok
	}
	return leaveOnDone(ctx, track, func() (T, error) {
		cctx := context.WithoutCancel(ctx)
		if tracked {
			var stop func()
			cctx, stop = endWith(cctx, l.ctx)
			defer stop()
		}
		return call(cctx)
	}, nil)
}

// extend is Extend without the range check, for the watchdog's capped
// last renewal, which may be shorter than a lease may be acquired for.
func (l *Lease) extend(ctx context.Context, ttl time.Duration) error {
	if l.life.Gone() {
		return fmt.Errorf("%w: %q", ErrLeaseLost, l.key)
	}
	start := time.Now()
	cmd, werr := l.locker.cfg.repl.run(ctx, l.locker.rdb, l.keys.fence, extendScript, []string{l.keys.lease, l.keys.fence},
		l.value, ttl.Milliseconds(), l.locker.fenceTTL(ttl).Milliseconds())
	ok, err := cmd.Int()
	if err == nil && ok == 1 && werr != nil {
		err = werr // renewed on the master only: a failover would not know it
	}
	if err != nil {
		l.locker.cfg.sig.lease(l.key, LeaseExtendFailed)
		return fmt.Errorf("herd: extend lease %q: %w", l.key, err)
	}
	if ok != 1 {
		l.locker.cfg.sig.lease(l.key, LeaseExtendFailed)
		l.markLost()
		return fmt.Errorf("%w: %q", ErrLeaseLost, l.key)
	}
	if !l.life.Renewed(start.Add(ttl - lease.Drift(ttl))) {
		return fmt.Errorf("%w: %q: validity ran out or the lease was released while extending", ErrLeaseLost, l.key)
	}
	l.locker.cfg.sig.lease(l.key, LeaseExtended)
	return nil
}

// KeepAlive starts a watchdog that renews the lease, each time for the
// length it was acquired with, at a random point between a third and a
// half of that length, until Release, until the lease is lost, or until
// maxHold after the acquire. maxHold is not an interval but an absolute
// cap on the whole holding, counted from the acquire: the last renewal
// before it is shortened so that the lease ends at the cap, and a stuck
// holder cannot keep it forever. A cap that comes before the lease as
// acquired would end is kept too: Deadline becomes the cap (Lost closes
// at it) and the watchdog shortens the lease in Redis to it at once; when
// the cap has already passed (KeepAlive called late) or that renewal
// failed, the watchdog deletes the lease in Redis at the cap, so that no
// other owner is kept out past it. A maxHold of zero or less means no cap.
//
// A Redis error during a renewal is retried until the lease's validity
// runs out; then [Lease.Lost] is closed. The watchdog goroutine ends with
// the lease and Release waits for it. Calling KeepAlive again, or after
// the lease ended, does nothing.
func (l *Lease) KeepAlive(maxHold time.Duration) {
	if l == nil {
		return
	}
	l.life.KeepAlive(context.Background(), maxHold, l.renew)
}

// renew is the watchdog loop. When the holding ended at the cap without
// a renewal that shortened the lease in Redis to it (KeepAlive came after
// the cap, or the capped renewal failed), it deletes the key, so that it
// does not keep other owners out to the lease's own end.
func (l *Lease) renew(ctx context.Context, capAt time.Time) {
	capped := l.life.Renew(ctx, capAt, lease.Renewal{
		Extend: l.extend,
		Final: func(err error) bool {
			return errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrInvalidTTL)
		},
		Prompt: true,
	})
	if !capAt.IsZero() && !capped && ctx.Err() == nil && time.Until(capAt) < time.Millisecond {
		l.endAtCap(ctx)
	}
}

// endAtCap deletes the lease in Redis, if it is still this owner's, once
// its KeepAlive cap has ended the holding.
func (l *Lease) endAtCap(ctx context.Context) {
	if ok, err := l.releaseWith(ctx, msgReleased); err == nil && ok > 0 {
		l.life.Freed()
	}
}

// Release stops the watchdog, if any, and deletes the lease if it is still
// this owner's, waking waiters in every process. It returns an error
// wrapping [ErrLeaseLost] when the lease had already passed to someone
// else or expired (the other holder's lease is left alone), and a wrapped
// Redis error when Redis could not be reached. Release is nil-safe, and
// releasing twice is not an error. It keeps working after [Locker.Close].
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return nil
	}
	if freed, _, _ := l.life.Release(); freed {
		return nil // released before: the key may belong to someone else now
	}
	l.life.StopWatchdog()
	ok, err := leaseCall(l.locker, ctx, func(ctx context.Context) (int, error) {
		return l.releaseWith(ctx, msgReleased)
	})
	if err != nil {
		return fmt.Errorf("herd: release lease %q: %w", l.key, err)
	}
	if ok == 0 {
		return fmt.Errorf("%w: %q: it expired or passed to another owner before release", ErrLeaseLost, l.key)
	}
	l.life.Freed()
	return nil
}

// releaseWith runs the RELEASE script, publishing msg to the key's waiters
// when the lease was still ours. It reports 2 when released now with the
// key's fence still this lease's, 1 when released otherwise (now or by an
// earlier try of the same call) and 0 when the lease was not ours.
func (l *Lease) releaseWith(ctx context.Context, msg string) (int, error) {
	return l.releaseFailed(ctx, msg, 0, 0, 0)
}

// releaseFailed is releaseWith for a load that failed: when the lease was
// ours it also, with base > 0, starts or lengthens the key's refresh
// backoff (base doubled per consecutive failure, at most cap), and, with
// marker > 0, leaves msg as the key's failure marker for that long.
func (l *Lease) releaseFailed(ctx context.Context, msg string, base, cap, marker time.Duration) (int, error) {
	n := l.locker.notify
	names := []string{l.keys.lease, l.keys.fence}
	args := []any{l.value, n.publishCmd(ctx), l.keys.channel, msg}
	if base > 0 || marker > 0 {
		names = append(names, l.keys.backoff, l.keys.failed)
		args = append(args, base.Milliseconds(), cap.Milliseconds(), marker.Milliseconds())
	}
	cmd, _ := l.locker.cfg.repl.run(ctx, l.locker.rdb, l.keys.fence, releaseScript, names, args...)
	return cmd.Int()
}

// markLost closes Lost; the first loss of a lease not released is
// signalled and logged.
func (l *Lease) markLost() {
	if l.life.Lose() {
		sig := l.locker.cfg.sig
		sig.lease(l.key, LeaseLost)
		sig.logRare(slog.LevelWarn, "herd: lease lost: its validity ran out or another owner has it; stop the protected work", "key", l.key, "token", l.token)
	}
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
