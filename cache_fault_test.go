package herd

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

// shortTimeouts makes a client notice a dead or paused Redis quickly.
func shortTimeouts(o *redis.Options) {
	o.DialTimeout = 200 * time.Millisecond
	o.ReadTimeout = 200 * time.Millisecond
	o.WriteTimeout = 200 * time.Millisecond
	o.MaxRetries = -1
}

// D13: Redis down is not an outage. The Cache fails open to local loads,
// one per key per process, and recovers by itself when Redis is back.
func TestCacheRedisDownFailOpen(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t, shortTimeouts)
	c := newTestCache(t, rdb, &Options{BreakerThreshold: 2, BreakerCooldown: 100 * time.Millisecond})
	ctx := context.Background()
	var calls atomic.Int64
	slow := func(context.Context) ([]byte, error) {
		calls.Add(1)
		time.Sleep(50 * time.Millisecond)
		return []byte("v"), nil
	}

	srv.Stop(t)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			v, err := c.Get(ctx, "down", time.Minute, slow)
			if err != nil || string(v) != "v" {
				t.Errorf("Get with Redis down = (%q, %v), want a local load", v, err)
			}
		})
	}
	wg.Wait()
	if n := calls.Load(); n < 1 || n > 2 {
		// 20 callers share one local flight; a second one can start only
		// if the first finished before the last caller arrived.
		t.Errorf("origin calls with Redis down = %d, want 1 (local coalescing)", n)
	}
	// Many keys with Redis down: the breaker opens and flights skip Redis.
	for i := range 5 {
		if _, err := c.Get(ctx, "down-"+string(rune('a'+i)), time.Minute, slow); err != nil {
			t.Errorf("Get: %v", err)
		}
	}
	s := c.Stats()
	if s.FailOpen == 0 || s.BreakerOpens == 0 {
		t.Errorf("Stats = %+v, want fail-open loads and an opened breaker", s)
	}

	srv.Restart(t)
	// The same Cache recovers: after the cooldown a probe closes the
	// breaker and values are stored again.
	waitFor(t, 5*time.Second, "the cache to store values again", func() bool {
		_, err := c.Get(ctx, "back", time.Minute, slow)
		return err == nil && rdb.Exists(ctx, mustKeys(t, "back").Value).Val() == 1
	})
	before := calls.Load()
	for range 3 {
		if v, err := c.Get(ctx, "back", time.Minute, slow); err != nil || string(v) != "v" {
			t.Errorf("Get after recovery = (%q, %v)", v, err)
		}
	}
	if calls.Load() != before {
		t.Errorf("hits after recovery called the origin %d times", calls.Load()-before)
	}
}

// FailClosed returns ErrUnavailable within the client's timeouts.
func TestCacheRedisDownFailClosed(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t, shortTimeouts)
	c := newTestCache(t, rdb, &Options{FailClosed: true})
	srv.Stop(t)
	var calls atomic.Int64
	start := time.Now()
	_, err := c.Get(context.Background(), "k", time.Minute, constLoader(&calls, "v"))
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Get with Redis down and FailClosed: got %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("FailClosed error after %v, want within the client's timeouts", d)
	}
	if calls.Load() != 0 {
		t.Errorf("the loader ran with FailClosed")
	}
}

// D13: a paused (unresponsive) Redis: callers return within the client's
// read timeout plus the load.
func TestCacheRedisPaused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t, shortTimeouts)
	c := newTestCache(t, rdb, nil)
	srv.Pause(t)
	defer srv.Resume(t)
	var calls atomic.Int64
	start := time.Now()
	v, err := c.Get(context.Background(), "k", time.Minute, constLoader(&calls, "v"))
	if err != nil || string(v) != "v" {
		t.Errorf("Get with Redis paused = (%q, %v), want a local load", v, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Get took %v with Redis paused, want about the 200ms read timeout", d)
	}
}

