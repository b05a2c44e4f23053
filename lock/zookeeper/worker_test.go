package zookeeper

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/herdkit/herd"
	herdpg "github.com/herdkit/herd/lock/postgres"
	"github.com/herdkit/herd/lock/zookeeper/zktest"
	"github.com/jackc/pgx/v5"
)

// Worker roles: the test binary re-run as another process.
const (
	roleHolder = "holder" // takes the lock, says its token, waits for a line on stdin, then writes with its token
)

// Environment of a worker, and of the PostgreSQL server of the fenced
// write.
const (
	lockEnv   = "HERD_ZK_LOCK"  // the lock name
	ttlEnv    = "HERD_ZK_TTL"   // the lease length
	tableEnv  = "HERD_ZK_TABLE" // the fenced table
	dbEnv     = "HERD_ZK_DB"    // the fenced table's database URL
	pgURLEnv  = "HERD_PG_URL"   // the PostgreSQL admin URL
	defaultPG = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
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
	db, err := pgx.Connect(ctx, os.Getenv(dbEnv)) // the data's own connection
	if err != nil {
		return err
	}
	defer db.Close(ctx)
	locks := New([]string{os.Getenv(addrEnv)}, nil)
	defer locks.Close()
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
func startWorker(t *testing.T, srv *zktest.Server, role string, env ...string) *worker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{workerEnv + "=" + role, addrEnv + "=" + srv.Addr()}, env...)...)
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

// testDB creates a PostgreSQL database with a random name for the test,
// dropped at its end, and returns its URL. Without a server it skips the
// test, or fails it under HERD_REQUIRE_REDIS=1.
func testDB(t *testing.T) string {
	t.Helper()
	admin := os.Getenv(pgURLEnv)
	if admin == "" {
		admin = defaultPG
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		if zktest.Required() {
			t.Fatalf("PostgreSQL at %s is needed for the fenced write (HERD_REQUIRE_REDIS=1): %v", admin, err)
		}
		t.Skipf("no PostgreSQL server for the fenced write: %v (set HERD_REQUIRE_REDIS=1 to fail instead)", err)
	}
	defer c.Close(context.Background())
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "herd_zk_test_" + hex.EncodeToString(b[:])
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop the test database %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop the test database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// TestPausedHolderFenced is the pause scenario: a holder in another
// process takes the lock, with KeepAlive running, and is SIGSTOPped (a GC
// pause, a frozen VM) past its session timeout. The server expires its
// session and deletes its node, so a second holder takes the lock with a
// higher token and writes the row through the fenced write; when the
// first holder resumes and writes with its old token, the fenced write
// refuses it and the row keeps the second holder's value.
func TestPausedHolderFenced(t *testing.T) {
	requireZK(t)
	dbURL := testDB(t)
	ctx := context.Background()
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	const table = "paused"
	if _, err := db.Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, owner text, fence bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "INSERT INTO "+table+" (id, owner) VALUES (1, 'nobody')"); err != nil {
		t.Fatal(err)
	}
	name := testName(t)
	const ttl = time.Second
	a := startWorker(t, zkServer, roleHolder, lockEnv+"="+name, ttlEnv+"="+ttl.String(), tableEnv+"="+table, dbEnv+"="+dbURL)
	var first uint64
	if _, err := fmt.Sscanf(a.line(t, 30*time.Second), "token %d", &first); err != nil {
		t.Fatalf("the worker's token: %v", err)
	}
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()

	locks := newTestLocker(t, nil, &Options{Recheck: time.Minute})
	wctx, cancel := context.WithTimeout(ctx, 30*ttl)
	defer cancel()
	b, err := locks.Acquire(wctx, name, 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire while the holder is paused: %v (the server should have expired its session after %v)", err, ttl)
	}
	defer b.Release(ctx)
	if since := time.Since(paused); since < ttl*9/10 {
		t.Errorf("the lock passed %v after the holder's pause, before its session timeout of %v", since, ttl)
	}
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
