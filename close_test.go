package herd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/faultproxy"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// Defect 8 of issue 12: every call after Close returns ErrClosed. Leases
// handed out before Close stay their holders': Extend and Release work.

func TestLockerClosedRefusesCalls(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	l := NewLocker(rdb, nil)
	held, err := l.TryAcquire(ctx, "held", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if lease, err := l.TryAcquire(ctx, "free", time.Minute); !errors.Is(err, ErrClosed) || lease != nil {
		t.Errorf("TryAcquire of a free key after Close = (%v, %v), want ErrClosed", lease, err)
	}
	if lease, err := l.Acquire(ctx, "free", time.Minute); !errors.Is(err, ErrClosed) || lease != nil {
		t.Errorf("Acquire of a free key after Close = (%v, %v), want ErrClosed", lease, err)
	}
	if n := rdb.Exists(ctx, mustKeys(t, "free").Lease).Val(); n != 0 {
		t.Errorf("a call after Close took a lease in Redis")
	}
	// The lease handed out before Close is still its holder's.
	if err := held.Extend(ctx, 2*time.Minute); err != nil {
		t.Errorf("Extend after Close: %v, want nil", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Errorf("Release after Close: %v, want nil", err)
	}
	if n := rdb.Exists(ctx, mustKeys(t, "held").Lease).Val(); n != 0 {
		t.Errorf("Release after Close left the lease in Redis")
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestLockerCloseEndsWaitingAcquire(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	holder := newTestLocker(t, rdb, nil)
	held, err := holder.TryAcquire(ctx, "k", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	waiting := make(chan struct{}, 1)
	l := NewLocker(rdb, &LockerOptions{MaxWait: time.Minute, Observer: &Observer{
		Lease: func(_ string, ev LeaseEvent) {
			if ev == LeaseContended {
				select {
				case waiting <- struct{}{}:
				default:
				}
			}
		},
	}})
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(wctx, "k", time.Minute)
		if lease != nil {
			_ = lease.Release(ctx)
		}
		done <- err
	}()
	<-waiting
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire waiting when Close was called returned %v, want ErrClosed", err)
	}
}

func TestCacheClosedRefusesCalls(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	c := New(rdb, nil)
	if err := c.Set(ctx, "k", []byte("before"), time.Minute); err != nil {
		t.Fatal(err)
	}
	_, fill, err := c.Begin(ctx, "filled", time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin = (%v, %v), want a Fill", fill, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close aborted the open Fill and gave its lease back.
	if err := fill.Commit([]byte("late"), time.Minute, 0); err != nil {
		t.Errorf("Commit of a Fill Close aborted: %v, want nil (a no-op)", err)
	}
	if n := rdb.Exists(ctx, mustKeys(t, "filled").Value, mustKeys(t, "filled").Lease).Val(); n != 0 {
		t.Errorf("after Close and a late Commit, %d of the Fill's value and lease keys exist, want 0", n)
	}
	loads := 0
	load := func(context.Context) ([]byte, error) { loads++; return []byte("v"), nil }
	if err := c.Set(ctx, "k", []byte("after"), time.Minute); !errors.Is(err, ErrClosed) {
		t.Errorf("Set after Close: got %v, want ErrClosed", err)
	}
	if err := c.Invalidate(ctx, "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("Invalidate after Close: got %v, want ErrClosed", err)
	}
	if err := c.InvalidateSoft(ctx, "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("InvalidateSoft after Close: got %v, want ErrClosed", err)
	}
	if _, _, err := c.Peek(ctx, "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("Peek after Close: got %v, want ErrClosed", err)
	}
	if err := c.Set(ctx, "k", []byte("after"), time.Minute, "t"); !errors.Is(err, ErrClosed) {
		t.Errorf("tagged Set after Close: got %v, want ErrClosed", err)
	}
	if err := c.InvalidateTag(ctx, "t"); !errors.Is(err, ErrClosed) {
		t.Errorf("InvalidateTag after Close: got %v, want ErrClosed", err)
	}
	if _, err := c.Get(ctx, "k", time.Minute, load); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close: got %v, want ErrClosed", err)
	}
	if _, err := Fetch(ctx, c, "k", time.Minute, func(context.Context) (string, error) { return "v", nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("Fetch after Close: got %v, want ErrClosed", err)
	}
	if _, _, err := c.Begin(ctx, "k", time.Minute, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Begin after Close: got %v, want ErrClosed", err)
	}
	if loads != 0 {
		t.Errorf("a loader ran %d times after Close", loads)
	}
	// Neither Set nor Invalidate touched Redis.
	b, err := rdb.Get(ctx, mustKeys(t, "k").Value).Bytes()
	env, ok := wire.DecodeEnvelope(b)
	if err != nil || !ok || string(env.Payload) != "before" {
		t.Errorf("the value after Close is (%q, %v), want the one Set before Close", env.Payload, err)
	}
}

// Close stops every goroutine the Cache started, including a rebuild in
// flight (its loader's context ends), and later calls get ErrClosed.
func TestCacheClose(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	baseline := goleak.IgnoreCurrent()
	c := New(rdb, nil)
	ctx := context.Background()
	var calls atomic.Int64
	if _, err := c.Get(ctx, "warm", time.Minute, constLoader(&calls, "v")); err != nil {
		t.Fatal(err)
	}
	// A follower keeps the pub/sub connection busy; a leader is loading.
	g := newGatedLoader("never")
	leaderErr := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "inflight", time.Minute, g.load)
		leaderErr <- err
	}()
	g.waitEntered(t)
	other := New(rdb, nil)
	followerErr := make(chan error, 1)
	go func() {
		_, err := other.Get(ctx, "inflight", time.Minute, g.load)
		followerErr <- err
	}()
	waitFor(t, 5*time.Second, "the follower to wait", func() bool { return other.Stats().Waits == 1 })

	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-leaderErr; err == nil {
		t.Errorf("the in-flight Get returned no error after Close")
	}
	if got := g.ctxErr.Load(); got != context.Canceled.Error() {
		t.Errorf("loader ctx.Err() after Close = %v, want context canceled", got)
	}
	if _, err := c.Get(ctx, "after", time.Minute, constLoader(&calls, "v")); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close: got %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// The closed leader handed its lease back, so the other cache takes
	// over at once and loads.
	close(g.gate)
	select {
	case err := <-followerErr:
		if err != nil {
			t.Errorf("the other cache's follower: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the other cache's follower did not finish")
	}
	if s := other.Stats(); s.Takeovers != 1 {
		t.Errorf("other cache Stats.Takeovers = %d, want 1", s.Takeovers)
	}
	if err := other.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	goleak.VerifyNone(t, baseline)
}

// TestCloseNeverHangsOnABlackholedRedis attacks Close's promise (docs/guarantees.md
// "Failure behaviour", issue 12 item 2: "Close never hangs; no goroutine
// leaks") when Redis vanishes without closing anything: a Cache with a
// follower waiting (pub/sub subscribed) and a Locker with an Acquire
// waiting are closed after the link is blackholed (and, as a control, on a
// healthy link); the clients' timeouts
// are 20 s. Close must return within 5 s, the waiting calls must end, and
// no goroutine may outlive them.
func TestCloseNeverHangsOnABlackholedRedis(t *testing.T) {
	for _, bh := range []bool{false, true} {
		t.Run(map[bool]string{false: "healthy", true: "blackholed"}[bh], func(t *testing.T) { testCloseNeverHangs(t, bh) })
	}
}

// TestCacheCloseDoesNotHangOnACommitToABlackholedRedis attacks Close's
// promise ("Close cancels the rebuilds in flight ..., waits for them";
// issue 12: "Close never hangs") when the rebuild's COMMIT is on its way
// to a Redis that vanished without closing anything (blackhole). A sent
// command cannot be taken back, so Close waits for it, but no longer than
// the client's timeouts (3 s here, as herd asks for short ones); the
// leader's caller leaves at once with ErrClosed.
func TestCacheCloseDoesNotHangOnACommitToABlackholedRedis(t *testing.T) {
	r := newFaultRig(t)
	const clientTimeout = 3 * time.Second
	to := timeouts{dial: clientTimeout, read: clientTimeout, write: clientTimeout, retries: -1}
	c := r.cache(r.client(to), psOptions("bhc"))
	started, release := make(chan struct{}, 1), make(chan struct{})
	got := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), "bhc", time.Minute, gatedLoad(started, release, []byte("v")))
		got <- err
	}()
	<-started
	r.proxy.SetBlackhole(true)
	close(release) // the COMMIT goes into the blackhole
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case err := <-got:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("the leader's Get after Close = %v, want ErrClosed", err)
		}
	case <-time.After(clientTimeout / 2):
		t.Error("the leader's Get still running well after Close began")
		<-got
	}
	select {
	case <-closed:
	case <-time.After(3 * clientTimeout):
		<-closed
		t.Errorf("Cache.Close with a COMMIT in a blackhole took %v, past the client's %v timeouts", time.Since(start).Round(time.Millisecond), clientTimeout)
	}
	r.proxy.SetBlackhole(false)
	r.finish()
}

