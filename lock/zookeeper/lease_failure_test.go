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
	"github.com/herdkit/herd/lock/zookeeper/zktest"
	"github.com/herdkit/herd/locktest"
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

// TestCancelWithServerStalled: with the ZooKeeper server stopped
// (SIGSTOP), an Acquire queued behind a holder returns at once when its
// ctx is cancelled (locktest.CancelWithServerStalled).
func TestCancelWithServerStalled(t *testing.T) {
	srv := startServer(t)
	a := newTestLocker(t, srv, nil)
	locktest.CancelWithServerStalled(t, locktest.StalledServer[*Lease]{
		Holder: a,
		Waiter: newTestLocker(t, srv, nil),
		Queued: func(t *testing.T, name string) { waitChildren(t, srv, a.parent(name), 2) },
		Pause:  func(t *testing.T) func() { return pause(t, srv) },
		TTL:    6 * time.Second,
	})
}

// waitChildren waits, up to 10s, until the node parent has n children.
func waitChildren(t *testing.T, srv *zktest.Server, parent string, n int) {
	t.Helper()
	conn, events, err := zk.Connect([]string{srv.Addr()}, 10*time.Second, zk.WithLogger(zkLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		conn.Close()
		for range events {
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		children, _, err := conn.Children(parent)
		if err != nil {
			t.Fatal(err)
		}
		if len(children) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d children, want %d", parent, len(children), n)
		}
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

// TestKeepAliveCapBeforeFirstRenewal: KeepAlive's cap ends the lease
// even when it comes before the first renewal
// (locktest.KeepAliveCapBeforeFirstRenewal).
func TestKeepAliveCapBeforeFirstRenewal(t *testing.T) {
	locktest.KeepAliveCapBeforeFirstRenewal(t, newTestLocker(t, nil, nil))
}
