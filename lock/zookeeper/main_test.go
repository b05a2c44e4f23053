package zookeeper

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"

	"github.com/herdkit/herd/lock/zookeeper/zktest"
	"go.uber.org/goleak"
)

// Environment of the tests.
const (
	workerEnv = "HERD_ZK_WORKER" // set when the test binary runs as a worker process
	addrEnv   = "HERD_ZK_ADDR"   // the worker's ZooKeeper server
)

// The ZooKeeper server of this test binary, shared by the tests that do
// not stop it, or "" with zkErr saying why there is none.
var (
	zkServer *zktest.Server
	zkErr    error
)

func TestMain(m *testing.M) {
	if role := os.Getenv(workerEnv); role != "" {
		os.Exit(runWorker(role))
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "herd-zk-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if _, err := zktest.Available(); err != nil {
		zkErr = err
	} else if zkServer, err = zktest.Start(dir); err != nil {
		zkErr = err
	}
	if zkErr != nil && zktest.Required() {
		fmt.Fprintf(os.Stderr, "ZooKeeper is needed (HERD_REQUIRE_REDIS=1): %v\n", zkErr)
		return 1
	}
	code := m.Run()
	if zkServer != nil {
		if err := zkServer.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
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

// requireZK skips the test when there is no ZooKeeper (HERD_REQUIRE_REDIS=1
// has failed the run in TestMain then).
func requireZK(t testing.TB) {
	t.Helper()
	if zkServer == nil {
		t.Skipf("no ZooKeeper server: %v (set HERD_REQUIRE_REDIS=1 to fail instead)", zkErr)
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
