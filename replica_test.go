package herd

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

// Defect 12 of issue 12: a cluster client that routes reads to replicas
// made herd read its values from replicas, which may not have applied the
// Set or Invalidate that their master already answered.

func TestReadsReplicasDetected(t *testing.T) {
	t.Parallel()
	sentinel := []string{"127.0.0.1:1"} // never dialled: clients connect lazily
	for _, tc := range []struct {
		name string
		rdb  redis.UniversalClient
		want bool
	}{
		{"Client", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), false},
		{"ClusterClient", redis.NewClusterClient(&redis.ClusterOptions{Addrs: sentinel}), false},
		{"ClusterClient ReadOnly", redis.NewClusterClient(&redis.ClusterOptions{Addrs: sentinel, ReadOnly: true}), true},
		{"ClusterClient RouteByLatency", redis.NewClusterClient(&redis.ClusterOptions{Addrs: sentinel, RouteByLatency: true}), true},
		{"ClusterClient RouteRandomly", redis.NewClusterClient(&redis.ClusterOptions{Addrs: sentinel, RouteRandomly: true}), true},
		{"FailoverClusterClient", redis.NewFailoverClusterClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: sentinel}), false},
		{"FailoverClusterClient ReplicaOnly", redis.NewFailoverClusterClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: sentinel, ReplicaOnly: true}), true},
		{"FailoverClusterClient RouteByLatency", redis.NewFailoverClusterClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: sentinel, RouteByLatency: true}), true},
		{"FailoverClusterClient RouteRandomly", redis.NewFailoverClusterClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: sentinel, RouteRandomly: true}), true},
		// A failover *redis.Client with ReplicaOnly sends everything to a
		// replica and keeps no trace of it in its options: not detectable
		// (its writes fail with READONLY, an infrastructure error).
		{"FailoverClient ReplicaOnly", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: sentinel, ReplicaOnly: true}), false},
	} {
		if got := readsReplicas(tc.rdb); got != tc.want {
			t.Errorf("%s: readsReplicas = %v, want %v", tc.name, got, tc.want)
		}
		tc.rdb.Close()
	}
}

