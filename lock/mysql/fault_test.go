package mysql

import (
	"bufio"
	"context"
	"database/sql"
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

	"github.com/go-sql-driver/mysql"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/faultproxy"
)

// Worker roles: the test binary re-run as another process.
const (
	roleHolder = "holder" // takes the lock, says its token, waits for a line on stdin, then writes with its token
)

// Environment of a worker.
const (
	lockEnv  = "HERD_MYSQL_LOCK"  // the lock key
	tableEnv = "HERD_MYSQL_TABLE" // the fenced table
	ttlEnv   = "HERD_MYSQL_TTL"   // the lease length
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
	cfg, err := mysql.ParseDSN(os.Getenv(dbEnv))
	if err != nil {
		return err
	}
	cfg.Logger = quiet{}
	ttl, err := time.ParseDuration(os.Getenv(ttlEnv))
	if err != nil {
		return err
	}
	locks := New(cfg, nil)
	defer locks.Close()
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return err
	}
	db := sql.OpenDB(conn) // the data's own connections
	defer db.Close()
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
	cmd.Env = append(os.Environ(), append([]string{workerEnv + "=" + role, dbEnv + "=" + testDSN}, env...)...)
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
// pause, a frozen VM) past its lease. The server closes its silent
// session when its wait_timeout (the lease length) runs out, so a second
// holder takes the lock, with a higher token, and writes the row; when
// the first holder resumes and writes with its token, the fenced write
// refuses it and the row keeps the second holder's value.
func TestPausedHolderFenced(t *testing.T) {
	ctx := context.Background()
	db := testDB(t)
	table := "paused_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, owner text, fence bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO "+table+" (id, owner) VALUES (1, 'nobody')"); err != nil {
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
	stopped := time.Now()

	locks := newTestLocker(t, &Options{WaitChunk: time.Minute})
	wctx, cancel := context.WithTimeout(ctx, 30*ttl)
	defer cancel()
	b, err := locks.Acquire(wctx, name, 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire while the holder is paused: %v (the server should have closed its session after %v)", err, ttl)
	}
	defer b.Release(ctx)
	t.Logf("the paused holder's lock passed on %v after its SIGSTOP", time.Since(stopped).Round(time.Millisecond))
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
	if err := db.QueryRowContext(ctx, "SELECT owner, fence FROM "+table+" WHERE id = 1").Scan(&owner, &fence); err != nil {
		t.Fatal(err)
	}
	if owner != "B" || uint64(fence) != b.Token() {
		t.Errorf("the row is (%q, %d), want (\"B\", %d)", owner, fence, b.Token())
	}
	if err := a.cmd.Wait(); err != nil {
		t.Errorf("the worker: %v", err)
	}
}

// TestKilledHolder: KILL of a holder's connection (no KeepAlive, a long
// lease) closes Lost within the stated bound (the next check, 100ms here,
// and a round trip: the test allows 2s), and a waiter in another Locker
// takes the lock with a higher token, granted by the server when the
// session ends (its GET_LOCK waits a minute). The lost lease's Release
// reports ErrLeaseLost and leaves the new holder's lock alone.
func TestKilledHolder(t *testing.T) {
	ctx := context.Background()
	name := testName(t)
	const ttl = 20 * time.Second
	a := newTestLocker(t, &Options{Check: 100 * time.Millisecond})
	b := newTestLocker(t, &Options{WaitChunk: time.Minute})
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
	waitForWaiter(t, testDB(t), name)
	start := time.Now()
	kill(t, held)
	timer := time.NewTimer(2 * time.Second)
	defer timer.Stop()
	select {
	case <-held.Lost():
		t.Logf("Lost closed %v after the KILL", time.Since(start).Round(time.Millisecond))
	case <-timer.C:
		t.Fatalf("Lost still open %v after KILL", time.Since(start))
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	defer next.Release(ctx)
	if next.Token() <= held.Token() {
		t.Errorf("tokens %d then %d: not increasing", held.Token(), next.Token())
	}
	if err := held.Release(ctx); !errors.Is(err, herd.ErrLeaseLost) {
		t.Errorf("Release of the killed lease: %v, want ErrLeaseLost", err)
	}
	if _, err := a.TryAcquire(ctx, name, ttl); !errors.Is(err, herd.ErrLeaseHeld) {
		t.Errorf("TryAcquire after the killed lease's Release: %v, want ErrLeaseHeld", err)
	}
}

// waitForWaiter waits until a session waits on key's lock at the server
// (its GET_LOCK shows in the process list), up to 10s.
func waitForWaiter(t testing.TB, db *sql.DB, key string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if n := waiters(t, db, key); n > 0 {
			return
		}
	}
	t.Fatalf("no session waits on %q at the server", key)
}

