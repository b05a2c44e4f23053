package etcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/herdkit/herd/lock/etcd/etcdtest"
	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// Environment of the tests.
const (
	requireEnv = "HERD_REQUIRE_REDIS" // 1: a missing server fails the tests (herd's CI variable for every server)
	pgURLEnv   = "HERD_PG_URL"        // the PostgreSQL admin URL, for the fenced write of the pause test
	workerEnv  = "HERD_ETCD_WORKER"   // set when the test binary runs as a worker process
	defaultPG  = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
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
	if role := os.Getenv(workerEnv); role != "" {
		os.Exit(runWorker(role))
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	required := os.Getenv(requireEnv) == "1"
	dir, err := os.MkdirTemp("", "herd-etcd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	shared, serverErr = etcdtest.Start(dir)
	if serverErr != nil {
		shared = nil
		if required {
			fmt.Fprintf(os.Stderr, "etcd is needed (%s=1): %v\n", requireEnv, serverErr)
			return 1
		}
	}
	admin := os.Getenv(pgURLEnv)
	if admin == "" {
		admin = defaultPG
	}
	drop, err := createDB(admin)
	if err != nil {
		if required {
			fmt.Fprintf(os.Stderr, "PostgreSQL at %s is needed (%s=1): %v\n", admin, requireEnv, err)
			return 1
		}
		dbErr = err
	}
	code := m.Run()
	if drop != nil {
		if err := drop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = max(code, 1)
		}
	}
	if shared != nil {
		if err := shared.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = max(code, 1)
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// createDB creates a PostgreSQL database with a random name, sets testDB
// to its URL, and returns the function that drops it.
func createDB(admin string) (func() error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		return nil, err
	}
	defer c.Close(context.Background())
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "herd_etcd_test_" + hex.EncodeToString(b[:])
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, err
	}
	u, err := url.Parse(admin)
	if err != nil {
		return nil, err
	}
	u.Path = "/" + name
	testDB = u.String()
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			return fmt.Errorf("drop the test database %s: %w", name, err)
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop the test database %s: %w", name, err)
		}
		return nil
	}, nil
}

// sharedServer returns the run's etcd server, or skips the test when
// there is none (HERD_REQUIRE_REDIS=1 has failed the run in TestMain).
func sharedServer(t testing.TB) *etcdtest.Server {
	t.Helper()
	if shared == nil {
		t.Skipf("no etcd server: %v (set %s=1 to fail instead)", serverErr, requireEnv)
	}
	return shared
}

// startServer starts an etcd server of the test's own, for tests that
// kill or pause it; it is stopped at the end of the test.
func startServer(t testing.TB) *etcdtest.Server {
	t.Helper()
	s, err := etcdtest.Start(t.TempDir())
	if errors.Is(err, etcdtest.ErrNoBinary) && os.Getenv(requireEnv) != "1" {
		t.Skipf("%v (set %s=1 to fail instead)", err, requireEnv)
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
