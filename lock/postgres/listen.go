package postgres

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/herdkit/herd/internal/lease"
	"github.com/jackc/pgx/v5"
)

// listener is a Locker's one LISTEN connection, shared by its waiting
// Acquires: it is opened by the first wait, reopened with backoff when it
// fails, and closed by Close. A notification's payload is the advisory
// key of the lock released; it wakes that key's waiters. Each time the
// connection comes up it wakes every waiter, so that a release while it
// was down is not missed.
type listener struct {
	l *Locker

	mu      sync.Mutex
	subs    map[int64]map[*subscription]struct{}
	started bool
	wg      sync.WaitGroup
}

// subscription is one waiter's interest in a key. c receives a value when
// the key may have been released (it never blocks the listener).
type subscription struct {
	ln  *listener
	key int64
	c   chan struct{}
}

func newListener(l *Locker) *listener {
	return &listener{l: l, subs: make(map[int64]map[*subscription]struct{})}
}

// subscribe registers a waiter for key, starting the listening connection
// if it is not running yet. The caller holds a call of the Locker (Enter).
func (ln *listener) subscribe(key int64) *subscription {
	s := &subscription{ln: ln, key: key, c: make(chan struct{}, 1)}
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if ln.subs[key] == nil {
		ln.subs[key] = make(map[*subscription]struct{})
	}
	ln.subs[key][s] = struct{}{}
	if !ln.started {
		ln.started = true
		ln.wg.Add(1)
		go ln.run()
	}
	return s
}

func (s *subscription) release() {
	ln := s.ln
	ln.mu.Lock()
	defer ln.mu.Unlock()
	delete(ln.subs[s.key], s)
	if len(ln.subs[s.key]) == 0 {
		delete(ln.subs, s.key)
	}
}

func (s *subscription) wake() {
	select {
	case s.c <- struct{}{}:
	default:
	}
}

// wake wakes key's waiters, or every waiter when all is set.
func (ln *listener) wake(key int64, all bool) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if all {
		for _, subs := range ln.subs {
			for s := range subs {
				s.wake()
			}
		}
		return
	}
	for s := range ln.subs[key] {
		s.wake()
	}
}

// wait waits for the listening goroutine, once the Locker's root context
// is cancelled.
func (ln *listener) wait() { ln.wg.Wait() }

// run keeps the listening connection up until Close.
func (ln *listener) run() {
	defer ln.wg.Done()
	ctx := ln.l.gate.Root()
	backoff := 10 * time.Millisecond
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if ln.listen(ctx) {
			backoff = 10 * time.Millisecond
		}
		backoff = min(2*backoff, time.Second)
		timer.Reset(lease.Jitter(backoff))
	}
}

// listen opens the connection, LISTENs and delivers notifications until
// the connection fails or ctx ends. It reports whether the LISTEN ran.
func (ln *listener) listen(ctx context.Context) bool {
	c, err := pgx.ConnectConfig(ctx, ln.l.conf)
	if err != nil {
		return false
	}
	defer closeConn(c)
	if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{ln.l.cfg.channel}.Sanitize()); err != nil {
		return false
	}
	ln.wake(0, true) // releases while nobody listened
	for {
		n, err := c.WaitForNotification(ctx)
		if err != nil {
			ln.wake(0, true) // waiters re-check while the connection is down
			return true
		}
		key, err := strconv.ParseInt(n.Payload, 10, 64)
		if err != nil {
			continue // not a Locker's
		}
		ln.wake(key, false)
	}
}
