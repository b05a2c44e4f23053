package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/locktest"
)

// TestConformance runs herd's lock conformance suite on the Locker. Each
// Lock the suite asks for is a new Locker with a client of its own, as
// another process would have. Re-checks come once a minute, so a waiter
// that takes the key within the suite's bound (ten times Wake) was woken
// by the watch of its predecessor's key; Lose revokes the lease's etcd
// lease from another client, while KeepAlive renews it. The server's
// shortest lease is 1s (etcdtest's election timeout); Short is 2s, because
// a loaded CI machine once took longer than 1s to grant a lease and commit
// its key, and the acquire then rightly reported its validity spent.
func TestConformance(t *testing.T) {
	s := sharedServer(t)
	admin := newClient(t, s.Endpoints())
	opt := &Options{Recheck: time.Minute}
	locktest.Run(t, func(t *testing.T) herd.Lock[*Lease] {
		return newTestLocker(t, nil, opt)
	}, &locktest.Options{
		Wake:  50 * time.Millisecond,
		Short: 2 * time.Second,
		Lose: func(t *testing.T, lease herd.LeaseHandle) {
			t.Helper()
			if _, err := admin.Revoke(context.Background(), etcdLease(lease.(*Lease))); err != nil {
				t.Fatalf("revoke the lease's etcd lease: %v", err)
			}
		},
	})
}
