package herd

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// countingObserver counts Lookup outcomes and Load results.
type countingObserver struct {
	mu      sync.Mutex
	lookups map[Outcome]int
	loads   []error
}

func newCountingObserver() (*countingObserver, *Observer) {
	co := &countingObserver{lookups: map[Outcome]int{}}
	return co, &Observer{
		Lookup: func(_ string, o Outcome) {
			co.mu.Lock()
			defer co.mu.Unlock()
			co.lookups[o]++
		},
		Load: func(_ string, _ time.Duration, err error, _ bool) {
			co.mu.Lock()
			defer co.mu.Unlock()
			co.loads = append(co.loads, err)
		},
	}
}

func (co *countingObserver) lookup(o Outcome) int {
	co.mu.Lock()
	defer co.mu.Unlock()
	return co.lookups[o]
}

func (co *countingObserver) loadErrs() []error {
	co.mu.Lock()
	defer co.mu.Unlock()
	return append([]error(nil), co.loads...)
}

// TestFillPass: a Fill that passes tells its waiters, local and remote,
// to build the value themselves, and leaves a mark that makes every later
// Begin, in every process, return ErrPass at once, without a lease; Get
// rebuilds over the mark.
func TestFillPass(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			co, obs := newCountingObserver()
			c := newTestCache(t, b.rdb, &Options{Observer: obs})
			other := newTestCache(t, b.rdb, nil)
			ctx := context.Background()
			key := testKey(t)
			_, fill, err := c.Begin(ctx, key, time.Minute, nil)
			if err != nil || fill == nil || !fill.Leased() {
				t.Fatalf("Begin on a cold key = (%v, %v), want a leased Fill", fill, err)
			}
			local, remote := make(chan error, 1), make(chan error, 1)
			go func() { _, _, err := c.Begin(ctx, key, time.Minute, nil); local <- err }()
			go func() {
				_, f, err := other.Begin(ctx, key, time.Minute, nil)
				if f != nil {
					f.Abort(nil)
					err = errors.New("a remote waiter got a Fill")
				}
				remote <- err
			}()
			waitFor(t, 5*time.Second, "the remote waiter to follow", func() bool { return other.Stats().Waits == 1 })
			waitSubscribedTB(t, b, mustKeys(t, key).Channel, 1)
			waitLocalWaiters(t, c, key, 1)
			if err := fill.Pass(errors.New("sets a cookie"), time.Minute); err != nil {
				t.Fatal(err)
			}
			for name, ch := range map[string]chan error{"local": local, "remote": remote} {
				if err := <-ch; !errors.Is(err, ErrNotShared) || errors.Is(err, ErrPass) {
					t.Errorf("%s waiter: got %v, want ErrNotShared (it waited on the rebuild, it found no mark)", name, err)
				}
			}
			keys := mustKeys(t, key)
			if pttl := b.rdb.PTTL(ctx, keys.Value).Val(); pttl <= 0 || pttl > time.Minute {
				t.Errorf("the mark's PTTL is %v, want at most the Pass ttl (1m)", pttl)
			}
			for name, cache := range map[string]*Cache{"this": c, "other": other} {
				hit, f, err := cache.Begin(ctx, key, time.Minute, nil)
				if hit != nil || f != nil || !errors.Is(err, ErrPass) || !errors.Is(err, ErrNotShared) {
					t.Errorf("%s process: Begin on a marked key = (%v, %v, %v), want ErrPass wrapped with ErrNotShared", name, hit, f, err)
				}
			}
			if n := b.rdb.Exists(ctx, keys.Lease).Val(); n != 0 {
				t.Errorf("a Begin on a marked key took the lease")
			}
			if s := c.Stats(); s.Passes != 1 || s.NotShared != 1 || s.Loads != 1 || s.LoadErrors != 0 {
				t.Errorf("Stats = passes %d, not shared %d, loads %d, load errors %d; want 1, 1, 1, 0", s.Passes, s.NotShared, s.Loads, s.LoadErrors)
			}
			if got := co.lookup(OutcomePass); got != 1 {
				t.Errorf("Observer: %d pass lookups, want 1", got)
			}
			if errs := co.loadErrs(); len(errs) != 1 || !errors.Is(errs[0], ErrNotShared) {
				t.Errorf("Observer loads %v, want one, not shared", errs)
			}
			// Get reads the mark as a miss: its loader runs and its value
			// replaces the mark.
			v, err := other.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) { return []byte("value"), nil })
			if err != nil || string(v) != "value" {
				t.Fatalf("Get on a marked key = (%q, %v), want its loader's value", v, err)
			}
			hit, _, err := c.Begin(ctx, key, time.Minute, nil)
			if err != nil || hit == nil || string(hit.Value) != "value" {
				t.Errorf("Begin after Get = (%+v, %v), want Get's value", hit, err)
			}
		})
	}
}

