package mysql

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/herdkit/herd"
)

// TestAttackAcquireWaitLongerThanTTL: an Acquire that waits longer than
// its lease length for a holder's release must get the lock (the lease
// counts from the grant, not from the start of the wait). The holder
// keeps the lock for 1s; the waiter asks for 400ms leases, with MaxWait
// 5s, so the wait is allowed to last past its ttl.
func TestAttackAcquireWaitLongerThanTTL(t *testing.T) {
	l := newTestLocker(t, &Options{MaxWait: 5 * time.Second})
	key := testName(t)
	ctx := context.Background()
	held, err := l.TryAcquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waiter := newTestLocker(t, &Options{MaxWait: 5 * time.Second})
	release := time.AfterFunc(time.Second, func() { _ = held.Release(ctx) })
	defer release.Stop()
	lease, err := waiter.Acquire(ctx, key, 400*time.Millisecond)
	if err != nil {
		t.Fatalf("Acquire after a 1s wait with a 400ms lease: got %v, want the lock", err)
	}
	if time.Until(lease.Deadline()) <= 0 {
		t.Errorf("Deadline %v is already past when Acquire returns", lease.Deadline())
	}
	if err := lease.Release(ctx); err != nil {
		t.Error(err)
	}
}

// TestAttackFenceTableDropped: a Locker whose fence table was dropped
// after it created it must create it again (its doc: "created if
// missing"), and hand out higher tokens.
func TestAttackFenceTableDropped(t *testing.T) {
	l := newTestLocker(t, &Options{Table: "attack_dropped_fence"})
	db := testDB(t)
	ctx := context.Background()
	key := testName(t)
	lease, err := l.TryAcquire(ctx, key, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	first := lease.Token()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "DROP TABLE attack_dropped_fence"); err != nil {
		t.Fatal(err)
	}
	lease, err = l.TryAcquire(ctx, key, time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after the fence table was dropped: %v", err)
	}
	defer lease.Release(ctx)
	if lease.Token() <= first {
		t.Errorf("token after the drop: %d, want above %d", lease.Token(), first)
	}
}

// TestAttackKeepAliveCapBeforeFirstRenewal: KeepAlive's maxHold is an
// absolute cap on the holding, counted from the acquire. A cap shorter
// than the first renewal's wait (a third to a half of the lease) must
// still end the lease at the cap, not at the lease's own end.
func TestAttackKeepAliveCapBeforeFirstRenewal(t *testing.T) {
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

// TestAttackUpsertOtherUniqueKey: Upsert's doc says ErrFenced means the
// row exists with a fence at or above the token. An insert that fails on
// another unique index of the table (not the key) is no such thing: the
// row does not exist, and the error must not wrap ErrFenced.
func TestAttackUpsertOtherUniqueKey(t *testing.T) {
	ctx := context.Background()
	db := testDB(t)
	name := "attack_unique_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+name+" (id int PRIMARY KEY, email varchar(64) NOT NULL UNIQUE, fence bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	tbl := FencedTable{Table: name}
	if err := tbl.Upsert(ctx, db, 1, 5, map[string]any{"email": "x@example.com"}); err != nil {
		t.Fatal(err)
	}
	err := tbl.Upsert(ctx, db, 2, 7, map[string]any{"email": "x@example.com"})
	if err == nil {
		t.Fatal("Upsert of a duplicate email succeeded")
	}
	if errors.Is(err, herd.ErrFenced) {
		t.Errorf("Upsert of row 2 (missing) with a duplicate email: %v; want a database error, not ErrFenced", err)
	}
}
