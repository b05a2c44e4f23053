package zookeeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	// kill returns before the stop reaches every thread of the JVM: wait
	// until each one is stopped, so that no request is answered after.
	waitStopped(t, pid)
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

// waitStopped waits (bounded) until every thread of process pid is in
// the stopped state ('T' or 't' in /proc/pid/task/*/stat).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		stopped := len(tasks) > 0
		for _, task := range tasks {
			b, err := os.ReadFile(task)
			if err != nil {
				continue // the thread ended
			}
			// The state follows the command name, which is in parentheses.
			if i := bytes.LastIndexByte(b, ')'); i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
				stopped = false
				break
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not stopped 5s after SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCancelWithServerStalled: herd.Lock's contract says a wait cut
// short by ctx returns at once. With the ZooKeeper server stopped
// (SIGSTOP), an Acquire queued behind a holder must return promptly when
// its ctx is cancelled. Bound: 500ms.
func TestCancelWithServerStalled(t *testing.T) {
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

// TestTryAcquireCancelWithServerStalled: the same for a TryAcquire
// whose request hangs on a stopped server: its ctx's end must end it at
// once.
func TestTryAcquireCancelWithServerStalled(t *testing.T) {
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

// TestKeepAliveCapBeforeFirstRenewal: KeepAlive's maxHold is an
// absolute cap on the holding, counted from the acquire. A cap shorter
// than the first renewal's wait (a third to a half of the lease) must
// still end the lease at the cap, not at the lease's own end.
func TestKeepAliveCapBeforeFirstRenewal(t *testing.T) {
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
