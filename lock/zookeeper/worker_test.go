package zookeeper

import (
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/lock/postgres/pgtest"
	"github.com/herdkit/herd/locktest"
)

// TestPausedHolderFenced is the pause scenario
// (locktest.PausedHolderFenced): a holder in another process, with
// KeepAlive running, is SIGSTOPped past its session timeout. The server
// expires its session and deletes its node, no sooner than nine tenths of
// the timeout, so a second holder takes the lock with a higher token and
// writes the row through lock/postgres's fenced write; the first holder's
// late write is fenced.
func TestPausedHolderFenced(t *testing.T) {
	requireZK(t)
	locktest.PausedHolderFenced(t, locktest.PausedHolder[*Lease]{
		Env:    []string{addrEnv + "=" + zkServer.Addr(), dbEnv + "=" + testDB},
		Tables: tables(pgtest.Conn(t, testDB, dbErr)),
		NewLock: func(t *testing.T) herd.Lock[*Lease] {
			return newTestLocker(t, nil, &Options{Recheck: time.Minute})
		},
		Expiry:      "the server should have expired its session",
		MinHandover: time.Second * 9 / 10,
	})
}
