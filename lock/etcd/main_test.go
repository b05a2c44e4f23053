package etcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/lock/etcd/etcdtest"
	herdpg "github.com/herdkit/herd/lock/postgres"
	"github.com/herdkit/herd/lock/postgres/pgtest"
	"github.com/herdkit/herd/locktest"
	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Environment of a worker process (see holder).
const (
	endpointsEnv = "HERD_ETCD_ENDPOINTS" // the etcd endpoints, comma-separated
	dbEnv        = "HERD_ETCD_DB"        // the PostgreSQL database of the fenced table
)

// The shared etcd server of this run, or nil with serverErr saying why
// there is none; the PostgreSQL database of this run, or "" with dbErr.
var (
	shared    *etcdtest.Server
	serverErr error
	testDB    string
	dbErr     error
)

func TestMain(m *testing.M) {
	if code, ok := locktest.RunWorker(holder); ok {
		os.Exit(code)
	}
	os.Exit(locktest.Main(m, locktest.DirServer("etcd", "herd-etcd-", etcdtest.Start, &shared, &serverErr),
		pgtest.Server("herd_etcd_test_", &testDB, &dbErr)))
}

// holder is the worker process's holder of locktest.PausedHolderFenced:
// a Locker on the etcd at $HERD_ETCD_ENDPOINTS, and lock/postgres's
// fenced table in the database at $HERD_ETCD_DB.
func holder(ctx context.Context) (herd.Lock[*Lease], locktest.TableRig, func(), error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Getenv(endpointsEnv), ","), Logger: zap.NewNop()})
	if err != nil {
		return nil, locktest.TableRig{}, nil, err
	}
	db, err := pgx.Connect(ctx, os.Getenv(dbEnv)) // the data's own connection
	if err != nil {
		cli.Close()
		return nil, locktest.TableRig{}, nil, err
	}
	locks := New(cli, nil)
	return locks, tables(db), func() { locks.Close(); db.Close(ctx); cli.Close() }, nil
}

// tables is the locktest.TableRig of c, with lock/postgres's FencedTable
// writes.
func tables(c *pgx.Conn) locktest.TableRig {
	return pgtest.Tables(c, herdpg.DB(c), herdpg.FencedTable.Update, herdpg.FencedTable.Upsert)
}

// sharedServer returns the run's etcd server, or skips the test when
// there is none (HERD_REQUIRE_REDIS=1 has failed the run in TestMain).
func sharedServer(t testing.TB) *etcdtest.Server {
	t.Helper()
	if shared == nil {
		locktest.Skip(t, "etcd server", serverErr)
	}
	return shared
}

// startServer starts an etcd server of the test's own, for tests that
// kill or pause it; it is stopped at the end of the test.
func startServer(t testing.TB) *etcdtest.Server {
	t.Helper()
	s, err := etcdtest.Start(t.TempDir())
	if errors.Is(err, etcdtest.ErrNoBinary) && !locktest.Required() {
		locktest.Skip(t, "etcd binary", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// newClient returns a client of the server at endpoints, closed at the
// end of the test.
func newClient(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// newTestLocker returns a Locker with a client of its own on the server
// at endpoints (the shared server's when nil), closed at the end of the
// test.
func newTestLocker(t testing.TB, endpoints []string, opt *Options) *Locker {
	t.Helper()
	if endpoints == nil {
		endpoints = sharedServer(t).Endpoints()
	}
	l := New(newClient(t, endpoints), opt)
	t.Cleanup(func() { l.Close() })
	return l
}

// testName returns a lock name unique to the running test.
func testName(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return t.Name() + ":" + hex.EncodeToString(b[:])
}

// etcdLease returns the ID of lease's current etcd lease.
func etcdLease(lease *Lease) clientv3.LeaseID {
	lease.life.Lock()
	defer lease.life.Unlock()
	return lease.id
}