// waiters counts the sessions waiting in a GET_LOCK on key's lock.
func waiters(t testing.TB, db *sql.DB, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND ID <> CONNECTION_ID()",
		"SELECT GET_LOCK('"+lockName(key)+"', %").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestStalledHolderExpires: a holder that stops talking to the server
// (here its connection is kept from the lease's own checks, renewals and
// deadline, as a process frozen after its acquire would) loses the lock
// by the server's wait_timeout: a waiter takes it no sooner than the
// lease's deadline, and within the lease rounded up to a second and some
// slack (the test allows 10s).
func TestStalledHolderExpires(t *testing.T) {
	ctx := context.Background()
	name := testName(t)
	const ttl = 1500 * time.Millisecond // wait_timeout 2s
	a := newTestLocker(t, &Options{Check: 100 * time.Millisecond})
	b := newTestLocker(t, &Options{WaitChunk: time.Minute})
	held, err := a.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	held.life.StopExpiry() // the local deadline would release it: the process is "frozen"
	held.connMu.Lock()     // no check, no renewal: the session goes silent
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	next, err := b.Acquire(wctx, name, 20*time.Second)
	at := time.Now()
	held.connMu.Unlock()
	if err != nil {
		t.Fatalf("Acquire while the holder is stalled: %v", err)
	}
	defer next.Release(ctx)
	if at.Before(held.Deadline()) {
		t.Errorf("the lock passed on at %v, before the stalled lease's deadline %v", at, held.Deadline())
	}
	t.Logf("the stalled lease's lock passed on %v after its deadline", at.Sub(held.Deadline()).Round(time.Millisecond))
	if next.Token() <= held.Token() {
		t.Errorf("tokens %d then %d: not increasing", held.Token(), next.Token())
	}
	timer := time.NewTimer(2 * time.Second)
	defer timer.Stop()
	select {
	case <-held.Lost():
	case <-timer.C:
		t.Error("the stalled lease's Lost still open 2s after its check could run again")
	}
}

// TestCancelEndsServerWait: a cancelled Acquire returns at once (within
// 5s here; its GET_LOCK would wait a minute) and leaves no GET_LOCK
// waiting at the server: the Locker KILLs it (the driver's own
// cancellation would only close the client's side, and the server would
// go on waiting, and then take the lock).
func TestCancelEndsServerWait(t *testing.T) {
	ctx := context.Background()
	name := testName(t)
	a := newTestLocker(t, nil)
	b := newTestLocker(t, &Options{WaitChunk: time.Minute})
	held, err := a.TryAcquire(ctx, name, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	cctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := b.Acquire(cctx, name, 20*time.Second)
		got <- err
	}()
	waitForWaiter(t, testDB(t), name)
	cancel()
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	select {
	case err := <-got:
		if !errors.Is(err, herd.ErrLeaseHeld) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Acquire: %v, want ErrLeaseHeld and context.Canceled", err)
		}
	case <-timer.C:
		t.Fatal("Acquire still waiting 5s after its context was cancelled")
	}
	if n := waiters(t, testDB(t), name); n != 0 {
		t.Errorf("%d sessions still wait on the lock at the server after the Acquire returned", n)
	}
}