// TestBeginCloseWhileLookupOnSlowLink (claim 3): Begins whose callers
// left (deadline) while their lookups are held on a slow link, then Close
// at once, while the lookups are still on the wire: Close waits for them,
// the Fills they win are given up, nothing counts as a failed load and no
// goroutine outlives Close (goleak).
func TestBeginCloseWhileLookupOnSlowLink(t *testing.T) {
	r := newFaultRig(t)
	c := r.cache(r.client(timeouts{read: 10 * time.Second}), attackOptions(Options{}))
	const late = 600 * time.Millisecond
	r.proxy.SetLatency(faultproxy.Downstream, late)
	for i := range 4 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		_, _, err := c.Begin(ctx, "close-slow-"+strconv.Itoa(i%2), time.Minute, nil)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Begin = %v, want DeadlineExceeded", err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.LoadErrors != 0 {
		t.Errorf("LoadErrors = %d, want 0", s.LoadErrors)
	}
	r.proxy.SetLatency(faultproxy.Downstream, 0)
	r.finish()
}

// Close aborts open Fills: their watchdogs stop and another cache takes
// the key over at once.
func TestFillCloseAbortsOpenFills(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := New(srv.Client(t), nil)
	other := newTestCache(t, srv.Client(t), nil)
	ctx := context.Background()
	_, fill, err := c.Begin(ctx, "k", time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatal(err)
	}
	res := make(chan *Fill, 1)
	go func() {
		_, f, _ := other.Begin(ctx, "k", time.Minute, nil)
		res <- f
	}()
	waitFor(t, 5*time.Second, "the other cache to follow", func() bool { return other.Stats().Waits == 1 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-res:
		if f == nil || !f.Leased() {
			t.Fatalf("the other cache got %v, want the lease (a leased Fill)", f)
		}
		f.Abort(nil)
	case <-time.After(5 * time.Second):
		t.Fatal("the other cache was not handed the key after Close")
	}
	fill.Commit([]byte("late"), time.Minute, 0) // after Close: no effect, no panic
}

// The pooled hitCall under churn: callers whose ctx ends at random
// moments, on many keys, racing Close. Every answer is its key's own
// value (a hitCall reused while a goroutine still wrote to it would hand
// one caller another key's reply), no panic, no race, no leak.
func TestHitPoolChurnAndCloseRace(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	for round := range 3 {
		c := New(rdb, nil)
		bg := context.Background()
		for k := range 16 {
			if err := c.Set(bg, fmt.Sprint("churn-", k), []byte(fmt.Sprint("value-", k)), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		var served atomic.Int64
		for g := range 16 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(round), uint64(g)))
				for i := range 300 {
					k := rng.IntN(16)
					ctx, cancel := context.WithTimeout(bg, time.Duration(rng.IntN(300))*time.Microsecond)
					if i%3 == 0 {
						cancel()
						ctx, cancel = context.WithCancel(bg)
						go cancel()
					}
					v, err := c.Get(ctx, fmt.Sprint("churn-", k), time.Hour, func(context.Context) ([]byte, error) {
						return []byte(fmt.Sprint("value-", k)), nil
					})
					cancel()
					switch {
					case err == nil:
						served.Add(1)
						if want := fmt.Sprint("value-", k); string(v) != want {
							t.Errorf("Get of churn-%d = %q, want %q", k, v, want)
						}
					case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrClosed):
					default:
						t.Errorf("Get: %v", err)
					}
				}
			})
		}
		time.Sleep(time.Duration(20+round*20) * time.Millisecond)
		c.Close()
		wg.Wait()
		if _, err := c.Get(context.Background(), "churn-0", time.Hour, constLoader(new(atomic.Int64), "x")); !errors.Is(err, ErrClosed) {
			t.Errorf("Get after Close: %v, want ErrClosed", err)
		}
		t.Logf("round %d: %d answers", round, served.Load())
	}
}

