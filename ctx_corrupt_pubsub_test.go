package herd

// Core promises across features: every call honours its ctx at once,
// corrupt keys are a miss, and pub/sub wake-ups survive disconnects. Each
// test is named after the claim it protects and explains its scenario.

import (
	"bytes"
	"context"
	"errors"
	"hash/maphash"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/faultproxy"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// entryPoint is one public call of the core, run with ctx on a Cache and
// a Locker whose client goes through the rig's proxy, and a lease taken
// before the fault.
type entryPoint struct {
	name string
	call func(ctx context.Context, c *Cache, l *Locker, lease *Lease) error
}

func coreEntryPoints(key string) []entryPoint {
	load := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	return []entryPoint{
		{"Get", func(ctx context.Context, c *Cache, _ *Locker, _ *Lease) error {
			_, err := c.Get(ctx, key+"get", time.Minute, load)
			return err
		}},
		{"Fetch", func(ctx context.Context, c *Cache, _ *Locker, _ *Lease) error {
			_, err := Fetch(ctx, c, key+"fetch", time.Minute, func(context.Context) (string, error) { return "v", nil })
			return err
		}},
		{"GetMany", func(ctx context.Context, c *Cache, _ *Locker, _ *Lease) error {
			_, err := c.GetMany(ctx, []string{key + "many1", key + "many2"}, time.Minute, func(_ context.Context, ks []string) (map[string][]byte, error) {
				return map[string][]byte{ks[0]: []byte("v")}, nil
			})
			return err
		}},
		{"FetchMany", func(ctx context.Context, c *Cache, _ *Locker, _ *Lease) error {
			_, err := FetchMany(ctx, c, []string{key + "fetchmany"}, time.Minute, func(_ context.Context, ks []string) (map[string]string, error) {
				return map[string]string{ks[0]: "v"}, nil
			})
			return err
		}},
		{"Begin", func(ctx context.Context, c *Cache, _ *Locker, _ *Lease) error {
			_, fill, err := c.Begin(ctx, key+"begin", time.Minute, nil)
			if fill != nil {
				fill.Abort(errors.New("test"))
			}
			return err
		}},
		{"Set", func(ctx context.Context, c *Cache, _ *Locker, _ *Lease) error {
			return c.Set(ctx, key+"set", []byte("v"), time.Minute)
		}},
		{"Invalidate", func(ctx context.Context, c *Cache, _ *Locker, _ *Lease) error {
			return c.Invalidate(ctx, key+"inv")
		}},
		{"InvalidateSoft", func(ctx context.Context, c *Cache, _ *Locker, _ *Lease) error {
			return c.InvalidateSoft(ctx, key+"soft")
		}},
		{"Peek", func(ctx context.Context, c *Cache, _ *Locker, _ *Lease) error {
			_, _, err := c.Peek(ctx, key+"peek")
			return err
		}},
		{"Set/tagged", func(ctx context.Context, c *Cache, _ *Locker, _ *Lease) error {
			return c.Set(ctx, key+"settagged", []byte("v"), time.Minute, "t")
		}},
		{"InvalidateTag", func(ctx context.Context, c *Cache, _ *Locker, _ *Lease) error {
			return c.InvalidateTag(ctx, "t")
		}},
		{"Locker.TryAcquire", func(ctx context.Context, _ *Cache, l *Locker, _ *Lease) error {
			_, err := l.TryAcquire(ctx, key+"try", time.Minute)
			return err
		}},
		{"Locker.Acquire", func(ctx context.Context, _ *Cache, l *Locker, _ *Lease) error {
			_, err := l.Acquire(ctx, key+"acq", time.Minute)
			return err
		}},
		{"Lease.Extend", func(ctx context.Context, _ *Cache, _ *Locker, lease *Lease) error {
			return lease.Extend(ctx, time.Minute)
		}},
		{"Lease.Release", func(ctx context.Context, _ *Cache, _ *Locker, lease *Lease) error {
			return lease.Release(ctx)
		}},
	}
}

// TestEveryCallHonoursCtxAtOnce attacks docs/guarantees.md "Failure
// behaviour" ("Pass a context deadline for a hard bound: every call honours it at
// once") and issue 12 defect 5 ("Every entry point honours its caller's
// ctx at once"). Every Redis reply is made 3 s late (or the link is
// blackholed), under a client ReadTimeout of 20 s. Each entry point is
// called with a ctx that ends after 100 ms, either by a deadline or by a
// plain cancel (context.WithCancel: a caller whose request was dropped).
// Each must return ctx's error well before the reply could arrive: the
// bound is 1.5 s (15 × the ctx), half the reply latency.
func TestEveryCallHonoursCtxAtOnce(t *testing.T) {
	const (
		short = 100 * time.Millisecond
		late  = 3 * time.Second
		bound = 1500 * time.Millisecond
	)
	for _, fault := range []string{"latency", "blackhole"} {
		for _, how := range []string{"deadline", "cancel"} {
			t.Run(fault+"/"+how, func(t *testing.T) {
				r := newFaultRig(t)
				to := timeouts{dial: 20 * time.Second, read: 20 * time.Second, write: 20 * time.Second}
				rdb := r.client(to)
				c := r.cache(rdb, &Options{Prefix: "ctx"})
				l := NewLocker(rdb, &LockerOptions{Prefix: "ctxl"})
				t.Cleanup(func() { l.Close() })
				key := "ctx-" + fault + "-" + how + "-"
				// Warm the pub/sub connections and take the leases
				// Extend and Release work on, before the fault.
				if _, err := c.Get(context.Background(), key+"warm", time.Minute, func(context.Context) ([]byte, error) { return []byte("w"), nil }); err != nil {
					t.Fatal(err)
				}
				eps := coreEntryPoints(key)
				leases := map[string]*Lease{}
				for _, ep := range eps {
					lease, err := l.TryAcquire(context.Background(), key+"lease-"+ep.name, time.Minute)
					if err != nil {
						t.Fatal(err)
					}
					leases[ep.name] = lease
				}
				if fault == "latency" {
					r.proxy.SetLatency(faultproxy.Downstream, late)
				} else {
					r.proxy.SetBlackhole(true)
				}
				t.Cleanup(func() {
					r.proxy.SetLatency(faultproxy.Downstream, 0)
					r.proxy.SetBlackhole(false)
					r.proxy.Cut()
				})
				type res struct {
					name string
					err  error
					took time.Duration
				}
				out := make(chan res, len(eps))
				for _, ep := range eps {
					go func() {
						var ctx context.Context
						var cancel context.CancelFunc
						if how == "deadline" {
							ctx, cancel = context.WithTimeout(context.Background(), short)
						} else {
							ctx, cancel = context.WithCancel(context.Background())
							time.AfterFunc(short, cancel)
						}
						defer cancel()
						start := time.Now()
						err := ep.call(ctx, c, l, leases[ep.name])
						out <- res{ep.name, err, time.Since(start)}
					}()
				}
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), short)
					defer cancel()
					start := time.Now()
					err := rdb.Ping(ctx).Err()
					t.Logf("control: the client's own PING with a %v deadline: %v after %v", short, err, time.Since(start).Round(time.Millisecond))
				}()
				for range eps {
					x := <-out
					if x.err == nil {
						t.Errorf("%s (%s, ctx ended by %s after %v): nil error after %v: it waited for Redis past its ctx", x.name, fault, how, short, x.took.Round(time.Millisecond))
						continue
					}
					if x.took > bound {
						t.Errorf("%s (%s, ctx ended by %s after %v) returned after %v (> %v): it waited for Redis, not for its ctx; err: %v",
							x.name, fault, how, short, x.took.Round(time.Millisecond), bound, x.err)
					}
				}
			})
		}
	}
}

