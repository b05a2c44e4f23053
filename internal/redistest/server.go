package redistest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// startTimeout bounds how long a server may take to answer PING.
	startTimeout = 10 * time.Second
	// stopTimeout is how long Stop waits after SIGTERM before SIGKILL.
	stopTimeout = 5 * time.Second
	// portAttempts is how often a fresh server is started on a new port
	// when its port was taken by someone else.
	portAttempts = 5
	// pollInterval is the pause between readiness probes.
	pollInterval = 10 * time.Millisecond
	// probeTimeout bounds one readiness probe. It is short so that a
	// process that exits, for example because its port is taken by a
	// listener that accepts but never answers, is noticed quickly; a
	// probe that times out is simply repeated.
	probeTimeout = 200 * time.Millisecond

	logName    = "redis.log"
	outputName = "redis.out"
)

// errPortInUse reports that redis-server could not listen on its port
// because another process holds it.
var errPortInUse = errors.New("port already in use")

// Server is one redis-server process started for a test.
//
// The methods of a Server are safe for concurrent use. Methods that take a
// testing.TB use it only to report failures, so a Server started by
// [StartMain] can be controlled from any test.
type Server struct {
	bin   string   // path of redis-server
	dir   string   // working directory, log and cluster configuration
	extra []string // additional command-line options
	conf  string   // a configuration file to start with (Sentinels); "" for none
	port  int      // fixed once the first process is ready

	mu     sync.Mutex
	proc   *process // current or most recent process; nil before the first start
	paused bool
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait has returned
	err  error         // result of cmd.Wait, valid after done is closed
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits up to d for the process to exit and reports whether it did.
func (p *process) wait(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.done:
		return true
	case <-timer.C:
		return false
	}
}

// signal sends sig to the process. Signalling a process that has already
// exited is not an error.
func (p *process) signal(sig os.Signal) error {
	err := p.cmd.Process.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

// newServer returns a Server that runs bin in dir with the extra options.
// It does not start a process.
func newServer(bin, dir string, extra []string) *Server {
	return &Server{bin: bin, dir: dir, extra: extra}
}

// Addr returns the address of the server, "127.0.0.1:port". The address
// stays the same across [Server.Restart].
func (s *Server) Addr() string {
	return "127.0.0.1:" + strconv.Itoa(s.port)
}

// Pid returns the process id of the current redis-server process, or of the
// most recent one if the server is stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.pid()
}

// Dir returns the temporary directory of the server, which holds its log
// file and, for cluster nodes, the cluster configuration file.
func (s *Server) Dir() string {
	return s.dir
}

// start starts the first process of s on a port returned by pick, retrying
// with a new port when the chosen one turns out to be taken.
func (s *Server) start(pick func() (int, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var lastErr error
	for range portAttempts {
		port, err := pick()
		if err != nil {
			return err
		}
		err = s.launchLocked(port, time.Now().Add(startTimeout))
		if err == nil {
			s.port = port
			return nil
		}
		if !errors.Is(err, errPortInUse) {
			return err
		}
		lastErr = err
	}
	return fmt.Errorf("starting redis-server: giving up after %d attempts: %w", portAttempts, lastErr)
}

// launchLocked starts a redis-server process on port and waits until it
// answers. On failure the process is killed and reaped, and the error
// includes the tail of the server's log. s.mu must be held.
func (s *Server) launchLocked(port int, deadline time.Time) error {
	out, err := os.OpenFile(filepath.Join(s.dir, outputName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	defer out.Close() // the child has its own copy

	// Only what this process writes tells why it failed.
	logStart := s.logSizes()

	var args []string
	if s.conf != "" {
		args = append(args, s.conf, "--sentinel")
	}
	args = append(args,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, logName),
	)
	args = append(args, s.extra...)
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.proc = p
	s.paused = false

	if err := s.waitReady(p, port, logStart, deadline); err != nil {
		p.signal(syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("starting redis-server on port %d: %w\n%s", port, err, s.logTail())
	}
	return nil
}

// waitReady waits until the process p answers on port. It fails when p
// exits, when another process answers on the port or when the deadline
// passes.
func (s *Server) waitReady(p *process, port int, logStart map[string]int64, deadline time.Time) error {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	var lastErr error
	for {
		if p.exited() {
			if s.logMentions(logStart, "Address already in use") {
				return fmt.Errorf("%w: redis-server exited: %v", errPortInUse, p.err)
			}
			return fmt.Errorf("redis-server exited: %v", p.err)
		}
		info, err := commandString(addr, probeTimeout, "INFO", "server")
		if err == nil {
			v, _ := infoField(info, "process_id")
			if pid, _ := strconv.Atoi(v); pid != p.pid() {
				return fmt.Errorf("%w: a process other than pid %d (pid %q) answers on %s", errPortInUse, p.pid(), v, addr)
			}
			if _, err = commandString(addr, probeTimeout, "PING"); err == nil {
				return nil
			}
		}
		lastErr = err
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to PING within %v: %v", startTimeout, lastErr)
		}
		select {
		case <-p.done:
		case <-time.After(pollInterval):
		}
	}
}

// stop ends the current process with SIGTERM and waits for it, sending
// SIGKILL if it has not exited after stopTimeout. It does nothing if the
// server is not running.
func (s *Server) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked()
}

func (s *Server) stopLocked() error {
	p := s.proc
	if p == nil || p.exited() {
		s.paused = false
		return nil
	}
	// A stopped process keeps SIGTERM pending until it is continued.
	if err := p.signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stopping redis-server (pid %d): %w", p.pid(), err)
	}
	if s.paused {
		if err := p.signal(syscall.SIGCONT); err != nil {
			return fmt.Errorf("stopping redis-server (pid %d): %w", p.pid(), err)
		}
		s.paused = false
	}
	if p.wait(stopTimeout) {
		return nil
	}
	if err := p.signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing redis-server (pid %d): %w", p.pid(), err)
	}
	<-p.done
	return nil
}

