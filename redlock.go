package herd

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/herdkit/herd/internal/lease"
	"github.com/herdkit/herd/internal/lockgate"
	"github.com/redis/go-redis/v9"
)

// RedlockOptions configures a [Redlock]. A nil *RedlockOptions, and every
// zero field, means the documented default. Invalid values make
// [NewRedlock] panic: they are programming errors, not request-time
// conditions. Every duration is at most 50 years.
type RedlockOptions struct {
	// Prefix is the namespace of every Redis key the Redlock writes on its
	// masters, laid out as a [Locker]'s. It must not contain '{' or '}' and
	// is at most 64 bytes. Default: "herd". Do not point a Locker and a
	// Redlock with the same prefix at the same server: they would share the
	// key's lease and fence counter.
	Prefix string

	// NodeTimeout bounds each round of calls to the masters (acquire,
	// raise, extend, release): a master that has not answered by then
	// counts as failed for that round. Default: a tenth of the lease
	// length, at most 100ms. Give the clients ContextTimeoutEnabled so a
	// call to a stalled master also ends then; otherwise it runs on in the
	// background until the client's ReadTimeout (and [Redlock.Close] waits
	// for it).
	NodeTimeout time.Duration

	// MaxWait bounds how long [Redlock.Acquire] waits for a held lock, on
	// top of the caller's context. Default: three times the lease length.
	MaxWait time.Duration

	// PollMin and PollMax bound the fallback re-check of [Redlock.Acquire].
	// A waiter is woken by the release's notification on the masters (Redis
	// pub/sub) and retries then; without one (a lost message, a
	// subscription that is down, a holder whose lease simply runs out) it
	// looks again after about PollMin, each further time twice as long
	// (with jitter) up to PollMax, and never much later than the holder's
	// lease would expire. Defaults: 10ms and 250ms.
	PollMin, PollMax time.Duration

	// FenceTTL is how long a key's fence counter stays on each master after
	// the last lease on it; it is raised to at least twice the lease length
	// on every acquire and extend. Default: 24h.
	FenceTTL time.Duration

	// Observer receives the lease signals (acquired, contended, lost,
	// extended, extend failed). Default: none.
	Observer *Observer

	// KeyClass maps a key to the bounded class reported to Observer.
	// Default: "" for every key.
	KeyClass func(key string) string

	// Logger receives rare events (a lease lost), rate-limited. Default:
	// silent.
	Logger *slog.Logger
}

// The lease lengths a Redlock accepts, as the core's [Locker]: at least
// 10ms (1% + 2ms of every lease is the clock-drift allowance, so a shorter
// one leaves no validity to use) and at most 50 years (so that the default
// MaxWait of three lease lengths and the fence TTL of two cannot overflow).
const (
	redlockMinLease = 10 * time.Millisecond
	redlockMaxLease = 50 * 365 * 24 * time.Hour
)

// checkRedlockTTL rejects a lease length outside [redlockMinLease,
// redlockMaxLease] with an error naming the range.
func checkRedlockTTL(ttl time.Duration) error {
	if ttl < redlockMinLease || ttl > redlockMaxLease {
		return fmt.Errorf("%w: %v (a Redlock lease must be between %v and %v, 50 years: 1%% + 2ms of it is the clock-drift allowance)",
			ErrInvalidTTL, ttl, redlockMinLease, redlockMaxLease)
	}
	return nil
}

// redlockConfig is RedlockOptions with every default applied.
type redlockConfig struct {
	lockerConfig
	nodeTimeout time.Duration // 0: ttl/10, at most 100ms
}

