package herd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// redlockRig is N real redis-servers, one client each, and the Redlocks
// built on them.
type redlockRig struct {
	t       *testing.T
	srvs    []*redistest.Server
	clients []redis.UniversalClient
}

// startRedlockRig starts n redis-servers for the test.
func startRedlockRig(t *testing.T, n int) *redlockRig {
	t.Helper()
	g := &redlockRig{t: t}
	for range n {
		s := redistest.Start(t)
		g.srvs = append(g.srvs, s)
		g.clients = append(g.clients, s.Client(t))
	}
	return g
}

// testNodeTimeout is generous: a loaded 2-core machine under -race must
// not turn a healthy master into a missing one.
const testNodeTimeout = time.Second

// redlock returns a new Redlock over the rig's masters, with its own
// clients (as another process would have), closed when the test ends.
func (g *redlockRig) redlock(opt *RedlockOptions) *Redlock {
	g.t.Helper()
	if opt == nil {
		opt = &RedlockOptions{NodeTimeout: testNodeTimeout}
	}
	clients := make([]redis.UniversalClient, len(g.srvs))
	for i, s := range g.srvs {
		clients[i] = s.Client(g.t)
	}
	r := NewRedlock(clients, opt)
	g.t.Cleanup(func() {
		if err := r.Close(); err != nil && !errors.Is(err, ErrClosed) {
			g.t.Errorf("Close: %v", err)
		}
	})
	return r
}

// holders returns how many masters hold key's lease for owner.
func (g *redlockRig) holders(key, owner string) int {
	g.t.Helper()
	keys, _ := makeKeys(DefaultPrefix, key)
	n := 0
	for _, c := range g.clients {
		v, err := c.Get(context.Background(), keys.Lease).Result()
		if err == nil && v == owner {
			n++
		}
	}
	return n
}

func TestNewRedlockPanics(t *testing.T) {
	t.Parallel()
	var all []redis.UniversalClient
	c := func(addr string) redis.UniversalClient {
		x := redis.NewClient(&redis.Options{Addr: addr})
		all = append(all, x)
		return x
	}
	a, b, d, e := c("127.0.0.1:1"), c("127.0.0.1:2"), c("127.0.0.1:3"), c("127.0.0.1:4")
	aAgain, aMapped := c("127.0.0.1:1"), c("[::ffff:127.0.0.1]:1")
	defer func() {
		for _, x := range all {
			x.Close()
		}
	}()
	cases := []struct {
		name    string
		clients []redis.UniversalClient
		opt     *RedlockOptions
		want    string
	}{
		{"none", nil, nil, "odd number"},
		{"one", []redis.UniversalClient{a}, nil, "odd number"},
		{"even", []redis.UniversalClient{a, b, d, e}, nil, "odd number"},
		{"nil client", []redis.UniversalClient{a, nil, d}, nil, "nil Redis client"},
		{"same client twice", []redis.UniversalClient{a, b, a}, nil, "same Redis client"},
		{"same master, two clients", []redis.UniversalClient{a, b, aAgain}, nil, "same master 127.0.0.1:1"},
		{"same master, IPv4-mapped", []redis.UniversalClient{aMapped, b, a}, nil, "same master 127.0.0.1:1"},
		{"negative NodeTimeout", []redis.UniversalClient{a, b, d}, &RedlockOptions{NodeTimeout: -1}, "NodeTimeout is -1ns"},
		{"MaxWait above 50 years", []redis.UniversalClient{a, b, d}, &RedlockOptions{MaxWait: redlockMaxLease + 1}, "MaxWait"},
		{"PollMax below PollMin", []redis.UniversalClient{a, b, d}, &RedlockOptions{PollMin: time.Second, PollMax: time.Millisecond}, "PollMax"},
		{"bad prefix", []redis.UniversalClient{a, b, d}, &RedlockOptions{Prefix: "a{b"}, "prefix"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				msg := fmt.Sprint(recover())
				if !strings.HasPrefix(msg, "herd: ") || !strings.Contains(msg, tc.want) {
					t.Errorf("panic = %q, want a \"herd: \" message containing %q", msg, tc.want)
				}
			}()
			NewRedlock(tc.clients, tc.opt)
		})
	}
}

