package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// alive reports whether a process with the given pid exists.
func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

// noRetry makes a client fail fast instead of retrying.
func noRetry(o *redis.Options) {
	o.MaxRetries = -1
	o.DialerRetries = 1
	o.DialTimeout = time.Second
	o.ReadTimeout = time.Second
	o.WriteTimeout = time.Second
}

func TestStartSetGet(t *testing.T) {
	t.Parallel()
	s := Start(t)
	host, port, err := net.SplitHostPort(s.Addr())
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("Addr() = %q, want 127.0.0.1:port", s.Addr())
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p == 6379 {
		t.Fatalf("Addr() = %q, want a fresh port", s.Addr())
	}
	if pid := s.Pid(); pid <= 0 || !alive(pid) {
		t.Fatalf("Pid() = %d, want a live process", pid)
	}

	ctx := context.Background()
	c := s.Client(t)
	if err := c.Set(ctx, "greeting", "hello", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "greeting").Result(); err != nil || got != "hello" {
		t.Fatalf("GET = %q, %v; want hello", got, err)
	}
	// The server must be our own process, not the system redis.
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		t.Fatalf("INFO: %v", err)
	}
	if v, _ := infoField(info, "process_id"); v != strconv.Itoa(s.Pid()) {
		t.Fatalf("server reports process_id %q, want %d", v, s.Pid())
	}
	// Persistence is off.
	cfg, err := c.ConfigGet(ctx, "*").Result()
	if err != nil {
		t.Fatalf("CONFIG GET: %v", err)
	}
	if cfg["save"] != "" || cfg["appendonly"] != "no" || cfg["dir"] != s.Dir() {
		t.Fatalf("save=%q appendonly=%q dir=%q; want \"\", no, %q", cfg["save"], cfg["appendonly"], cfg["dir"], s.Dir())
	}
}

func TestClientOptions(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client(t, func(o *redis.Options) { o.DB = 3 }, func(o *redis.Options) { o.ClientName = "probe" })
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if n, err := s.Client(t).DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE of db 0 = %d, %v; want 0", n, err)
	}
	if name, err := c.ClientGetName(ctx).Result(); err != nil || name != "probe" {
		t.Fatalf("CLIENT GETNAME = %q, %v; want probe", name, err)
	}
}

func TestRestart(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ctx := context.Background()
	c := s.Client(t) // default options: it must reconnect by itself
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	addr, pid := s.Addr(), s.Pid()

	s.Restart(t)

	if s.Addr() != addr {
		t.Fatalf("Addr() after Restart = %q, want %q", s.Addr(), addr)
	}
	if s.Pid() == pid || !alive(s.Pid()) {
		t.Fatalf("Pid() after Restart = %d (was %d), want a new live process", s.Pid(), pid)
	}
	if alive(pid) {
		t.Fatalf("old process %d still exists", pid)
	}
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after Restart: err = %v, want redis.Nil (data is not kept)", err)
	}
	if err := c.Set(ctx, "k", "v2", 0).Err(); err != nil {
		t.Fatalf("SET after Restart: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v2" {
		t.Fatalf("GET after Restart = %q, %v; want v2", got, err)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ctx := context.Background()
	c := s.Client(t, func(o *redis.Options) {
		o.ReadTimeout = 200 * time.Millisecond
		o.MaxRetries = -1
	})
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	s.Pause(t)
	if st, known := procStopped(s.Pid()); known && !st {
		t.Fatalf("process %d is not stopped after Pause", s.Pid())
	}
	start := time.Now()
	err := c.Get(ctx, "k").Err()
	elapsed := time.Since(start)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("GET while paused: err = %v, want a timeout", err)
	}
	if elapsed < 150*time.Millisecond || elapsed > 2*time.Second {
		t.Fatalf("GET while paused failed after %v, want about 200ms", elapsed)
	}
	s.Pause(t) // pausing twice is harmless

	s.Resume(t)
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET after Resume = %q, %v; want v", got, err)
	}
}