func (o *RedlockOptions) resolve() redlockConfig {
	var in RedlockOptions
	if o != nil {
		in = *o
	}
	for name, d := range map[string]time.Duration{
		"NodeTimeout": in.NodeTimeout, "MaxWait": in.MaxWait, "PollMin": in.PollMin,
		"PollMax": in.PollMax, "FenceTTL": in.FenceTTL,
	} {
		if d < 0 || d > redlockMaxLease {
			panic(fmt.Sprintf("herd: RedlockOptions.%s is %v; it must be 0 (the default) or up to %v (50 years)", name, d, redlockMaxLease))
		}
	}
	if in.PollMin > 0 && in.PollMax > 0 && in.PollMax < in.PollMin {
		panic(fmt.Sprintf("herd: RedlockOptions.PollMax (%v) is below PollMin (%v)", in.PollMax, in.PollMin))
	}
	lc := (&LockerOptions{
		Prefix: in.Prefix, MaxWait: in.MaxWait, PollMin: in.PollMin, PollMax: in.PollMax,
		FenceTTL: in.FenceTTL, Observer: in.Observer, KeyClass: in.KeyClass, Logger: in.Logger,
	}).resolve()
	return redlockConfig{lockerConfig: lc, nodeTimeout: in.NodeTimeout}
}

// Redlock is a lock over N independent Redis masters (N odd, at least 3):
// a lease is held when a majority of them (N/2+1, the quorum) granted it,
// so the lock survives the loss of up to N/2 masters. Each lease carries a
// quorum fencing token that strictly increases from one holder to the next
// although every master keeps its own counter (the construction and its
// proof: docs/design.md, "Redlock").
//
// Acquiring runs two rounds, each sent to the masters in parallel and
// bounded by [RedlockOptions.NodeTimeout]. Round one takes the lease on
// every master that has it free (SET NX PX with a random owner id) and
// reads that master's fence counter, floored by its clock. With a quorum,
// the token is one more than the highest counter read, and round two
// raises the counter of every master won to at least the token, again
// only where the lease is still this owner's. The lease is held only if a
// quorum acknowledged both rounds and time is left: the validity is the
// lease length, less the time both rounds took, less an allowance for
// clock drift (1% + 2ms). Otherwise the lease is released on every master
// at once.
//
// A master restarted without persistence forgets the leases it granted:
// it must stay out (not be started, or be firewalled) for at least one
// maximum lease length before it rejoins, or a second owner can take a
// lock the first still holds. Its fence counter restarts from its clock,
// so tokens keep increasing as long as the masters' clocks are within the
// documented skew (see docs/design.md).
//
// A Redlock is safe for concurrent use. Call [Redlock.Close] when done;
// every call after it returns [ErrClosed].
type Redlock struct {
	nodes  []redis.UniversalClient
	writes *replicaWait // the write path, waiting for no replicas
	notify []*notifier  // one per master: the waiters' wake-ups, started on first use
	all    []int        // 0..N-1
	quorum int
	cfg    redlockConfig
	now    func() time.Time // the local clock; the model test replaces it

	// gate registers every running call and every goroutine started for
	// one, refuses calls after Close, and its Root is cancelled by Close.
	gate lockgate.Gate
}

// NewRedlock returns a Redlock over the independent masters clients,
// each a *redis.Client (or another UniversalClient) for one master. Their
// number must be odd and at least 3, and no master may appear twice: the
// same client twice, or two clients whose options name the same address,
// make it panic (two clients for one server would let that one server
// grant a quorum alone). The check compares the addresses as the clients'
// Options report them (network and host:port, IP literals in canonical
// form, Unix socket paths cleaned; the seed addresses of a cluster or
// ring client), not as they resolve: it cannot see two names or
// addresses of one server (a hostname and its IP, two interfaces, a
// proxy), nor the master behind a Sentinel failover client. Keeping the
// masters independent is the caller's part. Each master should have no
// replicas, as the Redlock algorithm assumes: Redlock waits for none (its
// safety across a master's loss is the quorum and the restart rule, not
// replication), so a master behind Sentinel or with replicas promoted on
// failure can hand the same lock out again from a replica that missed it.
// A nil opt means the defaults of [RedlockOptions]. It panics on an
// invalid configuration.
func NewRedlock(clients []redis.UniversalClient, opt *RedlockOptions) *Redlock {
	if len(clients) < 3 || len(clients)%2 == 0 {
		panic(fmt.Sprintf("herd: NewRedlock needs an odd number of Redis masters, at least 3; got %d", len(clients)))
	}
	seen := make(map[redis.UniversalClient]int, len(clients))
	addrs := make(map[string]int)
	for i, c := range clients {
		if c == nil {
			panic(fmt.Sprintf("herd: NewRedlock with a nil Redis client (index %d)", i))
		}
		if j, dup := seen[c]; dup {
			panic(fmt.Sprintf("herd: NewRedlock with the same Redis client at index %d and %d", j, i))
		}
		seen[c] = i
		for _, a := range masterAddrs(c) {
			if j, dup := addrs[a]; dup && j != i {
				panic(fmt.Sprintf("herd: NewRedlock with two clients for the same master %s (index %d and %d): the masters must be independent", a, j, i))
			}
			addrs[a] = i
		}
	}
	r := &Redlock{
		nodes:  append([]redis.UniversalClient(nil), clients...),
		writes: newReplicaWait(-1, 0),
		quorum: len(clients)/2 + 1,
		cfg:    opt.resolve(),
		now:    time.Now,
	}
	for i, c := range clients {
		r.all = append(r.all, i)
		r.notify = append(r.notify, newNotifier(c))
	}
	r.gate.Init()
	return r
}

