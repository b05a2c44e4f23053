package etcd

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
	herdpg "github.com/herdkit/herd/lock/postgres"
	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Worker roles: the test binary re-run as another process.
const (
	roleHolder = "holder" // takes the lock, says its token, waits for a line on stdin, then writes with its token
)

// Environment of a worker.
const (
	endpointsEnv = "HERD_ETCD_ENDPOINTS" // the etcd endpoints, comma-separated
	lockEnv      = "HERD_ETCD_LOCK"      // the lock name
	ttlEnv       = "HERD_ETCD_TTL"       // the lease length
	dbEnv        = "HERD_ETCD_DB"        // the PostgreSQL database of the fenced table
	tableEnv     = "HERD_ETCD_TABLE"     // the fenced table
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
	ttl, err := time.ParseDuration(os.Getenv(ttlEnv))
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Getenv(endpointsEnv), ","), Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	locks := New(cli, nil)
	defer locks.Close()
	db, err := pgx.Connect(ctx, os.Getenv(dbEnv)) // the data's own connection
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
	err = herdpg.FencedTable{Table: os.Getenv(tableEnv)}.Update(ctx, db, 1, lease.Token(), map[string]any{"owner": "A"})
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
	select {
	case <-lease.Lost():
		fmt.Println("lost: yes")
	case <-time.After(10 * time.Second):
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

// startWorker starts the test binary as a worker with role and env.
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

// testPG returns a connection to the run's PostgreSQL database, closed at
// the end of the test, or skips the test when there is none
// (HERD_REQUIRE_REDIS=1 has failed the run in TestMain then).
func testPG(t *testing.T) *pgx.Conn {
	t.Helper()
	if testDB == "" {
		t.Skipf("no PostgreSQL server for the fenced write: %v (set %s=1 to fail instead)", dbErr, requireEnv)
	}
	c, err := pgx.Connect(context.Background(), testDB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// TestPausedHolderFenced is the pause scenario: a holder in another
// process takes the lock, with KeepAlive running, and is SIGSTOPped (a GC
// pause, a frozen VM) past its lease. Its renewals stop, so etcd expires
// its etcd lease and deletes its key, and a waiter takes the lock with a
// higher token and writes the row through a fenced write (lock/postgres's
// FencedTable). When the first holder resumes and writes with its token,
// the fenced write refuses it, the row keeps the second holder's value,
// and the first holder's Lost is closed.
func TestPausedHolderFenced(t *testing.T) {
	ctx := context.Background()
	s := sharedServer(t)
	db := testPG(t)
	table := "paused_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := db.Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, owner text, fence bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "INSERT INTO "+table+" (id, owner) VALUES (1, 'nobody')"); err != nil {
		t.Fatal(err)
	}
	name := testName(t)
	const ttl = time.Second
	a := startWorker(t, roleHolder, endpointsEnv+"="+strings.Join(s.Endpoints(), ","), lockEnv+"="+name,
		ttlEnv+"="+ttl.String(), dbEnv+"="+testDB, tableEnv+"="+table)
	var first uint64
	if _, err := fmt.Sscanf(a.line(t, 30*time.Second), "token %d", &first); err != nil {
		t.Fatalf("the worker's token: %v", err)
	}
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	locks := newTestLocker(t, nil, nil)
	wctx, cancel := context.WithTimeout(ctx, 30*ttl)
	defer cancel()
	b, err := locks.Acquire(wctx, name, 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire while the holder is paused: %v (etcd should have expired its lease after %v)", err, ttl)
	}
	defer b.Release(ctx)
	if b.Token() <= first {
		t.Fatalf("tokens %d then %d: not increasing", first, b.Token())
	}
	tbl := herdpg.FencedTable{Table: table}
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
	if got := a.line(t, 30*time.Second); got != "lost: yes" {
		t.Errorf("the paused holder's Lost after it resumed: %q, want %q", got, "lost: yes")
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
	if isClosed(b.Lost()) {
		t.Error("the new holder's lease is lost")
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
