//go:build unix

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"html"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// pidExists reports whether a process (zombies included) has this pid.
func pidExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// checkGone fails the test if the redis-server a run started still
// exists.
func checkGone(t *testing.T, pid int) {
	t.Helper()
	if pid <= 0 {
		t.Fatalf("no pid recorded for the redis-server the run started")
	}
	if pidExists(pid) {
		t.Errorf("redis-server pid %d still exists after the run", pid)
	}
}

// checkDefaultRedis checks that a run without -redis, -cluster or
// -embedded used a redis-server of its own when one is on $PATH, and
// stopped it; else the embedded miniredis.
func checkDefaultRedis(t *testing.T, res *results) {
	t.Helper()
	ok, err := redistest.Available()
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		if res.RedisSrc != redisEmbedded || res.Redis != miniredisDesc {
			t.Errorf("no redis-server on $PATH: Redis %q (%s), want the embedded miniredis", res.Redis, res.RedisSrc)
		}
		return
	}
	if res.RedisSrc != redisStarted || !strings.HasPrefix(res.Redis, "redis-server "+serverVersion(t)+" ") {
		t.Errorf("redis-server on $PATH: Redis %q (%s), want a redis-server %s started for the run", res.Redis, res.RedisSrc, serverVersion(t))
	}
	checkGone(t, res.redisPid)
}