// masterAddrs returns the normalised addresses a client's options name:
// host:port (or "unix:" and the cleaned socket path), none for a client
// whose address it cannot know (a Sentinel failover client, another
// UniversalClient).
func masterAddrs(c redis.UniversalClient) []string {
	var network string
	var raw []string
	switch c := c.(type) {
	case *redis.Client:
		o := c.Options()
		if o.Addr == "FailoverClient" { // go-redis's placeholder: the master is found through Sentinel
			return nil
		}
		network, raw = o.Network, []string{o.Addr}
	case *redis.ClusterClient:
		raw = c.Options().Addrs
	case *redis.Ring:
		for _, a := range c.Options().Addrs {
			raw = append(raw, a)
		}
	}
	out := make([]string, 0, len(raw))
	for _, a := range raw {
		out = append(out, normaliseAddr(network, a))
	}
	return out
}

// normaliseAddr puts an address in one spelling: a Unix socket path
// cleaned ("unix:/path"), a host lowercased and an IP literal in
// canonical form (an IPv4-mapped IPv6 address as IPv4).
func normaliseAddr(network, addr string) string {
	if network == "unix" {
		return "unix:" + filepath.Clean(addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return strings.ToLower(addr)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	}
	return net.JoinHostPort(strings.ToLower(host), port)
}

// Quorum returns the number of masters that must grant a lease: N/2+1.
func (r *Redlock) Quorum() int { return r.quorum }

// Close stops the Redlock: it cancels its calls in progress (an Acquire
// waiting returns [ErrClosed] at once) and the watchdogs of its leases,
// closes its pub/sub connections, and waits for every goroutine it
// started, including calls to a stalled master that outlived their round
// (they end at the client's ReadTimeout). Leases not yet released stay on
// the masters until they expire: release them before Close. Every call
// made after Close, on the Redlock or on its leases, returns ErrClosed.
// It returns the first error of closing a pub/sub connection, if any.
func (r *Redlock) Close() error {
	if !r.gate.Close() {
		return ErrClosed
	}
	var first error
	for _, n := range r.notify {
		if err := n.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// enter registers a call; it fails with ErrClosed after Close. Every
// successful enter is paired with a leave.
func (r *Redlock) enter() error { return r.gate.Enter() }

func (r *Redlock) leave() { r.gate.Leave() }

// TryAcquire takes the lock on key for ttl, or fails at once. It returns
// an error wrapping [ErrLeaseHeld] when a quorum of masters answered but
// too few granted the lease and at least one of them reported another
// owner holding it, and one wrapping [ErrNoQuorum] (joined with the
// masters' errors, if any) otherwise: fewer than a quorum of masters
// answered within [RedlockOptions.NodeTimeout], the lease vanished from
// masters between the two rounds without another owner taking it (a
// master restarted empty), or a quorum answered only after the lease's
// validity was spent. Any string of 1 to [MaxLockKeyBytes] bytes is a
// valid key ([ErrInvalidKey] otherwise, see [CheckLockKey]); ttl must be
// between 10ms and 50 years ([ErrInvalidTTL]: 1% + 2ms of every lease is
// the clock-drift allowance). A failed attempt releases whatever it took,
// on every master, before it returns; on a master whose round-one reply
// did not come it also leaves a marker, for ttl, that makes a round-one
// request of the attempt landing there later take nothing.
//
// TryAcquire is safe under client retries: a retried round-one script
// recognises the lease as this attempt's, and the raise of round two is
// idempotent.
func (r *Redlock) TryAcquire(ctx context.Context, key string, ttl time.Duration) (*RedlockLease, error) {
	if err := r.enter(); err != nil {
		return nil, err
	}
	defer r.leave()
	keys, err := r.prepare(key, ttl)
	if err != nil {
		return nil, err
	}
	lease, _, err := r.try(ctx, key, keys, ttl)
	if errors.Is(err, ErrLeaseHeld) {
		r.cfg.sig.lease(key, LeaseContended)
	}
	return lease, err
}

// Acquire takes the lock on key for ttl, waiting while other owners hold
// it. A waiter subscribes to the key's wake-up channel on every master
// (Redis pub/sub; a master that is down or stalled does not hold it up)
// and tries again as soon as any master publishes a release there: the
// holder's release, or a failed attempt of another owner giving back what
// it took. A release on one master is only a hint; the attempt it starts
// is the quorum round. Without a notification (a lost message, pub/sub
// down on every master, a holder whose lease runs out) it looks again
// after the fallback re-check of [RedlockOptions.PollMin] and PollMax,
// and just after the holder's lease would expire. After an attempt that
// won some masters but not a quorum while no other owner held one (a
// split vote among waiters), it waits a short random delay before the
// next, so that the contenders do not collide again in step.
//
// The wait is bounded by ctx and by [RedlockOptions.MaxWait]: when ctx
// ends the error joins [ErrLeaseHeld] and ctx.Err(); when MaxWait runs out
// it wraps [ErrWaitTimeout] and [ErrLeaseHeld]. Both end the wait at once,
// as does [Redlock.Close], with [ErrClosed]. An attempt that fails for
// want of a quorum of answering masters ([ErrNoQuorum]) ends the wait at
// once. Key and ttl are checked as in [Redlock.TryAcquire].
func (r *Redlock) Acquire(ctx context.Context, key string, ttl time.Duration) (*RedlockLease, error) {
	if err := r.enter(); err != nil {
		return nil, err
	}
	defer r.leave()
	keys, err := r.prepare(key, ttl)
	if err != nil {
		return nil, err
	}
	lease, res, err := r.try(ctx, key, keys, ttl)
	if lease != nil || !errors.Is(err, ErrLeaseHeld) {
		return lease, err
	}
	r.cfg.sig.lease(key, LeaseContended) // once per wait

	maxWait := r.cfg.maxWait
	if maxWait == 0 {
		maxWait = 3 * ttl
	}
	limit := time.NewTimer(maxWait)
	defer limit.Stop()

	// Listen before trying again: a release published after the
	// subscription is confirmed on a master arrives as a message, and one
	// before it is seen by the attempt that the confirmation (a notice
	// too) starts. A subscription already live in this process gets no
	// confirmation: then look again at once.
	ping := make(chan struct{}, 1)
	live, stop := r.listen(ctx, keys.Channel, ping, r.nodeTimeout(ttl))
	defer stop()

	backoff := r.cfg.pollMin
	poll := time.NewTimer(pollWait(backoff, res.holder))
	defer poll.Stop()
	if live {
		poll.Reset(0)
	}
	wake := (<-chan struct{})(ping)
	for {
		select {
		case <-ctx.Done():
			return nil, errors.Join(ErrLeaseHeld, ctx.Err())
		case <-limit.C:
			return nil, fmt.Errorf("%w after %v: %w", ErrWaitTimeout, maxWait, ErrLeaseHeld)
		case <-r.gate.Root().Done():
			return nil, ErrClosed
		case <-wake:
		case <-poll.C:
		}
		lease, res, err = r.try(ctx, key, keys, ttl)
		if err != nil && ctx.Err() != nil {
			return nil, errors.Join(ErrLeaseHeld, ctx.Err())
		}
		if lease != nil || !errors.Is(err, ErrLeaseHeld) {
			return lease, err
		}
		wake = ping
		if res.split {
			// Every contender of a split vote was just woken by the
			// others' give-backs: each waits a random part of an
			// attempt's time again, so that one of them goes first.
			// Notices meanwhile stay in ping for the attempt after.
			wake = nil
			poll.Reset(rand.N(max(2*res.took, time.Millisecond)))
			continue
		}
		backoff = min(2*backoff, r.cfg.pollMax)
		poll.Reset(pollWait(backoff, res.holder))
	}
}

// listen subscribes ping to channel on every master, without waiting for
// any of them, and reports whether a subscription was already live in
// this process. stop ends the subscriptions; it never waits for Redis.
func (r *Redlock) listen(ctx context.Context, channel string, ping chan<- struct{}, timeout time.Duration) (live bool, stop func()) {
	subs := make([]*subscription, len(r.nodes))
	lives := make([]bool, len(r.nodes))
	var wg sync.WaitGroup
	for i, n := range r.notify {
		if _, plain := r.nodes[i].(*redis.Client); plain {
			// No I/O before the subscription is registered.
			subs[i], lives[i], _ = n.Listen(ctx, channel, ping)
			continue
		}
		// A cluster or ring client may look up where the channel lives:
		// in parallel, each for at most a round's timeout.
		wg.Add(1)
		go func() {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			subs[i], lives[i], _ = n.Listen(lctx, channel, ping)
		}()
	}
	wg.Wait()
	for _, l := range lives {
		live = live || l
	}
	return live, func() {
		for _, s := range subs {
			if s != nil {
				s.Release()
			}
		}
	}
}

// pollWait is the jittered backoff, cut short when a holder's lease ends
// sooner.
func pollWait(backoff, holder time.Duration) time.Duration {
	wait := lease.Jitter(backoff)
	if holder > 0 && holder+time.Millisecond < wait {
		wait = holder + time.Millisecond
	}
	return wait
}

func (r *Redlock) prepare(key string, ttl time.Duration) (keyFamily, error) {
	if err := CheckLockKey(key); err != nil {
		return keyFamily{}, err
	}
	if err := checkRedlockTTL(ttl); err != nil {
		return keyFamily{}, err
	}
	return makeKeys(r.cfg.prefix, key)
}

// fenceTTL is how long a fence counter stays after an acquire or extend
// with lease ttl: FenceTTL, at least twice the lease (ttl is at most 50
// years, so 2*ttl does not overflow).
func (r *Redlock) fenceTTL(ttl time.Duration) time.Duration {
	return max(r.cfg.fenceTTL, 2*ttl)
}

// releasedKey is the marker a failed attempt's release leaves for its
// owner: while it exists, that owner's round-one script takes nothing.
// It shares the key family's hash tag.
func releasedKey(keys keyFamily, owner string) string {
	return keys.Lease + ":x:" + owner
}

// nodeTimeout is the bound of one round for a lease of length ttl.
func (r *Redlock) nodeTimeout(ttl time.Duration) time.Duration {
	if r.cfg.nodeTimeout > 0 {
		return r.cfg.nodeTimeout
	}
	return min(max(ttl/10, time.Millisecond), 100*time.Millisecond)
}

// tried is what a failed attempt tells the wait that follows it.
type tried struct {
	holder time.Duration // the shortest remaining lease of another owner seen (0: unknown)
	split  bool          // it won masters, but no quorum, and no other owner held one
	took   time.Duration // how long the attempt ran, its release included
}

// try runs one attempt: both rounds and, when it fails, the release on
// every master.
func (r *Redlock) try(ctx context.Context, key string, keys keyFamily, ttl time.Duration) (*RedlockLease, tried, error) {
	a := r.newAttempt(key, keys, ttl)
	timeout := r.nodeTimeout(ttl)
	a.acq = r.fanout(ctx, r.all, timeout, func(ctx context.Context, i int) nodeReply {
		return r.acquireNode(ctx, i, keys, a.owner, ttl)
	})
	err := a.afterAcquire()
	if err == nil {
		raised := r.fanout(ctx, a.won, timeout, func(ctx context.Context, i int) nodeReply {
			return r.raiseNode(ctx, i, keys, a.owner, a.token, ttl)
		})
		var lease *RedlockLease
		if lease, err = a.afterRaise(raised); err == nil {
			r.cfg.sig.lease(key, LeaseAcquired)
			return lease, tried{}, nil
		}
	}
	// Release everywhere at once, also where no reply came: the SET may
	// have run there after the round gave up on it, or may still land
	// there later; the marker left there makes that late SET a no-op.
	// What it gives back is published to the key's waiters, unless
	// another owner holds a quorum: none of them could win then.
	notify := !a.otherHasQuorum()
	r.fanout(context.WithoutCancel(ctx), r.all, timeout, func(ctx context.Context, i int) nodeReply {
		return r.releaseNotify(ctx, i, keys, a.owner, a.releaseMark(i), notify)
	})
	if r.gate.Root().Err() != nil {
		// Close cut the rounds short: that, not the masters, is the cause.
		err = fmt.Errorf("%w: acquire %q", ErrClosed, key)
	}
	return nil, tried{holder: a.holderTTL(), split: notify && len(a.won) > 0, took: r.now().Sub(a.start)}, err
}

// nodeReply is one master's answer in one round.
type nodeReply struct {
	ok   bool          // acquired, raised, extended or released there
	held bool          // round one or two, not ok: another owner holds the lease there
	n    uint64        // round one, ok: the master's fence counter
	pttl time.Duration // round one, held: the other owner's remaining lease
	by   string        // round one, held: the other owner
	err  error         // no answer (a Redis error, the round's timeout); ok is false
}

// fanout calls call for each of nodes in parallel under one deadline,
// timeout from now, and returns the replies indexed by node (a node not
// in nodes, or that has not answered by the deadline, gets an error). A
// call still running at the deadline is left to finish in the background;
// Close waits for it.
func (r *Redlock) fanout(ctx context.Context, nodes []int, timeout time.Duration, call func(ctx context.Context, node int) nodeReply) []nodeReply {
	replies := make([]nodeReply, len(r.nodes))
	for i := range replies {
		replies[i].err = errNotAsked
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stop := context.AfterFunc(r.gate.Root(), cancel)
	defer stop()

	type answer struct {
		node  int
		reply nodeReply
	}
	answers := make(chan answer, len(nodes)) // never blocks a late call
	for _, i := range nodes {
		replies[i].err = nil
		// The calling method holds a call of the gate, so Go never races
		// Close's wait.
		r.gate.Go(func() { answers <- answer{i, call(ctx, i)} })
	}
	got := make([]bool, len(r.nodes))
	for pending := len(nodes); pending > 0; pending-- {
		var a answer
		select {
		case a = <-answers:
		case <-ctx.Done():
			select {
			case a = <-answers: // answered just in time
			default: // the round is over: what did not answer failed
				for _, i := range nodes {
					if !got[i] {
						replies[i] = nodeReply{err: fmt.Errorf("master %d: no answer: %w", i, context.Cause(ctx))}
					}
				}
				return replies
			}
		}
		replies[a.node], got[a.node] = a.reply, true
	}
	return replies
}

var errNotAsked = errors.New("not asked")

func (r *Redlock) acquireNode(ctx context.Context, i int, keys keyFamily, owner string, ttl time.Duration) nodeReply {
	cmd := r.send(ctx, i, redlockAcquireScript, []string{keys.Lease, keys.Fence, releasedKey(keys, owner)},
		owner, ttl.Milliseconds(), r.fenceTTL(ttl).Milliseconds())
	res, err := cmd.Slice()
	if err != nil {
		return nodeReply{err: fmt.Errorf("master %d: %w", i, err)}
	}
	ok, val, err := parsePair(res)
	if err != nil {
		return nodeReply{err: fmt.Errorf("master %d: %w", i, err)}
	}
	switch ok {
	case 0:
		pttl, _ := strconv.ParseInt(val, 10, 64)
		if pttl == 0 {
			// Whole milliseconds: 0 is a lease that ends within one, not
			// an unknown time; a waiter told 0 would wait a full re-check.
			pttl = 1
		}
		rep := nodeReply{held: true, pttl: max(time.Duration(pttl)*time.Millisecond, 0)}
		if len(res) > 2 {
			rep.by, _ = res[2].(string)
		}
		return rep
	case -1: // this attempt was already released here: a late request
		return nodeReply{}
	}
	n, err := strconv.ParseUint(val, 10, 64)
	if err != nil {
		return nodeReply{err: fmt.Errorf("master %d: %w: bad fence counter %.40q", i, errBadReply, val)}
	}
	return nodeReply{ok: true, n: n}
}

func (r *Redlock) raiseNode(ctx context.Context, i int, keys keyFamily, owner string, token uint64, ttl time.Duration) nodeReply {
	return r.intNode(i, r.send(ctx, i, redlockRaiseScript, []string{keys.Lease, keys.Fence},
		owner, strconv.FormatUint(token, 10), r.fenceTTL(ttl).Milliseconds()))
}

func (r *Redlock) extendNode(ctx context.Context, i int, keys keyFamily, owner string, ttl time.Duration) nodeReply {
	return r.intNode(i, r.send(ctx, i, redlockExtendScript, []string{keys.Lease, keys.Fence},
		owner, ttl.Milliseconds(), r.fenceTTL(ttl).Milliseconds()))
}

// releaseNode releases a held lease on master i.
func (r *Redlock) releaseNode(ctx context.Context, i int, keys keyFamily, owner string) nodeReply {
	return r.releaseMarked(ctx, i, keys, owner, 0)
}

// releaseMarked releases owner's lease on master i and, with mark > 0,
// leaves the released marker there for mark (a failed attempt). A lease
// it deletes is published to the key's waiters.
func (r *Redlock) releaseMarked(ctx context.Context, i int, keys keyFamily, owner string, mark time.Duration) nodeReply {
	return r.releaseNotify(ctx, i, keys, owner, mark, true)
}

// releaseNotify is releaseMarked that publishes the release only when
// notify is set.
func (r *Redlock) releaseNotify(ctx context.Context, i int, keys keyFamily, owner string, mark time.Duration, notify bool) nodeReply {
	publish := ""
	if notify {
		publish = r.notify[i].PublishCmd(ctx)
	}
	return r.intNode(i, r.send(ctx, i, redlockReleaseScript,
		[]string{keys.Lease, keys.Fence, releasedKey(keys, owner)}, owner, mark.Milliseconds(), publish, keys.Channel))
}

// send runs s on master i through the write path. Redlock's masters are
// independent and have no replicas (the algorithm's own assumption), so
// its path waits for none (r.writes has ReplicaAcks -1).
func (r *Redlock) send(ctx context.Context, i int, s *script, keys []string, args ...any) *redis.Cmd {
	cmd, _ := r.writes.run(ctx, r.nodes[i], keys[0], s, keys, args...)
	return cmd
}

// intNode reads a script's 1 (ok), 0 (not this owner's lease; for the
// raise: another owner's) or -1 (raise: nobody's) reply.
func (r *Redlock) intNode(i int, cmd *redis.Cmd) nodeReply {
	n, err := cmd.Int()
	if err != nil {
		return nodeReply{err: fmt.Errorf("master %d: %w", i, err)}
	}
	return nodeReply{ok: n == 1, held: n == 0}
}

// tally counts a round's replies: granted, refused (another owner's lease
// there, or no longer ours), and the errors of those that did not answer.
func tally(replies []nodeReply) (ok, refused int, errs []error) {
	for _, rep := range replies {
		switch {
		case rep.ok:
			ok++
		case errors.Is(rep.err, errNotAsked):
		case rep.err != nil:
			errs = append(errs, rep.err)
		default:
			refused++
		}
	}
	return ok, refused, errs
}

// rlAttempt is one try at a Redlock lease: the owner id, the clock reading
// before the first round, and what the rounds brought back. The steps are
// separate methods so the model test can interleave them across attempts.
type rlAttempt struct {
	r     *Redlock
	key   string
	keys  keyFamily
	owner string
	ttl   time.Duration
	start time.Time   // read before round one is sent
	acq   []nodeReply // round one, by master
	won   []int       // the masters that granted round one
	token uint64      // 1 + the highest counter read in round one
}

func (r *Redlock) newAttempt(key string, keys keyFamily, ttl time.Duration) *rlAttempt {
	return &rlAttempt{r: r, key: key, keys: keys, owner: newOwner(), ttl: ttl, start: r.now()}
}

// releaseMark is how long the release of the failed attempt leaves the
// released marker on master i: the lease length where round one got no
// reply (its SET may still land), none elsewhere.
func (a *rlAttempt) releaseMark(i int) time.Duration {
	if i < len(a.acq) && a.acq[i].err != nil && !errors.Is(a.acq[i].err, errNotAsked) {
		return a.ttl
	}
	return 0
}

// deadline is the end of the attempt's validity: no master's lease, set
// after start, expires before start + ttl, less the drift allowance.
func (a *rlAttempt) deadline() time.Time { return a.start.Add(a.ttl - lease.Drift(a.ttl)) }

// afterAcquire decides round one: with a quorum of grants and validity
// left, it picks the token (1 + the highest counter the grants read).
func (a *rlAttempt) afterAcquire() error {
	a.won = a.won[:0]
	var top uint64
	for i, rep := range a.acq {
		if rep.ok {
			a.won = append(a.won, i)
			top = max(top, rep.n)
		}
	}
	if err := a.quorumError(a.acq, "acquire"); err != nil {
		return err
	}
	if !a.r.now().Before(a.deadline()) {
		return fmt.Errorf("%w: %q: a quorum granted the lease only after its validity", ErrNoQuorum, a.key)
	}
	a.token = top + 1
	return nil
}

// afterRaise decides round two and, when it held, returns the lease.
func (a *rlAttempt) afterRaise(raised []nodeReply) (*RedlockLease, error) {
	if err := a.quorumError(raised, "raise the fence on"); err != nil {
		return nil, err
	}
	deadline := a.deadline()
	now := a.r.now()
	if !now.Before(deadline) {
		return nil, fmt.Errorf("%w: %q: the lease's validity was spent before a quorum raised its fence", ErrNoQuorum, a.key)
	}
	l := &RedlockLease{
		r:     a.r,
		key:   a.key,
		keys:  a.keys,
		owner: a.owner,
		token: a.token,
		ttl:   a.ttl,
	}
	l.life.Init(a.ttl, a.start, deadline, a.r.now, l.markLost)
	return l, nil
}

// quorumError is nil when a quorum granted the round. Otherwise it wraps
// ErrLeaseHeld when a quorum answered and at least one master reported
// another owner holding the lease, and ErrNoQuorum (joined with the
// masters' errors, if any) when too few answered or no other owner was
// seen (the lease vanished from a master between the rounds).
func (a *rlAttempt) quorumError(replies []nodeReply, what string) error {
	q, n := a.r.quorum, len(a.r.nodes)
	ok, refused, errs := tally(replies)
	if ok >= q {
		return nil
	}
	held := 0
	for _, rep := range replies {
		if rep.held && !rep.ok && rep.err == nil {
			held++
		}
	}
	if held > 0 && ok+refused >= q {
		return fmt.Errorf("%w: %q: %d of %d masters granted it, %d needed; another owner holds it on %d", ErrLeaseHeld, a.key, ok, n, q, held)
	}
	return withCauses(fmt.Errorf("%w: %s %q: %d of %d masters answered, %d granted, %d needed, another owner holds it on %d",
		ErrNoQuorum, what, a.key, ok+refused, n, ok, q, held), errs)
}

// withCauses joins the masters' errors, if any, to err.
func withCauses(err error, errs []error) error {
	if len(errs) == 0 {
		return err
	}
	return fmt.Errorf("%w: %w", err, errors.Join(errs...))
}

// otherHasQuorum reports whether round one saw one other owner holding
// the lease on a quorum of masters.
func (a *rlAttempt) otherHasQuorum() bool {
	count := make(map[string]int)
	for _, rep := range a.acq {
		if rep.held && rep.by != "" {
			count[rep.by]++
			if count[rep.by] >= a.r.quorum {
				return true
			}
		}
	}
	return false
}

// holderTTL is the shortest remaining lease of another owner seen in round
// one, or 0.
func (a *rlAttempt) holderTTL() time.Duration {
	var d time.Duration
	for _, rep := range a.acq {
		if !rep.ok && rep.err == nil && rep.pttl > 0 && (d == 0 || rep.pttl < d) {
			d = rep.pttl
		}
	}
	return d
}
