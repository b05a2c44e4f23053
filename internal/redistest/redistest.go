package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// requireEnv is the environment variable that turns a missing redis-server
// from a reason to skip into a test failure.
const requireEnv = "HERD_REQUIRE_REDIS"

// required reports whether requireEnv is set to a true value such as 1.
func required() bool {
	v, err := strconv.ParseBool(os.Getenv(requireEnv))
	return err == nil && v
}

// lookup returns the path of the named binary. When it is missing, found
// is false, and err is non-nil if HERD_REQUIRE_REDIS demands the binary.
func lookup(name string) (path string, found bool, err error) {
	path, lerr := exec.LookPath(name)
	if lerr == nil {
		return path, true, nil
	}
	if required() {
		return "", false, fmt.Errorf("redistest: %s not found and %s=1", name, requireEnv)
	}
	return "", false, nil
}

// Available reports whether redis-server is on $PATH. When it is missing
// and the environment variable HERD_REQUIRE_REDIS is 1, Available returns
// false and an error saying so; when it is missing otherwise, it returns
// false and a nil error, and tests that need redis should be skipped.
func Available() (bool, error) {
	_, found, err := lookup("redis-server")
	return found, err
}

// Require skips the test if redis-server is not on $PATH, or fails it if
// the environment variable HERD_REQUIRE_REDIS is also 1. [Start] and
// [StartCluster] call Require, so tests rarely need to call it directly.
func Require(t testing.TB) {
	t.Helper()
	requireBinaries(t, "redis-server")
}

// requireBinaries is Require for any set of binaries. It returns their
// paths in order.
func requireBinaries(t testing.TB, names ...string) []string {
	t.Helper()
	paths := make([]string, len(names))
	for i, name := range names {
		path, found, err := lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		if !found {
			t.Skipf("redistest: %s not found in $PATH; skipping (set %s=1 to fail instead)", name, requireEnv)
		}
		paths[i] = path
	}
	return paths
}

// Start starts a fresh redis-server on a free port on 127.0.0.1 and waits
// until it answers PING. The server keeps no data on disk (no RDB snapshots
// and no append-only file) and uses its own temporary directory, which holds
// its log. It is stopped when the test and its subtests finish.
//
// options are more redis-server command-line options, each word its own
// string, appended after redistest's own (so they override them): for
// example "--rename-command", "SPUBLISH", "" removes SPUBLISH, and
// [Without70Commands] removes every command Redis 7.0 added. They apply
// to every process of the server, restarts included.
//
// Start skips or fails the test as described for [Require] when
// redis-server is missing, and fails it when the server does not come up
// within 10 seconds, reporting the tail of the server's log.
func Start(t testing.TB, options ...string) *Server {
	t.Helper()
	bin := requireBinaries(t, "redis-server")[0]
	s := newServer(bin, t.TempDir(), options)
	if err := s.start(freePort); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("redistest: %v", err)
		}
	})
	return s
}

// StartMain is like [Start] for use in TestMain, where there is no
// testing.TB. It returns the server and a function that stops it and
// removes its temporary directory; calling that function more than once is
// harmless. StartMain returns an error when redis-server is missing or does
// not start; callers that want to skip instead can consult [Available]
// first. It needs no test at all: the bench command (./bench) uses it to
// start the redis-server it runs against.
func StartMain() (*Server, func(), error) {
	bin, found, err := lookup("redis-server")
	if err != nil {
		return nil, nil, err
	}
	if !found {
		return nil, nil, errors.New("redistest: redis-server not found in $PATH")
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, nil, fmt.Errorf("redistest: %w", err)
	}
	s := newServer(bin, dir, nil)
	if err := s.start(freePort); err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("redistest: %w", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			if err := s.stop(); err != nil {
				fmt.Fprintf(os.Stderr, "redistest: %v\n", err)
			}
			os.RemoveAll(dir)
		})
	}
	return s, stop, nil
}

// Client returns a new go-redis client connected to the server. The options
// start out with only Addr set and are then passed to each of opts in
// order. The client is closed when the test finishes.
func (s *Server) Client(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	opt := &redis.Options{Addr: s.Addr()}
	for _, o := range opts {
		o(opt)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// Stop stops the server with SIGTERM and waits for the process to exit,
// sending SIGKILL if it is still running after 5 seconds. A paused server is
// resumed so that it can shut down. Stop does nothing if the server is
// already stopped.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if err := s.stop(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// Kill kills the server with SIGKILL and waits for the process to exit. It
// does nothing if the server is already stopped.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	if err := s.kill(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// Restart starts the server again on the same port and waits until it
// answers PING. A running server is stopped first as by [Server.Stop]; a
// paused one is resumed and then stopped.
//
// Because the server keeps nothing on disk, the restarted server starts
// with an empty data set, which models a server that lost its memory. A
// cluster node keeps its cluster configuration file, so it rejoins its
// cluster with the same node id and slots, but without its keys.
//
// Existing clients see their connections closed and reconnect to the new
// process.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.restart(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// Pause freezes the server with SIGSTOP. A paused server still accepts TCP
// connections, through the kernel, but answers nothing, so commands time
// out. Pause fails the test if the server is not running.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	if err := s.pause(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// Resume continues a server frozen by [Server.Pause] with SIGCONT. It fails
// the test if the server is not running.
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	if err := s.resume(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}