// TestCorruptKeysAreAMissAndOverwritten attacks guarantee 6 ("Corrupt or
// foreign bytes at a value key are a miss, counted and overwritten by the
// next rebuild"), and guarantees 1 and 6 for the key's other names: a
// foreign write (a bug elsewhere, a shared Redis, a key-space collision of
// a careless operator) puts garbage at the value, lease or fence key,
// either bytes of the wrong shape or a value of the wrong Redis type. For
// each, Get must return the loader's value with no error and no panic,
// and the rebuild must repair the key: after it, the next Gets are hits
// (1 load for 3 sequential Gets), not a load per Get forever.
func TestCorruptKeysAreAMissAndOverwritten(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	direct := srv.Client(t)
	ctx := context.Background()
	type corruption struct {
		name  string
		apply func(k keyFamily) error
	}
	cases := []corruption{
		{"value/garbage-bytes", func(k keyFamily) error { return direct.Set(ctx, k.Value, "\x00garbage", 0).Err() }},
		{"value/wrong-type-hash", func(k keyFamily) error { return direct.HSet(ctx, k.Value, "a", "b").Err() }},
		{"value/wrong-type-list", func(k keyFamily) error { return direct.RPush(ctx, k.Value, "a").Err() }},
		{"fence/garbage-string", func(k keyFamily) error { return direct.Set(ctx, k.Fence, "garbage", 0).Err() }},
		{"fence/hash-non-numeric", func(k keyFamily) error { return direct.HSet(ctx, k.Fence, "n", "not-a-number", "r", "x").Err() }},
		{"fence/wrong-type-list", func(k keyFamily) error { return direct.RPush(ctx, k.Fence, "a").Err() }},
		{"lease/wrong-type-hash", func(k keyFamily) error { return direct.HSet(ctx, k.Lease, "a", "b").Err() }},
		{"failed/garbage", func(k keyFamily) error { return direct.Set(ctx, k.Failed, "garbage-no-separator", time.Minute).Err() }},
		{"backoff/wrong-type", func(k keyFamily) error { return direct.RPush(ctx, k.Backoff, "a").Err() }},
	}
	for _, cs := range cases {
		t.Run(cs.name, func(t *testing.T) {
			rdb := srv.Client(t)
			c := newTestCache(t, rdb, &Options{Prefix: "corrupt", MinLease: 300 * time.Millisecond, DefaultLease: 300 * time.Millisecond,
				MaxLease: 300 * time.Millisecond, WaitTimeout: time.Second, StaleFor: time.Minute})
			key := "corrupt-" + cs.name
			k, err := makeKeys("corrupt", key)
			if err != nil {
				t.Fatal(err)
			}
			if err := cs.apply(k); err != nil {
				t.Fatal(err)
			}
			var loads int
			for i := range 3 {
				v, err := c.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) {
					loads++
					return []byte("fresh"), nil
				})
				if err != nil || string(v) != "fresh" {
					t.Errorf("Get #%d over corrupt %s = (%q, %v), want (\"fresh\", nil)", i+1, cs.name, v, err)
				}
			}
			if loads != 1 {
				t.Errorf("corrupt %s: 3 sequential Gets made %d loads, want 1: the rebuild did not repair the key (stats %+v)", cs.name, loads, c.Stats())
			}
		})
	}
}

