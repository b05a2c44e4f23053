package herd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"

	"net"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/herdkit/herd/internal/faultproxy"
)

// TestFencedWriteReportedDoneSurvivesFailover: FencedStore's promise that
// a write it reports done is on the replicas, so that after a failover a
// deposed holder's older token is still refused. B writes with t2 while
// both replicas are stopped; the master dies before they get it and one
// of them is promoted. Set must not have told B its write was done (before
// the write path, it returned nil, and A's older t1 was then accepted).
func TestFencedWriteReportedDoneSurvivesFailover(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	rdb := s.Client(t)
	ctx := context.Background()
	store := NewFencedStore(rdb, "").WithReplicaWait(0, failoverReplicaTimeout)
	key := testKey(t)
	const t1, t2 = 100, 200
	if err := store.Set(ctx, key, t1, []byte("A"), 0); err != nil {
		t.Fatalf("A's first write: %v", err)
	}
	master := s.Master(t)
	var replicas []*redistest.Server
	for _, n := range s.Nodes() {
		if n != master {
			replicas = append(replicas, n)
			n.Pause(t)
		}
	}
	errB := store.Set(ctx, key, t2, []byte("B"), 0)
	s.KillMasterThen(t, func() {
		for _, r := range replicas {
			r.Resume(t)
		}
	})
	errA := store.Set(ctx, key, t1, []byte("A again"), 0)
	if errB == nil && errA == nil {
		t.Fatalf("B's write with %d was reported done, and after the failover A's older %d was accepted", t2, t1)
	}
	if !errors.Is(errB, ErrNotReplicated) {
		t.Errorf("B's write with no replica acknowledging = %v, want ErrNotReplicated", errB)
	}
}

// TestFencedWriteWaitsForTheReplicas: a FencedStore write with a stalled
// replica is ErrNotReplicated (stored on the master only), and with the
// replicas healthy it is acknowledged.
func TestFencedWriteWaitsForTheReplicas(t *testing.T) {
	t.Parallel()
	p := startReplicated(t)
	ctx := context.Background()
	store := NewFencedStore(p.m, "").WithReplicaWait(0, failoverReplicaTimeout)
	key := testKey(t)
	if err := store.Set(ctx, key, 1, []byte("v"), time.Minute); err != nil {
		t.Fatalf("Set with healthy replicas: %v", err)
	}
	p.replica.Pause(t)
	defer p.replica.Resume(t)
	if err := store.Set(ctx, key, 2, []byte("v"), time.Minute); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("Set with a stalled replica = %v, want ErrNotReplicated", err)
	}
}

// TestFencedStoreSameHoldingWritesAgain: the equal-token rule that
// FencedStore shares with the FencedTable of lock/postgres and
// lock/mysql (docs/locks.md, "Fencing tokens"). A lease's holder writes
// twice with its token, both accepted (the second overwrites); a lower
// token is refused with ErrFenced, in an error that gives the record's
// fence and the token, and changes nothing; a higher one lands.
func TestFencedStoreSameHoldingWritesAgain(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	locks := NewLocker(rdb, nil)
	defer locks.Close()
	store := NewFencedStore(rdb, "")
	key := testKey(t)
	lease, err := locks.TryAcquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	tok := lease.Token()
	for _, v := range []string{"first", "second", "second"} {
		if err := store.Set(ctx, key, tok, []byte(v), 0); err != nil {
			t.Fatalf("the holding's write %q with its token %d: %v, want it accepted", v, tok, err)
		}
	}
	err = store.Set(ctx, key, tok-1, []byte("late"), 0)
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("a lower token: %v, want ErrFenced", err)
	}
	if msg, want := err.Error(), fmt.Sprintf("the record's fence is %d, above the write's token %d", tok, tok-1); !strings.Contains(msg, want) {
		t.Errorf("the refusal %q does not say %q", msg, want)
	}
	if v, got, err := store.Get(ctx, key); err != nil || string(v) != "second" || got != tok {
		t.Errorf("Get = %q, %d, %v; want \"second\", %d", v, got, err, tok)
	}
	if err := store.Set(ctx, key, tok+1, []byte("next"), 0); err != nil {
		t.Errorf("a higher token: %v", err)
	}
}

