package zookeeper

import (
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/lock/zookeeper/zktest"
	"github.com/herdkit/herd/locktest"
)

// TestConformance runs herd's lock conformance suite on the Locker. Each
// Lock the suite asks for is a new Locker with sessions of its own, as
// another process would have. Re-checks come once a minute, so a waiter
// that takes the key within the suite's bound (ten times Wake) was woken
// by the watch on its predecessor's node; Lose ends the lease's session
// from a second connection (closeSession with its id and password), which
// is what the server does when a session expires, while KeepAlive renews
// it. Short leases are 1s, not the suite's 300ms: a session of 300ms is
// lost whenever a pong takes 200ms (zk's read timeout, two thirds of the
// session), which a loaded machine running -race does now and then.
func TestConformance(t *testing.T) {
	requireZK(t)
	opt := &Options{Recheck: time.Minute}
	locktest.Run(t, func(t *testing.T) herd.Lock[*Lease] {
		return newTestLocker(t, nil, opt)
	}, &locktest.Options{Wake: 100 * time.Millisecond, Short: time.Second, Lose: func(t *testing.T, lease herd.LeaseHandle) {
		endSession(t, zkServer, lease.(*Lease))
	}})
}

// endSession ends lease's session from another connection.
func endSession(t *testing.T, srv *zktest.Server, lease *Lease) {
	t.Helper()
	id, passwd := lease.s.credentials()
	if err := srv.CloseSession(id, passwd); err != nil {
		t.Fatal(err)
	}
}