// Followers still get the value when their pub/sub connection is killed
// while they wait: go-redis reconnects and resubscribes, and the
// confirmation makes them look again (or their poll does).
func TestCachePubSubKilled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	key := "pubsub-killed"
	g := newGatedLoader("value")
	leader := newTestCache(t, srv.Client(t), nil)
	go leader.Get(ctx, key, time.Minute, g.load)
	g.waitEntered(t)

	const n = 3
	res := make(chan []byte, n)
	for range n {
		f := newTestCache(t, srv.Client(t), &Options{WaitTimeout: 30 * time.Second})
		go func() {
			v, _ := f.Get(ctx, key, time.Minute, g.load)
			res <- v
		}()
	}
	b := backend{name: "redis", rdb: admin}
	waitSubscribedTB(t, b, mustKeys(t, key).Channel, n)
	killed, err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
	if err != nil || killed < n {
		t.Fatalf("CLIENT KILL TYPE pubsub killed %d (%v), want %d", killed, err, n)
	}
	close(g.gate)
	for range n {
		select {
		case v := <-res:
			if string(v) != "value" {
				t.Errorf("follower got %q, want %q", v, "value")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a follower did not get the value after its pub/sub connection was killed")
		}
	}
	if calls := g.calls.Load(); calls != 1 {
		t.Errorf("origin calls = %d, want 1", calls)
	}
}

// D04: a leader that dies without releasing blocks the key for its lease
// and no longer: a waiting caller takes over and loads.
func TestCacheTakeoverFromDeadLeader(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	const lease = 400 * time.Millisecond
	key := "dead-leader"
	// The dead leader: it took the lease and will never commit or release.
	dead := NewLocker(rdb, nil)
	defer dead.Close()
	corpse, err := dead.TryAcquire(ctx, key, lease)
	if err != nil {
		t.Fatal(err)
	}
	corpse.life.StopExpiry()
	start := time.Now()
	c := newTestCache(t, rdb, &Options{WaitTimeout: 10 * lease})
	var calls atomic.Int64
	v, err := c.Get(ctx, key, time.Minute, constLoader(&calls, "rebuilt"))
	if err != nil || string(v) != "rebuilt" {
		t.Fatalf("Get = (%q, %v), want a takeover load", v, err)
	}
	if d := time.Since(start); d < lease-2*time.Millisecond || d > 3*lease {
		t.Errorf("took over after %v, want just after the dead leader's %v lease", d, lease)
	}
	if s := c.Stats(); s.Takeovers != 1 || s.Loads != 1 {
		t.Errorf("Stats = %+v, want one takeover and one load", s)
	}
}

// D11: the lease vanishes on the server while A loads (a premature expiry);
// B takes over and writes; A's later commit is fenced, and the stored
// value is B's, with the higher fence.
func TestCachePrematureLeaseExpiry(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	key := "premature"
	keys := mustKeys(t, key)
	a := newTestCache(t, srv.Client(t), nil)
	b := newTestCache(t, srv.Client(t), nil)
	ga := newGatedLoader("from A")
	aDone := make(chan struct{})
	go func() {
		a.Get(ctx, key, time.Minute, ga.load)
		close(aDone)
	}()
	ga.waitEntered(t)
	if err := rdb.Del(ctx, keys.Lease).Err(); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	if v, err := b.Get(ctx, key, time.Minute, constLoader(&calls, "from B")); err != nil || string(v) != "from B" {
		t.Fatalf("B: Get = (%q, %v), want its own load", v, err)
	}
	close(ga.gate)
	<-aDone
	if s := a.Stats(); s.Fenced != 1 {
		t.Errorf("A's Stats.Fenced = %d, want 1", s.Fenced)
	}
	env, ok := wire.DecodeEnvelope([]byte(rdb.Get(ctx, keys.Value).Val()))
	if !ok || string(env.Payload) != "from B" {
		t.Fatalf("stored value = %q (ok %v), want B's", env.Payload, ok)
	}
	if n, _ := rdb.HGet(ctx, keys.Fence, "n").Uint64(); env.Fence != n {
		t.Errorf("stored fence %d, want the highest issued %d", env.Fence, n)
	}
}

