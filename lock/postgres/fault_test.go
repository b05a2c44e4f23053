package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/locktest"
	"github.com/jackc/pgx/v5"
)

// TestPausedHolderFenced is the pause scenario
// (locktest.PausedHolderFenced): a holder in another process, with
// KeepAlive running, is SIGSTOPped past its lease. The server ends its
// silent session at the lease length (idle_session_timeout), so a second
// holder takes the lock, with a higher token, and writes the row; the
// first holder's late write is fenced.
func TestPausedHolderFenced(t *testing.T) {
	locktest.PausedHolderFenced(t, locktest.PausedHolder[*Lease]{
		Env:    []string{dbEnv + "=" + testURL},
		Tables: tables(testConn(t)),
		NewLock: func(t *testing.T) herd.Lock[*Lease] {
			return newTestLocker(t, &Options{PollMax: 200 * time.Millisecond})
		},
		Expiry: "the server should have ended its session",
	})
}

// TestTerminatedHolder: pg_terminate_backend of a holder's connection
// (no KeepAlive, a long lease) closes Lost within the stated bound (the
// session's end is seen at once: here within 10% of the lease), and a
// waiter in another Locker takes the lock with a higher token, woken by
// the holder's announcement although it re-checks only once a minute
// (locktest.CutHolderLost).
func TestTerminatedHolder(t *testing.T) {
	locktest.CutHolderLost(t, locktest.CutHolder[*Lease]{
		Holder: newTestLocker(t, nil),
		Waiter: newTestLocker(t, &Options{PollMin: time.Minute, PollMax: time.Minute}),
		Queued: func(t *testing.T, _ string) { listening(t) },
		Cut:    func(t *testing.T, l *Lease) { terminate(t, l) },
		Bound:  2 * time.Second,
	})
}

// listening waits until a session of the test database LISTENs: a
// waiting Acquire's Locker starts its listener when its first attempt
// fails.
func listening(t *testing.T) {
	t.Helper()
	db := testConn(t)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var n int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no session LISTENs 10s after the Acquire started")
		}
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
	locktest.ServerDown(t, l)
}

// TestBadOptions: invalid options panic in New, naming the field.
func TestBadOptions(t *testing.T) {
	conf := &pgx.ConnConfig{}
	locktest.BadOptions(t, map[string]func(){
		"MaxWait":   func() { New(conf, &Options{MaxWait: -1}) },
		"PollMin":   func() { New(conf, &Options{PollMin: -1}) },
		"PollMax":   func() { New(conf, &Options{PollMin: time.Second, PollMax: time.Millisecond}) },
		"IdleConns": func() { New(conf, &Options{IdleConns: -1}) },
	}, func() { New(nil, nil) })
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