func TestRedlockBasics(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 5)
	r1, r2 := g.redlock(nil), g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	const ttl = 5 * time.Second

	if _, err := r1.TryAcquire(ctx, "", ttl); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("empty key: err = %v, want ErrInvalidKey", err)
	}
	if _, err := r1.Acquire(ctx, key, 0); !errors.Is(err, ErrInvalidTTL) {
		t.Errorf("zero ttl: err = %v, want ErrInvalidTTL", err)
	}

	a, err := r1.TryAcquire(ctx, key, ttl)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if got := g.holders(key, a.owner); got != 5 {
		t.Errorf("masters holding the lease = %d, want 5", got)
	}
	if !a.Deadline().After(time.Now()) || a.Key() != key {
		t.Errorf("Deadline %v, Key %q", a.Deadline(), a.Key())
	}
	if _, err := r2.TryAcquire(ctx, key, ttl); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("second TryAcquire: err = %v, want ErrLeaseHeld", err)
	}
	if err := a.Extend(ctx, ttl); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Errorf("second Release: %v, want nil", err)
	}
	if err := a.Extend(ctx, ttl); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Extend after Release: %v, want ErrLeaseLost", err)
	}
	if got := g.holders(key, a.owner); got != 0 {
		t.Errorf("masters holding the released lease = %d, want 0", got)
	}
	b, err := r2.Acquire(ctx, key, ttl)
	if err != nil {
		t.Fatalf("Acquire after release: %v", err)
	}
	defer b.Release(ctx)
	if b.Token() <= a.Token() {
		t.Errorf("tokens: second %d, want above first %d", b.Token(), a.Token())
	}
}

// TestRedlockExtendLosesQuorum: a lease deleted on three of five masters
// cannot be extended; Extend says it is lost and Lost closes.
func TestRedlockExtendLosesQuorum(t *testing.T) {
	// Not parallel: its bounds are short timeouts, which a loaded machine misses.
	g := startRedlockRig(t, 5)
	r := g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	a, err := r.TryAcquire(ctx, key, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := makeKeys(DefaultPrefix, key)
	for _, c := range g.clients[:3] {
		c.Del(ctx, keys.Lease)
	}
	if err := a.Extend(ctx, 5*time.Second); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Extend: %v, want ErrLeaseLost", err)
	}
	if !isClosed(a.Lost()) {
		t.Error("Lost not closed after an extend that found no quorum")
	}
	if err := a.Release(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Release: %v, want ErrLeaseLost", err)
	}
}

