package postgres

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
	"github.com/jackc/pgx/v5"
)

// Worker roles: the test binary re-run as another process.
const (
	roleHolder = "holder" // takes the lock, says its token, waits for a line on stdin, then writes with its token
)

// Environment of a worker.
const (
	lockEnv  = "HERD_PG_LOCK"  // the lock name
	tableEnv = "HERD_PG_TABLE" // the fenced table
	ttlEnv   = "HERD_PG_TTL"   // the lease length
)

// runWorker runs a worker role and returns the process's exit code.
func runWorker(role string) int {
	if err := work(role); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}

func work(role string) error {
	if role != roleHolder {
		return fmt.Errorf("unknown role %q", role)
	}
	ctx := context.Background()
	conf, err := pgx.ParseConfig(os.Getenv(dbEnv))
	if err != nil {
		return err
	}
	ttl, err := time.ParseDuration(os.Getenv(ttlEnv))
	if err != nil {
		return err
	}
	locks := New(conf, nil)
	defer locks.Close()
	db, err := pgx.ConnectConfig(ctx, conf) // the data's own connection
	if err != nil {
		return err
	}
	defer db.Close(ctx)
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
	err = FencedTable{Table: os.Getenv(tableEnv)}.Update(ctx, db, 1, lease.Token(), map[string]any{"owner": "A"})
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
	return nil
}

// worker is a worker process with its stdin and stdout.
type worker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// startWorker starts the test binary as a worker with role and env.
func startWorker(t *testing.T, role string, env ...string) *worker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{workerEnv + "=" + role, dbEnv + "=" + testURL}, env...)...)
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

// TestPausedHolderFenced is the pause scenario: a holder in another
// process takes the lock, with KeepAlive running, and is SIGSTOPped (a GC
// pause, a frozen VM) past its lease. The server ends its silent session
// at the lease length, so a second holder takes the lock, with a higher
// token, and writes the row; when the first holder resumes and writes
// with its token, the fenced write refuses it and the row keeps the
// second holder's value.
func TestPausedHolderFenced(t *testing.T) {
	ctx := context.Background()
	db := testConn(t)
	table := "paused_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := db.Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, owner text, fence bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "INSERT INTO "+table+" (id, owner) VALUES (1, 'nobody')"); err != nil {
		t.Fatal(err)
	}
	name := testName(t)
	const ttl = time.Second
	a := startWorker(t, roleHolder, lockEnv+"="+name, tableEnv+"="+table, ttlEnv+"="+ttl.String())
	var first uint64
	if _, err := fmt.Sscanf(a.line(t, 30*time.Second), "token %d", &first); err != nil {
		t.Fatalf("the worker's token: %v", err)
	}
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	locks := newTestLocker(t, &Options{PollMax: 200 * time.Millisecond})
	wctx, cancel := context.WithTimeout(ctx, 30*ttl)
	defer cancel()
	b, err := locks.Acquire(wctx, name, 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire while the holder is paused: %v (the server should have ended its session after %v)", err, ttl)
	}
	defer b.Release(ctx)
	if b.Token() <= first {
		t.Fatalf("tokens %d then %d: not increasing", first, b.Token())
	}
	tbl := FencedTable{Table: table}
	if err := tbl.Update(ctx, db, 1, b.Token(), map[string]any{"owner": "B"}); err != nil {
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
	var owner string
	var fence int64
	if err := db.QueryRow(ctx, "SELECT owner, fence FROM "+table+" WHERE id = 1").Scan(&owner, &fence); err != nil {
		t.Fatal(err)
	}
	if owner != "B" || uint64(fence) != b.Token() {
		t.Errorf("the row is (%q, %d), want (\"B\", %d)", owner, fence, b.Token())
	}
	if err := a.cmd.Wait(); err != nil {
		t.Errorf("the worker: %v", err)
	}
}

