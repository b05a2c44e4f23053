package locktest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/herdkit/herd"
)

// The environment of a worker process of [PausedHolderFenced]: the test
// binary run again, with these set, in addition to [PausedHolder.Env].
const (
	workerEnv = "HERD_LOCKTEST_WORKER" // the role; set only in a worker
	lockEnv   = "HERD_LOCKTEST_LOCK"   // the lock key
	ttlEnv    = "HERD_LOCKTEST_TTL"    // the lease length
	tableEnv  = "HERD_LOCKTEST_TABLE"  // the fenced table
)

// roleHolder is the one worker role: take the lock with KeepAlive, say
// the token, wait for a line on stdin, write with the token, and say
// whether the lease was then lost.
const roleHolder = "holder"

// Holder builds, in a worker process of [PausedHolderFenced], the Lock
// the worker holds and the [TableRig] its fenced write goes through,
// from the environment the test gave it ([PausedHolder.Env]). The
// returned function closes both.
type Holder[L herd.LeaseHandle] func(ctx context.Context) (herd.Lock[L], TableRig, func(), error)

// RunWorker runs the test binary as a worker process, when a scenario of
// this package started it as one: call it first in TestMain,
//
//	if code, ok := locktest.RunWorker(holder); ok {
//		os.Exit(code)
//	}
//
// It reports false, and does nothing, in the test process itself.
func RunWorker[L herd.LeaseHandle](holder Holder[L]) (code int, ok bool) {
	role := os.Getenv(workerEnv)
	if role == "" {
		return 0, false
	}
	if err := work(role, holder); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1, true
	}
	return 0, true
}

func work[L herd.LeaseHandle](role string, holder Holder[L]) error {
	if role != roleHolder {
		return fmt.Errorf("unknown role %q", role)
	}
	ctx := context.Background()
	ttl, err := time.ParseDuration(os.Getenv(ttlEnv))
	if err != nil {
		return err
	}
	locks, rows, done, err := holder(ctx)
	if err != nil {
		return err
	}
	defer done()
	lease, err := locks.TryAcquire(ctx, os.Getenv(lockEnv), ttl)
	if err != nil {
		return err
	}
	defer lease.Release(ctx)
	lease.KeepAlive(0)
	fmt.Printf("token %d\n", lease.Token())
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	// The holder woke up: it writes its result, as code that checked
	// Lost before its pause would.
	err = rows.Update(ctx, os.Getenv(tableEnv), 1, lease.Token(), map[string]any{"owner": "A"})
	switch {
	case errors.Is(err, herd.ErrFenced):
		fmt.Println("write: fenced")
	case errors.Is(err, herd.ErrNotFound):
		fmt.Println("write: not found")
	case err != nil:
		fmt.Println("write:", err)
	default:
		fmt.Println("write: ok")
	}
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case <-lease.Lost():
		fmt.Println("lost: yes")
	case <-timer.C:
		fmt.Println("lost: no")
	}
	return nil
}

// worker is a worker process with its stdin and stdout.
type worker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// startWorker starts the test binary as a worker with role and env; it
// is killed, if still running, at the end of the test.
func startWorker(t *testing.T, role string, env ...string) *worker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{workerEnv + "=" + role}, env...)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &worker{cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return w
}

// line reads the worker's next line of output, waiting up to d.
func (w *worker) line(t *testing.T, d time.Duration) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		s, _ := w.out.ReadString('\n')
		got <- strings.TrimSpace(s)
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case s := <-got:
		return s
	case <-timer.C:
		t.Fatalf("no line from the worker within %v", d)
		return ""
	}
}

