package mysql

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/locktest"
)

// TestAcquireWaitLongerThanTTL: an Acquire that waits longer than
// its lease length for a holder's release must get the lock (the lease
// counts from the grant, not from the start of the wait). The holder
// keeps the lock for 1s; the waiter asks for 400ms leases, with MaxWait
// 5s, so the wait is allowed to last past its ttl.
func TestAcquireWaitLongerThanTTL(t *testing.T) {
	l := newTestLocker(t, &Options{MaxWait: 5 * time.Second})
	key := testName(t)
	ctx := context.Background()
	held, err := l.TryAcquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waiter := newTestLocker(t, &Options{MaxWait: 5 * time.Second})
	release := time.AfterFunc(time.Second, func() { _ = held.Release(ctx) })
	defer release.Stop()
	lease, err := waiter.Acquire(ctx, key, 400*time.Millisecond)
	if err != nil {
		t.Fatalf("Acquire after a 1s wait with a 400ms lease: got %v, want the lock", err)
	}
	if time.Until(lease.Deadline()) <= 0 {
		t.Errorf("Deadline %v is already past when Acquire returns", lease.Deadline())
	}
	if err := lease.Release(ctx); err != nil {
		t.Error(err)
	}
}

// TestFenceTableDropped: a Locker whose fence table was dropped after it
// created it must create it again (its doc: "created if missing"), and
// hand out higher tokens (locktest.FenceTableDropped).
func TestFenceTableDropped(t *testing.T) {
	locktest.FenceTableDropped(t, newTestLocker(t, &Options{Table: "attack_dropped_fence"}), func(t *testing.T) {
		if _, err := testDB(t).Exec("DROP TABLE attack_dropped_fence"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestKeepAliveCapBeforeFirstRenewal: KeepAlive's cap ends the lease
// even when it comes before the first renewal
// (locktest.KeepAliveCapBeforeFirstRenewal).
func TestKeepAliveCapBeforeFirstRenewal(t *testing.T) {
	locktest.KeepAliveCapBeforeFirstRenewal(t, newTestLocker(t, nil))
}

// TestUpsertOtherUniqueKey: Upsert's doc says ErrFenced means the
// row exists with a fence at or above the token. An insert that fails on
// another unique index of the table (not the key) is no such thing: the
// row does not exist, and the error must not wrap ErrFenced.
func TestUpsertOtherUniqueKey(t *testing.T) {
	ctx := context.Background()
	db := testDB(t)
	name := "attack_unique_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+name+" (id int PRIMARY KEY, email varchar(64) NOT NULL UNIQUE, fence bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	tbl := FencedTable{Table: name}
	if err := tbl.Upsert(ctx, db, 1, 5, map[string]any{"email": "x@example.com"}); err != nil {
		t.Fatal(err)
	}
	err := tbl.Upsert(ctx, db, 2, 7, map[string]any{"email": "x@example.com"})
	if err == nil {
		t.Fatal("Upsert of a duplicate email succeeded")
	}
	if errors.Is(err, herd.ErrFenced) {
		t.Errorf("Upsert of row 2 (missing) with a duplicate email: %v; want a database error, not ErrFenced", err)
	}
}

// holdProxy is a TCP proxy to the MySQL server that holds the first
// client packet containing match until release is closed, and reports on
// held when it holds it and on seen when a packet containing see passes.
type holdProxy struct {
	ln      net.Listener
	target  string
	match   []byte
	see     []byte
	held    chan struct{}
	seen    chan struct{}
	release chan struct{}
	once    sync.Once
	seeOnce sync.Once
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func newHoldProxy(t *testing.T, target string, match, see []byte) *holdProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{ln: ln, target: target, match: match, see: see,
		held: make(chan struct{}), seen: make(chan struct{}), release: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.once.Do(func() {})
		select {
		case <-p.release:
		default:
			close(p.release)
		}
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *holdProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); _, _ = io.Copy(c, s); c.Close() }()
		go func() {
			defer p.wg.Done()
			defer s.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					chunk := buf[:n]
					if bytes.Contains(chunk, p.see) {
						p.seeOnce.Do(func() { close(p.seen) })
					}
					if bytes.Contains(chunk, p.match) {
						hold := false
						p.once.Do(func() { hold = true })
						if hold {
							close(p.held)
							<-p.release
						}
					}
					if _, err := s.Write(chunk); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// TestCancelBeforeWaitStarts: Acquire's doc says that when ctx
// ends the Locker ends the server's GET_LOCK with KILL QUERY, and the call
// returns (herd.Lock: "at once"). KILL QUERY of a session that is not
// running a statement does nothing on the server, so a cancel whose KILL
// lands before the GET_LOCK has started (here: the statement is held on
// the way to the server until the KILL has passed) must not leave the
// GET_LOCK waiting its whole WaitChunk (5s here). Bound: 2s.
func TestCancelBeforeWaitStarts(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	proxy := newHoldProxy(t, cfg.Addr, []byte(", 5.000000)"), []byte("KILL QUERY"))
	cfg.Addr = proxy.ln.Addr().String()
	holder := newTestLocker(t, nil)
	key := testName(t)
	held, err := holder.TryAcquire(ctx, key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	l := New(cfg, &Options{WaitChunk: 5 * time.Second, MaxWait: 30 * time.Second})
	defer l.Close()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(wctx, key, 30*time.Second)
		if lease != nil {
			lease.Release(ctx)
		}
		done <- err
	}()
	select {
	case <-proxy.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting GET_LOCK never passed the proxy")
	}
	cancel()
	select {
	case <-proxy.seen:
	case <-time.After(10 * time.Second):
		t.Fatal("no KILL QUERY passed the proxy after the cancel")
	}
	// Let the KILL reach the server before the held GET_LOCK does: the
	// KILL's reply comes back through the proxy's other direction, which
	// is not observed; a round trip on another connection orders it.
	if _, err := testDB(t).ExecContext(ctx, "DO 1"); err != nil {
		t.Fatal(err)
	}
	cancelled := time.Now()
	close(proxy.release)
	var got error
	select {
	case got = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Acquire did not return")
	}
	if took := time.Since(cancelled); took > 2*time.Second {
		t.Errorf("Acquire returned %v after its GET_LOCK reached the server, its context cancelled before; want at once (< 2s)", took)
	}
	if !errors.Is(got, herd.ErrLeaseHeld) || !errors.Is(got, context.Canceled) {
		t.Errorf("Acquire: %v, want ErrLeaseHeld and context.Canceled", got)
	}
}

// TestCancelWhileTableCreationBlocks: as in lock/postgres: while
// another attempt of the Locker is stuck creating the fence table (its
// CREATE TABLE IF NOT EXISTS waits for the metadata lock that another
// session's LOCK TABLES holds on the table), a TryAcquire with a short
// context returns when that context ends
// (locktest.CancelWhileTableCreationBlocks).
func TestCancelWhileTableCreationBlocks(t *testing.T) {
	ctx := context.Background()
	db := testDB(t)
	// A table of its own per run (-count > 1 shares the test database).
	table := fmt.Sprintf("attack_blocked_fence_%d", time.Now().UnixNano())
	t.Cleanup(func() { db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table) })
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (name VARBINARY(64) NOT NULL PRIMARY KEY, token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	locktest.CancelWhileTableCreationBlocks(t, locktest.TableCreationBlocked[*Lease]{
		Lock: newTestLocker(t, &Options{Table: table}),
		Block: func(t *testing.T) func() {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tx.Rollback() })
			if _, err := tx.ExecContext(ctx, "LOCK TABLES "+table+" WRITE"); err != nil {
				t.Fatal(err)
			}
			return func() {
				_, _ = tx.ExecContext(ctx, "UNLOCK TABLES")
				tx.Rollback()
			}
		},
		Waiting: func(t *testing.T) bool {
			var n int
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.processlist WHERE state LIKE 'Waiting for table metadata lock' AND info LIKE 'CREATE TABLE IF NOT EXISTS%'").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n > 0
		},
	})
}

// TestLeaseAfterClose: Close's doc says leases handed out before it
// keep working: Extend and Release succeed, and the lock is free
// afterwards.
func TestLeaseAfterClose(t *testing.T) {
	ctx := context.Background()
	l := New(testConfig(t), nil)
	key := testName(t)
	lease, err := l.TryAcquire(ctx, key, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lease.Extend(ctx, 2*time.Second); err != nil {
		t.Errorf("Extend after Close: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("Release after Close: %v", err)
	}
	other := newTestLocker(t, nil)
	next, err := other.TryAcquire(ctx, key, time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after the release: %v", err)
	}
	next.Release(ctx)
}
