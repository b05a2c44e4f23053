package leasewatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/herdkit/herd"
)

// recorder is a fake lease: it records the renewals asked for and fails
// them as told.
type recorder struct {
	mu    sync.Mutex
	asked []time.Duration
	fail  func(n int) error
	got   chan struct{}
}

func (r *recorder) extend(_ context.Context, d time.Duration) error {
	r.mu.Lock()
	r.asked = append(r.asked, d)
	n := len(r.asked)
	r.mu.Unlock()
	select {
	case r.got <- struct{}{}:
	default:
	}
	if r.fail != nil {
		return r.fail(n)
	}
	return nil
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.asked)
}

func run(ctx context.Context, lost chan struct{}, ttl time.Duration, capAt time.Time, deadline time.Time, r *recorder) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		Renew(ctx, lost, ttl, capAt, func() time.Time { return deadline }, r.extend)
	}()
	return done
}

func waitDone(t *testing.T, done chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("Renew did not return after %s", what)
	}
}

// Renewals come for the full length until ctx ends; then Renew returns.
func TestRenewUntilStopped(t *testing.T) {
	r := &recorder{got: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := run(ctx, make(chan struct{}), 300*time.Millisecond, time.Time{}, time.Now().Add(time.Hour), r)
	for range 2 {
		<-r.got
	}
	cancel()
	waitDone(t, done, "ctx ended")
	for _, d := range r.asked {
		if d != 300*time.Millisecond {
			t.Errorf("renewal for %v, want the lease's 300ms", d)
		}
	}
}

// The last renewal before the cap is shortened to end at the cap, and
// Renew stops there.
func TestRenewCapped(t *testing.T) {
	r := &recorder{got: make(chan struct{}, 1)}
	const ttl = 300 * time.Millisecond
	done := run(context.Background(), make(chan struct{}), ttl, time.Now().Add(ttl*3/4), time.Now().Add(time.Hour), r)
	waitDone(t, done, "the cap")
	if n := r.count(); n != 1 || r.asked[0] >= ttl {
		t.Fatalf("renewals %v, want one shorter than %v", r.asked, ttl)
	}
}

// A lost lease (lost closed, or extend reporting ErrLeaseLost) ends the
// loop; other errors are retried until the deadline has passed.
func TestRenewErrors(t *testing.T) {
	const ttl = 300 * time.Millisecond
	t.Run("lost channel", func(t *testing.T) {
		lost := make(chan struct{})
		r := &recorder{got: make(chan struct{}, 1)}
		done := run(context.Background(), lost, ttl, time.Time{}, time.Now().Add(time.Hour), r)
		<-r.got
		close(lost)
		waitDone(t, done, "lost closed")
	})
	t.Run("ErrLeaseLost", func(t *testing.T) {
		r := &recorder{got: make(chan struct{}, 1), fail: func(int) error { return fmt.Errorf("%w: k", herd.ErrLeaseLost) }}
		done := run(context.Background(), make(chan struct{}), ttl, time.Time{}, time.Now().Add(time.Hour), r)
		waitDone(t, done, "ErrLeaseLost")
		if n := r.count(); n != 1 {
			t.Errorf("%d renewals after ErrLeaseLost, want 1", n)
		}
	})
	t.Run("transient error retried", func(t *testing.T) {
		r := &recorder{got: make(chan struct{}, 8), fail: func(n int) error {
			if n < 3 {
				return errors.New("connection reset")
			}
			return nil
		}}
		ctx, cancel := context.WithCancel(context.Background())
		done := run(ctx, make(chan struct{}), ttl, time.Time{}, time.Now().Add(time.Hour), r)
		for r.count() < 4 {
			<-r.got
		}
		cancel()
		waitDone(t, done, "ctx ended")
	})
	t.Run("error past the deadline", func(t *testing.T) {
		r := &recorder{got: make(chan struct{}, 1), fail: func(int) error { return errors.New("connection reset") }}
		done := run(context.Background(), make(chan struct{}), ttl, time.Time{}, time.Now(), r)
		waitDone(t, done, "the deadline passed")
		if n := r.count(); n != 1 {
			t.Errorf("%d renewals past the deadline, want 1", n)
		}
	})
}