// TestRedlockTwoMastersKilled: with 2 of 5 masters gone, acquire, extend
// and release still work.
func TestRedlockTwoMastersKilled(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 5)
	r := g.redlock(nil)
	ctx := context.Background()
	// One round first, with every master up: its dials are connection
	// set-up, not the claim, and on a loaded machine a first round that
	// dials five masters can outlast NodeTimeout.
	warm, err := r.Acquire(ctx, testKey(t)+"-warm", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g.srvs[1].Kill(t)
	g.srvs[3].Kill(t)
	for i := range 3 {
		key := fmt.Sprintf("%s-%d", testKey(t), i)
		a, err := r.Acquire(ctx, key, 5*time.Second)
		if err != nil {
			t.Fatalf("Acquire %d with 2 masters down: %v", i, err)
		}
		if err := a.Extend(ctx, 5*time.Second); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		if err := a.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

// TestRedlockThreeMastersKilled: with 3 of 5 masters gone there is no
// quorum: TryAcquire and Acquire fail with ErrNoQuorum at once (not at
// the caller's deadline), and what the attempt took on the two live
// masters is released. A lease taken before the loss can no longer be
// extended or released.
func TestRedlockThreeMastersKilled(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 5)
	r := g.redlock(nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := testKey(t)
	held, err := r.TryAcquire(ctx, key+"held", time.Minute) // valid through the test
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 2, 4} {
		g.srvs[i].Kill(t)
	}
	for name, acquire := range map[string]func(context.Context, string, time.Duration) (*RedlockLease, error){
		"TryAcquire": r.TryAcquire, "Acquire": r.Acquire,
	} {
		_, err := acquire(ctx, key, 5*time.Second)
		if !errors.Is(err, ErrNoQuorum) || ctx.Err() != nil {
			t.Errorf("%s: err = %v (ctx %v), want ErrNoQuorum before the deadline", name, err, ctx.Err())
		}
		keys, _ := makeKeys(DefaultPrefix, key)
		for _, i := range []int{1, 3} {
			if n, _ := g.clients[i].Exists(ctx, keys.Lease).Result(); n != 0 {
				t.Errorf("%s: live master %d still holds the failed attempt's lease", name, i)
			}
		}
	}
	if err := held.Extend(ctx, time.Minute); !errors.Is(err, ErrNoQuorum) {
		t.Errorf("Extend: %v, want ErrNoQuorum", err)
	}
	if isClosed(held.Lost()) {
		t.Error("Lost closed by an extend that only lacked answers")
	}
	if err := held.Release(ctx); !errors.Is(err, ErrNoQuorum) {
		t.Errorf("Release: %v, want ErrNoQuorum", err)
	}
}

// TestRedlockPausedMaster: one master SIGSTOPped (it accepts connections
// and answers nothing) costs each round its NodeTimeout, no more: the
// clients here keep go-redis's default 3 s ReadTimeout and no context
// timeouts, so only the Redlock's own bound ends the calls to it.
func TestRedlockPausedMaster(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 5)
	r := g.redlock(&RedlockOptions{NodeTimeout: 500 * time.Millisecond})
	g.srvs[2].Pause(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 3 {
		key := fmt.Sprintf("%s-%d", testKey(t), i)
		a, err := r.TryAcquire(ctx, key, 5*time.Second)
		if err != nil {
			t.Fatalf("TryAcquire %d with a paused master: %v", i, err)
		}
		if err := a.Extend(ctx, 5*time.Second); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		if err := a.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	g.srvs[2].Resume(t)
}

// TestRedlockRestartRule: a master restarted without persistence forgets
// the leases it granted. Holder A has exactly a quorum (masters 0-2; 3 and
// 4 were down and come back empty). If master 2 restarts and rejoins at
// once, B gets a quorum (2, 3, 4) while A still holds: two holders. If
// master 2 stays out for one lease length, B gets the lock only once A's
// validity is over. Either way B's token is above A's (the counter of a
// restarted master starts from its clock), so a fenced resource still
// orders their writes.
func TestRedlockRestartRule(t *testing.T) {
	t.Parallel()
	const ttl = 5 * time.Second
	setup := func(t *testing.T) (*redlockRig, *Redlock, *RedlockLease) {
		g := startRedlockRig(t, 5)
		ra, rb := g.redlock(nil), g.redlock(nil)
		g.srvs[3].Kill(t)
		g.srvs[4].Kill(t)
		a, err := ra.TryAcquire(context.Background(), testKey(t), ttl)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.finish)
		g.srvs[3].Restart(t)
		g.srvs[4].Restart(t)
		return g, rb, a
	}
	ctx := context.Background()

	t.Run("rejoins at once", func(t *testing.T) {
		g, rb, a := setup(t)
		g.srvs[2].Restart(t)
		b, err := rb.TryAcquire(ctx, testKey(t), ttl)
		if err != nil {
			t.Fatalf("B: %v; want the lock, which master 2 forgot", err)
		}
		defer b.Release(ctx)
		if isClosed(a.Lost()) || !time.Now().Before(a.Deadline()) {
			t.Fatal("A's validity ran out before B won: the overlap was not shown; lengthen ttl")
		}
		t.Logf("two holders at once: A (token %d) until %v, B (token %d)", a.Token(), time.Until(a.Deadline()).Round(time.Millisecond), b.Token())
		if b.Token() <= a.Token() {
			t.Errorf("B's token %d is not above A's %d", b.Token(), a.Token())
		}
	})

	t.Run("stays out one ttl", func(t *testing.T) {
		g, rb, a := setup(t)
		g.srvs[2].Kill(t)
		if _, err := rb.TryAcquire(ctx, testKey(t), ttl); !errors.Is(err, ErrLeaseHeld) {
			t.Fatalf("B while master 2 is out: %v, want ErrLeaseHeld", err)
		}
		<-a.Lost()                                         // A's validity is over
		time.Sleep(time.Until(a.life.Acquired().Add(ttl))) // and its leases have expired on every master
		g.srvs[2].Restart(t)
		b, err := rb.Acquire(ctx, testKey(t), ttl)
		if err != nil {
			t.Fatalf("B after master 2 rejoined: %v", err)
		}
		defer b.Release(ctx)
		if !isClosed(a.Lost()) {
			t.Error("B won while A still held")
		}
		if b.Token() <= a.Token() {
			t.Errorf("B's token %d is not above A's %d", b.Token(), a.Token())
		}
	})
}

// TestRedlockPausedHolderFenced is the seed's pause scenario with a real
// process: holder A (a worker process) takes the lock with KeepAlive,
// writes to a FencedStore on a separate Redis, and is SIGSTOPped (a GC
// pause, a stalled VM), so its renewals stop and its validity runs out.
// B then gets the lock with a higher token and writes. A is resumed,
// writes with its old token, and the FencedStore rejects it.
func TestRedlockPausedHolderFenced(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 5)
	side := redistest.Start(t)
	sideRDB := side.Client(t)
	store := NewFencedStore(sideRDB, "")
	ctx := context.Background()
	key := "paused-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	const ttl = time.Second

	addrs := make([]string, len(g.srvs))
	for i, s := range g.srvs {
		addrs[i] = s.Addr()
	}
	p := startWorkers(t, 1, "redlock-holder", envAddr+"="+side.Addr(), envKey+"="+key,
		envMasters+"="+strings.Join(addrs, ","), envDuration+"="+ttl.String())
	var tokenA uint64
	waitFor(t, 30*time.Second, "the holder's lease and first write", func() bool {
		tokenA, _ = sideRDB.Get(ctx, key+":token").Uint64()
		return tokenA != 0
	})
	pid := p.pids()[0]
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}()

	b, err := g.redlock(nil).Acquire(ctx, key, 5*time.Second) // waits out A's leases
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	defer b.Release(ctx)
	if b.Token() <= tokenA {
		t.Fatalf("B's token %d is not above A's %d", b.Token(), tokenA)
	}
	if err := store.Set(ctx, key, b.Token(), []byte("B"), 0); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	if err := sideRDB.RPush(ctx, key+":wake", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	p.wait(time.Minute) // the worker fails unless its late write was fenced
	got, tok, err := store.Get(ctx, key)
	if err != nil || string(got) != "B" || tok != b.Token() {
		t.Errorf("stored %q token %d (%v), want B's write", got, tok, err)
	}
	if late, _ := sideRDB.Get(ctx, key+":late").Result(); !strings.Contains(late, ErrFenced.Error()) {
		t.Errorf("A's late write: %q, want it fenced", late)
	}
}