// TestOneCorruptKeyDoesNotTripTheBreakerForAll attacks guarantee 5 (the
// breaker opens on "repeated errors" of Redis, i.e. Redis down) and
// guarantee 1 for healthy keys: Redis is healthy, but one key's fence key
// holds a foreign value of the wrong type, so its scripts fail with
// WRONGTYPE. A few Gets of that key must not be taken for "Redis down":
// a healthy key read afterwards by two Caches must still be rebuilt once
// and then served from Redis (1 load, BreakerOpens 0).
func TestOneCorruptKeyDoesNotTripTheBreakerForAll(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	direct := srv.Client(t)
	ctx := context.Background()
	opt := &Options{Prefix: "trip"}
	c1 := newTestCache(t, srv.Client(t), opt)
	c2 := newTestCache(t, srv.Client(t), opt)
	bad, err := makeKeys("trip", "bad")
	if err != nil {
		t.Fatal(err)
	}
	if err := direct.RPush(ctx, bad.Fence, "foreign").Err(); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		c1.Get(ctx, "bad", time.Minute, func(context.Context) ([]byte, error) { return []byte("x"), nil })
	}
	var loads int
	for _, c := range []*Cache{c1, c2, c1} {
		if _, err := c.Get(ctx, "good", time.Minute, func(context.Context) ([]byte, error) {
			loads++
			return []byte("g"), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if s := c1.Stats(); loads != 1 || s.BreakerOpens != 0 {
		t.Errorf("after 6 Gets of one key with a corrupt fence, a healthy key's 3 Gets made %d loads (want 1), c1 BreakerOpens %d FailOpen %d (want 0): one corrupt key took Redis away from every key",
			loads, s.BreakerOpens, s.FailOpen)
	}
}

// ringKeys returns one key per shard of ring, each with its names and
// channel on one shard, and that shard's address.
func ringKeys(t *testing.T, ring *redis.Ring, prefix string) map[string]string {
	t.Helper()
	keys := map[string]string{}
	for i := 0; len(keys) < 2 && i < 1000; i++ {
		k := "rk-" + strconv.Itoa(i)
		shard, err := ring.GetShardClientForKey(channelOf(t, prefix, k))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := keys[shard.Options().Addr]; !ok {
			keys[shard.Options().Addr] = k
		}
	}
	if len(keys) != 2 {
		t.Fatalf("keys on %d shards, want 2", len(keys))
	}
	return keys
}

// TestRingPubSubResubscribesAfterKill attacks docs/guarantees.md
// "Failure behaviour" ("The pub/sub connection drops (a network error, a killed client, ...):
// the connection comes back by itself and herd subscribes its channels
// again, and the confirmation makes waiters look again") and "Redis Ring"
// ("herd keeps one pub/sub connection per shard") on a Ring of 2 servers.
// Two followers wait on one key of each shard; CLIENT KILL TYPE pubsub
// drops both shards' pub/sub connections. The subscriptions must come
// back, and both follows must end by their wake-up (Stats.Notified), not
// by a poll (PollMax is a minute).
func TestRingPubSubResubscribesAfterKill(t *testing.T) {
	t.Parallel()
	s1, s2 := redistest.Start(t), redistest.Start(t)
	ring := func() *redis.Ring {
		r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": s1.Addr(), "b": s2.Addr()}})
		t.Cleanup(func() { r.Close() })
		return r
	}
	ctx := context.Background()
	const prefix = "ringk"
	r1 := ring()
	keys := ringKeys(t, r1, prefix)
	frdb := ring()
	looks := countAcquires(frdb)
	leader, follower := New(ring(), psOptions(prefix)), New(frdb, psOptions(prefix))
	t.Cleanup(func() { leader.Close(); follower.Close() })
	release := make(chan struct{})
	var leads, follows []<-chan followed
	var ks []string
	numsub := func(k string) int64 {
		shard, _ := r1.GetShardClientForKey(channelOf(t, prefix, k))
		n, err := shard.PubSubNumSub(ctx, channelOf(t, prefix, k)).Result()
		if err != nil {
			return -1
		}
		return n[channelOf(t, prefix, k)]
	}
	for _, k := range keys {
		ks = append(ks, k)
		l, f := leadAndFollow(t, leader, follower, k, release, []byte("v-"+k))
		leads, follows = append(leads, l), append(follows, f)
		waitFor(t, 10*time.Second, "the follower's subscription", func() bool { return numsub(k) == 1 })
	}
	looks.waitLooked(t, prefix, []int{1, 1}, ks...)
	since := looks.snapshot(t, prefix, ks...)
	for _, s := range []*redistest.Server{s1, s2} {
		if err := s.Client(t).Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range ks {
		waitFor(t, 20*time.Second, "the subscription of "+k+" to come back after CLIENT KILL", func() bool { return numsub(k) == 1 })
	}
	looks.waitLooked(t, prefix, since, ks...)
	notified := follower.Stats().Notified
	close(release)
	for _, c := range append(leads, follows...) {
		if r := receive(t, c, "a Get"); r.err != nil || !strings.HasPrefix(string(r.val), "v-") {
			t.Errorf("Get on a Ring: (%q, %v)", r.val, r.err)
		}
	}
	if got := follower.Stats().Notified - notified; got != 2 {
		t.Errorf("after CLIENT KILL TYPE pubsub on a Ring, %d of 2 follows ended by a wake-up (stats %+v)", got, follower.Stats())
	}
	closeWithin(t, 10*time.Second, leader, follower)
}

// closeWithin closes each closer, failing when one takes longer than d.
func closeWithin(t *testing.T, d time.Duration, cs ...interface{ Close() error }) {
	t.Helper()
	for _, c := range cs {
		done := make(chan error, 1)
		go func() { done <- c.Close() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Close: %v", err)
			}
		case <-time.After(d):
			buf := make([]byte, 1<<20)
			t.Fatalf("Close hangs after %v; goroutines:\n%s", d, buf[:runtime.Stack(buf, true)])
		}
	}
}

// TestPubSubWakeUpsResumeAfterRedisRestartOrPause attacks docs/guarantees.md
// "Failure behaviour" (the pub/sub connection comes back by itself) for a
// standalone server that restarts (same port, empty), pauses (SIGSTOP
// for 3 s, longer than the clients' 500 ms ReadTimeout), kills the
// pub/sub clients (CLIENT KILL TYPE pubsub) or drops them at the pub/sub
// output-buffer limit (a 10 KiB inline wake-up over a 4 KiB limit). A wave before the
// fault ends by a wake-up; after it, a wave on a fresh key must end by a
// wake-up again (Stats.Notified), not by a poll (PollMax is a minute).
func TestPubSubWakeUpsResumeAfterAnyDisconnect(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"restart", "pause", "kill", "outbuf"} {
		t.Run(fault, func(t *testing.T) {
			srv := redistest.Start(t)
			to := func(o *redis.Options) {
				o.ReadTimeout, o.WriteTimeout, o.DialTimeout = 500*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
			}
			prefix := "psr" + fault
			frdb := srv.Client(t, to)
			looks := countAcquires(frdb)
			leader, follower := New(srv.Client(t, to), psOptions(prefix)), New(frdb, psOptions(prefix))
			t.Cleanup(func() { leader.Close(); follower.Close() })
			wave := func(key string, val []byte) {
				t.Helper()
				release := make(chan struct{})
				l, f := leadAndFollow(t, leader, follower, key, release, val)
				waitFor(t, 20*time.Second, "the follower's subscription of "+key, func() bool {
					n, err := srv.Client(t).PubSubNumSub(context.Background(), channelOf(t, prefix, key)).Result()
					return err == nil && n[channelOf(t, prefix, key)] >= 1
				})
				looks.waitLooked(t, prefix, []int{1}, key)
				before := follower.Stats().Notified
				close(release)
				for _, c := range []<-chan followed{l, f} {
					if r := receive(t, c, "a Get"); r.err != nil || string(r.val) != string(val) {
						t.Errorf("%s: Get = (%q, %v)", key, r.val, r.err)
					}
				}
				if got := follower.Stats().Notified - before; got != 1 && fault+key != "outbufduring" {
					t.Errorf("%s: the follow was not ended by a wake-up (Notified +%d, stats %+v)", key, got, follower.Stats())
				}
			}
			wave("before", []byte("v"))
			switch fault {
			case "kill":
				if err := srv.Client(t).Do(context.Background(), "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
					t.Fatal(err)
				}
			case "outbuf":
				// A value published inline (10 KiB < NotifyMaxBytes)
				// over the server's pub/sub output-buffer limit: the
				// server drops the follower's connection.
				if err := srv.Client(t).ConfigSet(context.Background(), "client-output-buffer-limit", "pubsub 4096 0 0").Err(); err != nil {
					t.Fatal(err)
				}
				wave("during", bytes.Repeat([]byte("x"), 10<<10))
			case "restart":
				srv.Restart(t)
			case "pause":
				srv.Pause(t)
				time.Sleep(3 * time.Second)
				srv.Resume(t)
			}
			// Let the clients find the server again.
			waitFor(t, 20*time.Second, "Redis back", func() bool {
				_, err := leader.Get(context.Background(), "probe-"+strconv.Itoa(int(time.Now().UnixNano())), time.Minute,
					func(context.Context) ([]byte, error) { return []byte("p"), nil })
				return err == nil
			})
			wave("after", []byte("v"))
			closeWithin(t, 10*time.Second, leader, follower)
		})
	}
}

// TestLoaderPanicOrGoexitReachesOtherProcessesAtOnce attacks guarantee 4
// ("A loader's error or panic reaches every waiter, in every process, as
// an error wrapping ErrLoadFailed ..., releases the lease at once and
// wakes the other processes at once") for a panic and for runtime.Goexit
// in the leader's loader: a follower in another Cache (its own client)
// waits on a 5 s lease with PollMax a minute; it must get ErrLoadFailed
// (a *PanicError for the panic) within 2 s of the leader's end, well
// before the lease could lapse.
func TestLoaderPanicOrGoexitReachesOtherProcessesAtOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, how := range []string{"panic", "goexit"} {
		t.Run(how, func(t *testing.T) {
			prefix := "pg" + how
			frdb := srv.Client(t)
			looks := countAcquires(frdb)
			leader, follower := New(srv.Client(t), psOptions(prefix)), New(frdb, psOptions(prefix))
			t.Cleanup(func() { leader.Close(); follower.Close() })
			key := "pg-" + how
			started, release := make(chan struct{}), make(chan struct{})
			lead := make(chan error, 1)
			go func() {
				_, err := leader.Get(context.Background(), key, time.Minute, func(context.Context) ([]byte, error) {
					close(started)
					<-release
					if how == "panic" {
						panic("boom")
					}
					runtime.Goexit()
					return nil, nil
				})
				lead <- err
			}()
			<-started
			fol := make(chan error, 1)
			go func() {
				_, err := follower.Get(context.Background(), key, time.Minute, func(context.Context) ([]byte, error) {
					return []byte("follower loaded"), nil
				})
				fol <- err
			}()
			looks.waitLooked(t, prefix, []int{1}, key)
			close(release)
			if err := <-lead; !errors.Is(err, ErrLoadFailed) {
				t.Errorf("leader: %v, want ErrLoadFailed", err)
			}
			select {
			case err := <-fol:
				var pe *PanicError
				if !errors.Is(err, ErrLoadFailed) || (how == "panic" && !errors.As(err, &pe)) {
					t.Errorf("follower in another process after the leader's %s: %v, want ErrLoadFailed (a *PanicError for a panic)", how, err)
				}
			case <-time.After(2 * time.Second):
				t.Errorf("follower in another process not woken within 2s of the leader's %s (lease 5s)", how)
				<-fol
			}
		})
	}
}

