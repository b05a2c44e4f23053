package mysql

import (
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/locktest"
)

// TestConformance runs herd's lock conformance suite on the Locker. Each
// Lock the suite asks for is a new Locker with connections of its own,
// as another process would have. A waiting Acquire's GET_LOCK lasts a
// minute before it is re-issued, so a waiter that takes the key within
// the suite's bound (ten times Wake) was granted the lock by the server
// at the release; Lose KILLs the lease's connection from another one,
// while KeepAlive renews it, and the lease's check (every 100ms here)
// sees it.
func TestConformance(t *testing.T) {
	testConfig(t)
	opt := &Options{WaitChunk: time.Minute, Check: 100 * time.Millisecond}
	locktest.Run(t, func(t *testing.T) herd.Lock[*Lease] {
		return newTestLocker(t, opt)
	}, &locktest.Options{Wake: 50 * time.Millisecond, Lose: func(t *testing.T, l herd.LeaseHandle) {
		kill(t, l.(*Lease))
	}})
}
