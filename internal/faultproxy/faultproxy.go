// Package faultproxy is a TCP proxy for fault-injection tests: it listens
// on 127.0.0.1:0 in front of one server (a redis-server in herd's tests)
// and, under the test's control, delays traffic, cuts connections, eats
// requests without answering, or resets a connection in the middle of a
// chosen command.
//
// The proxy knows nothing of the protocol it carries. The faults that aim
// at one command find it by a byte pattern in the client's stream (for
// Redis, a script's SHA1 digest in its EVALSHA, or a command name), which
// is enough for request/reply protocols in which a connection carries one
// command at a time, as go-redis's pooled connections do.
//
// Every connection runs four goroutines (a reader and a writer per
// direction) plus one dialing goroutine while it connects; [Proxy.Close]
// ends them all and waits for them, so tests can check for leaks with
// goleak.
package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Direction is a direction of traffic through the proxy.
type Direction int

const (
	// Upstream is client to server: requests.
	Upstream Direction = iota
	// Downstream is server to client: replies.
	Downstream
)

func (d Direction) String() string {
	if d == Upstream {
		return "upstream"
	}
	return "downstream"
}

// dialTimeout bounds the proxy's connect to the target.
const dialTimeout = 2 * time.Second

// chunkSize is the largest chunk read at once.
const chunkSize = 32 << 10

// Proxy is a fault-injecting TCP proxy. Its methods are safe for
// concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup // the accept loop and every link's goroutines

	mu        sync.Mutex // guards everything below
	closed    bool
	links     map[*link]struct{}
	latency   [2]time.Duration
	blackhole bool
	faults    []*Fault

	accepted, cut atomic.Int64
}

// Stats counts what the proxy did since it started.
type Stats struct {
	Accepted int64 // client connections accepted
	Open     int   // client connections open now
	Cut      int64 // connections closed by a fault (Cut, a blackhole's end, a request fault)
}

// Start starts a proxy on a free port of 127.0.0.1 that forwards every
// connection to target (host:port). Stop it with [Proxy.Close].
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{target: target, ln: ln, links: make(map[*link]struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the proxy's listening address, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Close stops accepting, closes every connection and waits until all of
// the proxy's goroutines have ended. Later calls do nothing.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	links := p.snapshotLocked()
	p.faults = nil
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.shut(false)
	}
	p.wg.Wait()
	return err
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	open := len(p.links)
	p.mu.Unlock()
	return Stats{Accepted: p.accepted.Load(), Open: open, Cut: p.cut.Load()}
}

// SetLatency delays every chunk of data travelling in direction dir by d
// from the moment the proxy read it (0 turns the delay off). Order is kept
// and throughput is not limited: a burst of chunks is delivered d later as
// a burst. The setting applies to data read after the call.
func (p *Proxy) SetLatency(dir Direction, d time.Duration) {
	p.mu.Lock()
	p.latency[dir] = max(d, 0)
	p.mu.Unlock()
}

// Latency returns the delay set for dir.
func (p *Proxy) Latency(dir Direction) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency[dir]
}

// Cut resets every open connection (both sides, with TCP RST) and returns
// how many it cut. New connections are accepted as before.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	links := p.snapshotLocked()
	p.mu.Unlock()
	for _, l := range links {
		l.shut(true)
	}
	return len(links)
}

// SetBlackhole turns the blackhole on or off. While it is on the proxy
// still accepts connections and reads from its clients, but forwards
// nothing in either direction: requests and replies are discarded and
// new connections are not connected to the target, as when a server or
// the network between vanishes without closing anything. Turning it off
// closes the connections that lost data while it was on (their request
// and reply streams are out of step); the others carry on.
func (p *Proxy) SetBlackhole(on bool) {
	p.mu.Lock()
	p.blackhole = on
	var lossy []*link
	if !on {
		for l := range p.links {
			if l.lost.Load() {
				lossy = append(lossy, l)
			}
		}
	}
	p.mu.Unlock()
	for _, l := range lossy {
		l.shut(true)
	}
}

// Blackholed reports whether the blackhole is on.
func (p *Proxy) Blackholed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blackhole
}

func (p *Proxy) snapshotLocked() []*link {
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	return links
}

// Fault kinds.
type faultKind int

const (
	cutRequest faultKind = iota // forward n bytes of the request from the pattern on, then reset
	dropReply                   // forward the request, reset instead of forwarding its reply
)