// TestFenceKeepsTheValueAndRefusesOlderTokens: Fence returns the record's
// value unchanged (empty for a missing record, which it creates) and from
// then on a write of a lower token is refused; a Fence of a lower token is
// refused too, and changes nothing.
func TestFenceKeepsTheValueAndRefusesOlderTokens(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	store := NewFencedStore(rdb, "")
	key := testKey(t)
	if v, err := store.Fence(ctx, key, 10); err != nil || len(v) != 0 {
		t.Fatalf("Fence of a missing record = %q, %v; want empty, nil", v, err)
	}
	if v, tok, err := store.Get(ctx, key); err != nil || len(v) != 0 || tok != 10 {
		t.Fatalf("Get after Fence = %q, %d, %v; want empty, 10", v, tok, err)
	}
	if err := store.Set(ctx, key, 10, []byte("done"), 0); err != nil {
		t.Fatal(err)
	}
	if v, err := store.Fence(ctx, key, 11); err != nil || string(v) != "done" {
		t.Fatalf("Fence of token 11 = %q, %v; want the value \"done\"", v, err)
	}
	if err := store.Set(ctx, key, 10, []byte("late"), 0); !errors.Is(err, ErrFenced) {
		t.Errorf("a write of token 10 after a Fence of 11: %v, want ErrFenced", err)
	}
	if _, err := store.Fence(ctx, key, 9); !errors.Is(err, ErrFenced) {
		t.Errorf("Fence of token 9 after 11: %v, want ErrFenced", err)
	}
	if v, tok, err := store.Get(ctx, key); err != nil || string(v) != "done" || tok != 11 {
		t.Errorf("Get = %q, %d, %v; want \"done\", 11", v, tok, err)
	}
	if _, err := store.Fence(ctx, "", 1); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Fence of an empty key: %v, want ErrInvalidKey", err)
	}
	// An existing record keeps its expiry (its fence goes with it).
	timed := testKey(t) + "-ttl"
	if err := store.Set(ctx, timed, 5, []byte("x"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Fence(ctx, timed, 6); err != nil {
		t.Fatal(err)
	}
	keys, _ := makeKeys(DefaultPrefix, timed)
	if ttl := rdb.PTTL(ctx, keys.Record).Val(); ttl <= 0 || ttl > time.Hour {
		t.Errorf("PTTL after Fence of a record set for an hour = %v, want its expiry kept", ttl)
	}
}

// appUserACL is a common hardened Redis user: every command except the
// @dangerous ones. INFO is @dangerous (COMMAND INFO info), WAIT, EVAL and
// EVALSHA are not, so this user can run every script and WAIT herd sends,
// but not the INFO replication the replica count is learned from.
var appUserACL = []any{"ACL", "SETUSER", "app", "on", ">app-secret", "~*", "&*", "+@all", "-@dangerous"}

// failoverUsers are the Redis users the failover tests of fenced writes
// run as: the default one, and appUserACL's without INFO, given the
// replica count (acks) or left to count them.
var failoverUsers = []struct {
	name     string
	user, pw string
	acks     int
}{
	{"default user", "", "", 0},
	{"user without INFO, 2 replicas given", "app", "app-secret", 2},
	{"user without INFO, default count", "app", "app-secret", 0},
}

// addAppUser creates the app user on node.
func addAppUser(t *testing.T, node *redis.Client) {
	t.Helper()
	if err := node.Do(context.Background(), appUserACL...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
}

// TestFencedWriteAsAUserWithoutINFO: the default replica count is learned
// from INFO replication, which a user without @dangerous may not run.
// Then the replicas cannot be counted and no write is reported done: Set
// returns ErrNotReplicated with an error that names the fix, even with
// healthy replicas. With the count given (WithReplicaWait), the same user
// waits for the replicas: done with healthy ones, not replicated with
// both stalled.
func TestFencedWriteAsAUserWithoutINFO(t *testing.T) {
	t.Parallel()
	p := startReplicated(t)
	addAppUser(t, p.m)
	app := p.master.Client(t, func(o *redis.Options) { o.Username, o.Password = "app", "app-secret" })
	ctx := context.Background()
	if err := app.Do(ctx, "WAIT", 0, 10).Err(); err != nil {
		t.Fatalf("the app user cannot WAIT: %v", err)
	}
	key := testKey(t)
	err := NewFencedStore(app, "").Set(ctx, key, 1, []byte("v1"), 0)
	if !errors.Is(err, ErrNotReplicated) || !strings.Contains(err.Error(), "+info") || !strings.Contains(err.Error(), "ReplicaAcks") {
		t.Errorf("Set by a user without INFO, default count = %v; want ErrNotReplicated naming +info and ReplicaAcks", err)
	}
	store := NewFencedStore(app, "").WithReplicaWait(2, failoverReplicaTimeout)
	if err := store.Set(ctx, key, 1, []byte("v1"), 0); err != nil {
		t.Fatalf("Set by a user without INFO, 2 replicas given, healthy replicas: %v", err)
	}
	p.replica.Pause(t)
	p.other.Pause(t)
	defer p.other.Resume(t)
	defer p.replica.Resume(t)
	err = store.Set(ctx, key, 2, []byte("v2"), 0)
	if !errors.Is(err, ErrNotReplicated) {
		t.Errorf("Set with both replicas stalled, 2 replicas given = %v, want ErrNotReplicated (it was stored on the master only)", err)
	}
}

// TestDeposedFencedWriteRefusedAfterFailover is the failover the
// FencedStore exists for, done by hand (as TestFailoverNoDuplicateToken
// does): the store writes t1 while both replicas are attached, then both
// leave the master (the replication link cut, the master still writable),
// B writes t2, the first replica is promoted, and A, the deposed holder,
// writes with the older t1 there. B's write is never reported done while
// A's is then accepted: with the default user (the count of 2 replicas is
// remembered for a minute), with a user without INFO and the count given,
// and with that user and the default count (no write is reported done).
func TestDeposedFencedWriteRefusedAfterFailover(t *testing.T) {
	t.Parallel()
	for _, tc := range failoverUsers {
		t.Run(tc.name, func(t *testing.T) {
			p := startReplicated(t)
			for _, c := range []*redis.Client{p.m, p.r, p.o} {
				addAppUser(t, c)
			}
			rdb, target := switchableAs(t, p.master.Addr(), tc.user, tc.pw)
			ctx := context.Background()
			store := NewFencedStore(rdb, "").WithReplicaWait(tc.acks, failoverReplicaTimeout)
			key := testKey(t)
			const t1, t2 = 100, 200
			uncounted := tc.user != "" && tc.acks == 0
			if err := store.Set(ctx, key, t1, []byte("A"), 0); err != nil && !(uncounted && errors.Is(err, ErrNotReplicated)) {
				t.Fatalf("A's first write: %v", err)
			}
			p.sync(t)
			p.cut(t)
			errB := store.Set(ctx, key, t2, []byte("B"), 0)
			p.promote(t)
			addr := p.replica.Addr()
			target.Store(&addr)
			p.master.Kill(t) // the old master's connections break; go-redis redials the new one
			_ = rdb.Ping(ctx).Err()
			store = NewFencedStore(rdb, "").WithReplicaWait(tc.acks, failoverReplicaTimeout) // A's process
			errA := store.Set(ctx, key, t1, []byte("A again"), 0)
			if errB == nil && errA == nil {
				val, tok, _ := store.Get(ctx, key)
				t.Fatalf("B's write with %d was reported done, and after the failover A's older %d was accepted (record now %q, token %d)", t2, t1, val, tok)
			}
			if !errors.Is(errB, ErrNotReplicated) {
				t.Errorf("B's write after both replicas left = %v, want ErrNotReplicated", errB)
			}
		})
	}
}

// switchableAs is switchable (failover_test.go) connecting as user.
func switchableAs(t *testing.T, addr, user, pw string) (*redis.Client, *atomic.Pointer[string]) {
	t.Helper()
	target := &atomic.Pointer[string]{}
	target.Store(&addr)
	c := redis.NewClient(&redis.Options{
		Addr:     addr,
		Username: user,
		Password: pw,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, *target.Load())
		},
	})
	t.Cleanup(func() { c.Close() })
	return c, target
}