// Close waits for the GETs it handed off, and leaves no goroutine: the
// hand-off of a caller that left on a latency-stalled Redis still runs
// when Close begins.
func TestHitCloseWaitsForHandedOffGETs(t *testing.T) {
	r := newFaultRig(t)
	to := timeouts{dial: 2 * time.Second, read: 2 * time.Second, write: 2 * time.Second, retries: -1}
	rdb := r.client(to)
	c := r.cache(rdb, &Options{Prefix: "wait"})
	bg := context.Background()
	if err := c.Set(bg, "w", []byte("stored"), time.Hour); err != nil {
		t.Fatal(err)
	}
	r.proxy.SetLatency(faultproxy.Downstream, 500*time.Millisecond)
	for range 8 {
		ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
		if _, err := c.Get(ctx, "w", time.Hour, constLoader(new(atomic.Int64), "x")); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Get on a slow Redis past its deadline: %v", err)
		}
		cancel()
	}
	c.Close()
	buf := make([]byte, 1<<20)
	if st := string(buf[:runtime.Stack(buf, true)]); strings.Contains(st, "(*hitCall).run") {
		t.Errorf("a handed-off GET still runs after Close returned:\n%s", st)
	}
	r.proxy.SetLatency(faultproxy.Downstream, 0)
	r.finish()
}

