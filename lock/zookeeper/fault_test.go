package zookeeper

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/lock/zookeeper/zktest"
	"github.com/herdkit/herd/locktest"
)

// TestServerRestart: the server is killed and restarted on the same data
// directory. The holder sees its connection drop and its lease lost at
// once (it cannot know whether its session survives); the server, which
// restores the session from its log, expires it one session timeout after
// the restart, and a new holder then takes the lock with a higher token
// (transaction ids go on from the log).
func TestServerRestart(t *testing.T) {
	srv := startServer(t)
	ctx := context.Background()
	name := testName(t)
	const ttl = time.Second
	a := newTestLocker(t, srv, nil)
	held, err := a.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	held.KeepAlive(0)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Lost():
	case <-time.After(ttl):
		t.Fatalf("Lost still open %v after the server was killed", ttl)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	b := newTestLocker(t, srv, &Options{Recheck: time.Minute})
	wctx, cancel := context.WithTimeout(ctx, 20*ttl)
	defer cancel()
	next, err := b.Acquire(wctx, name, ttl)
	if err != nil {
		t.Fatalf("Acquire after the restart: %v (the old session should expire %v after it)", err, ttl)
	}
	defer next.Release(ctx)
	t.Logf("a new holder took the lock %v after the restarted server began to serve", time.Since(restarted))
	if next.Token() <= held.Token() {
		t.Errorf("tokens %d then %d: not increasing across the restart", held.Token(), next.Token())
	}
	if err := held.Release(ctx); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Release of the lease lost in the restart: %v, want ErrLeaseLost", err)
	}
	if isClosed(next.Lost()) {
		t.Error("the new holder's lease is lost")
	}
}

// TestSessionExpiry: the holder's connection goes silent (its packets are
// dropped, as a cut network or a stalled host would), so the server hears
// nothing and expires the session after its timeout. The holder's Lost
// closes first, at two thirds of the session timeout (zk gives up on a
// connection silent for that long), although Extend had moved the lease's
// own end far away; then the server deletes the node and a waiter takes
// the lock with a higher token.
func TestSessionExpiry(t *testing.T) {
	requireZK(t)
	ctx := context.Background()
	name := testName(t)
	const ttl = time.Second
	var cut atomic.Bool
	a := newTestLocker(t, nil, &Options{Dialer: func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return &silentConn{Conn: c, cut: &cut}, nil
	}})
	held, err := a.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	if err := held.Extend(ctx, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Until(held.Deadline()); d > ttl {
		t.Errorf("Deadline() is %v away after an Extend past the session timeout; want at most the session timeout %v", d, ttl)
	}
	b := newTestLocker(t, nil, &Options{Recheck: time.Minute})
	wctx, cancel := context.WithTimeout(ctx, 20*ttl)
	defer cancel()
	waiter := make(chan *Lease, 1)
	go func() {
		l, err := b.Acquire(wctx, name, 10*time.Second)
		if err != nil {
			t.Errorf("the waiter: %v", err)
		}
		waiter <- l
	}()
	cutAt := time.Now()
	cut.Store(true)
	var lostAt time.Time
	select {
	case <-held.Lost():
		lostAt = time.Now()
	case <-wctx.Done():
		t.Fatal("Lost still open after the connection went silent")
	}
	next := <-waiter
	if next == nil {
		return
	}
	defer next.Release(ctx)
	tookAt := time.Now()
	t.Logf("lost %v after the cut, taken over %v after it", lostAt.Sub(cutAt), tookAt.Sub(cutAt))
	if tookAt.Sub(cutAt) < ttl*9/10 {
		t.Errorf("the lock passed %v after the cut, before the session timeout %v", tookAt.Sub(cutAt), ttl)
	}
	if next.Token() <= held.Token() {
		t.Errorf("tokens %d then %d: not increasing", held.Token(), next.Token())
	}
	if err := held.Release(ctx); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Release of the expired lease: %v, want ErrLeaseLost", err)
	}
}

// silentConn drops everything written to it while cut is set: the server
// hears nothing, not even pings, as behind a cut network.
type silentConn struct {
	net.Conn
	cut *atomic.Bool
}