func TestRestartWhilePaused(t *testing.T) {
	t.Parallel()
	s := Start(t)
	pid := s.Pid()
	s.Pause(t)
	start := time.Now()
	s.Restart(t)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Restart of a paused server took %v", d)
	}
	if alive(pid) || s.Pid() == pid {
		t.Fatalf("old process %d survived Restart", pid)
	}
	if err := s.Client(t, noRetry).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
}

func TestStop(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ctx := context.Background()
	c := s.Client(t, noRetry)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	pid := s.Pid()

	s.Stop(t)
	if alive(pid) {
		t.Fatalf("process %d still exists after Stop", pid)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING after Stop succeeded")
	}
	if err := s.Client(t, noRetry).Ping(ctx).Err(); err == nil {
		t.Fatal("PING from a new client after Stop succeeded")
	}
	s.Stop(t) // idempotent
	s.Kill(t) // harmless on a stopped server

	if err := s.pause(); err == nil {
		t.Fatal("pause of a stopped server succeeded")
	}

	// A stopped server can be started again.
	s.Restart(t)
	if err := s.Client(t, noRetry).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
}

func TestStopPaused(t *testing.T) {
	t.Parallel()
	s := Start(t)
	pid := s.Pid()
	s.Pause(t)
	start := time.Now()
	s.Stop(t)
	// SIGTERM alone would stay pending; Stop must not need its SIGKILL
	// fallback.
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Stop of a paused server took %v", d)
	}
	if alive(pid) {
		t.Fatalf("process %d still exists after Stop", pid)
	}
}

func TestKill(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ctx := context.Background()
	c := s.Client(t, noRetry)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	pid := s.Pid()
	s.Kill(t)
	if alive(pid) {
		t.Fatalf("process %d still exists after Kill", pid)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	s.Kill(t)
	s.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		// The first command may hit the connection the old process left.
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING after Restart: %v", err)
		}
	}
}

func TestStartMain(t *testing.T) {
	t.Parallel()
	s, stop, err := StartMain()
	if err != nil {
		t.Fatalf("StartMain: %v", err)
	}
	defer stop()
	ctx := context.Background()
	c := s.Client(t, noRetry)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	s.Restart(t)
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		// Allow one failure on the connection to the old process.
		if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
			t.Fatalf("GET after Restart: err = %v, want redis.Nil", err)
		}
	}
	pid, dir := s.Pid(), s.Dir()
	stop()
	if alive(pid) {
		t.Fatalf("process %d still exists after stop", pid)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("directory %s still exists after stop: %v", dir, err)
	}
	stop() // harmless
}

func TestStartClusterMain(t *testing.T) {
	t.Parallel()
	c, stop, err := StartClusterMain(3)
	if err != nil {
		t.Fatalf("StartClusterMain: %v", err)
	}
	defer stop()
	ctx := context.Background()
	cc := c.Client(t)
	if err := cc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	var dirs []string
	var pids []int
	for _, s := range c.Servers() {
		dirs, pids = append(dirs, s.Dir()), append(pids, s.Pid())
	}
	stop()
	for i, pid := range pids {
		if alive(pid) {
			t.Errorf("node process %d still exists after stop", pid)
		}
		if _, err := os.Stat(dirs[i]); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("directory %s still exists after stop: %v", dirs[i], err)
		}
	}
	stop() // harmless
	if _, _, err := StartClusterMain(2); err == nil {
		t.Error("StartClusterMain(2): no error, want one (a cluster needs 3 masters)")
	}
}

// TestStartRetriesTakenPort checks that Start moves on to another port when
// the one it picked is taken before redis-server binds it, both by a plain
// listener and by another redis-server.
func TestStartRetriesTakenPort(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	other := Start(t)
	otherPort, _ := strconv.Atoi(strings.TrimPrefix(other.Addr(), "127.0.0.1:"))

	taken := []int{l.Addr().(*net.TCPAddr).Port, otherPort}
	picks := 0
	pick := func() (int, error) {
		picks++
		if len(taken) > 0 {
			p := taken[0]
			taken = taken[1:]
			return p, nil
		}
		return freePort()
	}
	s := newServer(other.bin, t.TempDir(), nil)
	if err := s.start(pick); err != nil {
		t.Fatalf("start: %v", err)
	}
	defer s.stop()
	if picks != 3 {
		t.Fatalf("picked %d ports, want 3", picks)
	}
	if s.Addr() == other.Addr() || s.port == l.Addr().(*net.TCPAddr).Port {
		t.Fatalf("server runs on taken address %s", s.Addr())
	}
	if err := s.Client(t, noRetry).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
}