// Close while a batch settles: the loader has returned the value of one
// key and failed the other; the failed key's release is on its way to
// Redis when Close is called. The loaded key's COMMIT waits in the
// batch's pipeline for its sibling and is sent after Close cancelled the
// Cache's context. Close waits for the rebuilds in flight; once it
// returned, no lease of this Cache may be left behind in Redis, blocking
// the key for the other processes for a lease (a follower elsewhere waits
// it out, for a value that was loaded). Before the fix the COMMIT was
// sent with the cancelled context, so go-redis never sent it: the value
// was lost and the lease held until it expired.
func TestGetManyCloseWhileCommitting(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	h := &closeHook{mark: "atk-close-boom", entered: make(chan struct{}), release: make(chan struct{})}
	rdb := srv.Client(t)
	crdb := srv.Client(t)
	crdb.AddHook(h)
	ctx := context.Background()
	c := New(crdb, atkLeaseOpts(30*time.Second))
	defer c.Close()
	good, bad := t.Name()+"/good", t.Name()+"/bad"
	done := make(chan error, 1)
	go func() {
		_, err := c.GetMany(ctx, []string{good, bad}, time.Minute, func(context.Context, []string) (map[string][]byte, error) {
			return map[string][]byte{good: []byte("v-good")},
				&ManyError{Errs: map[string]error{bad: errors.New("atk-close-boom")}}
		})
		done <- err
	}()
	select {
	case <-h.entered: // bad's release, with its failure message, is held
	case <-time.After(10 * time.Second):
		t.Fatal("the failed key's release was not sent")
	}
	closed := make(chan struct{})
	go func() {
		c.Close()
		close(closed)
	}()
	waitFor(t, 10*time.Second, "Close to cancel the Cache's context", func() bool { return c.ctx.Err() != nil })
	close(h.release)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	<-done
	for _, k := range []string{good, bad} {
		if atkLeaseHeld(t, rdb, k) {
			t.Errorf("after Close the lease of %q is still held in Redis", k)
		}
	}
}

