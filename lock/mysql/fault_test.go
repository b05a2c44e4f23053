package mysql

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/faultproxy"
	"github.com/herdkit/herd/locktest"
)

// TestPausedHolderFenced is the pause scenario
// (locktest.PausedHolderFenced): a holder in another process, with
// KeepAlive running, is SIGSTOPped past its lease. The server closes its
// silent session when its wait_timeout (the lease length) runs out, so a
// second holder takes the lock, with a higher token, and writes the row;
// the first holder's late write is fenced.
func TestPausedHolderFenced(t *testing.T) {
	locktest.PausedHolderFenced(t, locktest.PausedHolder[*Lease]{
		Env:    []string{dbEnv + "=" + testDSN},
		Tables: tables(testDB(t)),
		NewLock: func(t *testing.T) herd.Lock[*Lease] {
			return newTestLocker(t, &Options{WaitChunk: time.Minute})
		},
		Expiry: "the server should have closed its session",
	})
}

// TestKilledHolder: KILL of a holder's connection (no KeepAlive, a long
// lease) closes Lost within the stated bound (the next check, 100ms here,
// and a round trip: the test allows 2s), and a waiter in another Locker
// takes the lock with a higher token, granted by the server when the
// session ends (its GET_LOCK waits a minute). The lost lease's Release
// reports ErrLeaseLost and leaves the new holder's lock alone
// (locktest.CutHolderLost).
func TestKilledHolder(t *testing.T) {
	locktest.CutHolderLost(t, locktest.CutHolder[*Lease]{
		Holder: newTestLocker(t, &Options{Check: 100 * time.Millisecond}),
		Waiter: newTestLocker(t, &Options{WaitChunk: time.Minute}),
		Queued: func(t *testing.T, key string) { waitForWaiter(t, testDB(t), key) },
		Cut:    kill,
		Bound:  2 * time.Second,
	})
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

// waiters counts the sessions waiting in a GET_LOCK on key's lock: the
// wait's statement, which ends with its timeout, not an attempt's
// GET_LOCK(name, 0) with more columns after it (caught while it runs, it
// is no wait: a fault set then hits the attempt instead).
func waiters(t testing.TB, db *sql.DB, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND ID <> CONNECTION_ID()",
		"SELECT GET_LOCK('"+lockName(key)+"', %)").Scan(&n); err != nil {
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
	locktest.ServerDown(t, l)
}

// TestBadOptions: invalid options panic in New, naming the field.
func TestBadOptions(t *testing.T) {
	cfg := mysql.NewConfig()
	locktest.BadOptions(t, map[string]func(){
		"MaxWait":   func() { New(cfg, &Options{MaxWait: -1}).Close() },
		"WaitChunk": func() { New(cfg, &Options{WaitChunk: time.Microsecond}).Close() },
		"Check":     func() { New(cfg, &Options{Check: -1}).Close() },
		"IdleConns": func() { New(cfg, &Options{IdleConns: -1}).Close() },
	}, func() { New(nil, nil) })
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