// TestTerminatedHolder: pg_terminate_backend of a holder's connection
// (no KeepAlive, a long lease) closes Lost within the stated bound (the
// session's end is seen at once: here within 10% of the lease), and a
// waiter in another Locker takes the lock with a higher token, woken by
// the holder's announcement although it re-checks only once a minute.
func TestTerminatedHolder(t *testing.T) {
	ctx := context.Background()
	name := testName(t)
	const ttl = 20 * time.Second
	a := newTestLocker(t, nil)
	b := newTestLocker(t, &Options{PollMin: time.Minute, PollMax: time.Minute})
	held, err := a.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	wctx, cancel := context.WithTimeout(ctx, ttl/10)
	defer cancel()
	got := make(chan error, 1)
	var next *Lease
	go func() {
		var err error
		next, err = b.Acquire(wctx, name, ttl)
		got <- err
	}()
	// Let the waiter reach its wait (one that is slower to get there only
	// makes the test weaker: it then finds the lock free).
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	terminate(t, held)
	select {
	case <-held.Lost():
	case <-wctx.Done():
		t.Fatalf("Lost still open %v after pg_terminate_backend", time.Since(start))
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	defer next.Release(ctx)
	if next.Token() <= held.Token() {
		t.Errorf("tokens %d then %d: not increasing", held.Token(), next.Token())
	}
	if err := held.Release(ctx); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Release of the terminated lease: %v, want ErrLeaseLost", err)
	}
}

// TestListenerRestarts: when the Locker's listening connection is
// terminated, a waiting Acquire still takes the lock soon after the
// holder's release (the listener reconnects and wakes its waiters), not at
// its once-a-minute re-check.
func TestListenerRestarts(t *testing.T) {
	ctx := context.Background()
	name := testName(t)
	const ttl = 20 * time.Second
	a := newTestLocker(t, nil)
	b := newTestLocker(t, &Options{PollMin: time.Minute, PollMax: time.Minute})
	held, err := a.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	wctx, cancel := context.WithTimeout(ctx, ttl/2)
	defer cancel()
	got := make(chan error, 1)
	var next *Lease
	go func() {
		var err error
		next, err = b.Acquire(wctx, name, ttl)
		got <- err
	}()
	// Find the listener's session (the only one of this database that ran
	// LISTEN) and end it.
	db := testConn(t)
	var n int
	for n == 0 && wctx.Err() == nil {
		err := db.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
	}
	if n != 1 {
		t.Fatalf("terminated %d listening sessions, want 1", n)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter after the listener's restart: %v", err)
	}
	next.Release(ctx)
}

// TestServerDown: with no server, TryAcquire and Acquire fail at once
// with the connection error (not ErrLeaseHeld, no hang).
func TestServerDown(t *testing.T) {
	conf, err := pgx.ParseConfig("postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	l := New(conf, nil)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, call := range map[string]func(context.Context, string, time.Duration) (*Lease, error){
		"TryAcquire": l.TryAcquire, "Acquire": l.Acquire,
	} {
		_, err := call(ctx, "down", time.Second)
		if err == nil || errors.Is(err, herd.ErrLeaseHeld) || ctx.Err() != nil {
			t.Errorf("%s with no server: %v, want a connection error at once", name, err)
		}
	}
}

// TestBadOptions: invalid options panic in New, naming the field.
func TestBadOptions(t *testing.T) {
	conf := &pgx.ConnConfig{}
	for name, opt := range map[string]*Options{
		"MaxWait":   {MaxWait: -1},
		"PollMin":   {PollMin: -1},
		"PollMax":   {PollMin: time.Second, PollMax: time.Millisecond},
		"IdleConns": {IdleConns: -1},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), name) {
					t.Errorf("New with a bad %s: recovered %v, want a panic naming it", name, r)
				}
			}()
			New(conf, opt)
		})
	}
	defer func() {
		if recover() == nil {
			t.Error("New(nil) did not panic")
		}
	}()
	New(nil, nil)
}

// TestTTLRange: a lease longer than idle_session_timeout can hold is
// ErrInvalidTTL, at once.
func TestTTLRange(t *testing.T) {
	l := newTestLocker(t, nil)
	for _, ttl := range []time.Duration{time.Millisecond, maxLease + time.Millisecond} {
		if _, err := l.TryAcquire(context.Background(), "ttl", ttl); !errors.Is(err, herd.ErrInvalidTTL) {
			t.Errorf("TryAcquire with ttl %v: %v, want ErrInvalidTTL", ttl, err)
		}
	}
}
