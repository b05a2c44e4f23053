package postgres

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/locktest"
	"github.com/jackc/pgx/v5"
)

// TestTokensAfterFenceRowsDeleted: Token's doc says tokens of one
// name strictly increase from one holder to the next. Deleting the fence
// table's rows (a restore from an older backup, a cleanup job) must not
// hand out a token again.
func TestTokensAfterFenceRowsDeleted(t *testing.T) {
	l := newTestLocker(t, nil)
	c := testConn(t)
	ctx := context.Background()
	name := testName(t)
	var last uint64
	for i := 0; i < 3; i++ {
		lease, err := l.TryAcquire(ctx, name, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if lease.Token() <= last {
			t.Errorf("holding %d: token %d, want above %d", i, lease.Token(), last)
		}
		last = lease.Token()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "DELETE FROM herd_lock_fence"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFenceTableDropped: a Locker whose fence table was dropped after it
// created it creates it again, and hands out higher tokens
// (locktest.FenceTableDropped).
func TestFenceTableDropped(t *testing.T) {
	locktest.FenceTableDropped(t, newTestLocker(t, &Options{Table: "attack_dropped_fence"}), func(t *testing.T) {
		if _, err := testConn(t).Exec(context.Background(), "DROP TABLE attack_dropped_fence"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLongName: TryAcquire's doc says any string of 1 to
// herd.MaxLockKeyBytes bytes is a valid name. A long name (random bytes
// do not compress; above 1KB, the fence table keeps its hash) must be
// lockable, and exclude a second holder, up to the bound.
func TestLongName(t *testing.T) {
	l := newTestLocker(t, nil)
	ctx := context.Background()
	for _, n := range []int{3000, herd.MaxLockKeyBytes} {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		name := string(b)
		lease, err := l.TryAcquire(ctx, name, time.Second)
		if err != nil {
			t.Errorf("a %d-byte name: TryAcquire: %.300s", n, err)
			continue
		}
		if _, err := l.TryAcquire(ctx, name, time.Second); !errors.Is(err, herd.ErrLeaseHeld) {
			t.Errorf("a %d-byte name, second TryAcquire: got %.300v, want ErrLeaseHeld", n, err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Error(err)
		}
	}
}

// TestKeepAliveCapBeforeFirstRenewal: KeepAlive's cap ends the lease
// even when it comes before the first renewal
// (locktest.KeepAliveCapBeforeFirstRenewal).
func TestKeepAliveCapBeforeFirstRenewal(t *testing.T) {
	locktest.KeepAliveCapBeforeFirstRenewal(t, newTestLocker(t, nil))
}

// TestCancelWhileTableCreationBlocks: while another attempt of the Locker
// is stuck creating the fence table (its CREATE waits for another
// session's uncommitted CREATE of the same table), a TryAcquire with a
// short context returns when that context ends
// (locktest.CancelWhileTableCreationBlocks).
func TestCancelWhileTableCreationBlocks(t *testing.T) {
	ctx := context.Background()
	// A table of its own per run: the stuck attempt's CREATE may go
	// through once the blocking transaction rolls back.
	table := fmt.Sprintf("attack_blocked_fence_%d", time.Now().UnixNano())
	t.Cleanup(func() { testConn(t).Exec(ctx, "DROP TABLE IF EXISTS "+table) })
	db := testConn(t)
	locktest.CancelWhileTableCreationBlocks(t, locktest.TableCreationBlocked[*Lease]{
		Lock: newTestLocker(t, &Options{Table: table}),
		Block: func(t *testing.T) func() {
			tx, err := testConn(t).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tx.Rollback(ctx) })
			if _, err := tx.Exec(ctx, "CREATE TABLE "+table+" (name bytea PRIMARY KEY, token bigint NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			return func() { tx.Rollback(ctx) }
		},
		Waiting: func(t *testing.T) bool {
			var n int
			if err := db.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'CREATE TABLE IF NOT EXISTS%'").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n > 0
		},
	})
}

// terminateInUnlock makes holder's leases' unlock statements fail: the
// session is terminated, and gone, just before the statement. It runs
// while the lease has its connection, so the lease's watcher cannot see
// the session end: only the unlock's failure tells. ended is closed once
// it ran.
func terminateInUnlock(t *testing.T, holder *Locker) (ended <-chan struct{}) {
	ctx := context.Background()
	db := testConn(t)
	done := make(chan struct{})
	holder.beforeUnlock = func(c *pgx.Conn) {
		defer close(done)
		pid := int64(c.PgConn().PID())
		if _, err := db.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			t.Errorf("pg_terminate_backend(%d): %v", pid, err)
			return
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			var n int
			if err := db.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil || n == 0 {
				return
			}
		}
		t.Errorf("session %d still up 10s after pg_terminate_backend", pid)
	}
	return done
}

// waitFor starts an Acquire of name in waiter and returns its outcome.
func waitFor(t *testing.T, waiter *Locker, name string) <-chan error {
	t.Helper()
	got := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	go func() {
		l, err := waiter.Acquire(ctx, name, 10*time.Second)
		if err == nil {
			err = l.Release(context.Background())
		}
		got <- err
	}()
	listening(t)
	return got
}

// woken fails unless the Acquire whose outcome is got takes the lock
// within 10 s (its Locker re-checks once a minute: only an announcement
// wakes it sooner).
func woken(t *testing.T, got <-chan error, what string) {
	t.Helper()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiting Acquire: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the waiter still waits 10s after %s: the lock was freed unannounced, and it re-checks once a minute", what)
	}
}

// TestLeaseWhoseSessionEndedBeforeItsDeadlineStillWakesWaiters: a lease
// that runs out unlocks and announces the lock; when its session has
// already ended by then (the server's idle limit fired before the
// client's deadline, a restart), the unlock cannot run and the server
// frees the lock silently. A waiter that re-checks once a minute must
// still take the lock soon after, woken by the lease's announcement, also
// when the lease's Locker was closed meanwhile (its leases keep working).
func TestLeaseWhoseSessionEndedBeforeItsDeadlineStillWakesWaiters(t *testing.T) {
	for _, closed := range []bool{false, true} {
		t.Run(map[bool]string{false: "open Locker", true: "closed Locker"}[closed], func(t *testing.T) {
			holder := newTestLocker(t, nil)
			waiter := newTestLocker(t, &Options{PollMin: time.Minute, PollMax: time.Minute})
			ended := terminateInUnlock(t, holder)
			name := testName(t)
			held, err := holder.TryAcquire(context.Background(), name, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if closed {
				holder.Close()
			}
			got := waitFor(t, waiter, name)
			select {
			case <-held.Lost():
			case <-time.After(10 * time.Second):
				t.Fatal("Lost() still open 10s after a 1s lease that nobody renewed")
			}
			<-ended
			woken(t, got, "the lease ran out on an ended session")
		})
	}
}

// TestSessionEndedWhileHeldWakesWaitersAfterClose: a lease of a closed
// Locker whose session ends while held (pg_terminate_backend) announces
// the freed lock, as an open Locker's does (TestTerminatedHolder).
func TestSessionEndedWhileHeldWakesWaitersAfterClose(t *testing.T) {
	holder := newTestLocker(t, nil)
	waiter := newTestLocker(t, &Options{PollMin: time.Minute, PollMax: time.Minute})
	name := testName(t)
	held, err := holder.TryAcquire(context.Background(), name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	holder.Close()
	got := waitFor(t, waiter, name)
	terminate(t, held)
	<-held.Lost()
	woken(t, got, "a closed Locker's lease's session was terminated")
}
