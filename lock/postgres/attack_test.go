package postgres

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd"
)

// TestAttackTokensAfterFenceRowsDeleted: Token's doc says tokens of one
// name strictly increase from one holder to the next. Deleting the fence
// table's rows (a restore from an older backup, a cleanup job) must not
// hand out a token again.
func TestAttackTokensAfterFenceRowsDeleted(t *testing.T) {
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

// TestAttackFenceTableDropped: a Locker whose fence table was dropped
// (and which created it once) keeps failing every acquire, though its
// doc says it creates the table if missing.
func TestAttackFenceTableDropped(t *testing.T) {
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

// TestAttackLongName: TryAcquire's doc says any string but the empty one
// is a valid name. A long name (random bytes do not compress) must be
// lockable, and exclude a second holder.
func TestAttackLongName(t *testing.T) {
	l := newTestLocker(t, nil)
	ctx := context.Background()
	for _, n := range []int{3000, 100 << 10} {
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
