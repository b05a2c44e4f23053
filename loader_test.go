package herd

// The loader's error as callers see it (*LoadError) on the paths that do
// not need OS processes to prove it: GetMany's per-key errors, Begin and
// Fill, the failure marker, failure messages of an earlier version, and
// the follower's retry found through the marker. Each Cache here is one
// instance on its own Redis client; what crosses processes is in
// loaderr_process_test.go.

import (
	"context"
	"errors"
	"fmt"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var errDB = errors.New("db: connection reset")

// checkLoadError checks that err is a *LoadError for key whose message
// says the key and the cause once, and returns it.
func checkLoadError(t *testing.T, who string, err error, key, cause string, remote bool) *LoadError {
	t.Helper()
	var le *LoadError
	if !errors.As(err, &le) {
		t.Errorf("%s: %v (%T), want a *LoadError", who, err, err)
		return nil
	}
	if !errors.Is(err, ErrLoadFailed) {
		t.Errorf("%s: errors.Is(%v, ErrLoadFailed) = false", who, err)
	}
	if le.Key != key || le.Remote != remote || le.Msg != cause {
		t.Errorf("%s: LoadError{Key: %q, Remote: %v, Msg: %q}, want {%q, %v, %q}", who, le.Key, le.Remote, le.Msg, key, remote, cause)
	}
	msg := err.Error()
	if n := strings.Count(msg, "load failed"); n != 1 {
		t.Errorf("%s: %q says \"load failed\" %d times, want once", who, msg, n)
	}
	if n := strings.Count(msg, cause); cause != "" && n != 1 {
		t.Errorf("%s: %q says the cause %q %d times, want once", who, msg, cause, n)
	}
	if !strings.Contains(msg, fmt.Sprintf("%q", key)) {
		t.Errorf("%s: %q does not name the key %q", who, msg, key)
	}
	return le
}

// failingLeader makes c lead key with a loader that blocks until the
// returned release is called, then fails with cause. done receives the
// leader's error.
func failingLeader(t *testing.T, c *Cache, key string, cause error) (release func(), done <-chan error) {
	t.Helper()
	gate, entered, res := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), key, time.Minute, func(context.Context) ([]byte, error) {
			close(entered)
			<-gate
			return nil, cause
		})
		res <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the leader's loader did not start")
	}
	return func() { close(gate) }, res
}

func recvOne[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: no result", what)
		panic("unreachable")
	}
}

// GetMany: a key another instance fails is a remote *LoadError in the
// *ManyError; a key this instance's loader fails is a local one that
// unwraps to the loader's error.
func TestLoadErrorGetMany(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	b := newTestCache(t, srv.Client(t), nil)
	release, leaderDone := failingLeader(t, a, "k1", errDB)

	errLocal := errors.New("shard 7 down")
	res := make(chan error, 1)
	go func() {
		_, err := b.GetMany(context.Background(), []string{"k1", "k2"}, time.Minute, func(_ context.Context, keys []string) (map[string][]byte, error) {
			return nil, &ManyError{Errs: map[string]error{"k2": fmt.Errorf("load: %w", errLocal)}}
		})
		res <- err
	}()
	waitFor(t, 10*time.Second, "b to follow k1", func() bool { return b.Stats().Waits == 1 })
	release()
	checkLoadError(t, "a's leader", recvOne(t, "leader", leaderDone), "k1", errDB.Error(), false)

	err := recvOne(t, "GetMany", res)
	var me *ManyError
	if !errors.As(err, &me) || len(me.Errs) != 2 {
		t.Fatalf("GetMany: %v, want a *ManyError for k1 and k2", err)
	}
	if le := checkLoadError(t, "k1 (followed)", me.Errs["k1"], "k1", errDB.Error(), true); le != nil && le.Err != nil {
		t.Errorf("k1: Err = %v, want nil in another instance", le.Err)
	}
	checkLoadError(t, "k2 (led)", me.Errs["k2"], "k2", "load: shard 7 down", false)
	if !errors.Is(me.Errs["k2"], errLocal) || !errors.Is(err, errLocal) {
		t.Errorf("k2: %v does not unwrap to the loader's error", me.Errs["k2"])
	}
	if errors.Is(me.Errs["k1"], errDB) {
		t.Errorf("k1: %v unwraps to errDB in an instance that did not run the loader", me.Errs["k1"])
	}
}

