package zookeeper

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/lock/zookeeper/zktest"
)

// pause stops srv's JVM with SIGSTOP until the returned function (also
// run at the end of the test) resumes it.
func pause(t *testing.T, srv *zktest.Server) func() {
	t.Helper()
	pid := srv.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	done := false
	resume := func() {
		if !done {
			done = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	return resume
}

// TestAttackCancelWithServerStalled: herd.Lock's contract says a wait cut
// short by ctx returns at once. With the ZooKeeper server stopped
// (SIGSTOP), an Acquire queued behind a holder must return promptly when
// its ctx is cancelled. Bound: 500ms.
func TestAttackCancelWithServerStalled(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t)
	name := testName(t)
	const ttl = 6 * time.Second
	a := newTestLocker(t, srv, nil)
	b := newTestLocker(t, srv, nil)
	held, err := a.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		lease *Lease
		err   error
	}
	ch := make(chan result, 1)
	go func() {
		lease, err := b.Acquire(wctx, name, ttl)
		ch <- result{lease, err}
	}()
	// Wait until the waiter's node is queued.
	conn, events, err := zk.Connect([]string{srv.Addr()}, 10*time.Second, zk.WithLogger(zkLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		conn.Close()
		for range events {
		}
	}()
	for {
		children, _, err := conn.Children(a.parent(name))
		if err != nil {
			t.Fatal(err)
		}
		if len(children) == 2 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	resume := pause(t, srv)
	cancel()
	cancelled := time.Now()
	var r result
	select {
	case r = <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return within 10s of its cancel")
	}
	took := time.Since(cancelled)
	resume()
	if r.lease != nil {
		_ = r.lease.Release(ctx)
	}
	if !errors.Is(r.err, herd.ErrLeaseHeld) || !errors.Is(r.err, context.Canceled) {
		t.Errorf("Acquire: %v, want ErrLeaseHeld and context.Canceled", r.err)
	}
	if took > 500*time.Millisecond {
		t.Errorf("Acquire returned %v after its context was cancelled, want at once (< 500ms)", took)
	}
}

// TestAttackTryAcquireCancelWithServerStalled: the same for a TryAcquire
// whose request hangs on a stopped server: its ctx's end must end it at
// once.
func TestAttackTryAcquireCancelWithServerStalled(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t)
	name := testName(t)
	const ttl = 6 * time.Second
	a := newTestLocker(t, srv, nil)
	// Warm an idle session, so the attempt's request, not the connect,
	// is what hangs.
	lease, err := a.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	resume := pause(t, srv)
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	lease, err = a.TryAcquire(tctx, name, ttl)
	took := time.Since(start)
	resume()
	if err == nil {
		lease.Release(ctx)
		t.Fatal("TryAcquire on a stopped server succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("TryAcquire: %v, want context.DeadlineExceeded", err)
	}
	if took > 700*time.Millisecond {
		t.Errorf("TryAcquire with a 200ms context returned after %v, want about 200ms (< 700ms)", took)
	}
}

// TestAttackKeepAliveCapBeforeFirstRenewal: KeepAlive's maxHold is an
// absolute cap on the holding, counted from the acquire. A cap shorter
// than the first renewal's wait (a third to a half of the lease) must
// still end the lease at the cap, not at the lease's own end.
func TestAttackKeepAliveCapBeforeFirstRenewal(t *testing.T) {
	l := newTestLocker(t, nil, nil)
	ctx := context.Background()
	const ttl, maxHold = 6 * time.Second, 300 * time.Millisecond
	lease, err := l.TryAcquire(ctx, testName(t), ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	capAt := time.Now().Add(maxHold)
	lease.KeepAlive(maxHold)
	if d := lease.Deadline(); d.After(capAt) {
		t.Errorf("Deadline %v after KeepAlive(%v), past the cap by %v", d, maxHold, d.Sub(capAt))
	}
	select {
	case <-lease.Lost():
	case <-time.After(ttl / 2):
		t.Errorf("Lost still open %v after the acquire, with KeepAlive(%v)", ttl/2, maxHold)
	}
}

// TestAttackHostileKeys: any string but the empty one is a valid name,
// and distinct names are distinct locks: names that escape to prefixes
// of one another, or that look like escapes, path separators, NUL bytes,
// invalid UTF-8 and long names can all be held at once.
func TestAttackHostileKeys(t *testing.T) {
	ctx := context.Background()
	l := newTestLocker(t, nil, nil)
	base := testName(t)
	names := []string{
		base, base + "/", base + "/x", base + "%2F", base + "%252F", base + "%", base + ".",
		base + "/..", base + "\x00", base + "\xff\xfe", base + "é", base + " ", base + "/" + base,
		strings.Repeat("k", 10<<10),
	}
	var leases []*Lease
	for _, n := range names {
		lease, err := l.TryAcquire(ctx, n, 2*time.Second)
		if err != nil {
			t.Errorf("TryAcquire %.60q while the others are held: %.200v", n, err)
			continue
		}
		leases = append(leases, lease)
	}
	for _, n := range names {
		if _, err := l.TryAcquire(ctx, n, 2*time.Second); !errors.Is(err, herd.ErrLeaseHeld) {
			t.Errorf("second TryAcquire of %.60q: %.200v, want ErrLeaseHeld", n, err)
		}
	}
	for _, lease := range leases {
		if err := lease.Release(ctx); err != nil {
			t.Error(err)
		}
	}
}

// TestAttackConcurrentRelease: a Lease's methods are safe for concurrent
// use. Two Releases of one lease at once must not touch what the lease
// no longer owns: the loser of the race must not close the session that
// the winner has handed back to the Locker for its next attempts (which
// would end the lock of whatever lease took that session), and neither
// may report the lease lost, since it was released.
func TestAttackConcurrentRelease(t *testing.T) {
	ctx := context.Background()
	l := newTestLocker(t, nil, &Options{IdleSessions: 4})
	for i := 0; i < 30; i++ {
		lease, err := l.TryAcquire(ctx, testName(t), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		start := make(chan struct{})
		for range 2 {
			go func() {
				<-start
				errs <- lease.Release(ctx)
			}()
		}
		close(start)
		for range 2 {
			if err := <-errs; err != nil {
				t.Errorf("round %d: a concurrent Release: %v", i, err)
			}
		}
		l.idleMu.Lock()
		for _, s := range l.idle {
			if _, _, up := s.info(); !up {
				t.Errorf("round %d: the Locker keeps a session for later attempts that a Release closed", i)
			}
		}
		l.idleMu.Unlock()
		if t.Failed() {
			return
		}
	}
}