// viaProxy starts a fault proxy in front of the test server, closed at
// the end of the test, and returns the test database's configuration
// with the proxy as its address.
func viaProxy(t *testing.T) (*mysql.Config, *faultproxy.Proxy) {
	t.Helper()
	cfg := testConfig(t)
	p, err := faultproxy.Start(cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	cfg.Addr = p.Addr()
	return cfg, p
}

// TestAcquireReturnsAtOnceWhenCtxEndsOnASilentLink: herd.Lock promises
// that a waiting Acquire returns at once when its context ends. Here the
// waiter reaches the server through a link that goes silent while its
// GET_LOCK waits (the proxy drops every packet both ways and resets
// nothing), so neither the GET_LOCK's reply nor the KILL QUERY gets
// through. Acquire must still return, with ErrLeaseHeld and
// context.Canceled (the test allows 2s, which only stops a hang: the
// GET_LOCK's own deadline is 40s away). The abandoned wait is still
// queued at the server, which grants it the lock when the holder
// releases: that lock is nobody's lease, and Close must end the attempt
// and close its connection, which frees it.
func TestAcquireReturnsAtOnceWhenCtxEndsOnASilentLink(t *testing.T) {
	ctx := context.Background()
	name := testName(t)
	holder := newTestLocker(t, nil)
	held, err := holder.TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	cfg, proxy := viaProxy(t)
	waiter := New(cfg, nil)
	defer waiter.Close()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		lease, err := waiter.Acquire(wctx, name, 30*time.Second)
		if lease != nil {
			lease.Release(ctx)
		}
		got <- err
	}()
	db := testDB(t)
	waitForWaiter(t, db, name)
	proxy.SetBlackhole(true)
	cancel()
	start := time.Now()
	timer := time.NewTimer(2 * time.Second)
	defer timer.Stop()
	select {
	case err = <-got:
		t.Logf("Acquire returned %v after its context was cancelled", time.Since(start).Round(time.Millisecond))
	case <-timer.C:
		hang := time.NewTimer(2 * time.Minute)
		defer hang.Stop()
		select {
		case <-got:
			t.Fatalf("Acquire returned %v after its context was cancelled on a silent link; want at once (< 2s)", time.Since(start).Round(100*time.Millisecond))
		case <-hang.C:
			t.Fatal("Acquire still waiting 2m after its context was cancelled on a silent link")
		}
	}
	if !errors.Is(err, herd.ErrLeaseHeld) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v, want ErrLeaseHeld and context.Canceled", err)
	}

	// The holder leaves: the server grants the lock to the abandoned wait.
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !eventually(5*time.Second, func() bool { return lockHolder(t, db, name).Valid }) {
		t.Fatal("the abandoned wait was not granted the lock at the release")
	}
	closed := make(chan error, 1)
	go func() { closed <- waiter.Close() }()
	timer.Reset(5 * time.Second)
	select {
	case <-closed:
	case <-timer.C:
		t.Fatal("Close still running 5s after it was called, with an abandoned wait on a silent link")
	}
	if !eventually(5*time.Second, func() bool { return !lockHolder(t, db, name).Valid }) {
		t.Fatalf("the abandoned wait's session %d still holds the lock 5s after Close", lockHolder(t, db, name).Int64)
	}
	next, err := holder.TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after Close freed the abandoned wait's lock: %v", err)
	}
	next.Release(ctx)
}

// lockHolder returns the session that holds key's lock at the server
// (IS_USED_LOCK), not Valid when the lock is free.
func lockHolder(t testing.TB, db *sql.DB, key string) sql.NullInt64 {
	t.Helper()
	var id sql.NullInt64
	if err := db.QueryRow("SELECT IS_USED_LOCK('" + lockName(key) + "')").Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// eventually reports whether cond held within d, checking every 5ms.
func eventually(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// TestWaitTimeout: Acquire gives up after MaxWait with ErrWaitTimeout and
// ErrLeaseHeld, and its GET_LOCK waits no longer either.
func TestWaitTimeout(t *testing.T) {
	ctx := context.Background()
	name := testName(t)
	a := newTestLocker(t, nil)
	b := newTestLocker(t, &Options{MaxWait: 300 * time.Millisecond})
	held, err := a.TryAcquire(ctx, name, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	_, err = b.Acquire(ctx, name, 20*time.Second)
	if !errors.Is(err, herd.ErrWaitTimeout) || !errors.Is(err, herd.ErrLeaseHeld) {
		t.Fatalf("Acquire past MaxWait: %v, want ErrWaitTimeout and ErrLeaseHeld", err)
	}
}

// TestAnyKey: keys of any bytes, up to herd.MaxLockKeyBytes of them, map
// to lock names within the servers' 64 characters, and distinct keys are
// distinct locks.
func TestAnyKey(t *testing.T) {
	ctx := context.Background()
	l := newTestLocker(t, nil)
	long := strings.Repeat("k", herd.MaxLockKeyBytes-1-len(testName(t))) + testName(t)
	keys := []string{long, long + "\x00", "\x00\xff'`\"\\%_", "ключ " + testName(t), "Case" + testName(t), "case" + testName(t)[0:0] + testName(t)}
	var leases []*Lease
	defer func() {
		for _, lease := range leases {
			lease.Release(ctx)
		}
	}()
	for _, k := range keys {
		if n := len(lockName(k)); n > 64 {
			t.Errorf("lock name of a %d-byte key has %d characters, over 64", len(k), n)
		}
		lease, err := l.TryAcquire(ctx, k, 20*time.Second)
		if err != nil {
			t.Fatalf("TryAcquire(%q...): %v", k[:min(len(k), 20)], err)
		}
		leases = append(leases, lease)
		if lease.Key() != k {
			t.Errorf("Key() is not the key acquired")
		}
	}
	for _, k := range keys {
		if _, err := l.TryAcquire(ctx, k, 20*time.Second); !errors.Is(err, herd.ErrLeaseHeld) {
			t.Errorf("TryAcquire(%q...) again: %v, want ErrLeaseHeld", k[:min(len(k), 20)], err)
		}
	}
}

// TestServerDown: with no server, TryAcquire and Acquire fail at once
// with the connection error (not ErrLeaseHeld, no hang).
func TestServerDown(t *testing.T) {
	cfg, err := mysql.ParseDSN("root@tcp(127.0.0.1:1)/none?timeout=5s")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = quiet{}
	l := New(cfg, nil)
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
	cfg := mysql.NewConfig()
	for name, opt := range map[string]*Options{
		"MaxWait":   {MaxWait: -1},
		"WaitChunk": {WaitChunk: time.Microsecond},
		"Check":     {Check: -1},
		"IdleConns": {IdleConns: -1},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), name) {
					t.Errorf("New with a bad %s: recovered %v, want a panic naming it", name, r)
				}
			}()
			New(cfg, opt).Close()
		})
	}
	defer func() {
		if recover() == nil {
			t.Error("New(nil) did not panic")
		}
	}()
	New(nil, nil)
}