// Begin and Fill: Abort's cause reaches a waiting Get in another instance
// as a remote *LoadError with the cause once, and a local Begin waiter as
// one that unwraps to it; a Begin follower does not retry, even with
// RetryFailedLoad (its caller decides: the middleware retries itself).
func TestLoadErrorBeginAndFill(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	b := newTestCache(t, srv.Client(t), nil)
	c := newTestCache(t, srv.Client(t), &Options{RetryFailedLoad: true})
	ctx := context.Background()
	const key = "page"
	_, fill, err := a.Begin(ctx, key, time.Minute, nil)
	if fill == nil {
		t.Fatalf("a.Begin: no Fill (%v)", err)
	}
	type result struct{ err error }
	local, remoteGet, remoteBegin := make(chan result, 1), make(chan result, 1), make(chan result, 1)
	go func() {
		_, f, err := a.Begin(ctx, key, time.Minute, nil)
		if f != nil {
			f.Abort(nil)
		}
		local <- result{err}
	}()
	var calls atomic.Int64
	go func() {
		_, err := b.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) { calls.Add(1); return []byte("v"), nil })
		remoteGet <- result{err}
	}()
	go func() {
		_, f, err := c.Begin(ctx, key, time.Minute, nil)
		if f != nil {
			f.Commit([]byte("v"), time.Minute, 0)
			err = errors.New("c's Begin was handed a Fill: it retried")
		}
		remoteBegin <- result{err}
	}()
	waitFor(t, 10*time.Second, "b and c to follow, a's second Begin to wait", func() bool {
		a.fillMu.Lock()
		defer a.fillMu.Unlock()
		lf := a.fills[key]
		return b.Stats().Waits == 1 && c.Stats().Waits == 1 && lf != nil && lf.waiters == 1
	})
	fill.Abort(fmt.Errorf("render: %w", errDB))

	const cause = "render: db: connection reset"
	r := recvOne(t, "local Begin", local)
	checkLoadError(t, "a's Begin waiter", r.err, key, cause, false)
	if !errors.Is(r.err, errDB) {
		t.Errorf("a's Begin waiter: %v does not unwrap to errDB", r.err)
	}
	checkLoadError(t, "b's Get", recvOne(t, "b's Get", remoteGet).err, key, cause, true)
	checkLoadError(t, "c's Begin", recvOne(t, "c's Begin", remoteBegin).err, key, cause, true)
	if n := calls.Load(); n != 0 {
		t.Errorf("b's loader ran %d times, want 0 (RetryFailedLoad is off there)", n)
	}
	if s := c.Stats(); s.LoadRetries != 0 {
		t.Errorf("c: LoadRetries = %d, want 0 (Begin does not retry)", s.LoadRetries)
	}
}

// A follower that cannot hear the failure message learns it from the
// failure marker: a remote *LoadError; with RetryFailedLoad it retries
// through the marker too, takes the lease and loads (one more call).
func TestLoadErrorFromFailureMarker(t *testing.T) {
	t.Parallel()
	for _, retry := range []bool{false, true} {
		t.Run(fmt.Sprintf("retry=%v", retry), func(t *testing.T) {
			srv := redistest.Start(t)
			const lease = 2 * time.Second
			opt := &Options{MinLease: lease, MaxLease: lease, DefaultLease: lease, WaitTimeout: 5 * lease,
				PollMin: 20 * time.Millisecond, PollMax: 50 * time.Millisecond, RetryFailedLoad: retry}
			leader := newTestCache(t, srv.Client(t), opt)
			dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
			t.Cleanup(func() { dead.Close() })
			follower := newTestCache(t, noPubSub{Client: srv.Client(t), dead: dead}, opt)
			release, leaderDone := failingLeader(t, leader, "k", errDB)
			var calls atomic.Int64
			res := make(chan error, 1)
			go func() {
				v, err := follower.Get(context.Background(), "k", time.Minute, func(context.Context) ([]byte, error) {
					calls.Add(1)
					return []byte("second"), nil
				})
				if err == nil && string(v) != "second" {
					err = fmt.Errorf("value %q", v)
				}
				res <- err
			}()
			waitFor(t, 5*time.Second, "the follower to wait", func() bool { return follower.Stats().Waits == 1 })
			release()
			recvOne(t, "leader", leaderDone)
			err := recvOne(t, "follower", res)
			if retry {
				if err != nil || calls.Load() != 1 {
					t.Errorf("follower: %v after %d calls of its loader, want the retry's value after 1", err, calls.Load())
				}
				if s := follower.Stats(); s.LoadRetries != 1 || s.Notified != 0 {
					t.Errorf("follower Stats: LoadRetries %d, Notified %d; want 1 retry, found by the marker", s.LoadRetries, s.Notified)
				}
				return
			}
			checkLoadError(t, "follower", err, "k", errDB.Error(), true)
			if n := calls.Load(); n != 0 {
				t.Errorf("the follower's loader ran %d times, want 0", n)
			}
		})
	}
}

