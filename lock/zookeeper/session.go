package zookeeper

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// session is one ZooKeeper session: a zk.Conn of its own, opened with the
// lease length as its timeout. An attempt creates its node on it, and the
// lease it turns into keeps it.
//
// The session's state comes from zk's event callback; its id, password
// and negotiated timeout from the connect response, which the session's
// dialer reads off the connection as zk does (zk keeps the negotiated
// timeout to itself).
type session struct {
	l      *Locker
	ttl    time.Duration // the timeout asked for
	conn   *zk.Conn
	events <-chan zk.Event

	mu        sync.Mutex
	state     zk.State
	id        int64
	passwd    []byte
	timeout   time.Duration // negotiated by the last connect
	changed   chan struct{} // closed and replaced at every state change
	dialErr   error
	dialFails int    // consecutive failed dials
	down      func() // the holding lease's loss handler
	closing   bool
	everUp    bool // the session was established once

	closeOnce sync.Once
	closed    chan struct{} // zk's goroutines have ended
}

// newSession opens a session with timeout ttl. It does not wait for it:
// see await.
func (l *Locker) newSession(ttl time.Duration) (*session, error) {
	s := &session{l: l, ttl: ttl, changed: make(chan struct{}), closed: make(chan struct{})}
	conn, events, err := zk.Connect(l.servers, ttl,
		zk.WithDialer(s.dial),
		zk.WithEventCallback(s.event),
		zk.WithLogger(l.log),
		zk.WithLogInfo(false))
	if err != nil {
		return nil, err
	}
	s.conn, s.events = conn, events
	return s, nil
}

// dial is the session's zk.Dialer: the Locker's dialer, counting failures,
// with the connect response read as it passes.
func (s *session) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := s.l.dialer(network, addr, timeout)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.dialErr = err
		s.dialFails++
		s.notify()
		return nil, err
	}
	s.dialFails = 0
	return &sniffConn{Conn: c, s: s}, nil
}

// event is zk's callback, on its goroutines; it must not block.
func (s *session) event(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	s.mu.Lock()
	s.state = ev.State
	if ev.State == zk.StateHasSession {
		s.everUp = true
	}
	s.notify()
	var down func()
	if ev.State == zk.StateDisconnected || ev.State == zk.StateExpired {
		down, s.down = s.down, nil
	}
	s.mu.Unlock()
	if down != nil {
		down()
	}
}

// notify wakes the waiters on changed. s.mu is held.
func (s *session) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// await waits until the session is established, until ctx ends, and, for
// a session that was never established, for at most one failed dial per
// server (then it returns the dial error).
func (s *session) await(ctx context.Context) error {
	for {
		s.mu.Lock()
		st, ch, fails, derr, closing := s.state, s.changed, s.dialFails, s.dialErr, s.closing
		if s.everUp {
			fails = 0 // a waiter's session: wait for zk to reconnect
		}
		s.mu.Unlock()
		switch {
		case closing:
			return zk.ErrConnectionClosed
		case st == zk.StateHasSession:
			return nil
		case fails >= len(s.l.servers):
			return fmt.Errorf("connect to ZooKeeper: %w", derr)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-ch:
		}
	}
}

// info returns the session's id and negotiated timeout, and whether it is
// established.
func (s *session) info() (id int64, timeout time.Duration, up bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id, s.timeout, s.state == zk.StateHasSession && !s.closing
}

// changes returns a channel closed at the session's next state change.
func (s *session) changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// hold makes down the session's loss handler: it is called once, on
// zk's goroutine, when the session's connection is lost. It reports
// false, and sets nothing, when the session is not established now.
func (s *session) hold(down func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != zk.StateHasSession || s.closing {
		return false
	}
	s.down = down
	return true
}

// unhold removes the loss handler.
func (s *session) unhold() {
	s.mu.Lock()
	s.down = nil
	s.mu.Unlock()
}

// credentials returns the session's id and password (for tests that end
// the session from another connection).
func (s *session) credentials() (int64, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id, append([]byte(nil), s.passwd...)
}

// close closes the session, which makes the server delete its ephemeral
// node at once when it can be reached, and waits for zk's goroutines to
// end (about a second at most when the server cannot be reached). Every
// call waits for the first one to finish.
func (s *session) close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closing = true
		s.down = nil
		s.notify()
		s.mu.Unlock()
		s.conn.Close()
		for range s.events { // zk closes it when its goroutines are done
		}
		close(s.closed)
	})
}

// isConnErr reports whether err is zk's report of a connection that is
// down (the request may or may not have reached the server).
func isConnErr(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrNoServer) ||
		errors.Is(err, zk.ErrClosing) || errors.Is(err, zk.ErrSessionExpired) ||
		errors.Is(err, zk.ErrSessionMoved)
}

// sniffConn reads the connect response, the first frame the server sends
// on a connection, as it passes to zk.
type sniffConn struct {
	net.Conn
	s    *session
	done bool
	buf  []byte
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done && n > 0 {
		c.buf = append(c.buf, p[:n]...)
		c.parse()
	}
	return n, err
}

// parse decodes the connect response once it is complete: length,
// protocolVersion, timeOut (ms), sessionId, passwd (length and bytes).
func (c *sniffConn) parse() {
	if len(c.buf) < 4 {
		return
	}
	size := int(binary.BigEndian.Uint32(c.buf))
	if len(c.buf) < 4+size {
		return
	}
	c.done = true
	b := c.buf[4 : 4+size]
	c.buf = nil
	if len(b) < 20 {
		return
	}
	timeout := time.Duration(int32(binary.BigEndian.Uint32(b[4:8]))) * time.Millisecond
	id := int64(binary.BigEndian.Uint64(b[8:16]))
	pl := int(int32(binary.BigEndian.Uint32(b[16:20])))
	var passwd []byte
	if pl > 0 && 20+pl <= len(b) {
		passwd = append([]byte(nil), b[20:20+pl]...)
	}
	c.s.mu.Lock()
	c.s.timeout, c.s.id, c.s.passwd = timeout, id, passwd
	c.s.mu.Unlock()
}