// TestCalibrationOneSlowRebuildCountedOnceUnderHits attacks Options'
// calibration promises ("each rebuild counted once per process", "one or
// two slow rebuilds never move the lease") through the envelopes' Δ read
// on hits. Six keys of one class (KeyClass "report:*") were each rebuilt
// once: one slow (5 s), five fast (10 ms). Their rebuild tags fall into
// the same slot of the process's direct-mapped "seen" table (4096 slots:
// in a keyspace of more than a few thousand hot keys such sharing is the
// rule, here it is picked deterministically with the calibrator's seed),
// and the class remembers only its last 4 tags. The process then serves
// hits of the six keys in turn, as a busy service does. The slow
// rebuild is counted again on every round, so a single 5 s rebuild comes
// to dominate the class: its tail must stay at the fast rebuilds' bucket.
func TestCalibrationOneSlowRebuildCountedOnceUnderHits(t *testing.T) {
	t.Parallel()
	c := newCalibrator(calibration{})
	classOf := func(string) string { return "report:*" }
	slot := func(name string) uint64 {
		return rebuildTag(maphash.String(c.seed, name), 1) >> (64 - calibSeenBits)
	}
	slow := "herd:{slow}:v"
	names := []string{slow}
	for i := 0; len(names) < 6 && i < 1<<22; i++ {
		if n := "herd:{k" + strconv.Itoa(i) + "}:v"; slot(n) == slot(slow) {
			names = append(names, n)
		}
	}
	if len(names) < 6 {
		t.Fatalf("found only %d names sharing a seen slot", len(names))
	}
	delta := func(name string) time.Duration {
		if name == slow {
			return 5 * time.Second
		}
		return 10 * time.Millisecond
	}
	// The six rebuilds, each learned once (say from its first hit).
	for _, n := range names {
		c.observeRebuild(n, n, classOf, 1, delta(n))
	}
	if tail, ok := c.Tail("report:*"); ok && tail >= time.Second {
		t.Fatalf("after one 5s and five 10ms rebuilds the tail is already %v", tail)
	}
	// Hits: every one reads a Δ of one of the same six rebuilds.
	for range 20 {
		for _, n := range names {
			c.observeRebuild(n, n, classOf, 1, delta(n))
		}
	}
	if tail, ok := c.Tail("report:*"); !ok || tail >= time.Second {
		t.Errorf("after hits of the same six rebuilds (one 5s, five 10ms), the class's tail is %v (ok %v), lease %v: "+
			"the one slow rebuild was counted on every hit and dominates (weight %.1f)", tail, ok, c.Lease("report:*"), c.weight("report:*"))
	}
}

