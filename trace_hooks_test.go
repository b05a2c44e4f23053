package herd

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

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
