package herd

// Failover: the two reproductions of issue 13 on a real master and
// replica, with the replication link cut and the replica promoted by hand
// (REPLICAOF NO ONE), so that every step is ordered. The soak with real
// Sentinels is in failover_soak_test.go.

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// replicated is a master and two replicas, failed over by hand the way
// Sentinel does it: both replicas leave the master (which stays a writable
// master), the first is promoted and the second follows it.
type replicated struct {
	master, replica, other *redistest.Server
	m, r, o                *redis.Client // plain clients of each
}

func startReplicated(t testing.TB) *replicated {
	t.Helper()
	p := &replicated{master: redistest.Start(t), replica: redistest.Start(t), other: redistest.Start(t)}
	p.m, p.r, p.o = p.master.Client(t), p.replica.Client(t), p.other.Client(t)
	follow(t, p.r, p.master)
	follow(t, p.o, p.master)
	waitFor(t, 20*time.Second, "both replicas' links to come up", func() bool {
		return replInfo(p.r, "master_link_status") == "up" && replInfo(p.o, "master_link_status") == "up" &&
			replInfo(p.m, "connected_slaves") == "2"
	})
	return p
}

// failoverReplicaTimeout is the ReplicaTimeout of the tests on replicated
// servers: the default 250ms WAIT is too short for a healthy replica on a
// loaded machine (TestFailoverNoDuplicateToken failed on it in a stress
// run), and these tests are about what a failover keeps, not about how
// fast replicas acknowledge. It is below the clients' 3s ReadTimeout.
const failoverReplicaTimeout = 2 * time.Second

func follow(t testing.TB, c *redis.Client, m *redistest.Server) {
	t.Helper()
	host, port, _ := net.SplitHostPort(m.Addr())
	if err := c.ReplicaOf(context.Background(), host, port).Err(); err != nil {
		t.Fatalf("REPLICAOF: %v", err)
	}
}

// cut points both replicas at a port nobody listens on: they keep their
// data but receive nothing more, and the master has no replica left.
func (p *replicated) cut(t *testing.T) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	for _, c := range []*redis.Client{p.r, p.o} {
		if err := c.ReplicaOf(context.Background(), "127.0.0.1", port).Err(); err != nil {
			t.Fatalf("REPLICAOF: %v", err)
		}
	}
	waitFor(t, 10*time.Second, "the master to lose its replicas", func() bool {
		return replInfo(p.m, "connected_slaves") == "0"
	})
}

// promote makes the first replica a master and the second its replica.
func (p *replicated) promote(t *testing.T) {
	t.Helper()
	if err := p.r.ReplicaOf(context.Background(), "NO", "ONE").Err(); err != nil {
		t.Fatalf("REPLICAOF NO ONE: %v", err)
	}
	follow(t, p.o, p.replica)
	waitFor(t, 20*time.Second, "the second replica to follow the new master", func() bool {
		return replInfo(p.o, "master_link_status") == "up" && replInfo(p.r, "connected_slaves") == "1"
	})
}

// sync waits until both replicas have every write the master made so far.
func (p *replicated) sync(t *testing.T) {
	t.Helper()
	if n, err := p.m.Wait(context.Background(), 2, 10*time.Second).Result(); err != nil || n != 2 {
		t.Fatalf("WAIT = %d, %v", n, err)
	}
}

func replInfo(c *redis.Client, field string) string {
	info, _ := c.Info(context.Background(), "replication").Result()
	return infoValue(info, field)
}

// switchable is a client whose connections go to whichever address is
// current: a failover client reduced to its effect.
func switchable(t *testing.T, addr string) (*redis.Client, *atomic.Pointer[string]) {
	t.Helper()
	target := &atomic.Pointer[string]{}
	target.Store(&addr)
	c := redis.NewClient(&redis.Options{
		Addr: addr,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, *target.Load())
		},
	})
	t.Cleanup(func() { c.Close() })
	return c, target
}