func testCloseNeverHangs(t *testing.T, blackhole bool) {
	r := newFaultRig(t)
	// A command already sent into the blackhole cannot be taken back:
	// Close waits for it up to the client's timeouts (short, as herd asks).
	const clientTimeout = 3 * time.Second
	to := timeouts{dial: clientTimeout, read: clientTimeout, write: clientTimeout}
	ctx := context.Background()
	leader := r.cache(r.direct, psOptions("bh"))
	frdb := r.client(to)
	follower := r.cache(frdb, psOptions("bh"))
	holder := NewLocker(r.direct, &LockerOptions{Prefix: "bhl"})
	waiter := NewLocker(frdb, &LockerOptions{Prefix: "bhl", MaxWait: time.Minute})
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{}, 1)
	go leader.Get(ctx, "bh", time.Minute, gatedLoad(started, release, []byte("v")))
	<-started
	fol := make(chan error, 1)
	go func() {
		_, err := follower.Get(ctx, "bh", time.Minute, func(context.Context) ([]byte, error) { return []byte("f"), nil })
		fol <- err
	}()
	l, err := holder.TryAcquire(ctx, "bhlock", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	acq := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, "bhlock", time.Minute)
		acq <- err
	}()
	waitFor(t, 10*time.Second, "both subscriptions", func() bool {
		n, err := r.direct.PubSubNumSub(ctx, channelOf(t, "bh", "bh"), mustChannel(t, "bhl", "bhlock")).Result()
		return err == nil && n[channelOf(t, "bh", "bh")] == 1 && n[mustChannel(t, "bhl", "bhlock")] == 1
	})
	r.proxy.SetBlackhole(blackhole)
	closeWithin(t, 3*clientTimeout, follower, waiter)
	for what, ch := range map[string]chan error{"follower Get": fol, "Locker.Acquire": acq} {
		select {
		case err := <-ch:
			if err == nil {
				t.Errorf("%s after Close: nil error", what)
			}
		case <-time.After(5 * time.Second):
			l.Release(ctx)
			err := errors.New("(still waiting 10s later)")
			select {
			case err = <-ch:
			case <-time.After(10 * time.Second):
			}
			t.Errorf("%s still waiting 5s after Close; after the holder's release it returned %v", what, err)
		}
	}
	l.Release(ctx)
	holder.Close()
	r.proxy.SetBlackhole(false)
	r.finish()
}