// TestFillPassExpires: the mark lives in Redis for the ttl Pass was
// given, then the key leads again.
func TestFillPassExpires(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, nil)
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	_, fill, err := c.Begin(ctx, "k", time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatal(err)
	}
	if err := fill.Pass(nil, ttl); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Begin(ctx, "k", time.Minute, nil); !errors.Is(err, ErrPass) {
		t.Fatalf("Begin after Pass: %v, want ErrPass", err)
	}
	if pttl := rdb.PTTL(ctx, mustKeys(t, "k").Value).Val(); pttl <= 0 || pttl > ttl {
		t.Errorf("the mark's PTTL is %v, want in (0, %v]", pttl, ttl)
	}
	deadline := time.Now().Add(10 * ttl)
	for {
		_, f, err := c.Begin(ctx, "k", time.Minute, nil)
		if f != nil {
			f.Abort(nil)
			break
		}
		if !errors.Is(err, ErrPass) {
			t.Fatalf("Begin while marked: %v, want ErrPass", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key is still marked %v after a Pass of %v", 10*ttl, ttl)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, fill, err = c.Begin(ctx, "bad", time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatal(err)
	}
	if err := fill.Pass(nil, 0); !errors.Is(err, ErrInvalidTTL) {
		t.Errorf("Pass(ttl 0): %v, want ErrInvalidTTL", err)
	}
	if _, f, err := c.Begin(ctx, "bad", time.Minute, nil); f == nil {
		t.Errorf("Begin after a Pass with an invalid ttl: %v, want a Fill (no mark, the Fill aborted)", err)
	} else {
		f.Abort(nil)
	}
}

// TestFillLoadAccounting: every end of a Fill but a hand-over is one load
// in Stats and one Observer.Load, and only failures are load errors: a
// value that was not for sharing is counted apart.
func TestFillLoadAccounting(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	co, obs := newCountingObserver()
	c := newTestCache(t, srv.Client(t), &Options{Observer: obs, MaxValueBytes: 8})
	ctx := context.Background()
	steps := []struct {
		name      string
		end       func(*Fill)
		notShared bool
		failure   bool
	}{
		{"Commit", func(f *Fill) { f.Commit([]byte("ok"), time.Minute, 0) }, false, false},
		{"Abort(ErrNotShared)", func(f *Fill) { f.Abort(ErrNotShared) }, true, false},
		{"Abort(failure)", func(f *Fill) { f.Abort(errors.New("500")) }, false, true},
		{"Commit(too large)", func(f *Fill) { f.Commit([]byte("more than eight"), time.Minute, 0) }, true, false},
		{"Pass", func(f *Fill) { f.Pass(errors.New("private"), time.Minute) }, true, false},
		{"Handover", func(f *Fill) { f.Handover() }, false, false},
	}
	var want Stats
	for i, s := range steps {
		_, f, err := c.Begin(ctx, "k"+string(rune('a'+i)), time.Minute, nil)
		if err != nil || f == nil {
			t.Fatalf("%s: Begin = (%v, %v)", s.name, f, err)
		}
		s.end(f)
		if s.name != "Handover" {
			want.Loads++
		}
		if s.notShared {
			want.NotShared++
		}
		if s.failure {
			want.LoadErrors++
		}
		got := c.Stats()
		if got.Loads != want.Loads || got.NotShared != want.NotShared || got.LoadErrors != want.LoadErrors {
			t.Errorf("after %s: loads %d, not shared %d, load errors %d; want %d, %d, %d", s.name,
				got.Loads, got.NotShared, got.LoadErrors, want.Loads, want.NotShared, want.LoadErrors)
		}
	}
	errs := co.loadErrs()
	if len(errs) != int(want.Loads) {
		t.Fatalf("Observer.Load called %d times, want %d (one per load)", len(errs), want.Loads)
	}
	var notShared, failed int
	for _, err := range errs {
		switch {
		case errors.Is(err, ErrNotShared):
			notShared++
		case err != nil:
			failed++
		}
	}
	if notShared != int(want.NotShared) || failed != int(want.LoadErrors) {
		t.Errorf("Observer loads: %d not shared, %d failed; want %d, %d", notShared, failed, want.NotShared, want.LoadErrors)
	}
	if n := co.lookup(OutcomeLeader); n != len(steps) {
		t.Errorf("Observer: %d leader lookups, want %d", n, len(steps))
	}
}

// TestLookupLeaderPerLoad: of the callers of one rebuild in a process,
// one reports the leader's outcome and the others a follower's, for Get
// (callers sharing a flight) and for Begin (callers waiting on a Fill,
// whatever its end), so that leader lookups count loads.
func TestLookupLeaderPerLoad(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()

	t.Run("Get", func(t *testing.T) {
		co, obs := newCountingObserver()
		c := newTestCache(t, rdb, &Options{Observer: obs})
		gl := newGatedLoader("v")
		const n = 8
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				if _, err := c.Get(ctx, "get", time.Minute, gl.load); err != nil {
					t.Errorf("Get: %v", err)
				}
			})
		}
		<-gl.entered
		waitFlightJoiners(t, c, "get", n-1) // the others share the flight: followers, not leaders
		close(gl.gate)
		wg.Wait()
		leader, follower, hit := co.lookup(OutcomeLeader), co.lookup(OutcomeFollower), co.lookup(OutcomeHit)
		if leader != 1 || leader+follower+hit != n || gl.calls.Load() != 1 {
			t.Errorf("%d Gets, one load (%d): %d leader, %d follower, %d hit lookups; want 1 leader and %d in all", n, gl.calls.Load(), leader, follower, hit, n)
		}
	})

	t.Run("Begin", func(t *testing.T) {
		co, obs := newCountingObserver()
		c := newTestCache(t, rdb, &Options{Observer: obs})
		for _, cause := range []error{ErrNotShared, errors.New("failed")} {
			key := "begin-" + cause.Error()
			_, fill, err := c.Begin(ctx, key, time.Minute, nil)
			if err != nil || fill == nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { _, _, err := c.Begin(ctx, key, time.Minute, nil); done <- err }()
			waitLocalWaiters(t, c, key, 1)
			fill.Abort(cause)
			if err := <-done; err == nil {
				t.Errorf("the waiter got no error after Abort(%v)", cause)
			}
		}
		if l, f := co.lookup(OutcomeLeader), co.lookup(OutcomeFollower); l != 2 || f != 2 {
			t.Errorf("two Fills aborted, each with a local waiter: %d leader, %d follower lookups; want 2 and 2", l, f)
		}
	})
}

