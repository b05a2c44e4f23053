package herd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A hit allocates little more than the go-redis GET under it (6
// allocations for a GET of a 512-byte value): no flight, no goroutine, no
// channel. The budget is 10 per hit.
func TestHitAllocations(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, nil)
	ctx := context.Background()
	if err := c.Set(ctx, "hit", make([]byte, 512), time.Hour); err != nil {
		t.Fatal(err)
	}
	fail := func(context.Context) ([]byte, error) { panic("a hit called the loader") }
	if err := rdb.Set(ctx, "raw", make([]byte, 560), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	raw := testing.AllocsPerRun(200, func() {
		if _, err := rdb.Get(ctx, "raw").Bytes(); err != nil {
			t.Fatal(err)
		}
	})
	got := testing.AllocsPerRun(200, func() {
		if _, err := c.Get(ctx, "hit", time.Hour, fail); err != nil {
			t.Fatal(err)
		}
	})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	handed := testing.AllocsPerRun(200, func() {
		if _, err := c.Get(cctx, "hit", time.Hour, fail); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("allocations per hit: %.1f, %.1f with a ctx that can end (a raw GET: %.1f)", got, handed, raw)
	if got > 10 || handed > 10 {
		t.Errorf("a hit made %.1f allocations (%.1f with a ctx that can end), budget 10", got, handed)
	}
}

// gateHook holds every GET of one Redis key until its gate opens, and
// reports each one it holds.
type gateHook struct {
	key     string
	held    chan struct{}
	gate    chan struct{}
	holding atomic.Bool // only the first GET is held
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "get" && len(cmd.Args()) == 2 && cmd.Args()[1] == h.key && h.holding.CompareAndSwap(false, true) {
			h.held <- struct{}{}
			<-h.gate
		}
		return next(ctx, cmd)
	}
}

// A hit never waits for another caller's GET of the same key: each
// caller's GET is its own, so a stalled reply to one caller does not
// hold the others (with one shared lookup, the second caller waited for
// the first one's reply, then sent its own).
func TestHitDoesNotWaitForAnotherCallersGET(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, nil)
	ctx := context.Background()
	if err := c.Set(ctx, "k", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	vkey, _ := valueKey(DefaultPrefix, "k")
	h := &gateHook{key: vkey, held: make(chan struct{}, 1), gate: make(chan struct{})}
	rdb.AddHook(h)
	fail := func(context.Context) ([]byte, error) { panic("a hit called the loader") }

	var once sync.Once
	release := func() { once.Do(func() { close(h.gate) }) }
	t.Cleanup(release) // before the Cache's Close, which waits for the held GET

	first := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "k", time.Hour, fail)
		first <- err
	}()
	<-h.held // the first caller's GET is on hold
	second := make(chan error, 1)
	go func() {
		v, err := c.Get(ctx, "k", time.Hour, fail)
		if err == nil && string(v) != "v" {
			err = errors.New("wrong value " + string(v))
		}
		second <- err
	}()
	select {
	case err := <-second:
		if err != nil {
			t.Fatalf("second hit: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second hit waited for the first caller's held GET")
	}
	release()
	if err := <-first; err != nil {
		t.Fatalf("first hit: %v", err)
	}
	if s := c.Stats(); s.Hits != 2 {
		t.Errorf("Stats.Hits = %d, want 2 (one per caller)", s.Hits)
	}
}

// A Get whose ctx has already ended returns its error without a command.
func TestHitCancelledContext(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, nil)
	log := &cmdLog{}
	rdb.AddHook(log)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var calls atomic.Int64
	if _, err := c.Get(ctx, "k", time.Minute, constLoader(&calls, "v")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with a cancelled ctx: %v, want context.Canceled", err)
	}
	if n := log.take(); len(n) != 0 || calls.Load() != 0 {
		t.Errorf("sent %v and called the loader %d times for a cancelled caller", n, calls.Load())
	}
}

// A caller whose deadline ends while its hit's GET waits on a stalled
// Redis gets its ctx error; its deadline is not a Redis failure, so the
// breaker does not open and nothing loads locally.
func TestHitCallerDeadlineIsNotARedisFailure(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) {
		o.ContextTimeoutEnabled = true
		o.MaxRetries = -1
	})
	c := newTestCache(t, rdb, &Options{BreakerThreshold: 2})
	bg := context.Background()
	if err := c.Set(bg, "k", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	srv.Pause(t)
	for range 4 {
		ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
		_, err := c.Get(ctx, "k", time.Hour, constLoader(&calls, "local"))
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get past its deadline on a stalled Redis: %v, want context.DeadlineExceeded", err)
		}
	}
	srv.Resume(t)
	if s := c.Stats(); s.BreakerOpens != 0 || s.FailOpen != 0 || calls.Load() != 0 {
		t.Errorf("caller deadlines counted as Redis failures: %+v, %d local loads", s, calls.Load())
	}
	v, err := c.Get(bg, "k", time.Hour, constLoader(&calls, "local"))
	if err != nil || string(v) != "v" {
		t.Fatalf("Get after the stall: %q, %v", v, err)
	}
}

