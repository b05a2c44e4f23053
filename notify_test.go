package herd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/faultproxy"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// psOptions are Cache options for the pub/sub tests: a leader's lease and
// a follower's budget far longer than the test's steps, so that a follow
// ends by its wake-up (or, when pub/sub is dead, by a poll at the
// holder's lease, seconds later), never by a budget or a takeover.
func psOptions(prefix string) *Options {
	return &Options{
		Prefix:       prefix,
		DefaultLease: 5 * time.Second,
		MaxLease:     10 * time.Second,
		LoadTimeout:  time.Minute,
		WaitTimeout:  time.Minute,
		PollMax:      time.Minute,
	}
}

// gatedLoad is a loader that reports its start and returns val once
// release is closed.
func gatedLoad(started chan<- struct{}, release <-chan struct{}, val []byte) LoadFunc {
	return func(ctx context.Context) ([]byte, error) {
		started <- struct{}{}
		select {
		case <-release:
			return val, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// followed is one follower Get's result.
type followed struct {
	val []byte
	err error
	out Outcome
}

// leadAndFollow starts a leader Get of key on leader, whose loader waits
// for release, and then a follower Get of it on follower; it returns when
// the leader's loader runs. The follower's result arrives on the channel.
func leadAndFollow(t *testing.T, leader, follower *Cache, key string, release <-chan struct{}, val []byte) (lead, follow <-chan followed) {
	t.Helper()
	ctx := context.Background()
	started := make(chan struct{}, 1)
	lc := make(chan followed, 1)
	go func() {
		v, err := leader.Get(ctx, key, time.Minute, gatedLoad(started, release, val))
		lc <- followed{val: v, err: err}
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the leader's loader did not start", key)
	}
	fc := make(chan followed, 1)
	go func() {
		var o Outcome
		v, err := follower.Get(WithOutcome(ctx, &o), key, time.Minute, func(context.Context) ([]byte, error) {
			return nil, errors.New("the follower loaded")
		})
		fc <- followed{val: v, err: err, out: o}
	}()
	return lc, fc
}

// acquires counts, per first key, the scripts a client has run (with
// their replies in): for a follower, its ACQUIREs, one per look.
type acquires struct {
	mu sync.Mutex
	n  map[string]int
}

func countAcquires(rdb redis.UniversalClient) *acquires {
	a := &acquires{n: map[string]int{}}
	// The replica wait sends a script in a pipeline (with WAIT or INFO),
	// so pipelined commands count too.
	rdb.AddHook(cmdHook{after: a.count})
	return a
}

func (a *acquires) count(cmd redis.Cmder) {
	if args := cmd.Args(); len(args) > 3 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") {
		if k, ok := args[3].(string); ok {
			a.mu.Lock()
			a.n[k]++
			a.mu.Unlock()
		}
	}
}

// snapshot returns the counts of the keys' leases.
func (a *acquires) snapshot(t *testing.T, prefix string, keys ...string) []int {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []int
	for _, k := range keys {
		fam, _ := makeKeys(prefix, k)
		out = append(out, a.n[fam.Lease])
	}
	return out
}

// waitLooked waits until the follower has looked at each key again since
// the snapshot (the look a confirmation triggers), so that the look cannot
// overlap the leader's commit and take the value from Redis instead of
// the message.
func (a *acquires) waitLooked(t *testing.T, prefix string, since []int, keys ...string) {
	t.Helper()
	waitFor(t, 10*time.Second, "the follower to look again after the confirmation", func() bool {
		now := a.snapshot(t, prefix, keys...)
		for i := range now {
			if now[i] <= since[i] {
				return false
			}
		}
		return true
	})
}

func receive(t *testing.T, c <-chan followed, what string) followed {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return", what)
		return followed{}
	}
}

// clusterPair finds two keys whose channels are in different slots of one
// master, and returns them with that master's client.
func clusterPair(t *testing.T, cc *redis.ClusterClient, prefix string) (k1, k2 string, master *redis.Client) {
	t.Helper()
	ctx := context.Background()
	info := func(k string) (int64, string) {
		fam, err := makeKeys(prefix, k)
		if err != nil {
			t.Fatal(err)
		}
		slot, err := cc.ClusterKeySlot(ctx, fam.Channel).Result()
		if err != nil {
			t.Fatal(err)
		}
		m, err := cc.MasterForKey(ctx, fam.Channel)
		if err != nil {
			t.Fatal(err)
		}
		return slot, m.Options().Addr
	}
	k1 = "pair-0"
	slot1, addr := info(k1)
	for i := 1; i < 1000; i++ {
		k := "pair-" + strconv.Itoa(i)
		if slot, a := info(k); a == addr && slot != slot1 {
			m, err := cc.MasterForKey(ctx, channelOf(t, prefix, k1))
			if err != nil {
				t.Fatal(err)
			}
			return k1, k, m
		}
	}
	t.Fatal("no two keys in different slots of one master")
	return "", "", nil
}

func channelOf(t *testing.T, prefix, key string) string {
	t.Helper()
	fam, err := makeKeys(prefix, key)
	if err != nil {
		t.Fatal(err)
	}
	return fam.Channel
}

// waitShardSubscribed waits until the master reports one subscriber of
// every channel (PUBSUB SHARDNUMSUB).
func waitShardSubscribed(t *testing.T, m *redis.Client, d time.Duration, what string, channels ...string) {
	t.Helper()
	var last map[string]int64
	ok := until(d, func() bool {
		n, err := m.PubSubShardNumSub(context.Background(), channels...).Result()
		if err != nil {
			return false
		}
		last = n
		for _, ch := range channels {
			if n[ch] != 1 {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("%s: the channels are not subscribed on their master within %v (SHARDNUMSUB %v)", what, d, last)
	}
}

// pubsubIDs returns the ids of the master's pub/sub clients.
func pubsubIDs(t *testing.T, m *redis.Client) map[string]bool {
	t.Helper()
	list, err := m.Do(context.Background(), "CLIENT", "LIST", "TYPE", "pubsub").Text()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		for f := range strings.FieldsSeq(line) {
			if id, ok := strings.CutPrefix(f, "id="); ok {
				ids[id] = true
			}
		}
	}
	return ids
}

// On Redis Cluster 7+, a follower's pub/sub connection to a master that
// carries channels of two slots is killed (CLIENT KILL TYPE pubsub) while
// both follows wait. The subscriptions must come back (go-redis's own
// resubscription sends both channels in one SSUBSCRIBE, which the server
// rejects with CROSSSLOT), and both follows must end by their wake-up
// message (Stats.Notified), not by a poll.
func TestShardedPubSubResubscribesAfterKill(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	direct := cl.Client(t)
	const prefix = "psk"
	leader := New(cl.Client(t), psOptions(prefix))
	frdb := cl.Client(t)
	looks := countAcquires(frdb)
	follower := New(frdb, psOptions(prefix))
	t.Cleanup(func() { leader.Close(); follower.Close() })
	if follower.notify.PublishCmd(ctx) != "SPUBLISH" {
		t.Fatal("the cluster does not use sharded pub/sub")
	}
	k1, k2, master := clusterPair(t, direct, prefix)
	ch1, ch2 := channelOf(t, prefix, k1), channelOf(t, prefix, k2)

	release := make(chan struct{})
	l1, f1 := leadAndFollow(t, leader, follower, k1, release, []byte("v1"))
	l2, f2 := leadAndFollow(t, leader, follower, k2, release, []byte("v2"))
	waitShardSubscribed(t, master, 10*time.Second, "before the kill", ch1, ch2)
	// Each follower's first ACQUIRE, and the look the confirmation
	// triggers.
	looks.waitLooked(t, prefix, []int{1, 1}, k1, k2)
	since := looks.snapshot(t, prefix, k1, k2)

	before := pubsubIDs(t, master)
	if err := master.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the killed connection to be gone", func() bool {
		for id := range pubsubIDs(t, master) {
			if before[id] {
				return false
			}
		}
		return true
	})
	waitShardSubscribed(t, master, 10*time.Second, "after the kill", ch1, ch2)
	looks.waitLooked(t, prefix, since, k1, k2)

	notified := follower.Stats().Notified
	close(release)
	for i, c := range []<-chan followed{f1, f2} {
		r := receive(t, c, "a follower")
		if want := fmt.Sprintf("v%d", i+1); r.err != nil || string(r.val) != want {
			t.Errorf("follower %d: (%q, %v), want %q", i+1, r.val, r.err, want)
		}
	}
	for _, c := range []<-chan followed{l1, l2} {
		if r := receive(t, c, "a leader"); r.err != nil {
			t.Errorf("leader: %v", r.err)
		}
	}
	if got := follower.Stats().Notified - notified; got != 2 {
		t.Errorf("after the kill, %d of 2 follows ended by a wake-up (stats %+v)", got, follower.Stats())
	}
}

// The same with the pub/sub output-buffer limit: a value published inline
// that is larger than the limit makes the master drop the follower's
// connection. The subscription of the other key (another slot) must come
// back, and its follow must end by its wake-up.
func TestShardedPubSubResubscribesAfterOutputBufferLimit(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	direct := cl.Client(t)
	const prefix = "psb"
	opt := psOptions(prefix)
	opt.NotifyMaxBytes = 256 << 10
	leader := New(cl.Client(t), opt)
	frdb := cl.Client(t)
	looks := countAcquires(frdb)
	follower := New(frdb, opt)
	t.Cleanup(func() { leader.Close(); follower.Close() })
	k1, k2, master := clusterPair(t, direct, prefix)
	ch1, ch2 := channelOf(t, prefix, k1), channelOf(t, prefix, k2)
	if err := master.ConfigSet(ctx, "client-output-buffer-limit", "pubsub 16384 0 0").Err(); err != nil {
		t.Fatal(err)
	}

	big := []byte(strings.Repeat("x", 128<<10))
	release1, release2 := make(chan struct{}), make(chan struct{})
	l1, f1 := leadAndFollow(t, leader, follower, k1, release1, big)
	l2, f2 := leadAndFollow(t, leader, follower, k2, release2, []byte("small"))
	waitShardSubscribed(t, master, 10*time.Second, "before the large message", ch1, ch2)
	looks.waitLooked(t, prefix, []int{1, 1}, k1, k2)
	since := looks.snapshot(t, prefix, k2)

	before := pubsubIDs(t, master)
	close(release1)
	if r := receive(t, l1, "the leader of the large value"); r.err != nil {
		t.Fatal(r.err)
	}
	waitFor(t, 10*time.Second, "the master to drop the connection over its output-buffer limit", func() bool {
		for id := range pubsubIDs(t, master) {
			if before[id] {
				return false
			}
		}
		return true
	})
	if r := receive(t, f1, "the follower of the large value"); r.err != nil || len(r.val) != len(big) {
		t.Errorf("follower of the large value: %d bytes, %v", len(r.val), r.err)
	}
	waitShardSubscribed(t, master, 10*time.Second, "after the disconnect", ch2)
	looks.waitLooked(t, prefix, since, k2)

	notified := follower.Stats().Notified
	close(release2)
	if r := receive(t, f2, "the follower"); r.err != nil || string(r.val) != "small" {
		t.Errorf("follower: (%q, %v), want \"small\"", r.val, r.err)
	}
	if r := receive(t, l2, "the leader"); r.err != nil {
		t.Errorf("leader: %v", r.err)
	}
	if got := follower.Stats().Notified - notified; got != 1 {
		t.Errorf("after the disconnect the follow did not end by its wake-up (stats %+v)", follower.Stats())
	}
}

// A *redis.Ring of two real servers: Locker.Acquire waits without a panic
// (Ring.Subscribe panics without channels) and gets the lease after the
// release; followers of keys on either shard are woken by the leader's
// message, which the scripts publish on the shard that holds the key (the
// channel has the key's hash tag); Close returns.
func TestRingPubSub(t *testing.T) {
	t.Parallel()
	s1, s2 := redistest.Start(t), redistest.Start(t)
	ring := func() *redis.Ring {
		r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": s1.Addr(), "b": s2.Addr()}})
		t.Cleanup(func() { r.Close() })
		return r
	}
	ctx := context.Background()
	const prefix = "ring"
	r1, r2 := ring(), ring()

	// One key on each shard; each key's names and channel on one shard.
	keys := map[string]string{}
	for i := 0; len(keys) < 2 && i < 1000; i++ {
		k := "rk-" + strconv.Itoa(i)
		fam, err := makeKeys(prefix, k)
		if err != nil {
			t.Fatal(err)
		}
		lease, err := r1.GetShardClientForKey(fam.Lease)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := r1.GetShardClientForKey(fam.Channel)
		if err != nil {
			t.Fatal(err)
		}
		if lease.Options().Addr != ch.Options().Addr {
			t.Fatalf("key %s: lease on %s, channel on %s", k, lease.Options().Addr, ch.Options().Addr)
		}
		if _, ok := keys[lease.Options().Addr]; !ok {
			keys[lease.Options().Addr] = k
		}
	}
	if len(keys) != 2 {
		t.Fatalf("keys on %d shards, want 2", len(keys))
	}

	// Locker.Acquire waits for the holder's release.
	holder := NewLocker(r1, &LockerOptions{Prefix: prefix})
	waiter := NewLocker(r2, &LockerOptions{Prefix: prefix})
	t.Cleanup(func() { holder.Close(); waiter.Close() })
	for _, k := range keys {
		l, err := holder.TryAcquire(ctx, k, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			wl, err := waiter.Acquire(ctx, k, time.Minute)
			if err == nil {
				err = wl.Release(ctx)
			}
			got <- err
		}()
		shard, _ := r1.GetShardClientForKey(channelOf(t, prefix, k))
		waitFor(t, 10*time.Second, "the waiter's subscription", func() bool {
			n, err := shard.PubSubNumSub(ctx, channelOf(t, prefix, k)).Result()
			return err == nil && n[channelOf(t, prefix, k)] == 1
		})
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Errorf("Acquire on a Ring: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Acquire on a Ring did not return after the release")
		}
	}

	// Followers of both shards' keys are woken by the message.
	frdb := ring()
	looks := countAcquires(frdb)
	leader, follower := New(ring(), psOptions(prefix)), New(frdb, psOptions(prefix))
	t.Cleanup(func() { leader.Close(); follower.Close() })
	release := make(chan struct{})
	var leads, follows []<-chan followed
	var ks []string
	for _, k := range keys {
		ks = append(ks, k)
		l, f := leadAndFollow(t, leader, follower, k, release, []byte("v-"+k))
		leads, follows = append(leads, l), append(follows, f)
		shard, _ := r1.GetShardClientForKey(channelOf(t, prefix, k))
		waitFor(t, 10*time.Second, "the follower's subscription", func() bool {
			n, err := shard.PubSubNumSub(ctx, channelOf(t, prefix, k)).Result()
			return err == nil && n[channelOf(t, prefix, k)] == 1
		})
	}
	looks.waitLooked(t, prefix, []int{1, 1}, ks...)
	close(release)
	for _, c := range append(leads, follows...) {
		if r := receive(t, c, "a Get"); r.err != nil || !strings.HasPrefix(string(r.val), "v-") {
			t.Errorf("Get on a Ring: (%q, %v)", r.val, r.err)
		}
	}
	if s := follower.Stats(); s.Notified != 2 {
		t.Errorf("%d of 2 follows on a Ring ended by a wake-up (stats %+v)", s.Notified, s)
	}
	for _, c := range []interface{ Close() error }{leader, follower, holder, waiter} {
		done := make(chan error, 1)
		go func() { done <- c.Close() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Close: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close hangs")
		}
	}
}

