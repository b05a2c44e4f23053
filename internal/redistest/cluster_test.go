package redistest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestCluster(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	if n := len(c.Addrs()); n != 3 {
		t.Fatalf("len(Addrs()) = %d, want 3", n)
	}
	if n := len(c.Servers()); n != 3 {
		t.Fatalf("len(Servers()) = %d, want 3", n)
	}
	for i, s := range c.Servers() {
		if s.Addr() != c.Addrs()[i] {
			t.Fatalf("Servers()[%d].Addr() = %s, Addrs()[%d] = %s", i, s.Addr(), i, c.Addrs()[i])
		}
		if !alive(s.Pid()) {
			t.Fatalf("node %s (pid %d) is not running", s.Addr(), s.Pid())
		}
	}

	ctx := context.Background()
	cc := c.Client(t)
	for i := range 100 {
		if err := cc.Set(ctx, fmt.Sprintf("key:%d", i), i, 0).Err(); err != nil {
			t.Fatalf("SET key:%d: %v", i, err)
		}
	}
	for i := range 100 {
		got, err := cc.Get(ctx, fmt.Sprintf("key:%d", i)).Int()
		if err != nil || got != i {
			t.Fatalf("GET key:%d = %d, %v; want %d", i, got, err, i)
		}
	}

	// "foo" hashes to slot 12182 in every Redis Cluster.
	if slot, err := cc.ClusterKeySlot(ctx, "foo").Result(); err != nil || slot != 12182 {
		t.Fatalf("CLUSTER KEYSLOT foo = %d, %v; want 12182", slot, err)
	}

	var mu sync.Mutex
	sizes := map[string]int64{}
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		info, err := m.ClusterInfo(ctx).Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster state is not ok:\n%s", m.Options().Addr, info)
		}
		mu.Lock()
		sizes[m.Options().Addr] = n
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatalf("ForEachMaster: %v", err)
	}
	if len(sizes) != 3 {
		t.Fatalf("ForEachMaster visited %d masters (%v), want 3", len(sizes), sizes)
	}
	var total int64
	for addr, n := range sizes {
		if n == 0 {
			t.Errorf("master %s holds no keys; sizes %v", addr, sizes)
		}
		total += n
	}
	if total != 100 {
		t.Errorf("masters hold %d keys in total, want 100; sizes %v", total, sizes)
	}
	if err := c.ready(); err != nil {
		t.Fatalf("cluster not ready at the end: %v", err)
	}
}

func TestStartClusterTooSmall(t *testing.T) {
	t.Parallel()
	Require(t)
	f := callRequire(func(tb testing.TB) { StartCluster(tb, 2) })
	if !f.failed || !strings.Contains(f.msg, "at least 3") {
		t.Fatalf("StartCluster(t, 2): failed=%v msg=%q; want a failure", f.failed, f.msg)
	}
}

func TestSlotMap(t *testing.T) {
	t.Parallel()
	want := []string{"127.0.0.1:7000", "127.0.0.1:7001"}
	good := "" +
		"aaa 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-8191\n" +
		"bbb 127.0.0.1:7001@17001 master - 0 1 2 connected 8192-16383\n"
	same := "" +
		"bbb 127.0.0.1:7001@17001 myself,master - 0 0 2 connected 8192-16383\n" +
		"aaa 127.0.0.1:7000@17000 master - 0 1 1 connected 0-8191\n"
	a, err := slotMap(good, want)
	if err != nil {
		t.Fatalf("slotMap(good): %v", err)
	}
	b, err := slotMap(same, want)
	if err != nil {
		t.Fatalf("slotMap(same): %v", err)
	}
	if a != b {
		t.Fatalf("views differ:\n%s\n%s", a, b)
	}
	for name, bad := range map[string]string{
		"missing slots": strings.Replace(good, "0-8191", "0-8190", 1),
		"double slot":   strings.Replace(good, "0-8191", "0-8192", 1),
		"failing node":  strings.Replace(good, "master -", "master,fail? -", 1),
		"handshake":     strings.Replace(good, "master -", "master,handshake -", 1),
		"disconnected":  strings.Replace(good, "2 connected", "2 disconnected", 1),
		"migrating":     strings.Replace(good, "0-8191", "0-8191 [8191->-bbb]", 1),
		"unknown node":  strings.Replace(good, "7001@", "7002@", 1),
		"missing node":  "aaa 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-16383\n",
	} {
		if _, err := slotMap(bad, want); err == nil {
			t.Errorf("slotMap accepted %s:\n%s", name, bad)
		}
	}
}

func TestClusterReplicas(t *testing.T) {
	t.Parallel()
	c := StartClusterReplicas(t, 3, 1)
	if n := len(c.Servers()); n != 6 {
		t.Fatalf("len(Servers()) = %d, want 6", n)
	}
	ctx := context.Background()
	cc := c.Client(t)
	//lint:ignore SA1019 CLUSTER SLOTS also answers on Redis 6.2, which herd supports; CLUSTER SHARDS is 7.0+
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	masters := map[string]bool{}
	for _, s := range slots {
		if len(s.Nodes) != 2 {
			nodes, _ := cc.ClusterNodes(ctx).Result()
			t.Fatalf("slots %d-%d are served by %d nodes, want a master and a replica\n%v\n%s", s.Start, s.End, len(s.Nodes), slots, nodes)
		}
		masters[s.Nodes[0].Addr] = true
	}
	if len(masters) != 3 {
		t.Fatalf("%d masters serve the slots, want 3", len(masters))
	}
	// A write reaches the replicas, which a ReadOnly client reads from.
	if err := cc.Set(ctx, "foo", "bar", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := cc.Wait(ctx, 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	ro := c.Client(t, func(o *redis.ClusterOptions) { o.ReadOnly = true })
	if got, err := ro.Get(ctx, "foo").Result(); err != nil || got != "bar" {
		t.Fatalf("GET foo from a replica = %q, %v; want bar", got, err)
	}
}
