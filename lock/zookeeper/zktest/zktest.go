// Package zktest starts standalone ZooKeeper servers for tests and
// benchmarks: a JVM running org.apache.zookeeper.server.ZooKeeperServerMain
// on a free loopback port, with a data directory and a generated zoo.cfg
// of its own, stopped by its pid.
//
// The server is configured for tests: a tick of 100ms, so that session
// timeouts from [MinSessionTimeout] to [MaxSessionTimeout] are accepted
// and expired sessions are found within a tick; no connection limit per
// client address; the admin server off; the four-letter words ruok, srvr,
// stat, cons, mntr, wchp, wchc and dump enabled. ZooKeeper's own defaults
// (a tick of 2s, session timeouts of 4s to 40s) differ.
//
// The JVM is java on $PATH (or $HERD_ZK_JAVA), with the class path
// $HERD_ZK_CLASSPATH, by default Debian's /usr/share/java/zookeeper.jar,
// whose manifest names its dependencies. [Available] says whether both are
// there; with HERD_REQUIRE_REDIS=1 (herd's CI variable for every server a
// test needs) a missing one is an error instead of a reason to skip.
package zktest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The session timeouts the servers accept, and their tick.
const (
	TickTime          = 100 * time.Millisecond
	MinSessionTimeout = 200 * time.Millisecond
	MaxSessionTimeout = 60 * time.Second
)

const (
	requireEnv       = "HERD_REQUIRE_REDIS"
	javaEnv          = "HERD_ZK_JAVA"
	classPathEnv     = "HERD_ZK_CLASSPATH"
	defaultClassPath = "/usr/share/java/zookeeper.jar"
	startTimeout     = 60 * time.Second // a JVM on a busy machine
)

// Required reports whether HERD_REQUIRE_REDIS demands the servers the
// tests need.
func Required() bool {
	v, err := strconv.ParseBool(os.Getenv(requireEnv))
	return err == nil && v
}

// Available reports whether a ZooKeeper server can be started: java and
// the class path's first entry exist. When one is missing it returns false
// and the reason, which a test either skips with or, when [Required],
// fails with.
func Available() (bool, error) {
	if _, _, err := paths(); err != nil {
		return false, err
	}
	return true, nil
}

func paths() (java, classPath string, err error) {
	java = os.Getenv(javaEnv)
	if java == "" {
		if java, err = exec.LookPath("java"); err != nil {
			return "", "", fmt.Errorf("zktest: java not found: %w", err)
		}
	}
	classPath = os.Getenv(classPathEnv)
	if classPath == "" {
		classPath = defaultClassPath
	}
	first, _, _ := strings.Cut(classPath, ":")
	if _, err := os.Stat(first); err != nil {
		return "", "", fmt.Errorf("zktest: ZooKeeper's jar: %w", err)
	}
	return java, classPath, nil
}

// Server is a running standalone ZooKeeper server. Its methods are safe
// for concurrent use.
type Server struct {
	dir      string
	java, cp string
	port     int
	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
}

