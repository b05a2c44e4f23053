package herd

import (
	"context"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// Lease.KeepAlive's doc: "maxHold is not an interval but an absolute cap
// on the whole holding, counted from the acquire ... A cap that comes
// before the lease as acquired would end is kept too: Deadline becomes
// the cap (Lost closes at it)", and Lease.Lost's: it closes when
// "[Lease.KeepAlive] reached its cap". An Extend of the same lease after
// KeepAlive set the cap must not move the holding past it: neither the
// local Deadline (then Lost does not close at the cap) nor the lease in
// Redis (then other owners are kept out past it).
func TestKeepAliveCapHoldsAgainstAnExtend(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	l := newTestLocker(t, rdb, nil)
	ctx := context.Background()
	key := testKey(t)
	keys := mustKeys(t, key)
	start := time.Now()
	lease, err := l.TryAcquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	const maxHold = 3 * time.Second
	lease.KeepAlive(maxHold)
	capAt := start.Add(maxHold)
	// The watchdog's prompt renewal shortens the lease in Redis to the cap.
	waitFor(t, 5*time.Second, "the watchdog to shorten the lease to the cap", func() bool {
		return rdb.PTTL(ctx, keys.Lease).Val() <= maxHold
	})
	if d := lease.Deadline(); d.After(capAt) {
		t.Fatalf("Deadline %v after the cap before any Extend", d.Sub(capAt))
	}
	err = lease.Extend(ctx, 10*time.Second)
	if err != nil {
		return // refusing the Extend keeps the cap
	}
	if d := lease.Deadline(); d.After(capAt) {
		t.Errorf("after Extend(10s) the Deadline is %v past the KeepAlive cap: Lost will not close at the cap", d.Sub(capAt).Round(time.Millisecond))
	}
	if pttl := rdb.PTTL(ctx, keys.Lease).Val(); pttl > maxHold {
		t.Errorf("after Extend(10s) the lease lives %v in Redis, past the %v cap counted from the acquire", pttl, maxHold)
	}
}