// serverVersion is the version redis-server on $PATH reports for itself.
func serverVersion(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("redis-server", "--version").Output()
	if err != nil {
		t.Fatalf("redis-server --version: %v", err)
	}
	m := regexp.MustCompile(`v=(\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("redis-server --version: no version in %q", out)
	}
	return string(m[1])
}

func mustParse(t *testing.T, args ...string) *config {
	t.Helper()
	cfg, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestStartRedis checks which Redis the bench picks and that it stops the
// redis-server it starts, and only that one.
func TestStartRedis(t *testing.T) {
	ctx := context.Background()

	t.Run("-cluster start", func(t *testing.T) {
		redistest.Require(t)
		cfg := mustParse(t, "-cluster", "start")
		e, err := startRedis(ctx, cfg, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		defer e.close()
		cc, ok := e.admin.(*redis.ClusterClient)
		if !ok || len(e.spec.Addrs) != 3 || !isLoopback(e.spec.Addrs) {
			t.Fatalf("admin %T at %v: want a cluster client of three loopback masters", e.admin, e.spec.Addrs)
		}
		if !strings.Contains(e.describe(), "3 masters (started for this run") {
			t.Errorf("description %q does not say the run started the cluster", e.describe())
		}
		var masters atomic.Int32
		if err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			masters.Add(1)
			return m.Ping(ctx).Err()
		}); err != nil || masters.Load() != 3 {
			t.Fatalf("%d masters answered PING (%v), want 3", masters.Load(), err)
		}
		addr := e.spec.Addrs[0]
		e.close()
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			t.Errorf("a node still listens on %s after close", addr)
		}
	})

	t.Run("redis-server on PATH", func(t *testing.T) {
		redistest.Require(t)
		var errOut bytes.Buffer
		e, err := startRedis(ctx, mustParse(t), &errOut)
		if err != nil {
			t.Fatal(err)
		}
		defer e.close()
		if e.kind != redisStarted || e.srv == nil || e.mini != nil {
			t.Fatalf("kind %q, server %v, miniredis %v: want a started redis-server", e.kind, e.srv, e.mini)
		}
		pid, dir := e.srv.pid, e.srv.dir
		// The server answering on the address is the process it started.
		info, err := e.admin.Info(ctx, "server").Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := infoField(info, "process_id"); got != strconv.Itoa(pid) {
			t.Errorf("process_id %s answers on %s, want the started pid %d", got, e.spec.Addrs[0], pid)
		}
		if v := serverVersion(t); e.version != v || !strings.HasPrefix(e.describe(), "redis-server "+v+" ") {
			t.Errorf("version %q, description %q: want redis-server %s", e.version, e.describe(), v)
		}
		if !isLoopback(e.spec.Addrs) {
			t.Errorf("address %v is not on loopback", e.spec.Addrs)
		}
		if got := infoField(mustInfo(t, e, "persistence"), "aof_enabled"); got != "0" {
			t.Errorf("aof_enabled %q, want 0", got)
		}
		if save, err := e.admin.ConfigGet(ctx, "save").Result(); err != nil || save["save"] != "" {
			t.Errorf("CONFIG GET save: %v, %v; want no snapshots", save, err)
		}
		if !strings.Contains(errOut.String(), "(pid "+strconv.Itoa(pid)+")") {
			t.Errorf("stderr does not name the started server's pid %d: %q", pid, errOut.String())
		}
		e.close()
		if pidExists(pid) {
			t.Errorf("redis-server pid %d still exists after close", pid)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the server's directory %s is still there (%v)", dir, err)
		}
	})

	t.Run("no redis-server on PATH", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		// What CI sets for the tests must not bind the bench.
		t.Setenv("HERD_REQUIRE_REDIS", "1")
		var errOut bytes.Buffer
		e, err := startRedis(ctx, mustParse(t), &errOut)
		if err != nil {
			t.Fatal(err)
		}
		defer e.close()
		if e.kind != redisEmbedded || e.mini == nil || e.srv != nil {
			t.Fatalf("kind %q, server %v, miniredis %v: want the embedded miniredis", e.kind, e.srv, e.mini)
		}
		if got := e.describe(); got != miniredisDesc {
			t.Errorf("description %q, want %q", got, miniredisDesc)
		}
		if !strings.Contains(errOut.String(), "no redis-server on $PATH") {
			t.Errorf("stderr does not say why it used miniredis: %q", errOut.String())
		}
	})

	t.Run("-embedded", func(t *testing.T) {
		redistest.Require(t) // the flag matters only when there is a choice
		var errOut bytes.Buffer
		e, err := startRedis(ctx, mustParse(t, "-embedded"), &errOut)
		if err != nil {
			t.Fatal(err)
		}
		defer e.close()
		if e.kind != redisEmbedded || e.mini == nil || e.srv != nil {
			t.Fatalf("kind %q, server %v, miniredis %v: want the embedded miniredis", e.kind, e.srv, e.mini)
		}
		if got := e.describe(); got != miniredisDesc {
			t.Errorf("description %q, want %q", got, miniredisDesc)
		}
	})

	t.Run("-redis", func(t *testing.T) {
		srv := redistest.Start(t)
		e, err := startRedis(ctx, mustParse(t, "-redis", srv.Addr()), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if e.kind != redisGiven || e.srv != nil || e.mini != nil {
			t.Fatalf("kind %q, server %v, miniredis %v: want the given server only", e.kind, e.srv, e.mini)
		}
		if want := "redis-server " + serverVersion(t) + " at " + srv.Addr(); e.describe() != want {
			t.Errorf("description %q, want %q", e.describe(), want)
		}
		e.close()
		// The user's server is not ours to stop.
		if err := srv.Client(t).Ping(ctx).Err(); err != nil {
			t.Errorf("the given server no longer answers after close: %v", err)
		}
	})
}

func mustInfo(t *testing.T, e *redisEnv, section string) string {
	t.Helper()
	info, err := e.admin.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// tinyRun is the smallest run worth having: one process, two callers, one
// cold wave, two strategies.
var tinyRun = []string{"-p", "1", "-c", "2", "-waves", "1", "-scenarios", "cold", "-strategies", "none,herd-notify"}

// TestReportNamesRedis runs the bench end to end on a redis-server it
// starts and on miniredis: the table, the Markdown and the chart name the
// Redis, and the started server is gone when the run returns.
func TestReportNamesRedis(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"started", nil, redisStarted},
		{"embedded", []string{"-embedded"}, redisEmbedded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			redistest.Require(t)
			dir := t.TempDir()
			mdPath, svgPath := filepath.Join(dir, "r.md"), filepath.Join(dir, "r.svg")
			args := append(append(slicesClone(tinyRun), tc.args...), "-md", mdPath, "-svg", svgPath)
			res, out := runBench(t, args...)
			if res.RedisSrc != tc.want {
				t.Fatalf("Redis %q (%s), want %s", res.Redis, res.RedisSrc, tc.want)
			}
			switch tc.want {
			case redisStarted:
				v := serverVersion(t)
				if res.RedisVer != v || !strings.HasPrefix(res.Redis, "redis-server "+v+" (started for this run on 127.0.0.1:") {
					t.Errorf("Redis %q, version %q: want a started redis-server %s", res.Redis, res.RedisVer, v)
				}
				checkGone(t, res.redisPid)
			case redisEmbedded:
				if res.Redis != miniredisDesc || res.redisPid != 0 {
					t.Errorf("Redis %q, pid %d: want %q", res.Redis, res.redisPid, miniredisDesc)
				}
			}
			for _, pr := range res.Phases {
				if pr.Errors != 0 || pr.Requests != 2 {
					t.Errorf("%s/%s: %d requests, %d errors (%s)", pr.Scenario, pr.Strategy, pr.Requests, pr.Errors, pr.ErrorMsg)
				}
			}
			if lines := strings.SplitN(out, "\n", 3); len(lines) < 3 || lines[1] != "Redis: "+res.Redis {
				t.Errorf("the table's second line does not name the Redis %q:\n%s", res.Redis, out)
			}
			md, err := os.ReadFile(mdPath)
			if err != nil || !strings.Contains(string(md), res.Redis+";") {
				t.Errorf("the Markdown does not name the Redis %q (%v):\n%s", res.Redis, err, md)
			}
			svg, err := os.ReadFile(svgPath)
			if err != nil || !strings.Contains(string(svg), html.EscapeString("Redis: "+res.Redis)) {
				t.Errorf("the chart does not name the Redis %q (%v)", res.Redis, err)
			}
		})
	}
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

// TestRunErrorStopsRedis: a run that fails after starting its
// redis-server (here the chart cannot be written) stops it too.
func TestRunErrorStopsRedis(t *testing.T) {
	redistest.Require(t)
	cfg := mustParse(t, append(slicesClone(tinyRun), "-strategies", "none", "-svg", filepath.Join(t.TempDir(), "no", "such", "dir", "r.svg"))...)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	var errOut lockedBuffer
	res, err := run(ctx, cfg, io.Discard, &errOut)
	if err == nil {
		t.Fatal("run: no error writing the chart into a missing directory")
	}
	if res == nil || res.RedisSrc != redisStarted {
		t.Fatalf("results %+v: want a run on a started redis-server", res)
	}
	checkGone(t, res.redisPid)
}

// TestInterruptStopsRedis runs the bench command in a child process,
// signals it in the middle of a phase as Ctrl-C or a service manager
// would, and checks that it stopped the redis-server it had started and
// removed its directory. The directory matters: on Linux the server would
// also die of its parent-death signal, but only the bench's own shutdown
// removes the directory.
func TestInterruptStopsRedis(t *testing.T) {
	redistest.Require(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			tmp := t.TempDir()
			cmd := exec.Command(exe, "-p", "1", "-c", "2", "-scenarios", "steady", "-strategies", "none", "-duration", "60s")
			cmd.Env = append(os.Environ(), testMainEnv+"=1", "TMPDIR="+tmp)
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stdout = io.Discard
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			lines := make(chan string, 64)
			var log lockedBuffer
			go func() {
				sc := bufio.NewScanner(stderr)
				for sc.Scan() {
					log.Write([]byte(sc.Text() + "\n"))
					select {
					case lines <- sc.Text():
					default:
					}
				}
				close(lines)
				exited <- cmd.Wait()
			}()
			timeout := time.NewTimer(60 * time.Second)
			defer timeout.Stop()
			fail := func(format string, args ...any) {
				t.Helper()
				_ = cmd.Process.Kill()
				<-exited
				t.Fatalf(format+"\nstderr:\n%s", append(args, log.String())...)
			}

			// Wait for the server's pid, then for the phase to begin.
			pidRe := regexp.MustCompile(`started redis-server .* \(pid (\d+)\)`)
			pid := 0
			for started := false; !started; {
				select {
				case l, ok := <-lines:
					if !ok {
						fail("the bench exited before its phase began")
					}
					if m := pidRe.FindStringSubmatch(l); m != nil {
						pid, _ = strconv.Atoi(m[1])
					}
					started = pid != 0 && strings.Contains(l, "steady × none")
				case <-timeout.C:
					fail("no phase began within 60s")
				}
			}
			if !pidExists(pid) {
				fail("redis-server pid %d is not running during the phase", pid)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				fail("signal: %v", err)
			}
			go func() {
				for range lines {
				}
			}()
			var werr error
			select {
			case werr = <-exited:
			case <-timeout.C:
				fail("the bench did not exit within 60s of %v", sig)
			}
			var ee *exec.ExitError
			if !errors.As(werr, &ee) || ee.ExitCode() != 130 {
				t.Errorf("exit: %v, want status 130 (interrupted)\nstderr:\n%s", werr, log.String())
			}
			if pidExists(pid) {
				t.Errorf("redis-server pid %d still exists after the bench exited", pid)
			}
			t.Logf("stderr:\n%s", log.String())
			left, _ := filepath.Glob(filepath.Join(tmp, "redistest-*"))
			if len(left) > 0 {
				t.Errorf("the server's directory was not removed: %v", left)
			}
		})
	}
}