func mustChannel(t *testing.T, prefix, key string) string {
	t.Helper()
	k, err := makeKeys(prefix, key)
	if err != nil {
		t.Fatal(err)
	}
	return k.Channel
}

// TestRingWakeUpsAfterAShardGoesDown attacks docs/guarantees.md "Redis Ring" ("A Ring
// has no replication: a shard that goes down loses its leases, like a
// cluster master, and the Ring moves its keys to the other shards") with
// the failure-behaviour promise that the pub/sub comes back: on a Ring of
// 2, a key of shard a is followed once (so the Cache holds a's pub/sub
// connection), then a is killed and the Ring moves the key to b. A wave
// on that key must still end its follow by a wake-up (Stats.Notified),
// not by a poll (PollMax is a minute), and Close must not hang.
func TestRingWakeUpsAfterAShardGoesDown(t *testing.T) {
	t.Parallel()
	s1, s2 := redistest.Start(t), redistest.Start(t)
	ring := func() *redis.Ring {
		r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": s1.Addr(), "b": s2.Addr()},
			HeartbeatFrequency: 100 * time.Millisecond,
			NewClient: func(opt *redis.Options) *redis.Client {
				opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
				return redis.NewClient(opt)
			}})
		t.Cleanup(func() { r.Close() })
		return r
	}
	ctx := context.Background()
	const prefix = "ringdown"
	r1 := ring()
	var key string
	for k, i := "", 0; key == "" && i < 1000; i++ {
		k = "rd-" + strconv.Itoa(i)
		if sh, err := r1.GetShardClientForKey(channelOf(t, prefix, k)); err == nil && sh.Options().Addr == s1.Addr() {
			key = k
		}
	}
	if key == "" {
		t.Fatal("no key on shard a")
	}
	frdb := ring()
	looks := countAcquires(frdb)
	lrdb := ring()
	leader, follower := New(lrdb, psOptions(prefix)), New(frdb, psOptions(prefix))
	t.Cleanup(func() { leader.Close(); follower.Close() })
	wave := func(k string, srv *redistest.Server, since []int) {
		t.Helper()
		release := make(chan struct{})
		l, f := leadAndFollow(t, leader, follower, k, release, []byte("v"))
		waitFor(t, 20*time.Second, "the follower's subscription of "+k+" on "+srv.Addr(), func() bool {
			n, err := srv.Client(t).PubSubNumSub(ctx, channelOf(t, prefix, k)).Result()
			return err == nil && n[channelOf(t, prefix, k)] >= 1
		})
		looks.waitLooked(t, prefix, since, k)
		before := follower.Stats().Notified
		close(release)
		for _, c := range []<-chan followed{l, f} {
			if r := receive(t, c, "a Get"); r.err != nil || string(r.val) != "v" {
				t.Errorf("%s: Get = (%q, %v)", k, r.val, r.err)
			}
		}
		if got := follower.Stats().Notified - before; got != 1 {
			t.Errorf("%s: the follow on %s was not ended by a wake-up (Notified +%d, stats %+v)", k, srv.Addr(), got, follower.Stats())
		}
	}
	wave(key, s1, []int{1})
	s1.Kill(t)
	for _, r := range []*redis.Ring{r1, frdb, lrdb} {
		waitFor(t, 20*time.Second, "the Ring to move the key to shard b", func() bool {
			sh, err := r.GetShardClientForKey(channelOf(t, prefix, key))
			return err == nil && sh.Options().Addr == s2.Addr()
		})
	}
	// The key's value was on a: it is a miss again, led anew.
	key2 := key
	since := looks.snapshot(t, prefix, key2)
	since[0] += 2
	wave(key2, s2, since)
	closeWithin(t, 10*time.Second, leader, follower)
}