func (c *silentConn) Write(p []byte) (int, error) {
	if c.cut.Load() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// TestNoHerdEffect: with a holder and several waiters queued on one lock,
// each node is watched by at most two sessions (its own, for the holder,
// and its successor's), as the server's own watch table (wchp) shows; a
// release wakes the one waiter behind it, which takes the lock.
func TestNoHerdEffect(t *testing.T) {
	requireZK(t)
	ctx := context.Background()
	name := testName(t)
	const waiters = 5
	l := newTestLocker(t, nil, &Options{Recheck: time.Minute})
	held, err := l.TryAcquire(ctx, name, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got := make(chan *Lease, waiters)
	for range waiters {
		go func() {
			lease, err := l.Acquire(wctx, name, 10*time.Second)
			if err != nil {
				t.Errorf("waiter: %v", err)
			}
			got <- lease
		}()
	}
	parent := l.parent(name)
	// Wait until every waiter has queued and set its watch.
	var watched map[string]int
	for wctx.Err() == nil {
		watched = watches(t, zkServer, parent)
		total := 0
		for _, n := range watched {
			total += n
		}
		if total == waiters+1 { // the holder's own, and one per waiter
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for node, n := range watched {
		if n > 2 {
			t.Errorf("%s is watched by %d sessions, want at most 2 (no herd effect)", node, n)
		}
	}
	if n := watched[held.Node()]; n != 2 {
		t.Errorf("the holder's node is watched by %d sessions, want 2 (its own and the first waiter's): %v", n, watched)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	last := held.Token()
	for range waiters {
		lease := <-got
		if lease == nil {
			t.FailNow()
		}
		if lease.Token() <= last {
			t.Errorf("tokens %d then %d: not increasing", last, lease.Token())
		}
		last = lease.Token()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// watches returns, for each watched node under parent, the number of
// sessions watching it, from the server's wchp.
func watches(t *testing.T, srv *zktest.Server, parent string) map[string]int {
	t.Helper()
	out, err := srv.FourLetterWord("wchp")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	var cur string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "/"):
			cur = line
		case strings.HasPrefix(strings.TrimSpace(line), "0x") && strings.HasPrefix(cur, parent+"/"):
			m[cur]++
		}
	}
	return m
}

// TestLostCreateReply: the connection drops after the server has created
// an attempt's node but before its reply arrives. zk reconnects within
// the session; the attempt finds its node by the GUID in its name rather
// than creating another one (which would queue behind its own orphan and
// find the lock held by itself), and wins.
func TestLostCreateReply(t *testing.T) {
	requireZK(t)
	ctx := context.Background()
	name := testName(t)
	// The lock's parent exists already, so the next create is the node's.
	warm := newTestLocker(t, nil, nil)
	lease, err := warm.TryAcquire(ctx, name, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	var dropped atomic.Int32
	armed.Store(true)
	l := newTestLocker(t, nil, &Options{Dialer: func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return &dropReplyConn{Conn: c, armed: &armed, dropped: &dropped}, nil
	}})
	lease, err = l.TryAcquire(ctx, name, 10*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after a lost create reply: %v", err)
	}
	defer lease.Release(ctx)
	if dropped.Load() != 1 {
		t.Fatalf("dropped %d create replies, want 1", dropped.Load())
	}
	children, _, err := newTestConn(t).Children(l.parent(name))
	if err != nil {
		t.Fatal(err)
	}
	if len(children) != 1 || lease.Node() != l.parent(name)+"/"+children[0] {
		t.Errorf("the queue is %v, want only the lease's node %s", children, lease.Node())
	}
}

// dropReplyConn, while armed, closes the connection instead of passing on
// the reply to the first create request it sees written.
type dropReplyConn struct {
	net.Conn
	armed   *atomic.Bool
	dropped *atomic.Int32
	mu      sync.Mutex
	xid     int32 // of the create whose reply is to be dropped, 0 none
	r       *bufio.Reader
	pending []byte
}

func (c *dropReplyConn) Write(p []byte) (int, error) {
	// A request frame: length, xid, opcode (1 is create).
	if len(p) >= 12 && binary.BigEndian.Uint32(p[8:12]) == 1 && c.armed.CompareAndSwap(true, false) {
		c.mu.Lock()
		c.xid = int32(binary.BigEndian.Uint32(p[4:8]))
		c.mu.Unlock()
	}
	return c.Conn.Write(p)
}

func (c *dropReplyConn) Read(p []byte) (int, error) {
	if len(c.pending) == 0 {
		if c.r == nil {
			c.r = bufio.NewReader(c.Conn)
		}
		var n [4]byte
		if _, err := io.ReadFull(c.r, n[:]); err != nil {
			return 0, err
		}
		frame := make([]byte, 4+binary.BigEndian.Uint32(n[:]))
		copy(frame, n[:])
		if _, err := io.ReadFull(c.r, frame[4:]); err != nil {
			return 0, err
		}
		c.mu.Lock()
		xid := c.xid
		c.mu.Unlock()
		if xid != 0 && len(frame) >= 8 && int32(binary.BigEndian.Uint32(frame[4:8])) == xid {
			c.dropped.Add(1)
			c.Conn.Close()
			return 0, errors.New("connection dropped before the create's reply")
		}
		c.pending = frame
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// newTestConn returns a plain zk connection to the shared server, closed
// at the end of the test.
func newTestConn(t *testing.T) *zk.Conn {
	t.Helper()
	c, events, err := zk.Connect([]string{zkServer.Addr()}, 10*time.Second, zk.WithLogger(zkLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		for range events {
		}
	})
	return c
}

// TestTTLRange: a lease length outside the server's session timeouts is
// ErrInvalidTTL naming the bound the server answered with, and, once the
// Locker has learned it, at once without a session.
func TestTTLRange(t *testing.T) {
	l := newTestLocker(t, nil, nil)
	ctx := context.Background()
	for _, c := range []struct {
		ttl   time.Duration
		bound string
	}{
		{100 * time.Millisecond, zktest.MinSessionTimeout.String()},
		{2 * zktest.MaxSessionTimeout, zktest.MaxSessionTimeout.String()},
	} {
		for _, try := range []string{"first", "learned"} {
			_, err := l.TryAcquire(ctx, testName(t), c.ttl)
			if !errors.Is(err, herd.ErrInvalidTTL) || !strings.Contains(err.Error(), c.bound) {
				t.Errorf("%s TryAcquire with ttl %v: %v, want ErrInvalidTTL naming %s", try, c.ttl, err, c.bound)
			}
		}
	}
	if _, err := l.TryAcquire(ctx, testName(t), 1500*time.Microsecond); !errors.Is(err, herd.ErrInvalidTTL) {
		t.Errorf("TryAcquire with a ttl of 1.5ms: %v, want ErrInvalidTTL", err)
	}
}

// TestServerDown: with no server, TryAcquire and Acquire fail after one
// failed dial with the connection error (not ErrLeaseHeld, no hang).
func TestServerDown(t *testing.T) {
	l := New([]string{"127.0.0.1:1"}, nil)
	defer l.Close()
	locktest.ServerDown(t, l)
}

// TestBadOptions: invalid options panic in New, naming the field.
func TestBadOptions(t *testing.T) {
	servers := []string{"127.0.0.1:2181"}
	locktest.BadOptions(t, map[string]func(){
		"MaxWait":      func() { New(servers, &Options{MaxWait: -1}) },
		"Recheck":      func() { New(servers, &Options{Recheck: -1}) },
		"IdleSessions": func() { New(servers, &Options{IdleSessions: -1}) },
		"Root":         func() { New(servers, &Options{Root: "herd/lock"}) },
	}, func() { New(nil, nil) })
}

// TestParent: lock names map to one path component each, injectively.
func TestParent(t *testing.T) {
	l := New([]string{"127.0.0.1:2181"}, nil)
	defer l.Close()
	for name, want := range map[string]string{
		"job":       "/herd/lock/job",
		"a/b":       "/herd/lock/a%2Fb",
		"..":        "/herd/lock/%2E%2E",
		"50%":       "/herd/lock/50%25",
		"é":         "/herd/lock/%C3%A9",
		"x:y@z=1-_": "/herd/lock/x:y@z=1-_",
	} {
		if got := l.parent(name); got != want {
			t.Errorf("parent(%q) = %q, want %q", name, got, want)
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestNodeDeleted: a lease whose node someone else deletes is lost at
// once (its watch fires), Release reports ErrLeaseLost, and the lock is
// free for the next owner.
func TestNodeDeleted(t *testing.T) {
	requireZK(t)
	ctx := context.Background()
	name := testName(t)
	l := newTestLocker(t, nil, nil)
	held, err := l.TryAcquire(ctx, name, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	if err := newTestConn(t).Delete(held.Node(), -1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost still open 5s after the lease's node was deleted")
	}
	if err := held.Extend(ctx, 10*time.Second); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Extend after the deletion: %v, want ErrLeaseLost", err)
	}
	next, err := newTestLocker(t, nil, nil).TryAcquire(ctx, name, 10*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after the holder's node was deleted: %v", err)
	}
	defer next.Release(ctx)
	if err := held.Release(ctx); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Release after the deletion: %v, want ErrLeaseLost", err)
	}
	if isClosed(next.Lost()) {
		t.Error("the old holder's Release ended the new holder's lease")
	}
}