// A follower whose retry finds, by the marker, that a newer leader failed
// while it was not listening does not load a third time: leader A fails,
// follower B (pub/sub) retries and fails, follower C (no pub/sub, polls)
// gets B's failure. The source is called twice.
func TestRetryFailedLoadMarkerOfNewerLeader(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const lease = 2 * time.Second
	opt := func(poll time.Duration) *Options {
		return &Options{MinLease: lease, MaxLease: lease, DefaultLease: lease, WaitTimeout: 5 * lease,
			PollMin: poll, PollMax: poll, RetryFailedLoad: true}
	}
	a := newTestCache(t, srv.Client(t), opt(50*time.Millisecond))
	b := newTestCache(t, srv.Client(t), opt(50*time.Millisecond))
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { dead.Close() })
	// C polls slowly (it cannot hear messages): B's retry ends first.
	c := newTestCache(t, noPubSub{Client: srv.Client(t), dead: dead}, opt(600*time.Millisecond))

	var callsB, callsC atomic.Int64
	failing := func(n *atomic.Int64) LoadFunc {
		return func(context.Context) ([]byte, error) {
			n.Add(1)
			return nil, errDB
		}
	}
	release, leaderDone := failingLeader(t, a, "k", errDB)
	resB, resC := make(chan error, 1), make(chan error, 1)
	go func() { _, err := b.Get(context.Background(), "k", time.Minute, failing(&callsB)); resB <- err }()
	go func() { _, err := c.Get(context.Background(), "k", time.Minute, failing(&callsC)); resC <- err }()
	waitFor(t, 5*time.Second, "b and c to follow", func() bool { return b.Stats().Waits == 1 && c.Stats().Waits == 1 })
	release()
	recvOne(t, "a", leaderDone)
	errB, errC := recvOne(t, "b", resB), recvOne(t, "c", resC)
	if n := 1 + callsB.Load() + callsC.Load(); n != 2 {
		t.Errorf("source calls = %d (b %d, c %d), want 2: a's and one retry", n, callsB.Load(), callsC.Load())
	}
	if callsC.Load() != 0 {
		// c looked in the millisecond between a's failure and b's
		// ACQUIRE and led the retry itself: legal, but not the path
		// this test is about.
		t.Logf("c led the retry (b %v, c %v); the newer-marker path was not taken this run", errB, errC)
		return
	}
	checkLoadError(t, "b (led the retry)", errB, "k", errDB.Error(), false)
	le := checkLoadError(t, "c", errC, "k", errDB.Error(), true)
	if le != nil && errors.Is(le, errDB) {
		t.Errorf("c: %v unwraps to errDB in an instance that did not run the loader", le)
	}
	// c found b's failure by the marker: at once (the lease free, b's
	// fence newer than a's: no retry of its own), or after retrying on
	// a's marker seen while b held the lease (its retry then found b's).
	if s := c.Stats(); s.Notified != 0 {
		t.Errorf("c Stats: Notified %d, want 0 (it has no pub/sub)", s.Notified)
	} else {
		t.Logf("c: LoadRetries %d", s.LoadRetries)
	}
}

