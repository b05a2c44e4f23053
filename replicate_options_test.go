package herd

// Attacks on the failover/fencing claims (issue 13): docs/guarantees.md
// "Failure behaviour" and its failover paragraph, docs/faults.md
// "Failover (Sentinel)", the godoc of ReplicaAcks/ReplicaTimeout and ErrNotReplicated, and
// replicate.go. Each test here failed on the code it was written against.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestReplicaWaitOnTheScriptsConnectionRing attacks replicate.go's
// "followed by a WAIT for the replicas, pipelined on the same connection"
// and ErrNotReplicated's godoc (returned when too few replicas
// acknowledged) on a *redis.Ring, which docs/guarantees.md "Redis Ring" says
// works.
// A Ring pipeline routes each command by its first key; WAIT (and INFO
// replication) have none, so go-redis sends them to a RANDOM shard, not
// to the shard that ran the script. Shard a has a replica, shard b has
// none. With ReplicaAcks 1, a Set of a key on b must always fail with
// ErrNotReplicated (nothing replicated it) and a Set of a key on a must
// always succeed; with the WAIT on a random shard, some Sets of b's key
// are acknowledged (WAIT answered by a's replica) and some of a's key
// are refused.
func TestReplicaWaitOnTheScriptsConnectionRing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sa, sb, rep := redistest.Start(t), redistest.Start(t), redistest.Start(t)
	rc := rep.Client(t)
	follow(t, rc, sa)
	waitFor(t, 20*time.Second, "the replica's link", func() bool {
		return replInfo(rc, "master_link_status") == "up"
	})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": sa.Addr(), "b": sb.Addr()}})
	defer ring.Close()
	keys := ringKeys(t, ring, DefaultPrefix)
	c := New(ring, &Options{ReplicaAcks: 1, ReplicaTimeout: 50 * time.Millisecond})
	defer c.Close()
	// a's Sets get 2s to be acknowledged: a healthy replica on a loaded
	// machine missed 50ms once; a WAIT sent to b (no replica) still
	// refuses them, after the 2s.
	ca := New(ring, &Options{ReplicaAcks: 1, ReplicaTimeout: failoverReplicaTimeout})
	defer ca.Close()
	var wrongOK, wrongErr int
	for i := 0; i < 16; i++ {
		if err := c.Set(ctx, keys[sb.Addr()], []byte("v"), time.Minute); err == nil {
			wrongOK++ // a write on b, which has no replica, acknowledged
		} else if !errors.Is(err, ErrNotReplicated) {
			t.Fatalf("Set on b = %v, want ErrNotReplicated", err)
		}
		if err := ca.Set(ctx, keys[sa.Addr()], []byte("v"), time.Minute); err != nil {
			wrongErr++ // a write on a, replicated, refused
		}
	}
	if wrongOK > 0 || wrongErr > 0 {
		t.Errorf("of 16 Sets per shard: %d on the unreplicated shard acknowledged, %d on the replicated shard refused; want 0 and 0 (WAIT sent to another shard than the script)", wrongOK, wrongErr)
	}
}

// TestReplicaAcksAutoDoesNotWaitOnAMasterThatNeverHadOne attacks the
// godoc of LockerOptions.ReplicaAcks ("ReplicaAcks 0 (the default) ...
// does not wait on a master that never had one") and docs/guarantees.md's
// failover paragraph (a promoted replica keeps serving). A replica is
// promoted (REPLICAOF NO ONE, as Sentinel does after a kill -9 of the
// master of a master+1-replica set): it has no replica and never had one,
// but Redis keeps its replication backlog active (a replica has one, for
// a later partial resync), and learn counts "one while the backlog is
// active". With default options every TryAcquire on the new master then
// fails with ErrNotReplicated, for repl-backlog-ttl (1h by default).
func TestReplicaAcksAutoDoesNotWaitOnAMasterThatNeverHadOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, r := redistest.Start(t), redistest.Start(t)
	mc, rc := m.Client(t), r.Client(t)
	follow(t, rc, m)
	waitFor(t, 20*time.Second, "the replica's link", func() bool {
		return replInfo(rc, "master_link_status") == "up"
	})
	m.Kill(t) // the master dies; its only replica is promoted
	_ = mc
	if err := rc.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatalf("REPLICAOF NO ONE: %v", err)
	}
	if n := replInfo(rc, "connected_slaves"); n != "0" {
		t.Fatalf("connected_slaves on the promoted replica = %s, want 0", n)
	}
	l := NewLocker(rc, nil)
	defer l.Close()
	lease, err := l.TryAcquire(ctx, "res", time.Second)
	if err != nil {
		t.Fatalf("TryAcquire on a promoted replica that never had a replica (default options) = %v, want a lease (backlog active: %s)", err, replInfo(rc, "repl_backlog_active"))
	}
	_ = lease.Release(ctx)
}