// envMasters lists the Redlock masters of a worker, comma-separated.
const envMasters = "HERD_TEST_MASTERS"

func init() { workerRoles["redlock-holder"] = redlockHolderWorker }

// redlockHolderWorker takes the Redlock on envKey for envDuration with
// KeepAlive, writes "A1" to the FencedStore at envAddr, publishes its
// token, then blocks until the test wakes it (it is SIGSTOPped meanwhile)
// and writes "A2" with the same token, as a holder that ignores Lost
// would. It records that write's error and fails unless it was fenced.
func redlockHolderWorker(ctx context.Context, _ string) error {
	key := os.Getenv(envKey)
	ttl, err := time.ParseDuration(os.Getenv(envDuration))
	if err != nil {
		return err
	}
	side := redis.NewClient(&redis.Options{Addr: os.Getenv(envAddr)})
	defer side.Close()
	var masters []redis.UniversalClient
	for _, addr := range strings.Split(os.Getenv(envMasters), ",") {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		masters = append(masters, c)
	}
	rl := NewRedlock(masters, &RedlockOptions{NodeTimeout: testNodeTimeout})
	defer rl.Close()
	lease, err := rl.TryAcquire(ctx, key, ttl)
	if err != nil {
		return err
	}
	lease.KeepAlive(time.Minute)
	store := NewFencedStore(side, "")
	if err := store.Set(ctx, key, lease.Token(), []byte("A1"), 0); err != nil {
		return fmt.Errorf("first write: %w", err)
	}
	if err := side.Set(ctx, key+":token", lease.Token(), time.Minute).Err(); err != nil {
		return err
	}
	if err := side.BLPop(ctx, time.Minute, key+":wake").Err(); err != nil {
		return fmt.Errorf("waiting to be woken: %w", err)
	}
	err = store.Set(ctx, key, lease.Token(), []byte("A2"), 0)
	side.Set(ctx, key+":late", fmt.Sprint(err), time.Minute)
	_ = lease.Release(ctx)
	if !errors.Is(err, ErrFenced) {
		return fmt.Errorf("late write with token %d: %v, want ErrFenced", lease.Token(), err)
	}
	return nil
}