// PausedHolder describes the backend to [PausedHolderFenced].
type PausedHolder[L herd.LeaseHandle] struct {
	// Env is the worker's environment beyond the scenario's own: what the
	// backend's [Holder] needs to reach its servers ("NAME=value").
	Env []string
	// Tables is the database of the fenced table, in the test's process.
	Tables TableRig
	// NewLock returns the Lock of the second holder, in the test's
	// process.
	NewLock func(t *testing.T) herd.Lock[L]
	// Expiry says what ends the paused holder's lease, for the failure
	// message ("the server should have ended its session").
	Expiry string
	// MinHandover, if not zero, is the least time from the pause to the
	// second holder's acquire: the server must not end the silent
	// holder's lease sooner.
	MinHandover time.Duration
}

// PausedHolderFenced is the pause scenario: a holder in another process
// (the test binary run again; see [RunWorker]) takes the lock, with
// KeepAlive running, for a lease of 1s, and is SIGSTOPped (a GC pause, a
// frozen VM) past its lease. Its renewals stop, so the backend's server
// ends its lease, and a second holder takes the lock with a higher token
// (no sooner than MinHandover after the pause) and writes a row of a
// fenced table. When the first holder resumes and writes with its token,
// the fenced write refuses it ([herd.ErrFenced]), the row keeps the
// second holder's value and fence, the first holder's Lost closes
// (within 10s), and the second holder's stays open.
func PausedHolderFenced[L herd.LeaseHandle](t *testing.T, p PausedHolder[L]) {
	t.Helper()
	ctx := context.Background()
	table := "paused_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	p.Tables.exec(t, "CREATE TABLE "+table+" (id int PRIMARY KEY, owner text, fence bigint NOT NULL DEFAULT 0)")
	p.Tables.exec(t, "INSERT INTO "+table+" (id, owner) VALUES (1, 'nobody')")
	name := key(t)
	const ttl = time.Second
	env := append([]string{lockEnv + "=" + name, tableEnv + "=" + table, ttlEnv + "=" + ttl.String()}, p.Env...)
	a := startWorker(t, roleHolder, env...)
	var first uint64
	if _, err := fmt.Sscanf(a.line(t, 30*time.Second), "token %d", &first); err != nil {
		t.Fatalf("the worker's token: %v", err)
	}
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()

	locks := p.NewLock(t)
	wctx, cancel := context.WithTimeout(ctx, 30*ttl)
	defer cancel()
	b, err := locks.Acquire(wctx, name, 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire while the holder is paused: %v (%s after %v)", err, p.Expiry, ttl)
	}
	defer b.Release(ctx)
	since := time.Since(paused)
	t.Logf("the paused holder's lock passed on %v after its SIGSTOP", since.Round(time.Millisecond))
	if since < p.MinHandover {
		t.Errorf("the lock passed %v after the holder's pause, before %v", since, p.MinHandover)
	}
	if b.Token() <= first {
		t.Fatalf("tokens %d then %d: not increasing", first, b.Token())
	}
	if err := p.Tables.Update(ctx, table, 1, b.Token(), map[string]any{"owner": "B"}); err != nil {
		t.Fatalf("the new holder's write: %v", err)
	}

	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(a.in, "write\n"); err != nil {
		t.Fatal(err)
	}
	if got := a.line(t, 30*time.Second); got != "write: fenced" {
		t.Errorf("the paused holder's late write: %q, want %q", got, "write: fenced")
	}
	if got := a.line(t, 30*time.Second); got != "lost: yes" {
		t.Errorf("the paused holder's Lost after it resumed: %q, want %q", got, "lost: yes")
	}
	var owner string
	var fence int64
	if err := p.Tables.Query(ctx, "SELECT owner, fence FROM "+table+" WHERE id = 1", &owner, &fence); err != nil {
		t.Fatal(err)
	}
	if owner != "B" || uint64(fence) != b.Token() {
		t.Errorf("the row is (%q, %d), want (\"B\", %d)", owner, fence, b.Token())
	}
	if err := a.cmd.Wait(); err != nil {
		t.Errorf("the worker: %v", err)
	}
	if isClosed(b.Lost()) {
		t.Error("the new holder's lease is lost")
	}
}