// Fault is a one-shot fault armed on the next request that contains a
// pattern, on any connection.
type Fault struct {
	kind    faultKind
	pattern []byte
	n       int

	p     *Proxy
	fired chan struct{}
	once  sync.Once
}

// Fired is closed when the fault has hit: for CutRequest when the
// connection was reset, for DropReply when its request was seen (its
// reply is then dropped and the connection reset, unless the client gave
// up first).
func (f *Fault) Fired() <-chan struct{} { return f.fired }

// Disarm removes the fault if it has not matched yet. It reports whether
// it did (false when the fault already matched a request).
func (f *Fault) Disarm() bool {
	p := f.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, g := range p.faults {
		if g == f {
			p.faults = append(p.faults[:i:i], p.faults[i+1:]...)
			return true
		}
	}
	return false
}

func (f *Fault) fire() { f.once.Do(func() { close(f.fired) }) }

// CutRequest arms a fault on the next request, on any connection, whose
// bytes contain pattern: the proxy forwards the stream up to the start of
// the pattern and n bytes from there on, then resets the connection on
// both sides. The n bytes are counted within the data the client had sent
// when the pattern arrived (one request, for a client that waits for each
// reply). With n = 0 the server never sees the command; with n at least
// the rest of the request, the server runs it and the client never gets
// the reply. An empty pattern matches the next request on any
// connection.
func (p *Proxy) CutRequest(pattern []byte, n int) *Fault {
	return p.arm(&Fault{kind: cutRequest, pattern: bytes.Clone(pattern), n: max(n, 0)})
}

// DropReply arms a fault on the next request, on any connection, whose
// bytes contain pattern: the request is forwarded whole, and when the
// server's reply starts to arrive the proxy discards it and resets the
// connection. The server ran the command; the client sees a broken
// connection instead of its answer (a lost reply), and may retry.
func (p *Proxy) DropReply(pattern []byte) *Fault {
	return p.arm(&Fault{kind: dropReply, pattern: bytes.Clone(pattern)})
}

func (p *Proxy) arm(f *Fault) *Fault {
	f.p = p
	f.fired = make(chan struct{})
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.faults = append(p.faults, f)
	}
	return f
}

// match finds the first armed fault whose pattern occurs in window
// (the tail of earlier data followed by the new chunk), removes it and
// returns it with the offset of the pattern in window.
func (p *Proxy) match(window []byte) (*Fault, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, f := range p.faults {
		at := bytes.Index(window, f.pattern)
		if at < 0 {
			continue
		}
		p.faults = append(p.faults[:i:i], p.faults[i+1:]...)
		return f, at
	}
	return nil, -1
}

// longestPattern is the length of the longest armed pattern, for the
// matching window; armed is false when no fault is armed.
func (p *Proxy) longestPattern() (n int, armed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.faults {
		n = max(n, len(f.pattern))
	}
	return n, len(p.faults) > 0
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient accept error: the listener is still open.
			time.Sleep(5 * time.Millisecond)
			continue
		}
		p.accepted.Add(1)
		l := &link{p: p, client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.links[l] = struct{}{}
		hole := p.blackhole
		p.wg.Add(1)
		p.mu.Unlock()
		go l.run(hole)
	}
}

// link is one proxied connection.
type link struct {
	p      *Proxy
	client net.Conn
	done   chan struct{} // closed by shut

	mu       sync.Mutex
	server   net.Conn // nil until connected (and forever when blackholed at accept)
	shutOnce sync.Once

	lost      atomic.Bool           // data was discarded by the blackhole
	dropReply atomic.Pointer[Fault] // the next reply is to be dropped
	tail      []byte                // the upstream reader's last bytes, for patterns split over chunks
	queued    [2]chan chunk         // reader to writer, per direction
}

// chunk is data read in one direction, due for delivery at due. A chunk
// with reset set ends the link once everything before it is delivered.
type chunk struct {
	data  []byte
	due   time.Time
	reset *Fault
}