// Close while a batch loads: the caller gets ErrClosed for the keys still
// loading, the loader's ctx ends, Close waits for the batch, and a later
// GetMany returns ErrClosed without touching Redis.
func TestGetManyClose(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := New(srv.Client(t), nil)
	keys := manyKeys(t, 2)
	l := newManyLoader()
	l.gate = make(chan struct{}) // never opened: the loader ends with its ctx
	done := make(chan error, 1)
	go func() {
		_, err := c.GetMany(context.Background(), keys, time.Minute, l.load)
		done <- err
	}()
	l.waitEntered(t)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	err := <-done
	var me *ManyError
	if !errors.As(err, &me) || len(me.Errs) != 2 || !errors.Is(err, ErrClosed) {
		t.Errorf("err = %v, want ErrClosed for both keys", err)
	}
	if _, err := c.GetMany(context.Background(), keys, time.Minute, l.load); !errors.Is(err, ErrClosed) || errors.As(err, &me) {
		t.Errorf("GetMany after Close: %v, want ErrClosed alone", err)
	}
}

// Close with a hit's GET under way in a caller's goroutine (InlineHits,
// or a ctx that cannot end) on a stalled Redis: Close does not wait for
// it (the caller's goroutine is not the Cache's), and the caller returns
// ErrClosed or its value when the GET ends. The Close doc says so.
func TestInlineHitsClose(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.ReadTimeout = 5 * time.Second; o.MaxRetries = -1 })
	sent := make(chan struct{}, 4)
	rdb.AddHook(getSignal{sent})
	c := New(rdb, &Options{InlineHits: true})
	bg := context.Background()
	if err := c.Set(bg, "k", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	for len(sent) > 0 {
		<-sent
	}
	srv.Pause(t)
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume(t)
		}
	}()
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "k", time.Hour, noLoad(t))
		got <- err
	}()
	<-sent
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Fatal("Close waited for a caller's inline GET on a stalled Redis")
	}
	srv.Resume(t)
	resumed = true
	if err := <-got; err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("the inline Get after Close: %v, want its value or ErrClosed", err)
	}
}

// Close stops the near cache's goroutines; a Get after it is ErrClosed
// even with a near copy; a caller that leaves a slow fill gets ctx.Err()
// at once, and the fill still answers the others.
func TestNearCloseAndCancel(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	baseline := goleak.IgnoreCurrent()
	b := New(srv.Client(t), &Options{Near: NearOptions{MaxEntries: 10, Staleness: nearTestStaleness}})
	waitServing(t, b)
	if err := b.Set(ctx, "near-close", []byte("v"), time.Minute); err != nil {
		t.Fatal(err)
	}

	fill := newGate()
	setHooks(b, &nearHooks{beforeFill: func(string) { fill.pass() }})
	fill.close()
	cctx, cancel := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() {
		_, err := b.Get(cctx, "near-close", time.Minute, noLoad(t))
		left <- err
	}()
	waitFor(t, 5*time.Second, "the fill", func() bool { return fill.passed.Load() == 1 })
	other := make(chan string, 1)
	go func() {
		v, _ := b.Get(ctx, "near-close", time.Minute, noLoad(t))
		other <- string(v)
	}()
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that left: %v", err)
	}
	fill.release()
	if got := <-other; got != "v" {
		t.Fatalf("the caller that stayed: %q", got)
	}
	setHooks(b, nil)
	warm(t, b, "near-close", "v")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, "near-close", time.Minute, noLoad(t)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	goleak.VerifyNone(t, baseline)
}

