package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/lease"
	"github.com/herdkit/herd/lock/etcd/etcdtest"
	"github.com/herdkit/herd/locktest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// acquired is the result of an Acquire run in a goroutine.
type acquired struct {
	lease *Lease
	err   error
}

// acquireAsync runs l.Acquire in a goroutine; the lease it takes, if
// any, is released at the end of the test.
func acquireAsync(t *testing.T, ctx context.Context, l *Locker, name string, ttl time.Duration) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, ttl)
		ch <- acquired{lease, err}
	}()
	t.Cleanup(func() {
		select {
		case r := <-ch:
			_ = r.lease.Release(context.Background())
			ch <- r
		default:
		}
	})
	return ch
}

// await waits up to d for ch's result.
func await(t *testing.T, ch <-chan acquired, d time.Duration, what string) acquired {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case r := <-ch:
		return r
	case <-timer.C:
		t.Fatalf("%s: no result within %v", what, d)
		return acquired{}
	}
}

// queueLen returns the number of keys in name's queue.
func queueLen(t *testing.T, cli *clientv3.Client, l *Locker, name string) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), l.prefix(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// waitQueue waits, up to 10 seconds, until name's queue has n keys.
func waitQueue(t *testing.T, cli *clientv3.Client, l *Locker, name string, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for queueLen(t, cli, l, name) != n {
		if time.Now().After(deadline) {
			t.Fatalf("the queue of %q has %d keys, want %d", name, queueLen(t, cli, l, name), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestQueueOrder: waiters take the lock in the order they queued, each
// woken only by its predecessor's deletion (no herd effect: a release
// re-checks one waiter, not all), with increasing tokens; a waiter that
// gives up deletes its key, and the one behind it moves up to watch the
// key before it.
func TestQueueOrder(t *testing.T) {
	ctx := context.Background()
	cli := newClient(t, sharedServer(t).Endpoints())
	name := testName(t)
	const ttl = 20 * time.Second
	opt := &Options{Recheck: time.Minute}
	holder := newTestLocker(t, nil, opt)
	held, err := holder.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	const n = 4
	var (
		locks   [n]*Locker
		checks  [n]atomic.Int32
		results [n]<-chan acquired
		cancels [n]context.CancelFunc
	)
	for i := range n {
		locks[i] = newTestLocker(t, nil, opt)
		locks[i].checked = func() { checks[i].Add(1) }
		wctx, cancel := context.WithTimeout(ctx, ttl)
		defer cancel()
		cancels[i] = cancel
		results[i] = acquireAsync(t, wctx, locks[i], name, ttl)
		waitQueue(t, cli, holder, name, int64(i+2)) // queue in a known order
	}

	// Waiter 1 gives up: its key goes, and waiter 2 alone re-checks.
	cancels[1]()
	if r := await(t, results[1], 10*time.Second, "the cancelled waiter"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the cancelled waiter: %v, want context.Canceled", r.err)
	}
	waitQueue(t, cli, holder, name, n)
	deadline := time.Now().Add(10 * time.Second)
	for checks[2].Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := [n]int32{checks[0].Load(), checks[1].Load(), checks[2].Load(), checks[3].Load()}; got != [n]int32{0, 0, 1, 0} {
		t.Errorf("re-checks per waiter after waiter 1 gave up: %v, want [0 0 1 0]", got)
	}

	last := held.Token()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 2, 3} {
		r := await(t, results[i], 10*time.Second, fmt.Sprintf("waiter %d", i))
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		if r.lease.Token() <= last {
			t.Errorf("waiter %d: token %d after %d: not increasing", i, r.lease.Token(), last)
		}
		last = r.lease.Token()
		for j := i + 1; j < n; j++ {
			select {
			case r := <-results[j]:
				t.Fatalf("waiter %d returned (%v) while waiter %d, ahead of it, holds the lock", j, r.err, i)
			default:
			}
		}
		if err := r.lease.Release(ctx); err != nil {
			t.Fatalf("waiter %d's Release: %v", i, err)
		}
	}
	// One re-check per waiter per predecessor's deletion: 0 took it at
	// the holder's release, 2 at 0's (after the one at 1's give-up), 3
	// at 2's.
	if got := [n]int32{checks[0].Load(), checks[1].Load(), checks[2].Load(), checks[3].Load()}; got != [n]int32{1, 0, 2, 1} {
		t.Errorf("re-checks per waiter: %v, want [1 0 2 1]", got)
	}
	if got := queueLen(t, cli, holder, name); got != 0 {
		t.Errorf("%d keys left in the queue, want 0", got)
	}
}

// TestRevokedHolder: a revoke of a holder's etcd lease from another
// client (no KeepAlive, a long lease) closes Lost within the stated bound
// (the key's deletion is seen at once: here within 10% of the lease), and
// a waiter in another Locker takes the lock with a higher token, woken by
// the deletion although it re-checks only once a minute
// (locktest.CutHolderLost).
func TestRevokedHolder(t *testing.T) {
	s := sharedServer(t)
	a := newTestLocker(t, nil, nil)
	admin := newClient(t, s.Endpoints())
	locktest.CutHolderLost(t, locktest.CutHolder[*Lease]{
		Holder: a,
		Waiter: newTestLocker(t, nil, &Options{Recheck: time.Minute}),
		Queued: func(t *testing.T, name string) { waitQueue(t, admin, a, name, 2) },
		Cut: func(t *testing.T, held *Lease) {
			if _, err := admin.Revoke(context.Background(), etcdLease(held)); err != nil {
				t.Fatal(err)
			}
		},
		Bound: 2 * time.Second,
	})
}

// TestServerRestart: etcd is killed (SIGKILL) and started again on the
// same data directory, within the holder's lease. The holding survives:
// etcd keeps its keys and leases, and gives every etcd lease its full TTL
// again when its new leader starts, so the holder's KeepAlive renews it
// once the server is back, Lost stays open, and nobody else can take the
// lock. The waiter queued before the crash keeps its place (its watch
// resumes), takes the lock at the holder's release, and its token is
// higher; a key created after the restart has a higher token still.
func TestServerRestart(t *testing.T) {
	s := startServer(t)
	// The waiter must have joined the queue before the crash. The test
	// sees its key in etcd, but the kill can still cut the reply to its
	// join, and then that Acquire returns the error (its etcd lease is
	// revoked, so no orphan key stays): such a round proves nothing about
	// a queued waiter and is run again, up to three times.
	for round := range 3 {
		if serverRestartRound(t, s, fmt.Sprintf("%s-%d", testName(t), round)) {
			return
		}
		t.Logf("round %d: the kill cut the waiter's join reply; again", round)
	}
	t.Fatal("in 3 rounds the kill cut the waiter's join reply every time")
}

// serverRestartRound is one round of TestServerRestart on lock name. It
// reports false when the waiter's join of the queue got no reply (the
// kill cut it), so that the waiter was not queued before the crash.
func serverRestartRound(t *testing.T, s *etcdtest.Server, name string) bool {
	ctx := context.Background()
	const ttl = 10 * time.Second
	a := newTestLocker(t, s.Endpoints(), nil)
	b := newTestLocker(t, s.Endpoints(), &Options{Recheck: time.Minute})
	c := newTestLocker(t, s.Endpoints(), nil)
	held, err := a.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	held.KeepAlive(0)
	wctx, cancel := context.WithTimeout(ctx, 6*ttl)
	defer cancel()
	waiter := acquireAsync(t, wctx, b, name, ttl)
	waitQueue(t, newClient(t, s.Endpoints()), a, name, 2)

	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	// Wait for a renewal sent after the restart.
	for !held.Deadline().After(back.Add(ttl - lease.Drift(ttl))) {
		select {
		case <-held.Lost():
			t.Fatalf("the holder's lease was lost across a restart within its lease")
		case <-wctx.Done():
			t.Fatalf("no renewal of the holder's lease within %v of the restart", time.Since(back))
		case <-time.After(50 * time.Millisecond):
		}
	}
	if l, err := c.TryAcquire(ctx, name, ttl); !errors.Is(err, herd.ErrLeaseHeld) {
		l.Release(ctx)
		t.Fatalf("TryAcquire after the restart: %v, want ErrLeaseHeld", err)
	}
	select {
	case r := <-waiter:
		if r.err != nil && strings.Contains(r.err.Error(), "join the queue") {
			return false
		}
		t.Fatalf("the waiter returned (%v) while the holder still holds the lock", r.err)
	default:
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release after the restart: %v", err)
	}
	r := await(t, waiter, ttl, "the waiter queued before the crash")
	if r.err != nil {
		t.Fatalf("the waiter queued before the crash: %v", r.err)
	}
	if r.lease.Token() <= held.Token() {
		t.Errorf("tokens %d then %d: not increasing", held.Token(), r.lease.Token())
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := c.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.Token() <= r.lease.Token() {
		t.Errorf("tokens %d then %d: not increasing", r.lease.Token(), next.Token())
	}
	return true
}

// TestServerOutage: etcd is killed and stays down past the holder's
// lease. The holder's renewals fail, and Lost closes at its deadline (the
// last renewal's start plus the lease length), with the server still
// down. When the server is back it has given the old etcd lease a full
// TTL again (plus an election timeout), and nobody renews it any more:
// it runs out then (etcd sweeps expired leases every half second), and a
// new holder takes the lock with a higher token.
func TestServerOutage(t *testing.T) {
	ctx := context.Background()
	s := startServer(t)
	name := testName(t)
	const ttl = 2 * time.Second
	a := newTestLocker(t, s.Endpoints(), &Options{Timeout: 500 * time.Millisecond})
	b := newTestLocker(t, s.Endpoints(), &Options{MaxWait: 10 * ttl})
	held, err := a.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	held.KeepAlive(0)
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case <-held.Lost():
	case <-time.After(3 * ttl):
		t.Fatalf("Lost still open %v after the server was killed, with a %v lease", time.Since(killed), ttl)
	}
	if now := time.Now(); now.Before(held.Deadline()) {
		t.Errorf("Lost closed at %v, before the deadline %v", now, held.Deadline())
	}
	if err := held.Extend(ctx, ttl); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Extend of the lost lease: %v, want ErrLeaseLost", err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 10*ttl)
	defer cancel()
	next, err := b.Acquire(wctx, name, ttl)
	if err != nil {
		t.Fatalf("Acquire after the restart: %v", err)
	}
	defer next.Release(ctx)
	t.Logf("the old holder's lock was freed %v after the restart", time.Since(back))
	if next.Token() <= held.Token() {
		t.Errorf("tokens %d then %d: not increasing", held.Token(), next.Token())
	}
	if err := held.Release(ctx); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Release of the lost lease: %v, want ErrLeaseLost", err)
	}
}

// TestServerDown: with no server, TryAcquire and Acquire fail within the
// request timeout with the connection's error (not ErrLeaseHeld, no
// hang).
func TestServerDown(t *testing.T) {
	cli := newClient(t, []string{"127.0.0.1:1"})
	l := New(cli, &Options{Timeout: 500 * time.Millisecond})
	defer l.Close()
	locktest.ServerDown(t, l)
}

// TestBadOptions: invalid options panic in New, naming the field.
func TestBadOptions(t *testing.T) {
	cli := &clientv3.Client{}
	locktest.BadOptions(t, map[string]func(){
		"MaxWait": func() { New(cli, &Options{MaxWait: -1}) },
		"Recheck": func() { New(cli, &Options{Recheck: -1}) },
		"Timeout": func() { New(cli, &Options{Timeout: -1}) },
	}, func() { New(nil, nil) })
}

// TestTTL: a lease shorter than a second or longer than etcd's longest is
// ErrInvalidTTL, at once; a ttl between whole seconds is rounded up for
// the server, while the lease's deadline keeps the ttl asked for.
func TestTTL(t *testing.T) {
	ctx := context.Background()
	l := newTestLocker(t, nil, nil)
	for _, ttl := range []time.Duration{999 * time.Millisecond, maxLease + time.Second} {
		if _, err := l.TryAcquire(ctx, testName(t), ttl); !errors.Is(err, herd.ErrInvalidTTL) {
			t.Errorf("TryAcquire with ttl %v: %v, want ErrInvalidTTL", ttl, err)
		}
	}
	start := time.Now()
	lease, err := l.TryAcquire(ctx, testName(t), 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	if d := lease.Deadline(); d.After(start.Add(1500 * time.Millisecond)) {
		t.Errorf("Deadline %v after the start, more than the 1.5s asked for", d.Sub(start))
	}
	ttl, err := l.cli.TimeToLive(ctx, etcdLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	if ttl.GrantedTTL != 2 {
		t.Errorf("the etcd lease's TTL is %ds, want 2 (1.5s rounded up)", ttl.GrantedTTL)
	}
}

// TestExtendLonger: Extend to a length of other whole seconds moves the
// key to a new etcd lease of that TTL, keeping the token, and revokes the
// old etcd lease; a later KeepAlive renews the new one.
func TestExtendLonger(t *testing.T) {
	ctx := context.Background()
	l := newTestLocker(t, nil, nil)
	lease, err := l.TryAcquire(ctx, testName(t), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	old := etcdLease(lease)
	if err := lease.Extend(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	id := etcdLease(lease)
	if id == old {
		t.Fatal("Extend to 5s kept the 1s etcd lease")
	}
	got, err := l.cli.Get(ctx, lease.key)
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("the key after Extend: %v, %v", got, err)
	}
	if kv := got.Kvs[0]; uint64(kv.CreateRevision) != lease.Token() || clientv3.LeaseID(kv.Lease) != id {
		t.Errorf("the key after Extend: create revision %d, lease %x; want %d, %x", kv.CreateRevision, kv.Lease, lease.Token(), id)
	}
	if ttl, err := l.cli.TimeToLive(ctx, old); err != nil || ttl.TTL != -1 {
		t.Errorf("the old etcd lease after Extend: %+v, %v; want revoked (TTL -1)", ttl, err)
	}
	if ttl, err := l.cli.TimeToLive(ctx, id); err != nil || ttl.GrantedTTL != 5 {
		t.Errorf("the new etcd lease: %+v, %v; want a TTL of 5s", ttl, err)
	}
}

// TestReleaseLeavesLostOpen: Release deletes the lease's key, which the
// lease's own watch sees, and Lost stays open all the same.
func TestReleaseLeavesLostOpen(t *testing.T) {
	ctx := context.Background()
	l := newTestLocker(t, nil, nil)
	lease, err := l.TryAcquire(ctx, testName(t), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	lease.KeepAlive(0)
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Release waited for the watch's goroutine to end: had it closed Lost
	// on the deletion, it would be closed now.
	if isClosed(lease.Lost()) {
		t.Error("Release closed Lost")
	}
}