// TestStartFailureReportsLog checks that a server that cannot start is
// reported with its log.
func TestStartFailureReportsLog(t *testing.T) {
	t.Parallel()
	Require(t)
	bin, _, _ := lookup("redis-server")
	s := newServer(bin, t.TempDir(), []string{"--no-such-option", "x"})
	err := s.start(freePort)
	if err == nil {
		s.stop()
		t.Fatal("start with a bad option succeeded")
	}
	if !strings.Contains(err.Error(), "no-such-option") {
		t.Fatalf("error does not include the server's complaint: %v", err)
	}
	if s.proc != nil && !s.proc.exited() {
		t.Fatal("failed process was not reaped")
	}
}

// fakeTB records Skip and Fatal calls and ends the goroutine like the real
// ones do.
type fakeTB struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Skip(args ...any) { f.skipped, f.msg = true, fmt.Sprint(args...); runtime.Goexit() }
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped, f.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Fatal(args ...any) { f.failed, f.msg = true, fmt.Sprint(args...); runtime.Goexit() }
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// callRequire runs fn with a fakeTB in its own goroutine and returns the
// fakeTB.
func callRequire(fn func(testing.TB)) *fakeTB {
	f := &fakeTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f
}

func TestMissingBinary(t *testing.T) {
	// Not parallel: it changes the environment.
	t.Setenv("PATH", t.TempDir())

	t.Setenv(requireEnv, "")
	if ok, err := Available(); ok || err != nil {
		t.Fatalf("Available() = %v, %v; want false, nil", ok, err)
	}
	f := callRequire(Require)
	if !f.skipped || f.failed || !strings.Contains(f.msg, "redis-server not found") {
		t.Fatalf("Require without %s: skipped=%v failed=%v msg=%q; want a skip", requireEnv, f.skipped, f.failed, f.msg)
	}
	f = callRequire(func(tb testing.TB) { Start(tb) })
	if !f.skipped {
		t.Fatalf("Start without redis-server did not skip: %q", f.msg)
	}
	f = callRequire(func(tb testing.TB) { StartCluster(tb, 3) })
	if !f.skipped {
		t.Fatalf("StartCluster without redis-server did not skip: %q", f.msg)
	}
	if _, _, err := StartMain(); err == nil {
		t.Fatal("StartMain without redis-server succeeded")
	}

	t.Setenv(requireEnv, "1")
	const want = "redis-server not found and HERD_REQUIRE_REDIS=1"
	if ok, err := Available(); ok || err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Available() = %v, %v; want false and %q", ok, err, want)
	}
	f = callRequire(Require)
	if !f.failed || f.skipped || !strings.Contains(f.msg, want) {
		t.Fatalf("Require with %s=1: skipped=%v failed=%v msg=%q; want a failure", requireEnv, f.skipped, f.failed, f.msg)
	}
	f = callRequire(func(tb testing.TB) { StartCluster(tb, 3) })
	if !f.failed {
		t.Fatalf("StartCluster without redis-server did not fail: %q", f.msg)
	}
	if _, _, err := StartMain(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("StartMain error = %v, want %q", err, want)
	}
}

func TestAvailable(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/redis-server"); err != nil {
		t.Skip("no /usr/bin/redis-server")
	}
	// PATH may be changed by TestMissingBinary, which is not parallel,
	// so it is not changed while this test runs.
	if ok, err := Available(); !ok || err != nil {
		t.Fatalf("Available() = %v, %v; want true, nil", ok, err)
	}
}