// TestPeekLeavesOnCtxAndClose: with Redis paused (each GET waits for the
// client's 10 s ReadTimeout), a Peek returns its ctx's error when its
// deadline passes, and a Peek and a Get waiting for their GETs return
// ErrClosed when Close is called (their ctx can end), before any reply.
func TestPeekLeavesOnCtxAndClose(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	// Connections made before the pause: a GET that must dial one would
	// wait in the dial, which does end with its ctx.
	rdb := srv.Client(t, func(o *redis.Options) {
		o.ReadTimeout, o.MaxRetries, o.MinIdleConns = 10*time.Second, -1, 5
	})
	waitFor(t, 10*time.Second, "idle connections", func() bool { return rdb.PoolStats().IdleConns >= 5 })
	gets := make(chan struct{}, 10)
	var replies atomic.Int64
	rdb.AddHook(getHook{gets, &replies})
	c := New(rdb, nil)
	ctx := context.Background()
	if err := c.Set(ctx, "k", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	srv.Pause(t)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			srv.Resume(t)
		}
	})
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, _, err := c.Peek(dctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Peek past its deadline with Redis paused = %v, want context.DeadlineExceeded", err)
	}
	<-gets // the first Peek's GET
	got := make(chan error, 1)
	cctx, stop := context.WithCancel(ctx) // a ctx that can end, never ended here
	defer stop()
	go func() {
		_, _, err := c.Peek(cctx, "k")
		got <- err
	}()
	<-gets // this Peek waits for Redis: Close must end it
	// So must a Get waiting for its hit's GET (the same read, hit.go).
	gotGet := make(chan error, 1)
	go func() {
		_, err := c.Get(cctx, "k", time.Hour, func(context.Context) ([]byte, error) { return []byte("loaded"), nil })
		gotGet <- err
	}()
	<-gets
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	if err := <-got; !errors.Is(err, ErrClosed) {
		t.Errorf("Peek while Close ran = %v, want ErrClosed", err)
	}
	if err := <-gotGet; !errors.Is(err, ErrClosed) {
		t.Errorf("Get while Close ran = %v, want ErrClosed", err)
	}
	if n := replies.Load(); n != 0 {
		t.Errorf("Peek and Get returned after %d GET(s) got their reply (a timeout), want before: they waited for Redis, not for Close", n)
	}
	srv.Resume(t) // Close waits for the GETs already sent
	resumed = true
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// Close stops background refreshes too.
func TestFreshnessCloseStopsRefreshes(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	baseline := goleak.IgnoreCurrent()
	clk := newFakeClock()
	c := withClock(New(rdb, &Options{StaleFor: time.Hour}), clk)
	ctx := context.Background()
	started := make(chan struct{}, 1)
	var calls atomic.Int64
	load := func(ctx context.Context) ([]byte, error) {
		if calls.Add(1) > 1 {
			started <- struct{}{}
			<-ctx.Done() // a refresh that only Close can end
			return nil, ctx.Err()
		}
		return []byte("v"), nil
	}
	if _, err := c.Get(ctx, "k", time.Minute, load); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	c.Get(ctx, "k", time.Minute, load)
	<-started
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, baseline)
}

