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