// Failure messages of an earlier version (the whole error, key and prefix
// included; a panic with its stack) and malformed ones reach a waiting
// follower as a remote *LoadError with the cause once, never a crash.
func TestLoadErrorLegacyFailureMessages(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	a := newTestCache(t, rdb, nil)
	b := newTestCache(t, srv.Client(t), nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name, text string
		kind       byte
		wantMsg    string
		panic      bool
	}{
		{"error", `herd: load failed: "%s": db: connection reset`, 'e', "db: connection reset", false},
		{"panic", "herd: load failed: \"%s\": herd: loader panicked: boom\n\ngoroutine 7 [running]:\nmain.f()", 'p', "herd: loader panicked: boom", true},
		{"new-format", "db: connection reset", 'e', "db: connection reset", false},
		{"unknown-kind", "something odd", 'z', "something odd", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "legacy-" + tc.name
			_, fill, _ := a.Begin(ctx, key, time.Minute, nil)
			if fill == nil {
				t.Fatal("a.Begin: no Fill")
			}
			defer fill.Handover()
			res := make(chan error, 1)
			go func() {
				_, err := b.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) {
					return nil, errors.New("b's loader ran")
				})
				res <- err
			}()
			keys, _ := makeKeys(DefaultPrefix, key)
			waitFor(t, 10*time.Second, "b to subscribe", func() bool {
				m, _ := rdb.PubSubNumSub(ctx, keys.Channel).Result()
				return m[keys.Channel] == 1
			})
			text := tc.text
			if strings.Contains(text, "%s") {
				text = fmt.Sprintf(text, key)
			}
			msg := failMessage(tc.kind, fill.lease, text) // the format is unchanged
			if err := rdb.Publish(ctx, keys.Channel, msg).Err(); err != nil {
				t.Fatal(err)
			}
			err := recvOne(t, "b", res)
			le := checkLoadError(t, "b", err, key, tc.wantMsg, true)
			var pe *PanicError
			if got := errors.As(err, &pe); got != tc.panic || (got && (!pe.Remote || pe.Value != "boom")) {
				t.Errorf("b: *PanicError %+v (found %v), want found %v with Value boom, Remote", pe, got, tc.panic)
			}
			if le != nil && strings.Contains(le.Error(), "goroutine 7") {
				t.Errorf("b: %q carries the old process's stack", le.Error())
			}
		})
	}
	t.Run("malformed", func(t *testing.T) {
		for _, msg := range []string{"F", "Fe", "Fe12", "Fp|"} {
			if _, _, k := parseFailMessage(msg); k != "" && msg != "Fe12" {
				t.Errorf("parseFailMessage(%q) text %q", msg, k)
			}
			kind, _, text := parseFailMessage(msg)
			if e := remoteLoadError("k", kind, text); !errors.Is(e, ErrLoadFailed) || e.Key != "k" {
				t.Errorf("remoteLoadError(%q) = %v", msg, e)
			}
		}
	})
}

// NoShare: the leader's callers get the error; a follower in another
// instance does not get it, retries once (RetryFailedLoad off), and with a
// source that keeps failing with NoShare gets a LoadError that says the
// error was not shared, after 2 calls in all.
func TestNoShareInProcess(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	b := newTestCache(t, srv.Client(t), nil)
	c := newTestCache(t, srv.Client(t), nil)
	release, leaderDone := failingLeader(t, a, "k", NoShare(errDB))
	var calls atomic.Int64
	gate := make(chan struct{})
	load := func(context.Context) ([]byte, error) {
		calls.Add(1)
		<-gate // one retry leader at a time: the other waits on it
		return nil, NoShare(fmt.Errorf("tenant key refused: %w", errDB))
	}
	resB, resC := make(chan error, 1), make(chan error, 1)
	go func() { _, err := b.Get(context.Background(), "k", time.Minute, load); resB <- err }()
	go func() { _, err := c.Get(context.Background(), "k", time.Minute, load); resC <- err }()
	waitFor(t, 5*time.Second, "b and c to follow", func() bool { return b.Stats().Waits == 1 && c.Stats().Waits == 1 })
	release()
	le := checkLoadError(t, "a (leader)", recvOne(t, "a", leaderDone), "k", errDB.Error(), false)
	if le != nil && !errors.Is(le, errDB) {
		t.Errorf("a: %v does not unwrap to errDB", le)
	}
	waitFor(t, 5*time.Second, "the retry to start", func() bool { return calls.Load() == 1 })
	close(gate)
	errB, errC := recvOne(t, "b", resB), recvOne(t, "c", resC)
	// One of b and c led the retry (its own error, local); the other got
	// a LoadError that says the error was not shared.
	local, remote := errB, errC
	if errors.Is(errC, errDB) {
		local, remote = errC, errB
	}
	checkLoadError(t, "retry leader", local, "k", "tenant key refused: db: connection reset", false)
	checkLoadError(t, "retry follower", remote, "k", notSharedText, true)
	if strings.Contains(remote.Error(), "db:") || strings.Contains(remote.Error(), "tenant") {
		t.Errorf("retry follower: %q carries the unshared error's text", remote.Error())
	}
	if n := calls.Load() + 1; n != 2 {
		t.Errorf("source calls = %d, want 2", n)
	}
	if s := b.Stats().LoadRetries + c.Stats().LoadRetries; s < 1 || s > 2 {
		t.Errorf("LoadRetries b+c = %d, want 1 or 2 (each follower flight retries at most once)", s)
	}
}