// Many keys, many callers, contexts ending at random, and Close racing
// them: every answer is its own key's value or an error of the caller's
// ctx or of Close, and Close leaves no reader behind (goleak in
// TestMain).
func TestSharedReadManyKeysUnderChurnAndClose(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := New(rdb, nil)
	bg := context.Background()
	const keys = 8
	for i := range keys {
		if err := c.Set(bg, fmt.Sprint("k", i), []byte(fmt.Sprint("v", i)), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for n := range 200 {
				i := (g + n) % keys
				ctx, cancel := context.WithTimeout(bg, time.Duration(n%5)*100*time.Microsecond+50*time.Microsecond)
				v, err := c.Get(ctx, fmt.Sprint("k", i), time.Hour, noLoad(t))
				cancel()
				switch {
				case err == nil:
					if string(v) != fmt.Sprint("v", i) {
						t.Errorf("k%d: got %q", i, v)
						return
					}
				case errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrClosed):
				default:
					t.Errorf("k%d: %v", i, err)
					return
				}
			}
		})
	}
	time.Sleep(20 * time.Millisecond) // Close in the middle of the churn (a window, not an assertion)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// Close's promise for Begin: a Begin whose hit GET is under way returns
// ErrClosed when Close is called, whatever its ctx and with InlineHits
// too (only a Get or Peek whose ctx cannot end, or any with InlineHits,
// waits for its GET). Begin's hit GET is always a reader's, never sent
// from the caller's goroutine.
func TestBeginLeavesAtCloseWhileItsHitGETWaits(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		opt *Options
		mk  func() (context.Context, context.CancelFunc)
	}{
		"ctx that cannot end": {nil, func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }},
		"InlineHits":          {&Options{InlineHits: true}, func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a, ok := beginAfterClose(t, tc.opt, tc.mk)
			if !ok {
				t.Fatal("Begin whose hit GET was under way did not return within 5s of Close: it waited for the GET")
			}
			if !errors.Is(a.err, ErrClosed) {
				t.Errorf("Begin after Close = (%v, %v, %v), want ErrClosed", a.hit, a.fill, a.err)
			}
		})
	}
}

// blackholeOn turns the proxy's blackhole on when the first EVALSHA of sha
// starts (before go-redis writes it) and closes entered then: the command
// goes into the blackhole, and so does every retry of it.
type blackholeOn struct {
	sha     string
	on      func()
	once    sync.Once
	entered chan struct{}
}

func (h *blackholeOn) see(cmd redis.Cmder) {
	if a := cmd.Args(); len(a) > 1 && cmd.Name() == "evalsha" && a[1] == h.sha {
		h.once.Do(func() {
			h.on()
			close(h.entered)
		})
	}
}

// blackholeRig is a fault rig with a client through the proxy (1 s
// timeouts, default retries) whose first EVALSHA of sha blackholes Redis.
func blackholeRig(t *testing.T, sha string) (*faultRig, *redis.Client, *blackholeOn) {
	r := newFaultRig(t)
	rdb := r.client(timeouts{dial: blackholeTimeout, read: blackholeTimeout, write: blackholeTimeout})
	h := &blackholeOn{sha: sha, on: func() { r.proxy.SetBlackhole(true) }, entered: make(chan struct{})}
	rdb.AddHook(cmdHook{before: h.see})
	return r, rdb, h
}

// closeTakes closes c and fails when go-redis dialed for a retry while
// Close waited (a new connection to the proxy), or when Close took longer
// than blackholeCloseBound.
func closeTakes(t *testing.T, r *faultRig, what string, c interface{ Close() error }) {
	t.Helper()
	start, dialed := time.Now(), r.proxy.Stats().Accepted
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(blackholeCloseBound):
		<-done
		t.Errorf("%s: Close with one command in a blackhole took %v, past the client's %v timeouts",
			what, time.Since(start).Round(time.Millisecond), blackholeTimeout)
	}
	if n := r.proxy.Stats().Accepted - dialed; n > 0 {
		t.Errorf("%s: go-redis dialed %d connections to retry while Close waited (took %v)", what, n, time.Since(start).Round(time.Millisecond))
	}
}

