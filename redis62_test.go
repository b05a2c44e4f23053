package herd

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Redis 6.2, as far as a redis-server 7.0 can stand in for it: the
// servers of these tests lack every command 7.0 added (renamed away by
// redistest.Without70Commands), SPUBLISH and SSUBSCRIBE among them.

// keyPerMaster returns one key of prefix on each master of the cluster.
func keyPerMaster(t *testing.T, cc *redis.ClusterClient, prefix string) []string {
	t.Helper()
	ctx := context.Background()
	seen := map[string]bool{}
	var keys []string
	for i := 0; i < 1000 && len(seen) < 3; i++ {
		k := fmt.Sprintf("k%d", i)
		m, err := cc.MasterForKey(ctx, channelOf(t, prefix, k))
		if err != nil {
			t.Fatal(err)
		}
		if addr := m.Options().Addr; !seen[addr] {
			seen[addr] = true
			keys = append(keys, k)
		}
	}
	if len(seen) < 3 {
		t.Fatalf("keys on %d masters, want 3", len(seen))
	}
	return keys
}

// A 3-master cluster without sharded pub/sub: two Caches on clients of
// their own (as two processes would be) make a cold wave on keys of every
// master. Each key is loaded once, by the leader's Cache, and every
// follow ends by the leader's message (plain PUBLISH, which the cluster
// carries to every node), not by a poll: PollMax is a minute and the
// leader's lease five seconds.
func TestRedis62ClusterColdWave(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, redistest.Without70Commands()...)
	ctx := context.Background()
	const prefix = "c62"
	leader := newTestCache(t, cl.Client(t), psOptions(prefix))
	frdb := cl.Client(t)
	looks := countAcquires(frdb)
	follower := newTestCache(t, frdb, psOptions(prefix))
	for name, c := range map[string]*Cache{"leader": leader, "follower": follower} {
		if c.notify.PublishCmd(ctx) != "PUBLISH" {
			t.Fatalf("%s: the scripts publish with %s, want PUBLISH", name, c.notify.PublishCmd(ctx))
		}
	}
	keys := keyPerMaster(t, cl.Client(t), prefix)

	release := make(chan struct{})
	var leads, follows []<-chan followed
	for _, k := range keys {
		l, f := leadAndFollow(t, leader, follower, k, release, []byte("v-"+k))
		leads, follows = append(leads, l), append(follows, f)
	}
	// Two looks per key (the first, and the one the confirmation
	// starts): the follower now hears every message.
	firstLooks := make([]int, len(keys))
	for i := range firstLooks {
		firstLooks[i] = 1
	}
	looks.waitLooked(t, prefix, firstLooks, keys...)
	close(release)
	for i, k := range keys {
		if r := receive(t, leads[i], "a leader"); r.err != nil {
			t.Errorf("%s: leader: %v", k, r.err)
		}
		r := receive(t, follows[i], "a follower")
		if r.err != nil || string(r.val) != "v-"+k || r.out != OutcomeFollower {
			t.Errorf("%s: follower: (%q, %v, %v), want (%q, nil, follower)", k, r.val, r.err, r.out, "v-"+k)
		}
	}
	ls, fs := leader.Stats(), follower.Stats()
	if ls.Loads != uint64(len(keys)) || fs.Loads != 0 || fs.LocalLoads != 0 || ls.LocalLoads != 0 {
		t.Errorf("loads: leader %d (+%d local), follower %d (+%d local); want %d, 0, 0, 0", ls.Loads, ls.LocalLoads, fs.Loads, fs.LocalLoads, len(keys))
	}
	if fs.Waits != uint64(len(keys)) || fs.Notified != uint64(len(keys)) || fs.Polled != 0 {
		t.Errorf("follower: %d follows, %d ended by a wake-up, %d polls; want %d, %d, 0 (stats %+v)", fs.Waits, fs.Notified, fs.Polled, len(keys), len(keys), fs)
	}
}