// TestFencedSetReturnsAtOnceWhenCtxEndsOnASilentLink: writepath.go says
// every write herd makes goes through one path, and that the path owns
// the ctx hand-off: "a caller whose ctx ends leaves at once
// (leaveOnDone); the round trip already sent finishes on a context the
// caller cannot end". Cache.Set and the Locker leave at once; FencedStore
// (and so a Job's claim and record) sends its write on the caller's ctx
// without the hand-off. On a link that goes silent, a Set whose ctx is
// cancelled waits for go-redis's ReadTimeout, and its retries, before it
// returns.
func TestFencedSetReturnsAtOnceWhenCtxEndsOnASilentLink(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		open func(rdb *redis.Client) func(ctx context.Context, key string, n uint64) error
	}{
		{"Cache.Set", func(rdb *redis.Client) func(context.Context, string, uint64) error {
			c := newTestCache(t, rdb, nil)
			return func(ctx context.Context, key string, _ uint64) error {
				return c.Set(ctx, key, []byte("v"), time.Minute)
			}
		}},
		{"FencedStore.Set", func(rdb *redis.Client) func(context.Context, string, uint64) error {
			store := NewFencedStore(rdb, "")
			return func(ctx context.Context, key string, n uint64) error {
				return store.Set(ctx, key, n, []byte("v"), 0)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			p, err := faultproxy.Start(srv.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			rdb := redis.NewClient(&redis.Options{Addr: p.Addr()}) // go-redis's defaults: ReadTimeout 3s, MaxRetries 3
			defer rdb.Close()
			set := tc.open(rdb)
			ctx := context.Background()
			key := testKey(t)
			if err := set(ctx, key, 1); err != nil {
				t.Fatalf("a write on a healthy link: %v", err)
			}
			p.SetBlackhole(true)
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			got := make(chan error, 1)
			go func() { got <- set(cctx, key, 2) }()
			time.Sleep(100 * time.Millisecond) // the write is on the silent link
			cancel()
			start := time.Now()
			bound := time.NewTimer(time.Second)
			defer bound.Stop()
			select {
			case err = <-got:
			case <-bound.C:
				hang := time.NewTimer(time.Minute)
				defer hang.Stop()
				select {
				case <-got:
					t.Fatalf("%s returned %v after its ctx was cancelled on a silent link; want at once", tc.name, time.Since(start).Round(100*time.Millisecond))
				case <-hang.C:
					t.Fatalf("%s still running a minute after its ctx was cancelled on a silent link", tc.name)
				}
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled %s = %v, want context.Canceled", tc.name, err)
			}
		})
	}
}

// TestFencedErrorsDoNotCarryAnUnboundedKey: the seams issue's rule for
// defect 7, "an error never carries an unbounded copy of user input",
// which lock names now follow (CheckLockKey quotes a bounded prefix).
// FencedStore keys have no bound (they are hashed into Redis names), and
// its errors quote the whole key: a refused write of a 4 MiB key returns
// an error of more than 4 MiB. A Job's record key is bounded through its
// Name; a FencedStore used directly is not.
func TestFencedErrorsDoNotCarryAnUnboundedKey(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	store := NewFencedStore(rdb, "")
	ctx := context.Background()
	key := strings.Repeat("k", 4<<20)
	if err := store.Set(ctx, key, 2, []byte("v"), 0); err != nil {
		t.Fatalf("Set: %v", err)
	}
	err := store.Set(ctx, key, 1, []byte("older"), 0)
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("older token = %v, want ErrFenced", err)
	}
	if n := len(err.Error()); n > 2*MaxLockKeyBytes {
		t.Errorf("ErrFenced for a %d-byte key is %d bytes long; want it bounded (at most %d)", len(key), n, 2*MaxLockKeyBytes)
	}
	_, _, err = store.Get(ctx, key+"-missing")
	if n := len(err.Error()); n > 2*MaxLockKeyBytes {
		t.Errorf("ErrNotFound for a %d-byte key is %d bytes long; want it bounded (at most %d)", len(key), n, 2*MaxLockKeyBytes)
	}
}