// hangingPubSub returns a client of srv whose first connection goes to
// the server and every later one (the pub/sub connection) to a proxy
// that swallows everything: its handshake gets no answer until the
// client's long timeouts.
func hangingPubSub(t *testing.T, srv *redistest.Server) (*redis.Client, *faultproxy.Proxy) {
	t.Helper()
	p, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetBlackhole(true)
	var dials atomic.Int64
	rdb := srv.Client(t, func(o *redis.Options) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 20*time.Second, 20*time.Second, 20*time.Second
		o.PoolSize, o.MinIdleConns = 1, 0
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) > 1 {
				addr = p.Addr()
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	})
	return rdb, p
}

// A waiter's subscribe honours its ctx: Acquire with a short deadline
// returns soon after it, with ErrLeaseHeld and the deadline, while the
// pub/sub connection's handshake hangs; so does a second waiter that
// finds the connection still being created by a first waiter with no
// deadline. Neither leaves a subscription registered.
func TestSubscribeHonoursCtx(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()
	rdb, proxy := hangingPubSub(t, srv)
	const prefix = "hang"
	holder := NewLocker(srv.Client(t), &LockerOptions{Prefix: prefix})
	t.Cleanup(func() { holder.Close() })
	// No replica wait: its INFO would dial the connection this test
	// reserves for pub/sub (the server has no replicas anyway).
	waiter := NewLocker(rdb, &LockerOptions{Prefix: prefix, MaxWait: time.Minute, ReplicaAcks: -1})
	for _, k := range []string{"h1", "h2", "h3"} {
		l, err := holder.TryAcquire(ctx, k, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Release(ctx) })
	}
	// Make sure the waiter's one pooled connection is open before the
	// pub/sub connection is dialled.
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	const deadline = 300 * time.Millisecond
	try := func(key string) {
		t.Helper()
		dctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		start := time.Now()
		_, err := waiter.Acquire(dctx, key, time.Minute)
		took := time.Since(start)
		if !errors.Is(err, ErrLeaseHeld) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Acquire(%s): %v, want ErrLeaseHeld and the deadline", key, err)
		}
		if took > 10*deadline {
			t.Errorf("Acquire(%s) with a %v deadline returned after %v, while the pub/sub handshake hangs", key, deadline, took.Round(time.Millisecond))
		}
	}
	try("h1")

	// A first waiter without a deadline is creating the connection.
	first := make(chan error, 1)
	fctx, cancelFirst := context.WithCancel(ctx)
	go func() {
		_, err := waiter.Acquire(fctx, "h2", time.Minute)
		first <- err
	}()
	waitFor(t, 5*time.Second, "the first waiter to register", func() bool {
		return slices.Contains(waiter.notify.Channels(), channelOf(t, prefix, "h2"))
	})
	try("h3")
	cancelFirst()
	select {
	case <-first:
	case <-time.After(10 * deadline):
		t.Error("a waiter whose ctx was cancelled did not return")
	}

	left := len(waiter.notify.Channels())
	if left != 0 {
		t.Errorf("%d subscriptions left registered by waiters that gave up", left)
	}
	proxy.SetBlackhole(false) // let the hanging handshake fail, so Close is quick
	if err := waiter.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