// TestOneAcquireCancelledDoesNotDeafenAnother attacks guarantee 3 ("One
// caller's cancellation never fails another") for Locker.Acquire, whose
// waiters of one key share a subscription: two Acquires of one Locker wait
// for a held lease (PollMin and PollMax a minute: only a wake-up ends a
// wait early). The first one's ctx is cancelled and it returns; then the
// holder releases. The second must be woken and take the lease within
// 5 s, not sit deaf until its next poll a minute later.
func TestOneAcquireCancelledDoesNotDeafenAnother(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()
	holder := NewLocker(srv.Client(t), &LockerOptions{Prefix: "deaf"})
	wrdb := srv.Client(t)
	tries := &acquireCounter{}
	wrdb.AddHook(tries)
	waiter := NewLocker(wrdb, &LockerOptions{Prefix: "deaf", MaxWait: 2 * time.Minute, PollMin: time.Minute, PollMax: time.Minute})
	t.Cleanup(func() { holder.Close(); waiter.Close() })
	l, err := holder.TryAcquire(ctx, "k", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancelA := context.WithCancel(ctx)
	a, b := make(chan error, 1), make(chan error, 1)
	go func() { _, err := waiter.Acquire(actx, "k", time.Minute); a <- err }()
	go func() {
		bl, err := waiter.Acquire(ctx, "k", time.Minute)
		if err == nil {
			err = bl.Release(ctx)
		}
		b <- err
	}()
	ch := mustChannel(t, "deaf", "k")
	waitFor(t, 10*time.Second, "the waiters' subscription", func() bool {
		n, err := srv.Client(t).PubSubNumSub(ctx, ch).Result()
		return err == nil && n[ch] >= 1
	})
	// Both waiters reach their wait: each tried once before subscribing
	// and once more, its first look after subscribing (at once, or woken
	// by the confirmation); then only a wake-up or a poll a minute later
	// tries again.
	waitFor(t, 10*time.Second, "both waiters' first look after subscribing", func() bool { return tries.n.Load() >= 4 })
	cancelA()
	if err := <-a; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Acquire: %v, want context.Canceled", err)
	}
	// The cancelled waiter's release has been carried out: an UNSUBSCRIBE
	// it caused would have been sent.
	waitFor(t, 10*time.Second, "the pub/sub worker to settle after the cancel", func() bool { return notifierSettled(waiter.notify) })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-b:
		if err != nil {
			t.Errorf("the other Acquire: %v", err)
		}
	case <-time.After(5 * time.Second):
		n, _ := srv.Client(t).PubSubNumSub(ctx, ch).Result()
		t.Errorf("after another waiter's cancel and the release, the remaining Acquire was not woken within 5s (subscribers of the channel: %d)", n[ch])
		waiter.Close()
		<-b
	}
}

