package faultproxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// server is a line server for the tests: it records every byte it
// receives and, when echo is set, answers each line with the same line.
type server struct {
	ln   net.Listener
	echo bool
	wg   sync.WaitGroup

	mu    sync.Mutex
	got   bytes.Buffer
	conns []net.Conn
}

func newServer(t *testing.T, echo bool) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ln: ln, echo: echo}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Go(func() { s.serve(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *server) serve(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		s.mu.Lock()
		s.got.WriteString(line)
		s.mu.Unlock()
		if err != nil {
			return
		}
		if s.echo {
			if _, err := c.Write([]byte(line)); err != nil {
				return
			}
		}
	}
}

func (s *server) received() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got.String()
}

func startProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes line and reads one line back within d.
func roundTrip(c net.Conn, line string, d time.Duration) (string, error) {
	if err := c.SetDeadline(time.Now().Add(d)); err != nil {
		return "", err
	}
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(line)); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestPassThrough(t *testing.T) {
	s := newServer(t, true)
	p := startProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	for _, line := range []string{"hello\n", strings.Repeat("x", 100000) + "\n"} {
		got, err := roundTrip(c, line, 5*time.Second)
		if err != nil || got != line {
			t.Fatalf("round trip of %d bytes: got %d bytes, %v", len(line), len(got), err)
		}
	}
	if st := p.Stats(); st.Accepted != 1 || st.Open != 1 || st.Cut != 0 {
		t.Errorf("Stats = %+v, want 1 accepted, 1 open, 0 cut", st)
	}
}

func TestLatency(t *testing.T) {
	s := newServer(t, true)
	p := startProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	if _, err := roundTrip(c, "warm\n", time.Second); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []Direction{Downstream, Upstream} {
		p.SetLatency(dir, 100*time.Millisecond)
		start := time.Now()
		if got, err := roundTrip(c, "slow\n", 5*time.Second); err != nil || got != "slow\n" {
			t.Fatalf("%v latency: round trip = %q, %v", dir, got, err)
		}
		if d := time.Since(start); d < 100*time.Millisecond {
			t.Errorf("%v latency 100ms: round trip took %v", dir, d)
		}
		p.SetLatency(dir, 0)
	}
	// A burst is delayed once, not once per chunk.
	p.SetLatency(Downstream, 100*time.Millisecond)
	start := time.Now()
	r := bufio.NewReader(c)
	for range 10 {
		if _, err := c.Write([]byte("burst\n")); err != nil {
			t.Fatal(err)
		}
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for range 10 {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Errorf("10 pipelined lines with 100ms latency took %v: latency accumulates per chunk", d)
	}
	if got := p.Latency(Downstream); got != 100*time.Millisecond {
		t.Errorf("Latency(Downstream) = %v", got)
	}
}

func TestCut(t *testing.T) {
	s := newServer(t, true)
	p := startProxy(t, s.ln.Addr().String())
	var conns []net.Conn
	for range 3 {
		c := dial(t, p)
		if _, err := roundTrip(c, "a\n", time.Second); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	if n := p.Cut(); n != 3 {
		t.Errorf("Cut() = %d, want 3", n)
	}
	for i, c := range conns {
		if got, err := roundTrip(c, "b\n", time.Second); err == nil {
			t.Errorf("connection %d still answers after Cut: %q", i, got)
		} else if isTimeout(err) {
			t.Errorf("connection %d: %v, want a closed connection, not a timeout", i, err)
		}
	}
	c := dial(t, p)
	if got, err := roundTrip(c, "c\n", time.Second); err != nil || got != "c\n" {
		t.Errorf("new connection after Cut: %q, %v", got, err)
	}
	waitUntil(t, 2*time.Second, "the cut links to go", func() bool { return p.Stats().Open == 1 })
	if st := p.Stats(); st.Cut != 3 {
		t.Errorf("Stats.Cut = %d, want 3", st.Cut)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestBlackhole(t *testing.T) {
	s := newServer(t, true)
	p := startProxy(t, s.ln.Addr().String())
	old := dial(t, p)
	if _, err := roundTrip(old, "before\n", time.Second); err != nil {
		t.Fatal(err)
	}
	idle := dial(t, p)
	if _, err := roundTrip(idle, "idle\n", time.Second); err != nil {
		t.Fatal(err)
	}
	p.SetBlackhole(true)
	if !p.Blackholed() {
		t.Fatal("Blackholed() = false after SetBlackhole(true)")
	}
	// The proxy accepts connections and takes requests, and answers nothing.
	fresh := dial(t, p)
	for name, c := range map[string]net.Conn{"open": old, "new": fresh} {
		if got, err := roundTrip(c, "lost-"+name+"\n", 200*time.Millisecond); !isTimeout(err) {
			t.Errorf("%s connection in the blackhole: got %q, %v; want a timeout", name, got, err)
		}
	}
	if strings.Contains(s.received(), "lost") {
		t.Errorf("the server received data sent into the blackhole: %q", s.received())
	}
	p.SetBlackhole(false)
	// The connections that lost data are closed; the idle one carries on.
	for name, c := range map[string]net.Conn{"open": old, "new": fresh} {
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := io.ReadAll(c); isTimeout(err) {
			t.Errorf("%s connection not closed when the blackhole ended", name)
		}
	}
	if got, err := roundTrip(idle, "still\n", time.Second); err != nil || got != "still\n" {
		t.Errorf("idle connection after the blackhole: %q, %v", got, err)
	}
	c := dial(t, p)
	if got, err := roundTrip(c, "after\n", time.Second); err != nil || got != "after\n" {
		t.Errorf("new connection after the blackhole: %q, %v", got, err)
	}
}

func TestCutRequest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		split bool
		want  string
	}{
		{"before the pattern", 0, false, "first\nPRE "},
		{"three bytes in", 3, false, "first\nPRE EVA"},
		{"pattern split over two writes", 4, true, "first\nPRE EVAL"},
		{"whole request", 100, false, "first\nPRE EVALSHA abc\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, false)
			p := startProxy(t, s.ln.Addr().String())
			c := dial(t, p)
			f := p.CutRequest([]byte("EVALSHA"), tc.n)
			if _, err := c.Write([]byte("first\n")); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, time.Second, "the first line", func() bool { return s.received() == "first\n" })
			if tc.split {
				c.Write([]byte("PRE EVA"))
				time.Sleep(20 * time.Millisecond) // two reads for the proxy
				c.Write([]byte("LSHA abc\n"))
			} else {
				c.Write([]byte("PRE EVALSHA abc\n"))
			}
			select {
			case <-f.Fired():
			case <-time.After(2 * time.Second):
				t.Fatal("the fault did not fire")
			}
			c.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := io.ReadAll(c); isTimeout(err) {
				t.Error("the client's connection was not reset")
			}
			waitUntil(t, time.Second, "the server to see the cut", func() bool { return p.Stats().Open == 0 })
			time.Sleep(10 * time.Millisecond)
			if got := s.received(); got != tc.want {
				t.Errorf("server received %q, want %q", got, tc.want)
			}
			if f.Disarm() {
				t.Error("Disarm of a fault that fired reported true")
			}
		})
	}
}

