package herd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// stepBook counts the Start hooks' steps: each end must come once, for a
// step that started.
type stepBook struct {
	mu      sync.Mutex
	started map[string]int
	ended   map[string]int
	twice   []string
}

func newStepBook() *stepBook {
	return &stepBook{started: map[string]int{}, ended: map[string]int{}}
}

func (b *stepBook) start(kind string) func(string) {
	b.mu.Lock()
	b.started[kind]++
	b.mu.Unlock()
	called := false
	return func(how string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if called {
			b.twice = append(b.twice, kind+":"+how)
			return
		}
		called = true
		b.ended[kind]++
	}
}

// observer lends a context that is already cancelled and past its
// deadline, with a value: the loader must get the value only.
func (b *stepBook) observer() *Observer {
	return &Observer{
		StartLoad: func(ctx context.Context, st Step) (context.Context, func(error)) {
			end := b.start(fmt.Sprintf("load leased=%v", st.Leased))
			lent, cancel := context.WithDeadline(context.WithValue(context.Background(), ctxKey{}, "lent"), time.Now().Add(-time.Second))
			cancel()
			return lent, func(err error) { end(fmt.Sprint(err)) }
		},
		StartWait: func(ctx context.Context, st Step) func(WaitEnd) {
			end := b.start("wait")
			return func(e WaitEnd) { end(e.String()) }
		},
		StartCommit: func(ctx context.Context, st Step) func(CommitResult) {
			end := b.start("commit")
			return func(r CommitResult) { end(r.String()) }
		},
	}
}

func (b *stepBook) check(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.twice) > 0 {
		t.Errorf("steps ended twice: %v", b.twice)
	}
	for k, n := range b.started {
		if b.ended[k] != n {
			t.Errorf("%s: %d started, %d ended", k, n, b.ended[k])
		}
	}
	t.Logf("steps started %v", b.started)
}

// TestStartHooksLentContextAndEnds: the context StartLoad returns
// lends its values, never its deadline or cancellation; every started
// step ends exactly once through a loader error, a panic, a Close during
// a load, a fail-open load with Redis down, and Fill.Handover and Abort.
func TestStartHooksLentContextAndEnds(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetries = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond, 0
	})
	book := newStepBook()
	c := New(rdb, &Options{Observer: book.observer(), StaleFor: time.Hour})
	ctx := context.Background()
	key := testKey(t)

	// The lent context is cancelled and past its deadline: the loader's
	// must be neither, and carry the value.
	_, err := c.Get(ctx, key+":ok", time.Minute, func(lctx context.Context) ([]byte, error) {
		if lctx.Value(ctxKey{}) != "lent" {
			return nil, errors.New("no lent value")
		}
		if lctx.Err() != nil {
			return nil, fmt.Errorf("the loader's ctx ended with the lent one: %w", lctx.Err())
		}
		if d, ok := lctx.Deadline(); ok && time.Until(d) <= 0 {
			return nil, errors.New("the loader's deadline is the lent one")
		}
		return []byte("v"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, key+":err", time.Minute, func(context.Context) ([]byte, error) { return nil, errors.New("boom") }); err == nil {
		t.Fatal("loader error not returned")
	}
	if _, err := c.Get(ctx, key+":panic", time.Minute, func(context.Context) ([]byte, error) { panic("boom") }); err == nil {
		t.Fatal("loader panic not returned")
	}
	_, fill, err := c.Begin(ctx, key+":handover", time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin: %v %v", fill, err)
	}
	fill.Handover()
	_, fill, err = c.Begin(ctx, key+":abort", time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin: %v %v", fill, err)
	}
	fill.Abort(errors.New("no"))

	// A background refresh of a stale value, its loader failing.
	if err := c.Set(ctx, key+":stale", []byte("v"), 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	refreshed := make(chan struct{})
	var once sync.Once
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := c.Get(ctx, key+":stale", time.Minute, func(context.Context) ([]byte, error) {
			once.Do(func() { close(refreshed) })
			return nil, errors.New("source down")
		}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-refreshed:
		case <-time.After(50 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("no refresh")
			}
			continue
		}
		break
	}

	// Fail-open: Redis down, the load runs without a lease.
	srv.Kill(t)
	if _, err := c.Get(ctx, key+":down", time.Minute, func(context.Context) ([]byte, error) { return []byte("v"), nil }); err != nil {
		t.Logf("fail-open Get: %v", err)
	}
	srv.Restart(t)

	// Close while a leader's load is in progress.
	entered := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 { // Redis is back once an acquire succeeds
			_, err := c.Get(ctx, key+":close", time.Minute, func(lctx context.Context) ([]byte, error) {
				close(entered)
				<-lctx.Done()
				return nil, lctx.Err()
			})
			if !errors.Is(err, ErrClosed) && err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			return
		}
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the loader never ran after the restart")
	}
	c.Close()
	<-done
	book.check(t)
}