// A single server without the 7.0 commands: a Cache's Get (a miss, a
// follow woken by another Cache's message, a hit), Set, Invalidate and
// Inspect, a Locker waiter woken by the holder's release, a FencedStore,
// and a Redlock over three such servers.
func TestRedis62Server(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Without70Commands()...)
	ctx := context.Background()
	c1 := newTestCache(t, srv.Client(t), psOptions("s62"))
	rdb2 := srv.Client(t)
	looks := countAcquires(rdb2)
	c2 := newTestCache(t, rdb2, psOptions("s62"))

	// A cold key: c1 leads, c2 follows and is woken by the message.
	release := make(chan struct{})
	l, f := leadAndFollow(t, c1, c2, "k", release, []byte("v1"))
	in, err := c1.Inspect(ctx, "k")
	if err != nil || in.Lease == nil || in.Lease.TTL <= 0 || in.Value != nil {
		t.Fatalf("Inspect during the load: %+v, %v; want a lease and no value", in, err)
	}
	looks.waitLooked(t, "s62", []int{1}, "k") // subscribed, as in the cluster test
	close(release)
	if r := receive(t, l, "the leader"); r.err != nil || string(r.val) != "v1" {
		t.Fatalf("leader: %q, %v", r.val, r.err)
	}
	if r := receive(t, f, "the follower"); r.err != nil || string(r.val) != "v1" || r.out != OutcomeFollower {
		t.Fatalf("follower: %q, %v, %v", r.val, r.err, r.out)
	}
	if s := c2.Stats(); s.Notified != 1 || s.Polled != 0 {
		t.Errorf("follower stats %+v: the follow did not end by the message", s)
	}
	if v, err := c2.Get(ctx, "k", time.Minute, failLoad); err != nil || string(v) != "v1" {
		t.Errorf("hit: %q, %v", v, err)
	}

	if err := c1.Set(ctx, "k", []byte("v2"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if v, err := c2.Get(ctx, "k", time.Minute, failLoad); err != nil || string(v) != "v2" {
		t.Errorf("after Set: %q, %v", v, err)
	}
	in, err = c2.Inspect(ctx, "k")
	if err != nil || in.Value == nil || in.Value.Bytes != 2 || in.Value.TTL <= 0 || in.Lease != nil || in.Fence == 0 {
		t.Errorf("Inspect after Set: %+v, %v", in, err)
	}
	if err := c1.Invalidate(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if v, err := c2.Get(ctx, "k", time.Minute, func(context.Context) ([]byte, error) { return []byte("v3"), nil }); err != nil || string(v) != "v3" {
		t.Errorf("after Invalidate: %q, %v", v, err)
	}

	// A Locker waiter polls once a minute: only the release's message
	// (or its subscription's confirmation) ends its wait sooner.
	lopt := &LockerOptions{Prefix: "s62", PollMin: time.Minute, PollMax: time.Minute, MaxWait: 5 * time.Minute}
	holder, waiter := NewLocker(srv.Client(t), lopt), NewLocker(srv.Client(t), lopt)
	t.Cleanup(func() { holder.Close(); waiter.Close() })
	a, err := holder.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		b, err := waiter.Acquire(ctx, "job", time.Minute)
		if err == nil {
			err = b.Release(ctx)
		}
		got <- err
	}()
	job, err := makeKeys("s62", "job")
	if err != nil {
		t.Fatal(err)
	}
	direct := srv.Client(t)
	waitFor(t, 10*time.Second, "the waiter to subscribe", func() bool {
		n, err := direct.PubSubNumSub(ctx, job.Channel).Result()
		return err == nil && n[job.Channel] == 1
	})
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter was not woken by the release (its poll is a minute)")
	}

	fs := NewFencedStore(srv.Client(t), "s62")
	if err := fs.Set(ctx, "rec", 7, []byte("r7"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := fs.Set(ctx, "rec", 6, []byte("r6"), time.Minute); !errors.Is(err, ErrFenced) {
		t.Errorf("FencedStore.Set with an older token: %v, want ErrFenced", err)
	}
	if v, tok, err := fs.Get(ctx, "rec"); err != nil || string(v) != "r7" || tok != 7 {
		t.Errorf("FencedStore.Get: %q, %d, %v", v, tok, err)
	}

	var nodes []redis.UniversalClient
	for range 3 {
		nodes = append(nodes, redistest.Start(t, redistest.Without70Commands()...).Client(t))
	}
	rl := NewRedlock(nodes, &RedlockOptions{NodeTimeout: testNodeTimeout})
	t.Cleanup(func() { rl.Close() })
	rlease, err := rl.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := rlease.Extend(ctx, time.Minute); err != nil {
		t.Errorf("Redlock Extend: %v", err)
	}
	if err := rlease.Release(ctx); err != nil {
		t.Errorf("Redlock Release: %v", err)
	}
}

// failLoad is a loader that must not run.
func failLoad(context.Context) ([]byte, error) { return nil, errors.New("loaded") }

// Before 7.0, Redis wraps the error of a command a script called in an
// ERR of its own; a READONLY (a master that became a replica, a client
// sent to a replica) must still count as Redis being unable to serve,
// and an ordinary error reply inside a script must stay an answer. The
// texts are those of Redis 6.2's scripting.c.
func TestInfraErrorRedis62ScriptReplies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		msg  string
		want bool
	}{
		{"ERR Error running script (call to f_0c8d8c0b4a35d4e5fd0bd9cd9b0b1f0c53b36e4a): @user_script:12: @user_script: 12: -READONLY You can't write against a read only replica. ", true},
		{"ERR Error running script (call to f_0c8d8c0b4a35d4e5fd0bd9cd9b0b1f0c53b36e4a): @user_script:3: READONLY You can't write against a read only replica.", true},
		{"ERR Error running script (call to f_0c8d8c0b4a35d4e5fd0bd9cd9b0b1f0c53b36e4a): @user_script:5: WRONGTYPE Operation against a key holding the wrong kind of value", false},
		{"ERR Error running script (call to f_0c8d8c0b4a35d4e5fd0bd9cd9b0b1f0c53b36e4a): @user_script:1: @user_script: 1: Unknown Redis command called from Lua script ", false},
		// Redis 7.0's forms.
		{"READONLY You can't write against a read only replica. script: 0c8d8c0b4a35d4e5fd0bd9cd9b0b1f0c53b36e4a, on @user_script:12.", true},
		{"ERR herd commit: invalid value ttl 0", false},
	} {
		if got := isInfraError(replyError(tc.msg)); got != tc.want {
			t.Errorf("isInfraError(%q) = %v, want %v", tc.msg, got, tc.want)
		}
	}
}

// replyError is an error reply as go-redis returns it (a redis.Error).
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}