func (l *link) run(blackholed bool) {
	p := l.p
	defer p.wg.Done()
	defer func() {
		l.shut(false)
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	if blackholed {
		// Accept and read, never connect or answer.
		l.lost.Store(true)
		buf := make([]byte, chunkSize)
		for {
			if _, err := l.client.Read(buf); err != nil {
				return
			}
		}
	}
	d := net.Dialer{Timeout: dialTimeout}
	server, err := d.Dial("tcp", p.target)
	if err != nil {
		return // the client sees its connection closed, as with a dead server behind a balancer
	}
	l.mu.Lock()
	select {
	case <-l.done:
		l.mu.Unlock()
		server.Close()
		return
	default:
	}
	l.server = server
	l.mu.Unlock()

	for i := range l.queued {
		l.queued[i] = make(chan chunk, 64)
	}
	var wg sync.WaitGroup
	wg.Go(func() { l.read(Upstream, l.client) })
	wg.Go(func() { l.write(Upstream, server) })
	wg.Go(func() { l.read(Downstream, server) })
	wg.Go(func() { l.write(Downstream, l.client) })
	wg.Wait()
}

// shut closes both sides of the link, with TCP RST when reset is set.
func (l *link) shut(reset bool) {
	l.shutOnce.Do(func() {
		if reset {
			l.p.cut.Add(1)
		}
		close(l.done)
		l.mu.Lock()
		server := l.server
		l.mu.Unlock()
		for _, c := range []net.Conn{l.client, server} {
			if c == nil {
				continue
			}
			if tc, ok := c.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0)
			}
			c.Close()
		}
	})
}

// read pumps one direction from src into the writer's queue, applying the
// blackhole, the latency and the faults.
func (l *link) read(dir Direction, src net.Conn) {
	defer close(l.queued[dir])
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !l.accept(dir, bytes.Clone(buf[:n])) {
				return
			}
		}
		if err != nil {
			l.shut(false)
			return
		}
	}
}

// accept handles one chunk read in direction dir. It returns false when
// the reader should stop.
func (l *link) accept(dir Direction, data []byte) bool {
	p := l.p
	p.mu.Lock()
	hole, lat := p.blackhole, p.latency[dir]
	p.mu.Unlock()
	if hole {
		l.lost.Store(true)
		return true
	}
	due := time.Now().Add(lat)
	if dir == Downstream {
		if f := l.dropReply.Swap(nil); f != nil {
			// The reply of the faulted request: never delivered.
			l.shut(true)
			f.fire()
			return false
		}
		return l.enqueue(dir, chunk{data: data, due: due})
	}

	// Upstream: look for the armed faults' patterns.
	longest, armed := p.longestPattern()
	if !armed {
		l.tail = l.tail[:0]
		return l.enqueue(dir, chunk{data: data, due: due})
	}
	window := append(bytes.Clone(l.tail), data...)
	f, at := p.match(window)
	keep := min(len(window), max(longest-1, 0))
	l.tail = append(l.tail[:0], window[len(window)-keep:]...)
	if f == nil {
		return l.enqueue(dir, chunk{data: data, due: due})
	}
	start := at - (len(window) - len(data)) // the pattern's offset in data; may be negative
	switch f.kind {
	case dropReply:
		// The fault has hit its request: it fires now, whether the reply
		// then arrives (and is dropped) or the client gives up first.
		l.dropReply.Store(f)
		f.fire()
		return l.enqueue(dir, chunk{data: data, due: due})
	default: // cutRequest
		end := max(start, 0) + f.n
		if start < 0 {
			end = f.n + start // part of the pattern was in an earlier chunk, already forwarded
		}
		if end < 0 {
			end = 0
		}
		l.cutThen(dir, data[:min(end, len(data))], due, f)
		return false
	}
}

// cutThen queues the last data to forward and the reset after it; the
// reader stops reading.
func (l *link) cutThen(dir Direction, data []byte, due time.Time, f *Fault) {
	if l.enqueue(dir, chunk{data: data, due: due}) {
		l.enqueue(dir, chunk{due: due, reset: f})
	}
}

// enqueue hands c to the writer. It returns false when the link is shut.
func (l *link) enqueue(dir Direction, c chunk) bool {
	select {
	case l.queued[dir] <- c:
		return true
	case <-l.done:
		return false
	}
}

// write delivers the chunks of one direction to dst when they are due.
func (l *link) write(dir Direction, dst net.Conn) {
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for c := range l.queued[dir] {
		if d := time.Until(c.due); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-l.done:
				return
			}
		}
		if c.reset != nil {
			l.shut(true)
			c.reset.fire()
			return
		}
		if l.p.Blackholed() {
			l.lost.Store(true) // in flight when the blackhole began
			continue
		}
		if len(c.data) == 0 {
			continue
		}
		if _, err := dst.Write(c.data); err != nil {
			l.shut(false)
			return
		}
	}
}
