package etcd

import (
	"strings"
	"testing"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/lock/postgres/pgtest"
	"github.com/herdkit/herd/locktest"
)

// TestPausedHolderFenced is the pause scenario
// (locktest.PausedHolderFenced): a holder in another process, with
// KeepAlive running, is SIGSTOPped past its lease. Its renewals stop, so
// etcd expires its etcd lease and deletes its key, and a waiter takes the
// lock with a higher token and writes the row through a fenced write
// (lock/postgres's FencedTable); the first holder's late write is fenced,
// and its Lost closes once it resumes.
func TestPausedHolderFenced(t *testing.T) {
	s := sharedServer(t)
	locktest.PausedHolderFenced(t, locktest.PausedHolder[*Lease]{
		Env:    []string{endpointsEnv + "=" + strings.Join(s.Endpoints(), ","), dbEnv + "=" + testDB},
		Tables: tables(pgtest.Conn(t, testDB, dbErr)),
		NewLock: func(t *testing.T) herd.Lock[*Lease] {
			return newTestLocker(t, nil, nil)
		},
		Expiry: "etcd should have expired its lease",
	})
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
