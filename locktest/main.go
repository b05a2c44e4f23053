package locktest

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// requireEnv is herd's CI variable for every server a test needs: set to
// 1, a missing server fails the tests instead of skipping them.
const requireEnv = "HERD_REQUIRE_REDIS"

// Required reports whether HERD_REQUIRE_REDIS=1 demands the servers the
// tests need.
func Required() bool { return os.Getenv(requireEnv) == "1" }

// Server is a server (or a database on one) that a backend's tests need
// for the whole run, started by [Main] before the tests and stopped after
// them.
type Server struct {
	// Name says which server, for the message of a missing one
	// ("PostgreSQL at postgres://...").
	Name string
	// Start starts the server, or creates the database, and returns the
	// function that stops or drops it.
	Start func() (stop func() error, err error)
	// Err, when Start fails and the server is not [Required], is set to
	// the error, so that the tests that need the server skip with it.
	Err *error
}

// Main runs a backend's tests, m, for its TestMain: it starts the
// servers in turn (a missing one fails the run under HERD_REQUIRE_REDIS=1,
// and is recorded in its Err otherwise), runs the tests, stops the
// servers in reverse order (a failure to stop fails the run), and, when
// all passed, fails the run if goroutines are left (goleak). It returns
// the exit code.
func Main(m *testing.M, servers ...Server) int {
	var stops []func() error
	code := 0
	for _, s := range servers {
		stop, err := s.Start()
		if err != nil {
			if Required() {
				fmt.Fprintf(os.Stderr, "%s is needed (%s=1): %v\n", s.Name, requireEnv, err)
				code = 1
				break
			}
			*s.Err = err
			continue
		}
		stops = append(stops, stop)
	}
	if code == 0 {
		code = m.Run()
	}
	for i := len(stops) - 1; i >= 0; i-- {
		if err := stops[i](); err != nil {
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

// Skip skips t when err, a [Server]'s Err, says the server is missing
// (HERD_REQUIRE_REDIS=1 has failed the run in [Main] then).
func Skip(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Skipf("no %s: %v (set %s=1 to fail instead)", what, err, requireEnv)
	}
}

// DirServer is the [Server] of a server process that keeps its data in a
// directory of its own (etcdtest's, zktest's): start starts it in a new
// temporary directory named by pattern (os.MkdirTemp), and *srv is set
// to it; it is closed, and the directory removed, after the run.
func DirServer[S interface{ Close() error }](name, pattern string, start func(dir string) (S, error), srv *S, srvErr *error) Server {
	return Server{
		Name: name,
		Err:  srvErr,
		Start: func() (func() error, error) {
			dir, err := os.MkdirTemp("", pattern)
			if err != nil {
				return nil, err
			}
			s, err := start(dir)
			if err != nil {
				os.RemoveAll(dir)
				return nil, err
			}
			*srv = s
			return func() error {
				defer os.RemoveAll(dir)
				return s.Close()
			}, nil
		},
	}
}