// TestTTLRange: a lease shorter than the drift allowance allows, or
// longer than wait_timeout can hold, is ErrInvalidTTL, at once; a lease
// that is not a whole number of seconds gets a wait_timeout rounded up.
func TestTTLRange(t *testing.T) {
	l := newTestLocker(t, nil)
	for _, ttl := range []time.Duration{time.Millisecond, maxLease + time.Millisecond} {
		if _, err := l.TryAcquire(context.Background(), "ttl", ttl); !errors.Is(err, herd.ErrInvalidTTL) {
			t.Errorf("TryAcquire with ttl %v: %v, want ErrInvalidTTL", ttl, err)
		}
	}
	for ttl, want := range map[time.Duration]int64{10 * time.Millisecond: 1, time.Second: 1, 1001 * time.Millisecond: 2, maxLease: 31536000} {
		if got := waitTimeout(ttl); got != want {
			t.Errorf("waitTimeout(%v) = %d, want %d", ttl, got, want)
		}
	}
	ctx := context.Background()
	lease, err := l.TryAcquire(ctx, testName(t), 2500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	var wt int64
	if err := lease.use(func(c *sql.Conn) error {
		return c.QueryRowContext(ctx, "SELECT @@SESSION.wait_timeout").Scan(&wt)
	}); err != nil || wt != 3 {
		t.Errorf("the lease's session wait_timeout: %d, %v; want 3", wt, err)
	}
}

// TestAcquireMaxWaitBoundsTheWaitOnASilentLink: Options.MaxWait "bounds
// how long Acquire waits for a held lock, on top of the caller's
// context", and Acquire's doc says the wait is bounded by ctx and by
// MaxWait. A waiter with MaxWait 2s reaches the server through a link
// that goes silent while its GET_LOCK waits, and its ctx never ends: the
// GET_LOCK's reply cannot arrive, and Acquire waits for it to its own
// client deadline (the wait, 2s, and 30s), not for MaxWait. The fix for
// a cancelled ctx (leave after 250ms, the wait left to a stray) is not
// applied when MaxWait runs out.
func TestAcquireMaxWaitBoundsTheWaitOnASilentLink(t *testing.T) {
	ctx := context.Background()
	name := testName(t)
	holder := newTestLocker(t, nil)
	held, err := holder.TryAcquire(ctx, name, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	cfg, proxy := viaProxy(t)
	const maxWait = 2 * time.Second
	waiter := New(cfg, &Options{MaxWait: maxWait})
	defer waiter.Close()
	got := make(chan error, 1)
	start := time.Now()
	go func() {
		lease, err := waiter.Acquire(ctx, name, time.Minute)
		if lease != nil {
			lease.Release(ctx)
		}
		got <- err
	}()
	waitForWaiter(t, testDB(t), name)
	proxy.SetBlackhole(true)
	bound := time.NewTimer(maxWait + 2*time.Second)
	defer bound.Stop()
	select {
	case err = <-got:
	case <-bound.C:
		hang := time.NewTimer(2 * time.Minute)
		defer hang.Stop()
		select {
		case <-got:
			t.Fatalf("Acquire with MaxWait %v returned after %v on a silent link; want within about MaxWait", maxWait, time.Since(start).Round(100*time.Millisecond))
		case <-hang.C:
			t.Fatalf("Acquire with MaxWait %v still waiting after %v on a silent link", maxWait, time.Since(start).Round(time.Second))
		}
	}
	if !errors.Is(err, herd.ErrWaitTimeout) || !errors.Is(err, herd.ErrLeaseHeld) {
		t.Errorf("Acquire after MaxWait on a silent link = %v, want ErrWaitTimeout and ErrLeaseHeld", err)
	}
}