// TestLockerCloseLeaseCallInABlackhole attacks Locker.Close's
// promise (it waits for a call whose caller left "up to the client's
// timeouts") for Lease.Release and Lease.Extend: the call's script goes
// into a blackhole, its caller leaves, then Close. The call ran on
// WithoutCancel(ctx), so go-redis retried it after Close began, each try
// waiting out the read timeout, and Close waited for every try.
func TestLockerCloseLeaseCallInABlackhole(t *testing.T) {
	for _, tc := range []struct {
		name string
		sha  string
		call func(context.Context, *Lease) error
	}{
		{"Release", releaseScript.rs.Hash(), func(ctx context.Context, l *Lease) error { return l.Release(ctx) }},
		{"Extend", extendScript.rs.Hash(), func(ctx context.Context, l *Lease) error { return l.Extend(ctx, time.Minute) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, rdb, h := blackholeRig(t, tc.sha)
			lk := NewLocker(rdb, &LockerOptions{Prefix: "cak"})
			lease, err := lk.TryAcquire(context.Background(), "cak", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			got := make(chan error, 1)
			go func() { got <- tc.call(ctx, lease) }()
			<-h.entered
			cancel()
			if err := <-got; !errors.Is(err, context.Canceled) {
				t.Errorf("%s after its caller left = %v, want context.Canceled", tc.name, err)
			}
			closeTakes(t, r, tc.name, lk)
			r.proxy.SetBlackhole(false)
			r.finish()
		})
	}
}

// TestCacheCloseCommitInABlackholeWithRetries is
// TestCacheCloseDoesNotHangOnACommitToABlackholedRedis with go-redis's
// default retries: the COMMIT, on WithoutCancel(c.ctx), goes into a
// blackhole and Close begins. Close waits for the COMMIT sent, but
// go-redis must not re-send it after Close began.
// GetMany's COMMITs go in one pipeline (commitBatch).
func TestCacheCloseCommitInABlackholeWithRetries(t *testing.T) {
	for _, many := range []bool{false, true} {
		t.Run(map[bool]string{false: "Get", true: "GetMany"}[many], func(t *testing.T) {
			r, rdb, h := blackholeRig(t, commitScript.rs.Hash())
			c := r.cache(rdb, psOptions("cac"))
			started, release := make(chan struct{}, 1), make(chan struct{})
			load := gatedLoad(started, release, []byte("v"))
			if many {
				go c.GetMany(context.Background(), []string{"cac1", "cac2"}, time.Minute, func(ctx context.Context, keys []string) (map[string][]byte, error) {
					v, err := load(ctx)
					return map[string][]byte{"cac1": v, "cac2": v}, err
				})
			} else {
				go c.Get(context.Background(), "cac", time.Minute, load)
			}
			<-started
			close(release)
			<-h.entered
			closeTakes(t, r, "Cache", c)
			r.proxy.SetBlackhole(false)
			r.finish()
		})
	}
}

// blackholeTimeout is the client timeout of the blackhole Close tests below: go-redis
// keeps its default MaxRetries (3), so a command Close waits for must not
// be re-sent once Close began, or Close waits out the timeouts once per
// try. Through the proxy's blackhole a retry dials a new connection (the
// one that timed out is dropped) whose HELLO waits out the read timeout;
// where connects hang too, each of the MaxRetries dials waits out the
// dial timeout.
const blackholeTimeout = time.Second

// blackholeCloseBound is how long Close may take with one command in a
// blackhole: the rest of the read timeout of its one try, with slack for
// a loaded machine. A retry is caught by the dial it makes (closeTakes),
// not by this bound, which only stops a hang.
const blackholeCloseBound = 3 * blackholeTimeout