// Start starts a server with its data, configuration and log in dir
// (which must exist, and may hold the data of an earlier server, which the
// new one then loads), on a free port of 127.0.0.1, and waits until it
// serves requests. Close it when done.
func Start(dir string) (*Server, error) {
	java, cp, err := paths()
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, java: java, cp: cp}
	for try := 0; ; try++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s.port = port
		err = s.start()
		if err == nil || try == 2 || !errors.Is(err, errExited) {
			return s, err
		}
		// The port was taken between the probe and the JVM's bind: again.
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("zktest: find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

var errExited = errors.New("the server exited")

// start writes the configuration and starts the JVM on s.port.
func (s *Server) start() error {
	data := filepath.Join(s.dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return fmt.Errorf("zktest: %w", err)
	}
	cfg := fmt.Sprintf(`tickTime=%d
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
minSessionTimeout=%d
maxSessionTimeout=%d
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,cons,mntr,wchp,wchc,dump
`, TickTime.Milliseconds(), data, s.port, MinSessionTimeout.Milliseconds(), MaxSessionTimeout.Milliseconds())
	cfgPath := filepath.Join(s.dir, "zoo.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("zktest: %w", err)
	}
	out, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("zktest: %w", err)
	}
	cmd := exec.Command(s.java,
		"-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xmx256m",
		"-Dzookeeper.admin.enableServer=false",
		"-cp", s.cp, "org.apache.zookeeper.server.ZooKeeperServerMain", cfgPath)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("zktest: start java: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	return s.ready(exited)
}

// ready waits until the server answers srvr as a serving standalone
// server.
func (s *Server) ready(exited chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	for {
		if out, err := s.FourLetterWord("srvr"); err == nil && bytes.Contains(out, []byte("Mode: standalone")) {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("zktest: %w on port %d: %s", errExited, s.port, s.logTail())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Close()
			return fmt.Errorf("zktest: the server on port %d did not serve within %v: %s", s.port, startTimeout, s.logTail())
		}
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Addr returns the server's address, host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Pid returns the process id of the server's JVM, 0 when it is stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Kill kills the server with SIGKILL, as a crash would, and waits for the
// process to end. Its data directory stays, for [Server.Restart]. Kill
// does nothing when the server is stopped.
func (s *Server) Kill() error {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("zktest: kill %d: %w", cmd.Process.Pid, err)
	}
	<-exited
	return nil
}

// Restart starts the server again, after killing it if it runs, on the
// same port and data directory: it loads the sessions and nodes it had
// written to its transaction log, as ZooKeeper does after a crash.
func (s *Server) Restart() error {
	if err := s.Kill(); err != nil {
		return err
	}
	return s.start()
}

// Close stops the server (SIGKILL: a test server keeps nothing worth a
// clean shutdown) and waits for it. The directory is the caller's. Close
// is idempotent.
func (s *Server) Close() error { return s.Kill() }

// FourLetterWord sends a four-letter command (srvr, cons, wchp, ...) and
// returns the server's answer.
func (s *Server) FourLetterWord(cmd string) ([]byte, error) {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, cmd); err != nil {
		return nil, err
	}
	return io.ReadAll(c)
}

// CloseSession ends the session id, whose password is passwd, from a
// connection of its own: it attaches to the session, as a client
// reconnecting would, and sends closeSession. The server then deletes the
// session's ephemeral nodes, fires their watches and closes the session's
// other connection, as it does when a session expires. This is the usual
// way to expire a session on demand.
func (s *Server) CloseSession(id int64, passwd []byte) error {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return fmt.Errorf("zktest: close session %#x: %w", id, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	// ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId,
	// passwd, readOnly.
	var req bytes.Buffer
	be := binary.BigEndian
	req.Write(be.AppendUint32(nil, 0))
	req.Write(be.AppendUint64(nil, 0))
	req.Write(be.AppendUint32(nil, uint32(MaxSessionTimeout.Milliseconds())))
	req.Write(be.AppendUint64(nil, uint64(id)))
	req.Write(be.AppendUint32(nil, uint32(len(passwd))))
	req.Write(passwd)
	req.WriteByte(0)
	if err := writeFrame(c, req.Bytes()); err != nil {
		return fmt.Errorf("zktest: close session %#x: %w", id, err)
	}
	resp, err := readFrame(r)
	if err != nil {
		return fmt.Errorf("zktest: close session %#x: %w", id, err)
	}
	// ConnectResponse: protocolVersion, timeOut, sessionId, ...: a
	// session id of 0 means the session had already ended.
	if len(resp) < 16 || be.Uint64(resp[8:16]) == 0 {
		return fmt.Errorf("zktest: close session %#x: the server does not know it (expired?)", id)
	}
	// RequestHeader: xid, type closeSession (-11).
	if err := writeFrame(c, append(be.AppendUint32(nil, 1), be.AppendUint32(nil, uint32(0xFFFFFFF5))...)); err != nil {
		return fmt.Errorf("zktest: close session %#x: %w", id, err)
	}
	reply, err := readFrame(r)
	if err != nil {
		return fmt.Errorf("zktest: close session %#x: %w", id, err)
	}
	// ReplyHeader: xid, zxid, err.
	if len(reply) < 16 || be.Uint32(reply[12:16]) != 0 {
		return fmt.Errorf("zktest: close session %#x: reply %x", id, reply)
	}
	return nil
}

func writeFrame(w io.Writer, b []byte) error {
	_, err := w.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...))
	return err
}

func readFrame(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint32(n[:]))
	_, err := io.ReadFull(r, b)
	return b, err
}