// TestFailoverNoDuplicateToken is the first reproduction: holder A takes a
// lease on the master after the replication link was cut, the replica is
// promoted and holder B takes the lease there. Before the replica wait and
// the clock-based tokens, both got the same token and FencedStore accepted
// A's write after B's.
func TestFailoverNoDuplicateToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opt  *LockerOptions
	}{
		// The default replica wait, with a longer ReplicaTimeout than its
		// 250ms: on a loaded machine a healthy replica has missed that.
		{"default", &LockerOptions{ReplicaTimeout: failoverReplicaTimeout}},
		{"no replica wait", &LockerOptions{ReplicaAcks: -1}}, // the clock-based tokens alone
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			p := startReplicated(t)
			store := NewFencedStore(redistest.Start(t).Client(t), "")
			key := "res"
			la := NewLocker(p.m, tc.opt)
			defer la.Close()

			// An earlier lease, replicated: the counter exists on both. Its
			// length outlasts the replica wait (up to ReplicaTimeout): with
			// 1s, a loaded machine's WAIT made the reply come after the
			// lease's validity.
			l0, err := la.TryAcquire(ctx, key, 2*failoverReplicaTimeout)
			if err != nil {
				t.Fatalf("first TryAcquire: %v", err)
			}
			if err := l0.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			p.sync(t)

			p.cut(t)
			a, errA := la.TryAcquire(ctx, key, 5*time.Second)
			if tc.opt == nil && !errors.Is(errA, ErrNotReplicated) {
				t.Errorf("A's TryAcquire on a master without its replica = %v, want ErrNotReplicated", errA)
			}
			p.promote(t)
			lb := NewLocker(p.r, tc.opt)
			defer lb.Close()
			b, err := lb.TryAcquire(ctx, key, 5*time.Second)
			if err != nil {
				t.Fatalf("B's TryAcquire on the promoted replica: %v", err)
			}
			if err := store.Set(ctx, key, b.Token(), []byte("B"), 0); err != nil {
				t.Fatalf("B's fenced write: %v", err)
			}
			if errA != nil {
				return // A holds nothing: nothing to write
			}
			if a.Token() == b.Token() {
				t.Errorf("A and B both hold token %d", a.Token())
			}
			err = store.Set(ctx, key, a.Token(), []byte("A"), 0)
			if !errors.Is(err, ErrFenced) {
				t.Errorf("A's late write with token %d after B's %d = %v, want ErrFenced", a.Token(), b.Token(), err)
			}
			if v, tok, _ := store.Get(ctx, key); string(v) != "B" || tok != b.Token() {
				t.Errorf("downstream holds %q with token %d, want B's value and token %d", v, tok, b.Token())
			}
		})
	}
}

