package mysql

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestReleaseRestoresSession: a released lease's connection goes back to
// the Locker's pool with the wait_timeout it had before the lease (the
// lease's short one would have the server close it while idle), and holds
// no lock.
func TestReleaseRestoresSession(t *testing.T) {
	ctx := context.Background()
	l := newTestLocker(t, &Options{IdleConns: 1})
	name := testName(t)
	lease, err := l.TryAcquire(ctx, name, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := l.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var id, wt, locks int64
	if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID(), @@SESSION.wait_timeout, IS_USED_LOCK('"+lockName(name)+"') IS NOT NULL").Scan(&id, &wt, &locks); err != nil {
		t.Fatal(err)
	}
	if id != lease.ConnectionID() {
		t.Fatalf("the pool's connection is session %d, not the lease's %d: the lease's was not put back", id, lease.ConnectionID())
	}
	if wt != lease.idle || wt == waitTimeout(1500*time.Millisecond) {
		t.Errorf("the put-back session's wait_timeout is %d, want %d as before the lease", wt, lease.idle)
	}
	if locks != 0 {
		t.Error("the lock is still held after Release")
	}
}

// TestCloseLeavesNoGoroutine: after its leases are released (one of them
// kept alive, one waited for, one lost to a KILL) and Close, a Locker has
// no goroutine left: not its leases' checkers and watchdogs, not its
// pool's.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	ctx := context.Background()
	testConfig(t)
	before := goleak.IgnoreCurrent()
	db := testDB(t)
	l := New(testConfig(t), &Options{Check: 50 * time.Millisecond})
	name := testName(t)
	kept, err := l.TryAcquire(ctx, name, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	kept.KeepAlive(0)
	got := make(chan *Lease, 1)
	go func() {
		lease, _ := l.Acquire(ctx, name, time.Second)
		got <- lease
	}()
	waitForWaiter(t, db, name)
	if err := kept.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waited := <-got
	if waited == nil {
		t.Fatal("the waiting Acquire failed")
	}
	if _, err := db.Exec(fmt.Sprintf("KILL %d", waited.ConnectionID())); err != nil {
		t.Fatal(err)
	}
	<-waited.Lost()
	_ = waited.Release(ctx)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	db.Close()
	goleak.VerifyNone(t, before)
}

// TestAutocommitOff: with autocommit=0 in the DSN, the tokens are still
// committed as they are taken: another connection sees the last one, and
// another Locker's acquire is not blocked by an open transaction on the
// fence row.
func TestAutocommitOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := testConfig(t)
	cfg.Params = map[string]string{"autocommit": "0"}
	a, b := New(cfg, nil), New(cfg, nil)
	defer a.Close()
	defer b.Close()
	name := testName(t)
	first, err := a.TryAcquire(ctx, name, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var token uint64
	if err := testDB(t).QueryRowContext(ctx, "SELECT token FROM herd_lock_fence WHERE name = ?", lockName(name)).Scan(&token); err != nil || token != first.Token() {
		t.Errorf("the fence table's token, read elsewhere: %d, %v; want %d", token, err, first.Token())
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := b.TryAcquire(ctx, name, 20*time.Second)
	if err != nil {
		t.Fatalf("the next holder's TryAcquire: %v", err)
	}
	defer next.Release(ctx)
	if next.Token() <= first.Token() {
		t.Errorf("tokens %d then %d: not increasing", first.Token(), next.Token())
	}
}

// TestCustomTable: Options.Table names the fence table, database.table
// with a dot; the Locker creates it and takes its tokens there.
func TestCustomTable(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	l := newTestLocker(t, &Options{Table: cfg.DBName + ".my fence"})
	name := testName(t)
	lease, err := l.TryAcquire(ctx, name, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	var token uint64
	if err := testDB(t).QueryRowContext(ctx, "SELECT token FROM `my fence` WHERE name = ?", lockName(name)).Scan(&token); err != nil || token != lease.Token() {
		t.Errorf("the custom fence table's token: %d, %v; want %d", token, err, lease.Token())
	}
}