func TestDropReply(t *testing.T) {
	s := newServer(t, true)
	p := startProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	if got, err := roundTrip(c, "hello\n", time.Second); err != nil || got != "hello\n" {
		t.Fatalf("before the fault: %q, %v", got, err)
	}
	f := p.DropReply([]byte("PING"))
	other := p.DropReply([]byte("never sent"))
	if got, err := roundTrip(c, "PING 1\n", time.Second); err == nil {
		t.Errorf("the reply of the faulted request arrived: %q", got)
	} else if isTimeout(err) {
		t.Errorf("faulted request: %v, want a reset connection", err)
	}
	select {
	case <-f.Fired():
	case <-time.After(2 * time.Second):
		t.Fatal("the fault did not fire")
	}
	if got := s.received(); got != "hello\nPING 1\n" {
		t.Errorf("server received %q, want the request whole", got)
	}
	// One-shot: the next connection works.
	c2 := dial(t, p)
	if got, err := roundTrip(c2, "PING 2\n", time.Second); err != nil || got != "PING 2\n" {
		t.Errorf("after the fault: %q, %v", got, err)
	}
	if !other.Disarm() {
		t.Error("Disarm of an armed fault reported false")
	}
}

// Close ends every goroutine: connections open, blackholed, with data
// queued behind a latency, and a dial to a dead target.
func TestCloseStopsEverything(t *testing.T) {
	s := newServer(t, true)
	before := goleak.IgnoreCurrent()
	p, err := Start(s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	roundTrip(conns[0], "x\n", time.Second)
	p.SetLatency(Downstream, time.Hour)
	conns[0].Write([]byte("queued\n"))
	p.SetBlackhole(true)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	conns = append(conns, c)
	c.Write([]byte("into the hole\n"))
	p.DropReply([]byte("armed"))
	waitUntil(t, time.Second, "3 links", func() bool { return p.Stats().Open == 3 })
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v", d)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for _, c := range conns {
		c.Close()
	}
	goleak.VerifyNone(t, before)

	// A proxy whose target is down closes its clients' connections.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := dead.Addr().String()
	dead.Close()
	p2, err := Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	c2, err := net.Dial("tcp", p2.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.ReadAll(c2); isTimeout(err) {
		t.Error("a connection to a dead target was not closed")
	}
}

// An empty pattern matches the next request on any connection.
func TestCutRequestEmptyPattern(t *testing.T) {
	s := newServer(t, false)
	p := startProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	f := p.CutRequest(nil, 2)
	c.Write([]byte("hello\n"))
	select {
	case <-f.Fired():
	case <-time.After(2 * time.Second):
		t.Fatal("the fault did not fire")
	}
	waitUntil(t, time.Second, "the link to close", func() bool { return p.Stats().Open == 0 })
	time.Sleep(10 * time.Millisecond)
	if got := s.received(); got != "he" {
		t.Errorf("server received %q, want %q", got, "he")
	}
}