// TestReplicaReadsNoStaleHit: on a 3-master cluster with a replica each,
// a Cache on a ReadOnly client must not serve what a lagging replica
// still holds after Set or Invalidate returned. The replica is made to
// lag for sure: its link to the master is cut and cannot come back (a
// wrong masterauth), and the test checks the replica is stale first.
func TestReplicaReadsNoStaleHit(t *testing.T) {
	t.Parallel()
	cl := redistest.StartClusterReplicas(t, 3, 1)
	ctx := context.Background()
	ro := cl.Client(t, func(o *redis.ClusterOptions) { o.ReadOnly = true })
	// No replica wait: the test cuts the replica off on purpose, and the
	// wait would (rightly) refuse the writes it makes.
	c := newTestCache(t, ro, &Options{ReplicaAcks: -1})
	key := "replicated"
	vkey := mustKeys(t, key).Value
	master, replica := slotNodes(t, ro, vkey)

	if err := c.Set(ctx, key, []byte("v1"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if n, err := master.Wait(ctx, 1, 10_000).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v: the replica did not get v1", n, err)
	}
	// Cut the replica off: it keeps serving reads (replica-serve-stale-data)
	// but applies no more writes.
	for _, kv := range [][2]string{{"masteruser", "herd-test-nobody"}, {"masterauth", "wrong"}} {
		if err := replica.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := replica.Do(ctx, "CLIENT", "KILL", "TYPE", "master").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the replica's master link to go down", func() bool {
		info := replica.Info(ctx, "replication").Val()
		return strings.Contains(info, "master_link_status:down")
	})

	stale := func(what string) {
		t.Helper()
		b, err := replica.Get(ctx, vkey).Bytes()
		env, ok := wire.DecodeEnvelope(b)
		if err != nil || !ok || string(env.Payload) != "v1" {
			t.Fatalf("%s: the replica holds (%q, %v), want the stale v1 (the test proves nothing otherwise)", what, env.Payload, err)
		}
		if b, _ := ro.Get(ctx, vkey).Bytes(); !bytesHavePayload(b, "v1") {
			t.Fatalf("%s: the ReadOnly client's own GET does not reach the stale replica (the test proves nothing)", what)
		}
	}

	if err := c.Set(ctx, key, []byte("v2"), time.Hour); err != nil {
		t.Fatal(err)
	}
	stale("after Set(v2)")
	var calls atomic.Int64
	if v, err := c.Get(ctx, key, time.Hour, constLoader(&calls, "loaded")); err != nil || string(v) != "v2" {
		t.Errorf("Get after Set(v2) returned (%q, %v), want v2 (a stale hit from the replica)", v, err)
	}

	if err := c.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	stale("after Invalidate")
	if v, err := c.Get(ctx, key, time.Hour, constLoader(&calls, "loaded")); err != nil || string(v) != "loaded" {
		t.Errorf("Get after Invalidate returned (%q, %v), want a load (a stale hit from the replica)", v, err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("loads = %d, want 1", n)
	}
}

// slotNodes returns direct clients of the master and the replica that
// serve key; the replica's connections are READONLY.
func slotNodes(t *testing.T, cc *redis.ClusterClient, key string) (master, replica *redis.Client) {
	t.Helper()
	ctx := context.Background()
	slot, err := cc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1019 CLUSTER SLOTS also answers on Redis 6.2, which herd supports; CLUSTER SHARDS is 7.0+
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) >= 2 {
			master = redis.NewClient(&redis.Options{Addr: s.Nodes[0].Addr})
			replica = redis.NewClient(&redis.Options{Addr: s.Nodes[1].Addr, OnConnect: func(ctx context.Context, cn *redis.Conn) error {
				return cn.ReadOnly(ctx).Err()
			}})
			t.Cleanup(func() { master.Close(); replica.Close() })
			return master, replica
		}
	}
	t.Fatalf("no master with a replica serves slot %d: %v", slot, slots)
	return nil, nil
}

func bytesHavePayload(b []byte, want string) bool {
	env, ok := wire.DecodeEnvelope(b)
	return ok && string(env.Payload) == want
}

// BenchmarkReadValue compares the two ways the Cache reads a value on a
// real redis-server: GET, and the one-line script it uses when the client
// routes reads to replicas. Besides the round trip it reports the
// server's own time per call (INFO commandstats), which the load on the
// test host does not blur.
func BenchmarkReadValue(b *testing.B) {
	rdb := redistest.Start(b).Client(b)
	ctx := context.Background()
	c := New(rdb, nil)
	defer c.Close()
	if err := c.Set(ctx, "k", make([]byte, 512), time.Hour); err != nil {
		b.Fatal(err)
	}
	key := c.cfg.Prefix
	keys, _ := makeKeys(key, "k")
	for _, mode := range []struct {
		name   string
		script bool
		stat   string
	}{{"GET", false, "cmdstat_get"}, {"script", true, "cmdstat_evalsha"}} {
		b.Run(mode.name, func(b *testing.B) {
			c.masterReads = mode.script
			if _, err := c.readValue(ctx, keys.Value); err != nil { // loads the script
				b.Fatal(err)
			}
			rdb.ConfigResetStat(ctx)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.readValue(ctx, keys.Value); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			for line := range strings.SplitSeq(rdb.Info(ctx, "commandstats").Val(), "\r\n") {
				if rest, ok := strings.CutPrefix(line, mode.stat+":"); ok {
					for f := range strings.SplitSeq(rest, ",") {
						if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
							if us, err := strconv.ParseFloat(v, 64); err == nil {
								b.ReportMetric(us, "server-µs/call")
							}
						}
					}
				}
			}
		})
	}
}
