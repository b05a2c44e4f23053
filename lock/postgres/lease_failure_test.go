package postgres

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/herdkit/herd"
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

// TestFenceTableDropped: a Locker whose fence table was dropped
// (and which created it once) keeps failing every acquire, though its
// doc says it creates the table if missing.
func TestFenceTableDropped(t *testing.T) {
	l := newTestLocker(t, &Options{Table: "attack_dropped_fence"})
	c := testConn(t)
	ctx := context.Background()
	name := testName(t)
	lease, err := l.TryAcquire(ctx, name, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	first := lease.Token()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "DROP TABLE attack_dropped_fence"); err != nil {
		t.Fatal(err)
	}
	lease, err = l.TryAcquire(ctx, name, time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after the fence table was dropped: %v", err)
	}
	defer lease.Release(ctx)
	if lease.Token() <= first {
		t.Errorf("token after the drop: %d, want above %d", lease.Token(), first)
	}
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

// TestKeepAliveCapBeforeFirstRenewal: KeepAlive's maxHold is an
// absolute cap on the holding, counted from the acquire. A cap shorter
// than the first renewal's wait (a third to a half of the lease) must
// still end the lease at the cap, not at the lease's own end.
func TestKeepAliveCapBeforeFirstRenewal(t *testing.T) {
	l := newTestLocker(t, nil)
	ctx := context.Background()
	const ttl, maxHold = 6 * time.Second, 300 * time.Millisecond
	lease, err := l.TryAcquire(ctx, testName(t), ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	capAt := time.Now().Add(maxHold)
	lease.KeepAlive(maxHold)
	if d := lease.Deadline(); d.After(capAt) {
		t.Errorf("Deadline %v after KeepAlive(%v), past the cap by %v", d, maxHold, d.Sub(capAt))
	}
	select {
	case <-lease.Lost():
	case <-time.After(ttl / 2):
		t.Errorf("Lost still open %v after the acquire, with KeepAlive(%v)", ttl/2, maxHold)
	}
}

// TestCancelWhileTableCreationBlocks: TryAcquire's context bounds
// the call. While another attempt of the Locker is stuck creating the
// fence table (its CREATE waits for another session's uncommitted CREATE
// of the same table), a TryAcquire with a short context must return when
// that context ends, not when the other attempt does. Bound: 2s (the
// context is 200ms; the stuck attempt's is 20s).
func TestCancelWhileTableCreationBlocks(t *testing.T) {
	ctx := context.Background()
	admin := testConn(t)
	// A table of its own per run: the stuck attempt's CREATE may go
	// through once the blocking transaction rolls back.
	table := fmt.Sprintf("attack_blocked_fence_%d", time.Now().UnixNano())
	defer testConn(t).Exec(ctx, "DROP TABLE IF EXISTS "+table)
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "CREATE TABLE "+table+" (name bytea PRIMARY KEY, token bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	l := newTestLocker(t, &Options{Table: table})
	stuckCtx, stuckCancel := context.WithTimeout(ctx, 20*time.Second)
	defer stuckCancel()
	stuck := make(chan error, 1)
	go func() {
		lease, err := l.TryAcquire(stuckCtx, testName(t), time.Second)
		if lease != nil {
			lease.Release(ctx)
		}
		stuck <- err
	}()
	// Wait until the stuck attempt's CREATE waits for the lock.
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		if err := testConn(t).QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'CREATE TABLE IF NOT EXISTS%'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first attempt's CREATE never waited")
		}
		time.Sleep(10 * time.Millisecond)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		lease, err := l.TryAcquire(short, testName(t), time.Second)
		if lease != nil {
			lease.Release(ctx)
		}
		done <- err
	}()
	returned := false
	select {
	case err := <-done:
		returned = true
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("TryAcquire: %v, want its context's end", err)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("TryAcquire with a 200ms context still running after %v", time.Since(start))
	}
	tx.Rollback(ctx)
	stuckCancel()
	<-stuck
	if !returned {
		<-done
	}
}