// A batch's error names each failed key once: the *LoadError of a key is
// listed without its own "herd: load failed: <key>" prefix, a remote one
// says where it failed, and any other error is listed as it is.
func TestManyErrorSaysKeyOnce(t *testing.T) {
	t.Parallel()
	e := &ManyError{Errs: map[string]error{
		"a": &LoadError{Key: "a", Msg: "db: connection reset", Err: errDB},
		"b": &LoadError{Key: "b", Msg: "db: connection reset", Remote: true},
		"c": errors.New("row c broken"),
	}}
	want := `herd: 3 keys failed: "a": load failed: db: connection reset; "b": load failed in another process: db: connection reset; "c": row c broken`
	if got := e.Error(); got != want {
		t.Errorf("ManyError text\n got %s\nwant %s", got, want)
	}
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), nil)
	_, err := c.GetMany(context.Background(), []string{"x"}, time.Minute, func(context.Context, []string) (map[string][]byte, error) {
		return nil, errDB
	})
	if got := fmt.Sprint(err); strings.Count(got, `"x"`) != 1 || !strings.Contains(got, errDB.Error()) {
		t.Errorf("GetMany error %q: want the key once and the cause", got)
	}
}

// Options.LoadTimeout's doc: "The loader's context is detached from
// every caller's ... and ends after LoadTimeout or MaxHold, whichever is
// shorter, or on Close." A loader run without a lease (Redis down:
// fail-open) is one run of a loader too; its context must end at
// MaxHold when MaxHold is the shorter. The leader's run honours it
// (flight.go lead); the local run does not.
func TestLocalLoadContextEndsAtMaxHoldWhenShorter(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there: Redis is down
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 100 * time.Millisecond,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	const maxHold = 200 * time.Millisecond
	c := newTestCache(t, rdb, &Options{LoadTimeout: time.Minute, MaxHold: maxHold})
	for _, name := range []string{"Get", "GetMany"} {
		var left time.Duration
		var had bool
		probe := func(ctx context.Context) {
			var dl time.Time
			dl, had = ctx.Deadline()
			left = time.Until(dl)
		}
		switch name {
		case "Get":
			if _, err := c.Get(context.Background(), testKey(t)+name, time.Minute, func(ctx context.Context) ([]byte, error) {
				probe(ctx)
				return []byte("v"), nil
			}); err != nil {
				t.Fatalf("Get with Redis down: %v", err)
			}
		case "GetMany":
			if _, err := c.GetMany(context.Background(), []string{testKey(t) + name}, time.Minute, func(ctx context.Context, keys []string) (map[string][]byte, error) {
				probe(ctx)
				return map[string][]byte{keys[0]: []byte("v")}, nil
			}); err != nil {
				t.Fatalf("GetMany with Redis down: %v", err)
			}
		}
		if st := c.Stats(); st.LocalLoads == 0 {
			t.Fatalf("%s: no local load (stats %+v)", name, st)
		}
		if !had || left > maxHold {
			t.Errorf("%s's fail-open loader ran with %v left on its ctx (deadline set: %v), want at most MaxHold %v (LoadTimeout 1m): the doc says whichever is shorter", name, left.Round(time.Millisecond), had, maxHold)
		}
	}
}