// kill ends the current process with SIGKILL and waits for it. It does
// nothing if the server is not running.
func (s *Server) kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	s.paused = false
	if p == nil || p.exited() {
		return nil
	}
	if err := p.signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing redis-server (pid %d): %w", p.pid(), err)
	}
	<-p.done
	return nil
}

// restart stops the server if it is running and starts a new process on
// the same port.
func (s *Server) restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return errors.New("restarting redis-server: server was never started")
	}
	if err := s.stopLocked(); err != nil {
		return err
	}
	deadline := time.Now().Add(startTimeout)
	for {
		err := s.launchLocked(s.port, deadline)
		if err == nil {
			return nil
		}
		// The port may be held briefly by someone else; it cannot be
		// changed, so wait for it.
		if !errors.Is(err, errPortInUse) || time.Now().After(deadline) {
			return fmt.Errorf("restarting redis-server: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pause freezes the running process with SIGSTOP and waits until the
// kernel reports it stopped.
func (s *Server) pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil || p.exited() {
		return errors.New("pausing redis-server: server is not running")
	}
	if s.paused {
		return nil
	}
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pausing redis-server (pid %d): %w", p.pid(), err)
	}
	s.paused = true
	return waitState(p, true)
}

// resume continues a process frozen by pause.
func (s *Server) resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil || p.exited() {
		return errors.New("resuming redis-server: server is not running")
	}
	if err := p.signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("resuming redis-server (pid %d): %w", p.pid(), err)
	}
	s.paused = false
	return waitState(p, false)
}

// waitState waits briefly until the stopped state of p, as far as the
// system reports it, equals stopped.
func waitState(p *process, stopped bool) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		st, known := procStopped(p.pid())
		if !known || st == stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server (pid %d) did not reach stopped=%v", p.pid(), stopped)
		}
		time.Sleep(time.Millisecond)
	}
}

// logSizes returns the current sizes of the server's log and output files
// by name, for use with logMentions.
func (s *Server) logSizes() map[string]int64 {
	sizes := map[string]int64{}
	for _, name := range []string{logName, outputName} {
		if fi, err := os.Stat(filepath.Join(s.dir, name)); err == nil {
			sizes[name] = fi.Size()
		}
	}
	return sizes
}

// logMentions reports whether the log or the output of the server contains
// text beyond the offsets in from, as returned by logSizes.
func (s *Server) logMentions(from map[string]int64, text string) bool {
	for _, name := range []string{logName, outputName} {
		b, err := os.ReadFile(filepath.Join(s.dir, name))
		if err != nil {
			continue
		}
		if off := from[name]; off <= int64(len(b)) {
			b = b[off:]
		}
		if strings.Contains(string(b), text) {
			return true
		}
	}
	return false
}

// logTail returns the last lines of the server's log and output, for
// inclusion in error messages.
func (s *Server) logTail() string {
	var b strings.Builder
	for _, name := range []string{logName, outputName} {
		path := filepath.Join(s.dir, name)
		tail := fileTail(path, 30)
		if tail == "" {
			continue
		}
		fmt.Fprintf(&b, "--- tail of %s ---\n%s\n", path, tail)
	}
	if b.Len() == 0 {
		return "(redis-server wrote no log)"
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// fileTail returns at most the last n lines of the file at path.
func fileTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const maxBytes = 16 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > maxBytes {
		f.Seek(fi.Size()-maxBytes, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