// TestFencedStoreWithReplicaWaitRefusesBadOptions: WithReplicaWait takes
// the Locker's ReplicaAcks and ReplicaTimeout and refuses what they
// refuse, at once, naming the store; the store it was called on is left
// as it was.
func TestFencedStoreWithReplicaWaitRefusesBadOptions(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: time.Second})
	defer rdb.Close()
	s := NewFencedStore(rdb, "")
	for _, tc := range []struct {
		acks    int
		timeout time.Duration
		want    string
	}{
		{-2, 0, "FencedStore.ReplicaAcks is -2"},
		{0, -time.Second, "FencedStore.ReplicaTimeout is negative"},
		{0, time.Microsecond, "below the millisecond"},
		{0, time.Second, "not below the client's ReadTimeout"},
	} {
		func() {
			defer func() {
				if msg := fmt.Sprint(recover()); !strings.Contains(msg, tc.want) {
					t.Errorf("WithReplicaWait(%d, %v) panicked with %q, want %q", tc.acks, tc.timeout, msg, tc.want)
				}
			}()
			s.WithReplicaWait(tc.acks, tc.timeout)
		}()
	}
	if w := s.WithReplicaWait(2, 100*time.Millisecond); w == s || w.writes.acks != 2 || s.writes.acks != 0 {
		t.Errorf("WithReplicaWait(2, 100ms) = acks %d (the original's now %d), want a copy with 2", w.writes.acks, s.writes.acks)
	}
}