// TestFollowerReadIsNotAHit: a follower that reads the value its leader
// stored counts as a follow, not as a hit.
func TestFollowerReadIsNotAHit(t *testing.T) {
	t.Parallel()
	for _, b := range standaloneBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			// The wake-up carries no value: the follower reads it.
			c := newTestCache(t, b.rdb, &Options{NotifyMaxBytes: -1})
			other := newTestCache(t, b.rdb, nil)
			ctx := context.Background()
			key := testKey(t)
			_, fill, err := c.Begin(ctx, key, time.Minute, nil)
			if err != nil || fill == nil {
				t.Fatal(err)
			}
			got := make(chan *Hit, 1)
			go func() { h, _, _ := other.Begin(ctx, key, time.Minute, nil); got <- h }()
			waitFor(t, 5*time.Second, "the follower", func() bool { return other.Stats().Waits == 1 })
			fill.Commit([]byte("v"), time.Minute, 0)
			if h := <-got; h == nil || h.Outcome != OutcomeFollower {
				t.Fatalf("the follower got %+v, want the value as a follower", h)
			}
			if s := other.Stats(); s.Hits != 0 || s.Waits != 1 {
				t.Errorf("follower's Stats: hits %d, follows %d; want 0, 1", s.Hits, s.Waits)
			}
		})
	}
}
