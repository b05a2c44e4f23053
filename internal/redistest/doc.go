// Package redistest starts real redis-server processes for tests.
//
// Every server is an ordinary child process of the test binary, listening on
// a free port on 127.0.0.1, with persistence disabled and its own temporary
// directory for logs and cluster configuration. Servers started with [Start]
// or [StartCluster] are stopped automatically when the test that started them
// finishes; a server started with [StartMain] is stopped by the function that
// StartMain returns.
//
// The redis-server binary (and, for clusters, redis-cli) is looked up in
// $PATH. When it is missing, tests are skipped, unless the environment
// variable HERD_REQUIRE_REDIS is set to 1, in which case they fail. See
// [Require] and [Available].
//
// A test can control the lifecycle of a server to simulate failures:
// [Server.Stop] and [Server.Kill] end the process, [Server.Restart] starts a
// fresh process on the same port, and [Server.Pause] and [Server.Resume]
// freeze and thaw it with SIGSTOP and SIGCONT, which makes it look like a
// server that accepts connections but never answers.
//
// The package is meant for Linux. On Linux every child process is started
// with a parent-death signal of SIGKILL, so that it does not outlive a test
// binary that is killed before its cleanups run. Note that Linux delivers that
// signal when the thread that started the child exits; the Go runtime only
// ends threads whose goroutine exits while locked with [runtime.LockOSThread],
// so this matters only for tests that do that.
//
// Sharing one server between all tests of a package looks like this:
//
//	var srv *redistest.Server
//
//	func TestMain(m *testing.M) {
//		ok, err := redistest.Available()
//		if err != nil {
//			fmt.Fprintln(os.Stderr, err)
//			os.Exit(1)
//		}
//		if !ok {
//			os.Exit(m.Run()) // tests call redistest.Require or skip when srv is nil
//		}
//		s, stop, err := redistest.StartMain()
//		if err != nil {
//			fmt.Fprintln(os.Stderr, err)
//			os.Exit(1)
//		}
//		srv = s
//		code := m.Run()
//		stop()
//		os.Exit(code)
//	}
package redistest