// D14: Redis restarts empty while A rebuilds; B rebuilds after the restart
// and writes; A's commit must not overwrite it (the fence counter was
// re-seeded from the Redis clock, above every earlier token).
func TestCacheRedisRestartMidRebuild(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()
	key := "restart"
	keys := mustKeys(t, key)
	a := newTestCache(t, srv.Client(t), nil)
	b := newTestCache(t, srv.Client(t), nil)
	ga := newGatedLoader("from A")
	aDone := make(chan struct{})
	go func() {
		a.Get(ctx, key, time.Minute, ga.load)
		close(aDone)
	}()
	ga.waitEntered(t)
	srv.Restart(t)
	var calls atomic.Int64
	waitFor(t, 5*time.Second, "B to rebuild after the restart", func() bool {
		v, err := b.Get(ctx, key, time.Minute, constLoader(&calls, "from B"))
		return err == nil && string(v) == "from B" && b.Stats().Leads == 1
	})
	close(ga.gate)
	<-aDone
	rdb := srv.Client(t)
	env, ok := wire.DecodeEnvelope([]byte(rdb.Get(ctx, keys.Value).Val()))
	if !ok || string(env.Payload) != "from B" {
		t.Fatalf("stored value = %q (ok %v), want B's", env.Payload, ok)
	}
	if s := a.Stats(); s.Fenced+s.CommitErrors != 1 {
		t.Errorf("A's commit: Stats = %+v, want it fenced", s)
	}
}

// noPubSub is a client whose pub/sub never connects: followers on it
// wait by polling.
type noPubSub struct {
	*redis.Client
	dead *redis.Client
}

func (n noPubSub) Subscribe(ctx context.Context, channels ...string) *redis.PubSub {
	return n.dead.Subscribe(ctx, channels...)
}

// A follower that cannot hear the failure message (no pub/sub) still
// learns that the leader it waited for failed, from the failure marker,
// instead of taking the lease over and calling the failing source again.
func TestCacheFollowerWithoutPubSubLearnsFailure(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const lease = 2 * time.Second
	opt := &Options{MinLease: lease, MaxLease: lease, DefaultLease: lease, WaitTimeout: 5 * lease,
		PollMin: 20 * time.Millisecond, PollMax: 50 * time.Millisecond}
	leader := newTestCache(t, srv.Client(t), opt)
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { dead.Close() })
	follower := newTestCache(t, noPubSub{Client: srv.Client(t), dead: dead}, opt)
	ctx := context.Background()
	var calls atomic.Int64
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	failing := func(context.Context) ([]byte, error) {
		calls.Add(1)
		entered <- struct{}{}
		<-gate
		return nil, errors.New("origin down")
	}
	go leader.Get(ctx, "k", time.Minute, failing)
	<-entered
	res := make(chan error, 1)
	go func() {
		_, err := follower.Get(ctx, "k", time.Minute, failing)
		res <- err
	}()
	waitFor(t, 5*time.Second, "the follower to wait", func() bool { return follower.Stats().Waits == 1 })
	start := time.Now()
	close(gate)
	select {
	case err := <-res:
		if !errors.Is(err, ErrLoadFailed) || !strings.Contains(err.Error(), "origin down") {
			t.Errorf("follower: got %v, want ErrLoadFailed with the leader's error", err)
		}
		if d := time.Since(start); d > lease/2 {
			t.Errorf("the follower learned of the failure after %v, want well within the %v lease", d, lease)
		}
	case <-time.After(5 * lease):
		t.Fatal("the follower did not return")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("source calls = %d, want 1 (the follower must not take over and call the failing source)", n)
	}
	// It looked by polling, or when its failed subscription told it to
	// look: either way not by the failure message it cannot receive.
	if s := follower.Stats(); s.Notified != 0 {
		t.Errorf("follower Stats = %+v, want no wake-up message (it has no pub/sub)", s)
	}
}
