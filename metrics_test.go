package herd

import (
	"context"
	"errors"
	"fmt"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkSignals shows what the signals cost on the hit path: nothing
// with no Observer (a nil check, no allocation), a function call with one.
func BenchmarkSignals(b *testing.B) {
	b.Run("NilObserver", func(b *testing.B) {
		s := newSignals(nil, nil, nil)
		b.ReportAllocs()
		for b.Loop() {
			s.lookup("user:42", OutcomeHit)
		}
	})
	b.Run("Observer", func(b *testing.B) {
		var n atomic.Int64
		s := newSignals(&Observer{Lookup: func(string, Outcome) { n.Add(1) }}, func(string) string { return "user" }, nil)
		b.ReportAllocs()
		for b.Loop() {
			s.lookup("user:42", OutcomeHit)
		}
	})
}

func TestSignalsNilObserverAllocatesNothing(t *testing.T) {
	s := newSignals(nil, nil, nil)
	allocs := testing.AllocsPerRun(1000, func() {
		s.lookup("k", OutcomeHit)
		s.load("k", time.Millisecond, nil, true)
		s.wait("k", time.Millisecond, WaitNotified)
		s.lease("k", LeaseExtended)
		s.commit("k", CommitStored)
	})
	if allocs != 0 {
		t.Errorf("signals with a nil Observer allocate %v per call, want 0", allocs)
	}
}

// Rare events are logged at most once per second per message, with the
// number suppressed.
func TestLogRareIsRateLimited(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	s := newSignals(nil, nil, slog.New(slog.NewTextHandler(&out, nil)))
	for range 100 {
		s.logRare(slog.LevelWarn, "herd: circuit breaker opened")
	}
	if n := strings.Count(out.String(), "circuit breaker opened"); n != 1 {
		t.Fatalf("100 events logged %d lines within a second, want 1", n)
	}
	s.limitMu.Lock()
	s.lastLog["herd: circuit breaker opened"] = time.Now().Add(-2 * time.Second)
	s.limitMu.Unlock()
	s.logRare(slog.LevelWarn, "herd: circuit breaker opened")
	if !strings.Contains(out.String(), "suppressed=99") {
		t.Errorf("the next line does not report 99 suppressed:\n%s", out.String())
	}
}

func TestEventNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ got, want string }{
		{LeaseTakenOver.String(), "taken_over"}, {LeaseExtendFailed.String(), "extend_failed"},
		{WaitTakeover.String(), "takeover"}, {WaitCancelled.String(), "cancelled"},
		{CommitFenced.String(), "fenced"}, {RefreshDropped.String(), "dropped"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

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

// With no Observer, or one without the Start hooks, the hooks cost a nil
// check: no call, no allocation.
func TestStartHooksUnsetAllocateNothing(t *testing.T) {
	f := &flight{key: "k", keys: keyFamily{Value: "v:{tag}"}}
	lease := &Lease{token: 7}
	for _, s := range []*signals{
		newSignals(nil, nil, nil),
		newSignals(&Observer{Lookup: func(string, Outcome) {}}, func(string) string { return "c" }, nil),
	} {
		allocs := testing.AllocsPerRun(1000, func() {
			if v, end := s.startLoad(f, lease); v != nil || end != nil {
				t.Fatal("startLoad returned a context or an end without StartLoad")
			}
			if s.startWait(f) != nil || s.startCommit(f, lease) != nil {
				t.Fatal("startWait or startCommit returned an end without their hooks")
			}
		})
		if allocs != 0 {
			t.Errorf("unset Start hooks allocate %v per call, want 0", allocs)
		}
	}
}

type ctxKey struct{}

// stepLog records the Start hooks' calls.
type stepLog struct {
	mu      sync.Mutex
	loads   []Step
	waits   []Step
	commits []Step
	ends    []string
	origins []any // ctxKey{} in the context each hook got
	waiting chan struct{}
}

func (l *stepLog) observer() *Observer {
	return &Observer{
		StartLoad: func(ctx context.Context, st Step) (context.Context, func(error)) {
			l.mu.Lock()
			l.loads = append(l.loads, st)
			l.origins = append(l.origins, ctx.Value(ctxKey{}))
			l.mu.Unlock()
			return context.WithValue(ctx, ctxKey{}, "lent"), func(err error) {
				l.mu.Lock()
				defer l.mu.Unlock()
				l.ends = append(l.ends, "load:"+loadResultText(err))
			}
		},
		StartWait: func(ctx context.Context, st Step) func(WaitEnd) {
			l.mu.Lock()
			l.waits = append(l.waits, st)
			l.origins = append(l.origins, ctx.Value(ctxKey{}))
			l.mu.Unlock()
			close(l.waiting)
			return func(end WaitEnd) {
				l.mu.Lock()
				defer l.mu.Unlock()
				l.ends = append(l.ends, "wait:"+end.String())
			}
		},
		StartCommit: func(ctx context.Context, st Step) func(CommitResult) {
			l.mu.Lock()
			l.commits = append(l.commits, st)
			l.origins = append(l.origins, ctx.Value(ctxKey{}))
			l.mu.Unlock()
			return func(r CommitResult) {
				l.mu.Lock()
				defer l.mu.Unlock()
				l.ends = append(l.ends, "commit:"+r.String())
			}
		},
	}
}

func loadResultText(err error) string {
	if err == nil {
		return "ok"
	}
	return "error"
}

// A rebuild led by one Cache and waited for by another: the hooks get
// the starting caller's context, the loader's context carries what
// StartLoad lent it, and the wait names the rebuild of the load it waits
// for (the same Step.Rebuild as the leader's load and commit).
func TestStartHooksBracketARebuild(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	var l stepLog
	l.waiting = make(chan struct{})
	opt := &Options{Observer: l.observer(), KeyClass: func(string) string { return "user" }}
	a, b := newTestCache(t, rdb, opt), newTestCache(t, rdb, opt)
	key := testKey(t)

	entered, gate := make(chan any, 1), make(chan struct{})
	lead := make(chan error, 1)
	go func() {
		ctx := context.WithValue(context.Background(), ctxKey{}, "leader")
		_, err := a.Get(ctx, key, time.Minute, func(ctx context.Context) ([]byte, error) {
			entered <- ctx.Value(ctxKey{})
			<-gate
			return []byte("v"), nil
		})
		lead <- err
	}()
	if got := <-entered; got != "lent" {
		t.Errorf("the loader's context has ctxKey %v, want the value StartLoad lent", got)
	}
	follow := make(chan error, 1)
	go func() {
		ctx := context.WithValue(context.Background(), ctxKey{}, "follower")
		_, err := b.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) {
			return nil, errors.New("the follower ran its loader")
		})
		follow <- err
	}()
	<-l.waiting // b waits for a's rebuild
	close(gate)
	if err := <-lead; err != nil {
		t.Fatalf("leader: %v", err)
	}
	if err := <-follow; err != nil {
		t.Fatalf("follower: %v", err)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.loads) != 1 || len(l.waits) != 1 || len(l.commits) != 1 {
		t.Fatalf("got %d loads, %d waits, %d commits bracketed, want 1 each", len(l.loads), len(l.waits), len(l.commits))
	}
	ld, w, cm := l.loads[0], l.waits[0], l.commits[0]
	if ld.Class != "user" || !ld.Leased || ld.Rebuild == "" {
		t.Errorf("load step %+v, want class user, leased, a rebuild name", ld)
	}
	if w.Rebuild != ld.Rebuild || cm.Rebuild != ld.Rebuild {
		t.Errorf("wait names rebuild %q, commit %q, want the load's %q", w.Rebuild, cm.Rebuild, ld.Rebuild)
	}
	if want := []any{"leader", "follower", "leader"}; len(l.origins) != 3 || l.origins[0] != want[0] || l.origins[1] != want[1] || l.origins[2] != want[2] {
		t.Errorf("the hooks got contexts with %v, want %v (load, wait, commit)", l.origins, want)
	}
	for _, want := range [][]string{{"load:ok"}, {"commit:stored"}, {"wait:notified", "wait:polled"}} {
		found := false
		for _, e := range l.ends {
			for _, w := range want {
				found = found || e == w
			}
		}
		if !found {
			t.Errorf("ends %v lack %s", l.ends, strings.Join(want, " or "))
		}
	}
}