// TestReplicaAcksAutoWaitsForAReplicaAdded attacks docs/guarantees.md "Failure
// behaviour" ("A write herd reports done is on the replicas", with
// ReplicaAcks 0 waiting for "every replica the master had in the last
// minute", learned "about once a second"). replicate.run computes the
// count to wait for BEFORE the INFO replication it appends to the same
// pipeline, so the first write after a replica attached never waits for
// it, however long ago it attached. Here a Cache writes once (no replica:
// count 0), a replica attaches, its link is up for more than a second
// (past "about once a second"), then it lags (SIGSTOP). The next Set is
// acknowledged (nil) although the replica does not have it: a failover
// promoting that replica would undo an acknowledged Set.
func TestReplicaAcksAutoWaitsForAReplicaAdded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, r := redistest.Start(t), redistest.Start(t)
	mc, rc := m.Client(t), r.Client(t)
	c := New(mc, nil)
	defer c.Close()
	clock := newFakeClock() // the clock of the replica counts
	c.repl.now = clock.Now
	if err := c.Set(ctx, "k", []byte("v1"), time.Minute); err != nil {
		t.Fatalf("first Set (no replica): %v", err)
	}
	follow(t, rc, m)
	waitFor(t, 20*time.Second, "the replica's link", func() bool {
		return replInfo(rc, "master_link_status") == "up" && replInfo(mc, "connected_slaves") == "1"
	})
	clock.Advance(roleEvery + roleEvery/2) // past "about once a second"
	r.Pause(t)
	defer r.Resume(t)
	err := c.Set(ctx, "k", []byte("v2"), time.Minute)
	if err == nil {
		t.Errorf("Set with a replica attached for >1s but lagging = nil (master_repl_offset %s, replica %s), want ErrNotReplicated",
			replInfo(mc, "master_repl_offset"), replInfo(mc, "slave0"))
	} else if !errors.Is(err, ErrNotReplicated) {
		t.Errorf("Set = %v, want ErrNotReplicated", err)
	}
}

// TestReplicaAcksAutoStartsAfreshOnANewMaster attacks the godoc of
// LockerOptions.ReplicaAcks ("the count starts afresh when the master
// changes (a new replication id)"). Like the previous test, the count a
// write waits for is the one learned before it, so the first write after
// a failover waits for the OLD master's count. A master with two replicas
// dies (kill -9); one replica is promoted and the other follows it; the
// client now reaches the new master, which has one replica. The Set
// reaches every replica the new master has, yet it is refused with
// ErrNotReplicated ("1 of 2 replicas").
func TestReplicaAcksAutoStartsAfreshOnANewMaster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := startReplicated(t)
	cl, target := switchable(t, p.master.Addr())
	c := New(cl, &Options{ReplicaTimeout: failoverReplicaTimeout})
	defer c.Close()
	clock := newFakeClock() // the clock of the replica counts
	c.repl.now = clock.Now
	if err := c.Set(ctx, "k", []byte("v1"), time.Minute); err != nil {
		t.Fatalf("Set on the master with two replicas: %v", err)
	}
	p.master.Kill(t)
	p.promote(t)
	addr := p.replica.Addr()
	target.Store(&addr)
	clock.Advance(roleEvery + roleEvery/10) // past "about once a second": the write is due a new count
	err := c.Set(ctx, "k", []byte("v2"), time.Minute)
	if err != nil {
		t.Errorf("first Set on the new master (1 replica, link up) = %v, want nil", err)
	}
}

// TestReplicaTimeoutAboveReadTimeout attacks the godoc of ReplicaTimeout
// ("bounds each WAIT") and of ReplicaAcks ("When too few replicas
// acknowledge: an acquire returns an error wrapping ErrNotReplicated and
// hands out no lease (... the lease is released on a best-effort basis);
// Set and Invalidate return it"). A ReplicaTimeout longer than the
// client's ReadTimeout is accepted, but the client gives up reading the
// WAIT's reply first: go-redis then marks every command of the pipeline,
// the script's too, with the i/o timeout. Set returns a plain timeout
// (not ErrNotReplicated), and TryAcquire returns a timeout without
// releasing the lease the script took: the key stays locked for the
// whole lease although nobody holds it.
func TestReplicaTimeoutAboveReadTimeout(t *testing.T) {
	// Not parallel: its bounds are short timeouts, which a loaded machine misses.
	ctx := context.Background()
	m, r := redistest.Start(t), redistest.Start(t)
	mc := m.Client(t, func(o *redis.Options) { o.ReadTimeout = 300 * time.Millisecond; o.MaxRetries = -1 })
	rc := r.Client(t)
	follow(t, rc, m)
	waitFor(t, 20*time.Second, "the replica's link", func() bool {
		return replInfo(rc, "master_link_status") == "up"
	})
	r.Pause(t)
	defer r.Resume(t)
	// A ReplicaTimeout that does not fit in the client's ReadTimeout is a
	// configuration error now; the default is cut to fit.
	for _, build := range []func(){
		func() { New(mc, &Options{ReplicaAcks: 1, ReplicaTimeout: time.Second}).Close() },
		func() { NewLocker(mc, &LockerOptions{ReplicaAcks: 1, ReplicaTimeout: time.Second}).Close() },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("a ReplicaTimeout of 1s with a ReadTimeout of 300ms was accepted")
				}
			}()
			build()
		}()
	}
	c := New(mc, &Options{ReplicaAcks: 1})
	defer c.Close()
	if err := c.Set(ctx, "k", []byte("v"), time.Minute); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("Set with its replica stopped = %v, want ErrNotReplicated", err)
	}
	l := NewLocker(mc, &LockerOptions{ReplicaAcks: 1})
	defer l.Close()
	if lease, err := l.TryAcquire(ctx, "res", 5*time.Second); !errors.Is(err, ErrNotReplicated) || lease != nil {
		t.Errorf("TryAcquire with its replica stopped = %v, %v; want no lease and ErrNotReplicated", lease, err)
	}
	other := NewLocker(m.Client(t), &LockerOptions{ReplicaAcks: -1})
	defer other.Close()
	if lease, err := other.TryAcquire(ctx, "res", time.Second); err != nil {
		t.Errorf("TryAcquire by another process after the refused acquire = %v, want the lease (the refused one must have been released)", err)
	} else {
		_ = lease.Release(ctx)
	}
}
