package herd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/faultproxy"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// Attacks on the claims of the Redlock (redlock.go, redlock_lease.go,
// docs/design.md "Redlock"). Each test is named after the claim it checks.

// secondHolder acquires key through r2, waiting at most a few seconds, and
// reports whether a's lease was still believed held (Deadline ahead, Lost
// open) when r2 got it.
func secondHolderWhileValid(t *testing.T, r2 *Redlock, a *RedlockLease, key string, ttl time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := r2.Acquire(ctx, key, ttl)
	if err != nil {
		t.Logf("second owner: %v (the lease stayed exclusive)", err)
		return // the lease is still exclusive: the claim holds
	}
	defer b.Release(context.Background())
	lost := false
	select {
	case <-a.Lost():
		lost = true
	default:
	}
	if !lost && time.Now().Before(a.Deadline()) {
		t.Errorf("two holders at once: a second owner acquired %q (token %d) while the first (token %d) is still valid for %v and Lost() is open",
			key, b.Token(), a.Token(), time.Until(a.Deadline()).Round(time.Millisecond))
	}
}

// TestRedlockExtendNoQuorumLeavesLeaseAsItWas breaks the Extend godoc:
// "an error wrapping [ErrNoQuorum] when too few masters answered, leaving
// the lease as it was". An Extend whose validity check fails after a
// quorum ran the extend script has already PEXPIREd the lease to the new
// ttl on those masters, but the local Deadline and Lost stay as they were.
// With a 1ms ttl (accepted by checkTTL) the check always fails (1ms less
// the 2ms drift allowance is negative): the masters drop the lease at once
// while the holder still believes it holds it for ~30s, and a second
// owner takes the lock: mutual exclusion is gone without any fault.
func TestRedlockExtendNoQuorumLeavesLeaseAsItWas(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r1, r2 := g.redlock(nil), g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	a, err := r1.TryAcquire(ctx, key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	err = a.Extend(ctx, time.Millisecond)
	t.Logf("Extend(1ms): %v", err)
	if err == nil {
		return // a successful extend moves the deadline: nothing to check
	}
	secondHolderWhileValid(t, r2, a, key, 30*time.Second)
}

// TestRedlockSlowExtendLeavesLeaseAsItWas is the same hole without bad
// input: the masters answer an Extend(300ms) after 600ms (reply latency on
// every link, NodeTimeout 2s). The masters renewed the lease for 300ms,
// the reply comes after the new validity, so Extend fails with
// ErrNoQuorum "leaving the lease as it was" (local deadline ~30s ahead),
// yet the masters' leases end 300ms later and a second owner acquires.
func TestRedlockSlowExtendLeavesLeaseAsItWas(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	var proxies []*faultproxy.Proxy
	var clients []redis.UniversalClient
	for _, s := range g.srvs {
		p, err := faultproxy.Start(s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		proxies = append(proxies, p)
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	r1 := NewRedlock(clients, &RedlockOptions{NodeTimeout: 2 * time.Second})
	t.Cleanup(func() { r1.Close() })
	r2 := g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	a, err := r1.TryAcquire(ctx, key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	for _, p := range proxies {
		p.SetLatency(faultproxy.Downstream, 600*time.Millisecond)
	}
	err = a.Extend(ctx, 300*time.Millisecond)
	for _, p := range proxies {
		p.SetLatency(faultproxy.Downstream, 0)
	}
	t.Logf("slow Extend(300ms): %v", err)
	if err == nil {
		return
	}
	if strings.Contains(err.Error(), "%!") {
		t.Errorf("Extend error text is malformed: %v", err)
	}
	secondHolderWhileValid(t, r2, a, key, 30*time.Second)
}

// TestRedlockCallsAfterCloseReturnErrClosed breaks "Every call made after
// Close, on the Redlock or on its leases, returns [ErrClosed]": Extend
// checks its ttl before the closed state (ErrInvalidTTL), and Release of a
// lease released before Close returns nil.
func TestRedlockCallsAfterCloseReturnErrClosed(t *testing.T) {
	g := startRedlockRig(t, 3)
	r := g.redlock(nil)
	ctx := context.Background()
	a, err := r.TryAcquire(ctx, testKey(t)+"a", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.TryAcquire(ctx, testKey(t)+"b", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.finish()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	checks := map[string]error{
		"Extend(0)":             a.Extend(ctx, 0),
		"Extend(-1s)":           a.Extend(ctx, -time.Second),
		"Release of a released": b.Release(ctx),
		"TryAcquire(\"\")":      second(r.TryAcquire(ctx, "", time.Second)),
	}
	for name, err := range checks {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

// TestRedlockMinimumTTLIsUsable breaks TryAcquire's input contract: "ttl
// must be at least a millisecond ([ErrInvalidTTL])". A ttl of 1ms or 2ms
// passes the check but can never be granted (the drift allowance, 1% +
// 2ms, exceeds it), so on healthy masters the caller is told
// ErrNoQuorum ("no quorum of Redis masters"), a fault that did not happen.
// A ttl that cannot work must be ErrInvalidTTL.
func TestRedlockMinimumTTLIsUsable(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r := g.redlock(nil)
	ctx := context.Background()
	for _, ttl := range []time.Duration{time.Millisecond, 2 * time.Millisecond} {
		l, err := r.TryAcquire(ctx, testKey(t), ttl)
		if err == nil {
			l.Release(ctx)
			continue
		}
		if !errors.Is(err, ErrInvalidTTL) {
			t.Errorf("TryAcquire(ttl %v) on 3 healthy masters: %v; want a lease or ErrInvalidTTL", ttl, err)
		}
	}
}

// TestRedlockAcquireHugeTTLWaitsForContext breaks Acquire's wait bound
// ("bounded by ctx and by MaxWait", MaxWait default "three times the lease
// length"): for a ttl above MaxInt64/3 the default 3*ttl overflows to a
// negative duration and Acquire gives up at once with ErrWaitTimeout
// ("after -…") instead of waiting for ctx.
func TestRedlockAcquireHugeTTLWaitsForContext(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r1, r2 := g.redlock(nil), g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	a, err := r1.TryAcquire(ctx, key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	wctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	_, err = r2.Acquire(wctx, key, 1<<62)
	if errors.Is(err, ErrInvalidTTL) {
		// Leases above 50 years are rejected up front (TryAcquire's
		// contract): the bound must then hold for the longest accepted one.
		t.Logf("Acquire(ttl 2^62ns): %v", err)
		_, err = r2.Acquire(wctx, key, redlockMaxLease)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrLeaseHeld) {
		t.Errorf("Acquire(ttl 2^62ns) on a held key with a 1.5s ctx: %v; want ErrLeaseHeld joined with the ctx's DeadlineExceeded", err)
	}
}

// TestRedlockFenceTTLAtLeastTwiceLease breaks RedlockOptions.FenceTTL's
// "raised to at least twice the lease length on every acquire" (and A3 in
// docs/design.md: a counter never expires sooner than 2L after its last
// acquire): 2*ttl overflows for a ttl above MaxInt64/2, and the fence
// counter gets the 24h default while the lease itself lasts ~219 years.
func TestRedlockFenceTTLAtLeastTwiceLease(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r := g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	ttl := time.Duration(1<<62 + 1<<61)
	l, err := r.TryAcquire(ctx, key, ttl)
	if errors.Is(err, ErrInvalidTTL) {
		// Leases above 50 years are rejected up front (TryAcquire's
		// contract): the claim must then hold for the longest accepted one.
		t.Logf("TryAcquire(ttl %v): %v", ttl, err)
		ttl = redlockMaxLease
		l, err = r.TryAcquire(ctx, key, ttl)
	}
	if err != nil {
		t.Fatalf("TryAcquire(ttl %v): %v", ttl, err)
	}
	defer l.Release(ctx)
	keys, _ := makeKeys(DefaultPrefix, key)
	for i, c := range g.clients {
		lease, _ := c.PTTL(ctx, keys.Lease).Result()
		fence, _ := c.PTTL(ctx, keys.Fence).Result()
		if fence < lease {
			t.Errorf("master %d: fence counter TTL %v is shorter than the lease's %v (want at least twice it)", i, fence, lease)
		}
	}
}

// proxiedRedlock puts a faultproxy in front of every master of g and
// returns a Redlock over clients through them (opts applied to each).
func proxiedRedlock(t *testing.T, g *redlockRig, ropt *RedlockOptions, opts func(*redis.Options)) (*Redlock, []*faultproxy.Proxy) {
	t.Helper()
	var proxies []*faultproxy.Proxy
	var clients []redis.UniversalClient
	for _, s := range g.srvs {
		p, err := faultproxy.Start(s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		proxies = append(proxies, p)
		o := &redis.Options{Addr: p.Addr()}
		if opts != nil {
			opts(o)
		}
		c := redis.NewClient(o)
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	r := NewRedlock(clients, ropt)
	t.Cleanup(func() { r.Close() })
	return r, proxies
}

// TestRedlockFailedAttemptReleasesEverything breaks TryAcquire's "A failed
// attempt releases whatever it took, on every master, before it returns"
// (and try's comment "also where no reply came: the SET may have run there
// after the round gave up on it"). The round-one request to two of three
// masters is delayed (upstream latency 1.5s, NodeTimeout 400ms, clients
// without ContextTimeoutEnabled so the request is not abandoned); the
// attempt fails with ErrNoQuorum and its release reaches those masters
// first (latency turned off meanwhile), then the late SET lands there: the
// failed attempt leaves its lease on a quorum and nobody can take the key
// for the whole ttl. (The latency switch is timed, but a slow machine can
// only make the test pass, never fail spuriously.)
func TestRedlockFailedAttemptReleasesEverything(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r, proxies := proxiedRedlock(t, g, &RedlockOptions{NodeTimeout: 400 * time.Millisecond}, nil)
	other := g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	const ttl = 20 * time.Second
	warm, err := r.TryAcquire(ctx, key, ttl) // connections and scripts ready
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies[:2] {
		p.SetLatency(faultproxy.Upstream, 1500*time.Millisecond)
	}
	off := time.AfterFunc(150*time.Millisecond, func() {
		for _, p := range proxies[:2] {
			p.SetLatency(faultproxy.Upstream, 0)
		}
	})
	defer off.Stop()
	_, err = r.TryAcquire(ctx, key, ttl)
	if !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("TryAcquire with 2 of 3 masters delayed past NodeTimeout: %v, want ErrNoQuorum", err)
	}
	keys, _ := makeKeys(DefaultPrefix, key)
	deadline := time.Now().Add(4 * time.Second) // the delayed requests land by 1.5s
	for time.Now().Before(deadline) {
		n := 0
		for _, c := range g.clients[:2] {
			if c.Exists(ctx, keys.Lease).Val() == 1 {
				n++
			}
		}
		if n == 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if l, err := other.TryAcquire(ctx, key, ttl); err != nil {
		t.Errorf("after a failed attempt returned, the key is still taken: %v", err)
	} else {
		l.Release(ctx)
	}
}

// TestRedlockLostRepliesCoverage (passes; coverage): with the reply of the
// round-one script dropped on master 0, of the raise on master 1 and of
// the release on master 2 (connection reset: go-redis retries), the
// acquire and release still succeed and nothing is left on any master.
func TestRedlockLostRepliesCoverage(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r, proxies := proxiedRedlock(t, g, &RedlockOptions{NodeTimeout: 2 * time.Second}, nil)
	ctx := context.Background()
	key := testKey(t)
	warm, err := r.TryAcquire(ctx, key+"warm", 5*time.Second) // load the scripts
	if err != nil {
		t.Fatal(err)
	}
	warm.Release(ctx)
	f0 := proxies[0].DropReply([]byte(redlockAcquireScript.rs.Hash()))
	f1 := proxies[1].DropReply([]byte(redlockRaiseScript.rs.Hash()))
	f2 := proxies[2].DropReply([]byte(redlockReleaseScript.rs.Hash()))
	l, err := r.TryAcquire(ctx, key, 5*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire with lost replies: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release with a lost reply: %v", err)
	}
	for i, f := range []*faultproxy.Fault{f0, f1, f2} {
		select {
		case <-f.Fired():
		default:
			t.Errorf("fault %d did not fire", i)
		}
	}
	if n := g.holders(key, l.owner); n != 0 {
		t.Errorf("%d masters still hold the released lease", n)
	}
}

// TestRedlockTokensIncreaseAcrossEmptyRestarts (passes; coverage): tokens
// keep increasing when a quorum of masters restarts empty, with and
// without the stay-out rule (the restart breaks exclusion, documented, but
// not the token order).
func TestRedlockTokensIncreaseAcrossEmptyRestarts(t *testing.T) {
	g := startRedlockRig(t, 3)
	r1, r2 := g.redlock(nil), g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	a, err := r1.TryAcquire(ctx, key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.finish()
	g.srvs[0].Restart(t)
	g.srvs[1].Restart(t)
	b, err := r2.TryAcquire(ctx, key, 30*time.Second) // no stay-out: documented double holder
	if err != nil {
		t.Fatal(err)
	}
	if b.Token() <= a.Token() {
		t.Errorf("after 2 empty restarts: token %d, then %d", a.Token(), b.Token())
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range g.srvs {
		s.Restart(t)
	}
	c, err := r1.TryAcquire(ctx, key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release(ctx)
	if c.Token() <= b.Token() {
		t.Errorf("after all masters restarted empty: token %d, then %d", b.Token(), c.Token())
	}
}

// TestRedlockBlackholeBoundedAndLeakFree (passes; coverage): with one
// master's link blackholed (connections accepted, never answered) and
// clients without ContextTimeoutEnabled, acquire/extend/release succeed on
// the other two within NodeTimeout; with all three blackholed TryAcquire
// fails with ErrNoQuorum (no hang); Close waits for the stalled calls (the
// client's ReadTimeout) and leaves no goroutine behind.
func TestRedlockBlackholeBoundedAndLeakFree(t *testing.T) {
	g := startRedlockRig(t, 3)
	baseline := goleak.IgnoreCurrent()
	r, proxies := proxiedRedlock(t, g, &RedlockOptions{NodeTimeout: 500 * time.Millisecond},
		func(o *redis.Options) {
			o.ReadTimeout = time.Second
			o.WriteTimeout = time.Second
			o.DialTimeout = time.Second
		})
	ctx := context.Background()
	key := testKey(t)
	proxies[0].SetBlackhole(true)
	l, err := r.TryAcquire(ctx, key, 5*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire with one blackholed master: %v", err)
	}
	if err := l.Extend(ctx, 5*time.Second); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for _, p := range proxies {
		p.SetBlackhole(true)
	}
	if _, err := r.TryAcquire(ctx, key, 5*time.Second); !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("TryAcquire with every master blackholed: %v, want ErrNoQuorum", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		p.Close()
	}
	for _, c := range r.nodes {
		c.Close()
	}
	goleak.VerifyNone(t, baseline)
}

// TestRedlockSameMasterTwiceRejected breaks NewRedlock's "no client may
// appear twice" / "It panics on an invalid configuration": only the same
// client value is caught. Two distinct clients for one master pass, and
// since round one on a master accepts a lease that is already this
// owner's (the retry rule), that one master grants twice: a "quorum" of 2
// of 3 from one real server. With master B killed, TryAcquire succeeds on
// master A alone, although the Redlock claims to need a majority of
// independent masters.
func TestRedlockSameMasterTwiceRejected(t *testing.T) {
	g := startRedlockRig(t, 2)
	a, b := g.srvs[0], g.srvs[1]
	clients := []redis.UniversalClient{a.Client(t), a.Client(t), b.Client(t)}
	var r *Redlock
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Logf("NewRedlock panicked: %v", p)
			}
		}()
		r = NewRedlock(clients, &RedlockOptions{NodeTimeout: testNodeTimeout})
	}()
	if r == nil {
		return // rejected: the claim holds
	}
	defer r.Close()
	b.Kill(t)
	l, err := r.TryAcquire(context.Background(), testKey(t), 5*time.Second)
	if err == nil {
		defer l.finish()
		t.Errorf("NewRedlock accepted two clients for master %s, and TryAcquire won a quorum (token %d) with only that one master alive", a.Addr(), l.Token())
	}
}

// TestRedlockErrLeaseHeldOnlyWhenAnotherOwnerHolds breaks TryAcquire's
// error contract: "[ErrLeaseHeld] when other owners hold it on enough
// masters that no quorum is free" (design.md: "a quorum answered; other
// owners hold the rest"). Master 2 is down; round one wins masters 0 and 1;
// between the rounds (the Redlock's clock hook, read once per round) master
// 0 restarts empty, so its raise finds no lease. No other owner exists
// anywhere, yet TryAcquire says the lease is held by another owner rather
// than ErrNoQuorum.
func TestRedlockErrLeaseHeldOnlyWhenAnotherOwnerHolds(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r := g.redlock(nil)
	g.srvs[2].Kill(t)
	var calls atomic.Int32
	r.now = func() time.Time {
		if calls.Add(1) == 2 { // afterAcquire: round one is done, round two not sent
			g.srvs[0].Restart(t)
		}
		return time.Now()
	}
	key := testKey(t)
	_, err := r.TryAcquire(context.Background(), key, 30*time.Second)
	if calls.Load() < 2 {
		t.Fatalf("round one did not reach the hook: %v", err)
	}
	if errors.Is(err, ErrLeaseHeld) {
		t.Errorf("TryAcquire with master 0 restarted between the rounds, master 2 down and no other owner: %v; want ErrNoQuorum, not ErrLeaseHeld", err)
	}
}

// TestRedlockLostClosesAfterValidity (passes; coverage): a lease neither
// extended nor released is known lost once its validity runs out (Lost
// closes), and a second owner then gets a higher token.
func TestRedlockLostClosesAfterValidity(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r1, r2 := g.redlock(nil), g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	// A second, not 300ms: on a loaded machine a first round that dials
	// three masters took longer than a 300ms lease's validity.
	const ttl = time.Second
	a, err := r1.TryAcquire(ctx, key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Lost():
	case <-time.After(20 * ttl):
		t.Fatal("Lost not closed 20 lease lengths after the acquire")
	}
	if err := a.Extend(ctx, ttl); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Extend of a lost lease: %v, want ErrLeaseLost", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*ttl)
	defer cancel()
	b, err := r2.Acquire(wctx, key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if b.Token() <= a.Token() {
		t.Errorf("token %d after %d", b.Token(), a.Token())
	}
	before := g.holders(key, b.owner)
	if err := a.Release(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Release of a lost lease whose key passed on: %v, want ErrLeaseLost", err)
	}
	if n := g.holders(key, b.owner); n != before {
		t.Errorf("the lost holder's Release touched the new owner's lease: %d masters held it, %d after", before, n)
	}
}

func init() { workerRoles["redlock-contender"] = redlockContenderWorker }

// redlockContenderWorker: 4 goroutines each take the Redlock on envKey 5
// times over the masters in envMasters; inside the lock an INCR of
// key:inside on the side Redis (envAddr) must return 1, and the token is
// appended to key:log.
func redlockContenderWorker(ctx context.Context, _ string) error {
	key := os.Getenv(envKey)
	side := redis.NewClient(&redis.Options{Addr: os.Getenv(envAddr)})
	defer side.Close()
	var masters []redis.UniversalClient
	for _, addr := range strings.Split(os.Getenv(envMasters), ",") {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer c.Close()
		masters = append(masters, c)
	}
	rl := NewRedlock(masters, &RedlockOptions{NodeTimeout: testNodeTimeout, MaxWait: time.Minute})
	defer rl.Close()
	errc := make(chan error, 4*5)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 5 {
				l, err := rl.Acquire(ctx, key, 3*time.Second)
				if err != nil {
					errc <- fmt.Errorf("Acquire: %w", err)
					return
				}
				if n, err := side.Incr(ctx, key+":inside").Result(); err != nil || n != 1 {
					errc <- fmt.Errorf("INCR inside the lock = %d (%v): two holders", n, err)
				}
				side.RPush(ctx, key+":log", l.Token())
				side.Decr(ctx, key+":inside")
				if err := l.Release(ctx); err != nil {
					errc <- fmt.Errorf("Release: %w", err)
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// TestRedlockMutualExclusionAcrossProcesses (passes; coverage): 3 OS
// processes × 4 goroutines contend for one key over 3 masters; never two
// holders (INCR inside the lock on a side Redis is 1), and the tokens, in
// the order the holders held the lock, strictly increase.
func TestRedlockMutualExclusionAcrossProcesses(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	side := redistest.Start(t)
	key := testKey(t)
	var addrs []string
	for _, s := range g.srvs {
		addrs = append(addrs, s.Addr())
	}
	p := startWorkers(t, 3, "redlock-contender", envAddr+"="+side.Addr(), envKey+"="+key,
		envMasters+"="+strings.Join(addrs, ","))
	p.wait(2 * time.Minute)
	toks, err := side.Client(t).LRange(context.Background(), key+":log", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) != 3*4*5 {
		t.Fatalf("%d holdings logged, want %d", len(toks), 3*4*5)
	}
	prev := uint64(0)
	for i, s := range toks {
		n, _ := strconv.ParseUint(s, 10, 64)
		if n <= prev {
			t.Fatalf("holding %d: token %d after %d: not strictly increasing", i, n, prev)
		}
		prev = n
	}
}