// TestFailoverInvalidateNotUndone is the second reproduction: leader A
// takes its lease (replicated), the link is cut, B's Invalidate is
// acknowledged by the master, the replica is promoted and A's Commit goes
// to the new master. Before the replica wait, the new master stored the
// value A loaded before the Invalidate.
func TestFailoverInvalidateNotUndone(t *testing.T) {
	t.Parallel()
	for _, cut := range []bool{true, false} {
		name := "link cut"
		if !cut {
			name = "link up"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			p := startReplicated(t)
			key := "page"
			ac, target := switchable(t, p.master.Addr())
			a := New(ac, &Options{ReplicaTimeout: failoverReplicaTimeout})
			defer a.Close()
			b := New(p.m, &Options{ReplicaTimeout: failoverReplicaTimeout})
			defer b.Close()

			_, fill, err := a.Begin(ctx, key, time.Minute, nil)
			if err != nil || fill == nil || !fill.Leased() {
				t.Fatalf("Begin = %v, %v; want a leased Fill", fill, err)
			}
			// B has written while the replicas were attached, as a
			// running instance has: the replica count it waits for comes
			// from what it saw in the last minute. (A process that first
			// meets the master after its replicas left learns that none
			// is attached and does not wait: ReplicaAcks' documented limit.)
			if err := b.Set(ctx, "other", []byte("x"), time.Minute); err != nil {
				t.Fatalf("B's first write: %v", err)
			}
			p.sync(t)
			if cut {
				p.cut(t)
			}
			errInv := b.Invalidate(ctx, key)
			if cut && !errors.Is(errInv, ErrNotReplicated) {
				t.Errorf("Invalidate on a master without its replica = %v, want ErrNotReplicated", errInv)
			}
			if !cut && errInv != nil {
				t.Fatalf("Invalidate: %v", errInv)
			}
			if !cut {
				p.sync(t)
				p.cut(t)
			}
			p.promote(t)
			s := "" + p.replica.Addr()
			target.Store(&s)
			p.master.Kill(t) // A's connections to the old master break; go-redis redials
			_ = ac.Ping(ctx).Err()

			if err := fill.Commit([]byte("loaded before the invalidate"), time.Minute, 0); err != nil {
				t.Fatalf("Commit: %v", err)
			}
			c := New(p.r, nil)
			defer c.Close()
			got, err := c.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) { return []byte("fresh"), nil })
			if err != nil {
				t.Fatalf("Get on the new master: %v", err)
			}
			if errInv == nil && string(got) != "fresh" {
				t.Errorf("after an acknowledged Invalidate, the new master serves %q (A's commit was accepted: stats %+v)", got, a.Stats())
			}
		})
	}
}

// TestReplicaWaitOptions: a fixed ReplicaAcks on a master without
// replicas fails closed with ErrNotReplicated (writes, acquire, extend);
// ReplicaAcks -1 never waits; the auto default does not wait on a master
// that never had a replica; invalid values panic at New.
func TestReplicaWaitOptions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	strict := New(rdb, &Options{ReplicaAcks: 1, ReplicaTimeout: 200 * time.Millisecond})
	defer strict.Close()
	if err := strict.Set(ctx, "k", []byte("v"), time.Minute); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("Set with ReplicaAcks 1 and no replica = %v, want ErrNotReplicated", err)
	}
	if err := strict.Invalidate(ctx, "k"); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("Invalidate with ReplicaAcks 1 and no replica = %v, want ErrNotReplicated", err)
	}
	sl := NewLocker(rdb, &LockerOptions{ReplicaAcks: 1, ReplicaTimeout: 200 * time.Millisecond})
	defer sl.Close()
	if l, err := sl.TryAcquire(ctx, "lk", time.Second); !errors.Is(err, ErrNotReplicated) || l != nil {
		t.Errorf("TryAcquire with ReplicaAcks 1 and no replica = %v, %v; want no lease and ErrNotReplicated", l, err)
	}
	// The refused acquire gave its lease back: a locker that does not wait
	// gets it at once.
	for _, acks := range []int{0, -1} {
		l := NewLocker(rdb, &LockerOptions{ReplicaAcks: acks})
		lease, err := l.TryAcquire(ctx, "lk", time.Second)
		if err != nil {
			t.Fatalf("TryAcquire with ReplicaAcks %d on a master without replicas: %v", acks, err)
		}
		lease.locker = sl // extend through the strict locker's options
		if err := lease.Extend(ctx, time.Second); !errors.Is(err, ErrNotReplicated) {
			t.Errorf("Extend with ReplicaAcks 1 and no replica = %v, want ErrNotReplicated", err)
		}
		lease.locker = l
		if err := lease.Release(ctx); err != nil {
			t.Errorf("Release: %v", err)
		}
		l.Close()
	}
	for _, opt := range []*Options{{ReplicaAcks: -2}, {ReplicaTimeout: -time.Second}, {ReplicaTimeout: time.Microsecond}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New(%+v) did not panic", opt)
				}
			}()
			New(rdb, opt).Close()
		}()
	}
}