// TestClusterLockerWakeUpsAfterPubSubKill attacks docs/guarantees.md "Failure
// behaviour" (pub/sub comes back after a killed client, on Cluster one
// SSUBSCRIBE per channel) for Locker.Acquire on the real 3-master cluster:
// two Acquires wait on two keys whose channels are in different slots of
// one master (PollMin and PollMax a minute), CLIENT KILL TYPE pubsub
// drops the connection, the subscriptions come back; then the holder
// releases both, and both Acquires must return within 5 s (by the
// wake-up, not by a poll a minute later).
func TestClusterLockerWakeUpsAfterPubSubKill(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	direct := cl.Client(t)
	const prefix = "clk"
	holder := NewLocker(cl.Client(t), &LockerOptions{Prefix: prefix})
	wrdb := cl.Client(t)
	tries := &acquireCounter{}
	wrdb.AddHook(tries)
	waiter := NewLocker(wrdb, &LockerOptions{Prefix: prefix, MaxWait: 2 * time.Minute, PollMin: time.Minute, PollMax: time.Minute})
	t.Cleanup(func() { holder.Close(); waiter.Close() })
	k1, k2, master := clusterPair(t, direct, prefix)
	var leases []*Lease
	got := make(chan error, 2)
	for _, k := range []string{k1, k2} {
		l, err := holder.TryAcquire(ctx, k, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
		go func() {
			wl, err := waiter.Acquire(ctx, k, time.Minute)
			if err == nil {
				err = wl.Release(ctx)
			}
			got <- err
		}()
	}
	ch1, ch2 := channelOf(t, prefix, k1), channelOf(t, prefix, k2)
	waitShardSubscribed(t, master, 10*time.Second, "before the kill", ch1, ch2)
	// Both waiters in their wait: each tried before subscribing and once
	// after (at once, or woken by the confirmation); then only a wake-up
	// or a poll a minute later tries again.
	var before map[string]int64
	waitFor(t, 10*time.Second, "both waiters' first look after subscribing", func() bool {
		before = tries.perKey() // by lease key: the waiters' two keys
		if len(before) != 2 {
			return false
		}
		for _, n := range before {
			if n < 2 {
				return false
			}
		}
		return true
	})
	if err := master.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	// The confirmations' looks: after the kill only the confirmation of a
	// waiter's channel, subscribed again, wakes it to try once more. Once
	// both have, a release can reach them only as a message.
	waitFor(t, 20*time.Second, "both waiters' look after their channel's new confirmation", func() bool {
		now := tries.perKey()
		for k, n := range before {
			if now[k] <= n {
				return false
			}
		}
		return true
	})
	waitShardSubscribed(t, master, 20*time.Second, "after the kill", ch1, ch2)
	for _, l := range leases {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		select {
		case err := <-got:
			if err != nil {
				t.Errorf("Acquire: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("an Acquire on the cluster was not woken within 5s of the release after CLIENT KILL TYPE pubsub")
		}
	}
	closeWithin(t, 10*time.Second, holder, waiter)
}