// TestRedlockContention: 3 Redlocks (3 "processes", each with its own
// clients) × 8 goroutines take turns on one key over 5 masters. Inside the
// lock an INCR on a separate Redis must return 1 (no second holder), and
// the tokens, in the order the holders held the lock, strictly increase.
func TestRedlockContention(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 5)
	side := redistest.Start(t).Client(t)
	// 96 acquisitions one after the other, and no fairness among the 24
	// waiters: one of them may lose many hand-offs in a row, so its wait
	// is bounded by a generous MaxWait, not the default 3 × ttl (9s,
	// which a loaded machine's hand-offs added up to). What is checked is
	// mutual exclusion and the tokens, not how long a waiter waits.
	// Five masters and 24 waiters load the 2-core machine: a round's
	// masters get 3s to answer (CI saw three of five miss 1s, an
	// ErrNoQuorum that says nothing of mutual exclusion), under a lease
	// long enough to keep a validity after such a round.
	opt := &RedlockOptions{NodeTimeout: 3 * time.Second, MaxWait: 2 * time.Minute}
	locks := []*Redlock{g.redlock(opt), g.redlock(opt), g.redlock(opt)}
	ctx := context.Background()
	key := testKey(t)
	const rounds = 4

	var mu sync.Mutex
	var tokens []uint64
	errc := make(chan error, 24*rounds)
	var wg sync.WaitGroup
	for i := range 24 {
		rl := locks[i%3]
		wg.Go(func() {
			for range rounds {
				l, err := rl.Acquire(ctx, key, 10*time.Second)
				if err != nil {
					errc <- fmt.Errorf("Acquire: %w", err)
					return
				}
				if n, err := side.Incr(ctx, "inside").Result(); err != nil || n != 1 {
					errc <- fmt.Errorf("INCR inside the lock = %d (%v), want 1: two holders", n, err)
				}
				mu.Lock()
				tokens = append(tokens, l.Token())
				mu.Unlock()
				if _, err := side.Decr(ctx, "inside").Result(); err != nil {
					errc <- err
				}
				// A Release that a quorum did not answer in time (a loaded
				// machine: 24 goroutines on 5 masters) is reported as
				// ErrNoQuorum and the lease runs out by itself; what this
				// test checks is exclusion and tokens, not release speed.
				if err := l.Release(ctx); err != nil && !errors.Is(err, ErrNoQuorum) {
					errc <- fmt.Errorf("Release: %w", err)
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if len(tokens) != 24*rounds {
		t.Fatalf("%d acquisitions, want %d", len(tokens), 24*rounds)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d = %d after %d: not strictly increasing", i, tokens[i], tokens[i-1])
		}
	}
}

// TestRedlockClosed: every call after Close returns ErrClosed, and Close
// stops the watchdogs of leases still held (goleak checks the rest).
func TestRedlockClosed(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r := g.redlock(nil)
	ctx := context.Background()
	key := testKey(t)
	a, err := r.TryAcquire(ctx, key, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a.KeepAlive(time.Minute)
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	checks := map[string]error{
		"Close again": r.Close(),
		"TryAcquire":  second(r.TryAcquire(ctx, key, time.Second)),
		"Acquire":     second(r.Acquire(ctx, key, time.Second)),
		"Extend":      a.Extend(ctx, time.Second),
		"Release":     a.Release(ctx),
	}
	for name, err := range checks {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
	a.KeepAlive(time.Minute) // does nothing
}

// TestRedlockCloseEndsWait: Close during an Acquire's wait ends it with
// ErrClosed.
func TestRedlockCloseEndsWait(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	contended := make(chan struct{}, 1)
	obs := &Observer{Lease: func(_ string, ev LeaseEvent) {
		if ev == LeaseContended {
			contended <- struct{}{}
		}
	}}
	holder := g.redlock(nil)
	waiter := g.redlock(&RedlockOptions{NodeTimeout: testNodeTimeout, PollMin: time.Hour, PollMax: time.Hour, Observer: obs})
	ctx := context.Background()
	key := testKey(t)
	a, err := holder.TryAcquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, key, time.Minute)
		done <- err
	}()
	<-contended // the first attempt failed: the waiter waits
	if err := waiter.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire: %v, want ErrClosed", err)
	}
}

// TestRedlockRetriedScripts: a round-one script that runs twice for the
// same attempt (go-redis re-sent it after a lost reply) is recognised as
// the attempt's own, the raise is idempotent, and a second release of the
// same owner still reports 1.
func TestRedlockRetriedScripts(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r := g.redlock(nil)
	ctx := context.Background()
	keys, _ := makeKeys(DefaultPrefix, "retried")
	const ttl = 5 * time.Second
	first := r.acquireNode(ctx, 0, keys, "owner-a", ttl)
	again := r.acquireNode(ctx, 0, keys, "owner-a", ttl)
	other := r.acquireNode(ctx, 0, keys, "owner-b", ttl)
	if !first.ok || !again.ok || again.n < first.n || other.ok || other.pttl <= 0 {
		t.Fatalf("acquire %+v, retried %+v, other owner %+v", first, again, other)
	}
	for range 2 {
		if rep := r.raiseNode(ctx, 0, keys, "owner-a", again.n+1e9, ttl); !rep.ok {
			t.Fatalf("raise: %+v", rep)
		}
	}
	if n, _ := g.clients[0].HGet(ctx, keys.Fence, "n").Uint64(); n != again.n+1e9 {
		t.Errorf("counter after two raises = %d, want %d", n, again.n+1e9)
	}
	if rep := r.raiseNode(ctx, 0, keys, "owner-b", again.n+2e9, ttl); rep.ok {
		t.Error("a raise by an owner without the lease succeeded")
	}
	for i := range 2 {
		if rep := r.releaseNode(ctx, 0, keys, "owner-a"); !rep.ok {
			t.Errorf("release %d: %+v", i, rep)
		}
	}
	if rep := r.releaseNode(ctx, 0, keys, "owner-b"); rep.ok {
		t.Error("a release by another owner succeeded")
	}
}

func second[T any](_ T, err error) error { return err }

// TestRedlockKeepAliveCapEndsTheHoldingBeforeTheFirstRenewal: the cap of
// RedlockLease.KeepAlive holds for a cap before the first renewal: Lost
// closes and Deadline is at the cap (the masters' keys, which Redlock
// never shortens, live to the lease's end, as its godoc says).
func TestRedlockKeepAliveCapEndsTheHoldingBeforeTheFirstRenewal(t *testing.T) {
	t.Parallel()
	g := startRedlockRig(t, 3)
	r := g.redlock(nil)
	ctx := context.Background()
	lease, err := r.TryAcquire(ctx, testKey(t), 6*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	checkCapEndsHolding(t, lease, lease.life.Acquired(), 300*time.Millisecond)
}
