package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/locktest"
)

// TestConformance runs herd's lock conformance suite on the Locker. Each
// Lock the suite asks for is a new Locker with connections of its own,
// as another process would have. Re-checks come once a minute, so a
// waiter that takes the key within the suite's bound (ten times Wake) was
// woken by a NOTIFY; Lose ends the lease's session with
// pg_terminate_backend, while KeepAlive renews it.
func TestConformance(t *testing.T) {
	testConf(t)
	opt := &Options{PollMin: time.Minute, PollMax: time.Minute}
	locktest.Run(t, func(t *testing.T) herd.Lock[*Lease] {
		return newTestLocker(t, opt)
	}, &locktest.Options{Wake: 50 * time.Millisecond, Lose: terminate,
		// A session's lease is its idle_session_timeout: the server ends
		// a session idle for one lease length, so a renewal that a loaded
		// machine (the root package's -race suite beside this one) holds
		// up for longer loses it, as it should. The keepalive case's
		// 1s lease lost so once in CI; it gets 2s.
		Short: 2 * time.Second})
}

// terminate ends the session of lease's connection from another one.
func terminate(t *testing.T, lease herd.LeaseHandle) {
	t.Helper()
	pid := lease.(*Lease).conn.PgConn().PID()
	var ok bool
	if err := testConn(t).QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", int64(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v, %v", pid, ok, err)
	}
}
