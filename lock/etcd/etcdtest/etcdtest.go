// Package etcdtest starts real etcd servers for tests and benchmarks: one
// etcd process per [Server], a single-member cluster listening on free
// ports of 127.0.0.1, with its data in a directory the caller gives (a
// test's t.TempDir()). A Server can be killed and started again on the
// same data directory and ports, paused and resumed, to show what a
// lock's holders and waiters see when the server fails.
//
// The server is the etcd binary named by HERD_ETCD_BIN, else
// /usr/bin/etcd, else "etcd" on the PATH; [Start] returns an error
// wrapping [ErrNoBinary] when there is none, so that a test can skip (or,
// under HERD_REQUIRE_REDIS=1, fail).
//
// The servers run with a heartbeat of 50ms and an election timeout of
// 500ms, so that their shortest lease is 1 second (etcd's minimum lease
// TTL is 1.5 election timeouts, rounded up to whole seconds) and a
// restarted member elects itself quickly. Their logs go to etcd.log in
// the data directory.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoBinary is returned by [Start] when no etcd binary is installed.
var ErrNoBinary = errors.New("etcdtest: no etcd binary (set HERD_ETCD_BIN, or install etcd-server)")

const (
	// readyTimeout bounds how long a server may take to report healthy.
	readyTimeout = 20 * time.Second
	// stopTimeout is how long Close waits after SIGTERM before SIGKILL.
	stopTimeout = 5 * time.Second
	// attempts is how often Start tries fresh ports when the server could
	// not listen on the ones it picked.
	attempts = 5
)

// Binary returns the path of the etcd binary the servers run.
func Binary() (string, error) {
	if bin := os.Getenv("HERD_ETCD_BIN"); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("%w: HERD_ETCD_BIN: %v", ErrNoBinary, err)
		}
		return bin, nil
	}
	if _, err := os.Stat("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd", nil
	}
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return "", ErrNoBinary
	}
	return bin, nil
}

// Server is one etcd process (a single-member cluster) started by
// [Start]. Its methods are safe for concurrent use.
type Server struct {
	bin, dir string
	client   int // client port
	peer     int // peer port
	mu       sync.Mutex
	proc     *process // the current or last process
	closed   bool
	logFile  *os.File
}

// process is one run of etcd.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait returned
}

// Start starts an etcd server with its data in dir (created if missing)
// and waits until it reports healthy. Call [Server.Close] when done: it
// stops the process; the data directory is the caller's.
func Start(dir string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("etcdtest: %w", err)
	}
	log, err := os.OpenFile(filepath.Join(dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: %w", err)
	}
	s := &Server{bin: bin, dir: dir, logFile: log}
	for try := 1; ; try++ {
		if s.client, err = freePort(); err == nil {
			s.peer, err = freePort()
		}
		if err == nil {
			err = s.start()
		}
		if err == nil {
			return s, nil
		}
		if try == attempts || !errors.Is(err, errExited) {
			log.Close()
			return nil, err
		}
	}
}

// errExited is the error of a process that ended before it was ready,
// most often because another process took one of its ports.
var errExited = errors.New("etcd exited before it was ready")

// Endpoints returns the server's client URL, for clientv3.Config.
func (s *Server) Endpoints() []string {
	return []string{s.url()}
}

// Dir returns the server's data directory.
func (s *Server) Dir() string { return s.dir }

// Pid returns the process id of the running etcd, or 0 when none runs.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.exited() {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

func (s *Server) url() string { return "http://127.0.0.1:" + strconv.Itoa(s.client) }

// start runs etcd and waits for it to be healthy.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("etcdtest: the server is closed")
	}
	if s.proc != nil && !s.proc.exited() {
		return errors.New("etcdtest: the server is running")
	}
	peer := "http://127.0.0.1:" + strconv.Itoa(s.peer)
	cmd := exec.Command(s.bin,
		"--name", "herd",
		"--data-dir", filepath.Join(s.dir, "data"),
		"--listen-client-urls", s.url(),
		"--advertise-client-urls", s.url(),
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "herd="+peer,
		"--initial-cluster-state", "new",
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
		"--log-level", "warn",
		"--logger", "zap",
	)
	cmd.Stdout, cmd.Stderr = s.logFile, s.logFile
	cmd.Env = append(os.Environ(), "ETCD_UNSUPPORTED_ARCH="+archName())
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcdtest: start %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	s.proc = p
	if err := s.waitHealthy(p); err != nil {
		kill(p)
		return err
	}
	return nil
}

// waitHealthy polls the server's /health until it answers true.
func (s *Server) waitHealthy(p *process) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	hc := &http.Client{Timeout: 500 * time.Millisecond}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url()+"/health", nil)
		if resp, err := hc.Do(req); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), `"health":"true"`) {
				hc.CloseIdleConnections()
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%w (ports %d, %d; see %s)", errExited, s.client, s.peer, filepath.Join(s.dir, "etcd.log"))
		case <-ctx.Done():
			return fmt.Errorf("etcdtest: etcd not healthy within %v (see %s)", readyTimeout, filepath.Join(s.dir, "etcd.log"))
		case <-tick.C:
		}
	}
}

// Kill ends the server's process with SIGKILL (no shutdown: what a crash
// or a power cut does) and waits for it to exit. Its data stays in the
// data directory, and [Server.Restart] starts it again.
func (s *Server) Kill() error {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	kill(p)
	return nil
}

// Restart starts the server again, on the same data directory and ports,
// after [Server.Kill], and waits until it reports healthy.
func (s *Server) Restart() error {
	return s.start()
}

// Pause stops the server's process with SIGSTOP: it keeps its
// connections but answers nothing, as a frozen machine would. Resume
// continues it.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.exited() {
		return errors.New("etcdtest: the server is not running")
	}
	return s.proc.cmd.Process.Signal(sig)
}

// Close stops the server: SIGTERM (after a SIGCONT, in case it is
// paused), then SIGKILL if it has not exited within 5 seconds. It is
// idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	p := s.proc
	s.mu.Unlock()
	if p != nil && !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		timer := time.NewTimer(stopTimeout)
		select {
		case <-p.done:
		case <-timer.C:
			kill(p)
		}
		timer.Stop()
	}
	return s.logFile.Close()
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL to p's process and waits for it to exit.
func kill(p *process) {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
	}
	<-p.done
}

// freePort returns a port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("etcdtest: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
