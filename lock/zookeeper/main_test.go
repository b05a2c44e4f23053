package zookeeper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"

	"github.com/herdkit/herd"
	herdpg "github.com/herdkit/herd/lock/postgres"
	"github.com/herdkit/herd/lock/postgres/pgtest"
	"github.com/herdkit/herd/lock/zookeeper/zktest"
	"github.com/herdkit/herd/locktest"
	"github.com/jackc/pgx/v5"
)

// Environment of a worker process (see holder).
const (
	addrEnv = "HERD_ZK_ADDR" // the ZooKeeper server
	dbEnv   = "HERD_ZK_DB"   // the fenced table's PostgreSQL database
)

// The ZooKeeper server of this test binary, shared by the tests that do
// not stop it, or nil with zkErr saying why there is none; the PostgreSQL
// database of this run (for the fenced write of the pause scenario), or
// "" with dbErr.
var (
	zkServer *zktest.Server
	zkErr    error
	testDB   string
	dbErr    error
)

func TestMain(m *testing.M) {
	if code, ok := locktest.RunWorker(holder); ok {
		os.Exit(code)
	}
	os.Exit(locktest.Main(m, locktest.DirServer("ZooKeeper", "herd-zk-", startZK, &zkServer, &zkErr),
		pgtest.Server("herd_zk_test_", &testDB, &dbErr)))
}

// startZK starts a ZooKeeper server in dir, when java and its class path
// are there.
func startZK(dir string) (*zktest.Server, error) {
	if _, err := zktest.Available(); err != nil {
		return nil, err
	}
	return zktest.Start(dir)
}

// holder is the worker process's holder of locktest.PausedHolderFenced:
// a Locker on the ZooKeeper at $HERD_ZK_ADDR, and lock/postgres's fenced
// table in the database at $HERD_ZK_DB.
func holder(ctx context.Context) (herd.Lock[*Lease], locktest.TableRig, func(), error) {
	db, err := pgx.Connect(ctx, os.Getenv(dbEnv)) // the data's own connection
	if err != nil {
		return nil, locktest.TableRig{}, nil, err
	}
	locks := New([]string{os.Getenv(addrEnv)}, nil)
	return locks, tables(db), func() { locks.Close(); db.Close(ctx) }, nil
}

// tables is the locktest.TableRig of c, with lock/postgres's FencedTable
// writes.
func tables(c *pgx.Conn) locktest.TableRig {
	return pgtest.Tables(c, herdpg.DB(c), herdpg.FencedTable.Update, herdpg.FencedTable.Upsert)
}

// requireZK skips the test when there is no ZooKeeper (HERD_REQUIRE_REDIS=1
// has failed the run in TestMain then).
func requireZK(t testing.TB) {
	t.Helper()
	if zkServer == nil {
		locktest.Skip(t, "ZooKeeper server", zkErr)
	}
}

// startServer starts a ZooKeeper server of the test's own (for tests that
// kill it), stopped at the end of the test.
func startServer(t testing.TB) *zktest.Server {
	t.Helper()
	requireZK(t)
	s, err := zktest.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newTestLocker returns a Locker on srv (the shared server when nil),
// closed at the end of the test.
func newTestLocker(t testing.TB, srv *zktest.Server, opt *Options) *Locker {
	t.Helper()
	requireZK(t)
	if srv == nil {
		srv = zkServer
	}
	l := New([]string{srv.Addr()}, opt)
	t.Cleanup(func() { l.Close() })
	return l
}

// testName returns a lock name unique to the running test.
func testName(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return t.Name() + ":" + hex.EncodeToString(b[:])
}