// valueKey names the same Redis key as makeKeys.
func TestValueKeyMatchesFamily(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"a", "user:42", "{x}", string(make([]byte, 1000))} {
		f, err := makeKeys("p", k)
		if err != nil {
			t.Fatal(err)
		}
		v, err := valueKey("p", k)
		if err != nil || v != f.Value {
			t.Errorf("valueKey(%q) = %q, %v; makeKeys value %q", k, v, err, f.Value)
		}
	}
	if _, err := valueKey("p", ""); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("valueKey of an empty key: %v, want ErrInvalidKey", err)
	}
}

// ctxValueHook records, for every GET, the value of ctxProbe in the ctx
// go-redis ran it with.
type ctxValueHook struct {
	seen chan any
}

type ctxProbe struct{}

func (h ctxValueHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h ctxValueHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h ctxValueHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "get" {
			select {
			case h.seen <- ctx.Value(ctxProbe{}):
			default:
			}
		}
		return next(ctx, cmd)
	}
}

// With Options.InlineHits a hit with a ctx that can end sends its GET
// from the caller's goroutine, not from the hand-off's (which runs it
// under the Cache's own ctx): the caller's ctx values reach go-redis's
// hooks, allocations stay within the budget of 10, and, the documented
// price, a caller whose ctx
// ends while the GET waits on a stalled Redis returns only when the GET
// gives up at the client's ReadTimeout, with its own ctx error and
// without the breaker counting its deadline as more than that one GET.
func TestInlineHits(t *testing.T) {
	srv := redistest.Start(t)
	const readTimeout = 600 * time.Millisecond
	rdb := srv.Client(t, func(o *redis.Options) {
		o.ReadTimeout = readTimeout
		o.MaxRetries = -1
	})
	hook := ctxValueHook{seen: make(chan any, 1)}
	rdb.AddHook(hook)
	inline := newTestCache(t, rdb, &Options{InlineHits: true})
	handed := newTestCache(t, rdb, nil)
	bg := context.Background()
	if err := inline.Set(bg, "hit", make([]byte, 512), time.Hour); err != nil {
		t.Fatal(err)
	}
	fail := func(context.Context) ([]byte, error) { panic("a hit called the loader") }
	cctx, cancel := context.WithCancel(context.WithValue(bg, ctxProbe{}, "caller"))
	defer cancel()
	allocs := func(c *Cache, ctx context.Context) float64 {
		return testing.AllocsPerRun(200, func() {
			if _, err := c.Get(ctx, "hit", time.Hour, fail); err != nil {
				t.Fatal(err)
			}
		})
	}
	base, in, off := allocs(inline, bg), allocs(inline, cctx), allocs(handed, cctx)
	t.Logf("allocations per hit: %.1f (Background), %.1f (InlineHits, ctx that can end), %.1f (handed off)", base, in, off)
	if in > 10 {
		t.Errorf("InlineHits with a ctx that can end: %.1f allocations, budget 10", in)
	}

	for len(hook.seen) > 0 {
		<-hook.seen
	}
	if _, err := inline.Get(cctx, "hit", time.Hour, fail); err != nil {
		t.Fatal(err)
	}
	if v := <-hook.seen; v != "caller" {
		t.Errorf("the hit's GET ran with a ctx whose value is %v, want the caller's", v)
	}
	for len(hook.seen) > 0 {
		<-hook.seen
	}
	if _, err := handed.Get(cctx, "hit", time.Hour, fail); err != nil {
		t.Fatal(err)
	}
	if v := <-hook.seen; v != nil {
		t.Errorf("handed-off GET saw the caller's value %v: the test does not tell the two paths apart", v)
	}

	srv.Pause(t)
	ctx, cancel2 := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel2()
	start := time.Now()
	_, err := inline.Get(ctx, "hit", time.Hour, fail)
	took := time.Since(start)
	srv.Resume(t)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("InlineHits Get past its deadline on a stalled Redis: %v, want context.DeadlineExceeded", err)
	}
	if took < readTimeout/2 {
		t.Errorf("InlineHits Get returned after %v: it left at its deadline, not when its GET gave up (ReadTimeout %v), so the doc's price is wrong", took, readTimeout)
	}
}
