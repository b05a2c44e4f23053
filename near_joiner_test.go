package herd

// Second round of attacks on the near cache (near.go) and the hit path
// (hit.go): Begin answering from process memory, the near fill's joiners,
// the reverse index, Options.InlineHits. Real redis-server throughout.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// beginResult is what a Begin in a goroutine returned.
type beginResult struct {
	hit  *Hit
	fill *Fill
	err  error
}

func goBegin(c *Cache, key string, refresh func() LoadFunc) <-chan beginResult {
	ch := make(chan beginResult, 1)
	go func() {
		h, f, err := c.Begin(context.Background(), key, time.Minute, refresh)
		ch <- beginResult{h, f, err}
	}()
	return ch
}

// awaitJoin waits for a near miss to join its key's fill; a caller that
// never joins (the near cache was not serving) would make the test prove
// nothing.
func awaitJoin(t *testing.T, joined <-chan struct{}) {
	t.Helper()
	select {
	case <-joined:
	case <-time.After(10 * time.Second):
		t.Fatal("the caller never joined the near fill (the near cache was not serving): the test proves nothing")
	}
}

// "A value is never served past its own fresh period" (NearOptions.MaxAge),
// and through Begin "a stale value starts a refresh". A caller that joins
// a near fill takes the fill's answer as it was when the fill judged it:
// a caller that arrives after the value's fresh period ended, while the
// fill is between its freshness check and its return (a preempted
// goroutine, a GC pause; here a hook), got it as a fresh Hit, with an
// Expires in the past and no refresh started.
func TestNearJoinerPastFreshPeriod(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newNearCache(t, srv.Client(t), NearOptions{Staleness: 2 * time.Second}, func(o *Options) { o.StaleFor = time.Hour })
	var step atomic.Int64 // the Cache's clock runs ahead by this much
	c.now = func() time.Time { return time.Now().Add(time.Duration(step.Load())) }
	const key = "atk2-near-fresh-end"
	rawSetEnv(t, rdb, key, c.newEnvelope(0, []byte("v1"), time.Minute, time.Hour, 0))

	fill, joined := newGate(), make(chan struct{}, 8)
	setHooks(c, &nearHooks{
		beforeFill: func(string) { fill.pass() },
		joined:     func(string) { joined <- struct{}{} },
	})
	fill.close()
	defer fill.release()
	first := goBegin(c, key, nil)
	awaitJoin(t, joined)
	waitFor(t, 5*time.Second, "the fill to read the fresh v1", func() bool { return fill.passed.Load() == 1 })

	step.Store(int64(10 * time.Minute)) // the fresh period (1m) is over; the stale window (1h) is not
	refreshed := make(chan struct{}, 1)
	late := goBegin(c, key, func() LoadFunc {
		refreshed <- struct{}{}
		return func(context.Context) ([]byte, error) { return []byte("v2"), nil }
	})
	awaitJoin(t, joined)
	fill.release()
	if r := <-first; r.err != nil || r.hit == nil {
		t.Fatalf("the first Begin: %+v", r)
	}
	r := <-late
	if r.err != nil || r.hit == nil {
		t.Fatalf("the late Begin: hit %+v, fill %v, err %v; want a stale hit", r.hit, r.fill, r.err)
	}
	now := c.now()
	if r.hit.Outcome == OutcomeHit || !r.hit.Expires.After(now) && r.hit.Outcome != OutcomeStale {
		t.Fatalf("a Begin that started after the value's fresh period ended got it as %v, Expires %v before the Cache's now: want a stale hit and a refresh",
			r.hit.Outcome, now.Sub(r.hit.Expires))
	}
	select {
	case <-refreshed:
	case <-time.After(10 * time.Second):
		t.Fatal("the stale hit started no refresh")
	}
	waitFor(t, 10*time.Second, "the refresh's commit", func() bool { return c.Stats().Loads == 1 })
}

// "This process's own writes ... drop its near copies before they
// return, and a near miss's read that a write may have overtaken is not
// kept: a near copy is never older than a write the process has seen
// return" (docs/cache-aside.md, "Near cache"). A caller that joins a
// near fill is checked against Set and Invalidate (the key's write count), and against Staleness since
// the fill's GET, but not against the drops and flushes since the fill's
// snapshot: this Cache's own commits (Fill.Commit, a GetMany leader) and a
// lost subscription go unseen. The fill's own insert is refused; the
// joiner still gets the value the commit replaced.
func TestNearJoinerAfterOwnCommit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()

	// setup: v1 in Redis (its message heard), a fill of the key that read
	// v1 and is held before it returns.
	setup := func(t *testing.T, key string, x, z *Cache, hooks *nearHooks) (fill *gate, joined chan struct{}, first <-chan beginResult) {
		t.Helper()
		heard := x.Stats().NearInvalidations
		if err := z.Set(ctx, key, []byte("v1"), time.Hour); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "the message of v1", func() bool { return x.Stats().NearInvalidations > heard })
		fill, joined = newGate(), make(chan struct{}, 8)
		hooks.beforeFill = func(string) { fill.pass() }
		hooks.joined = func(string) { joined <- struct{}{} }
		setHooks(x, hooks)
		fill.close()
		t.Cleanup(fill.release)
		first = goBegin(x, key, nil)
		awaitJoin(t, joined)
		waitFor(t, 5*time.Second, "the fill to read v1", func() bool { return fill.passed.Load() == 1 })
		return fill, joined, first
	}

	t.Run("Fill.Commit after a lost subscription", func(t *testing.T) {
		x := newNearCache(t, srv.Client(t), NearOptions{Staleness: 2 * time.Second}, nil)
		z := newTestCache(t, srv.Client(t), nil) // another process
		const key = "atk2-near-commit-lost"
		resub := newGate()
		fill, joined, first := setup(t, key, x, z, &nearHooks{resubscribe: func(string) { resub.pass() }})
		resub.close()
		defer resub.release()
		if err := z.Invalidate(ctx, key); err != nil {
			t.Fatal(err)
		}
		if err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the near cache to notice the kill", func() bool { return resub.passed.Load() > 0 && !nearServing(x) })
		hit, fl, err := x.Begin(ctx, key, time.Minute, nil)
		if err != nil || fl == nil {
			t.Fatalf("Begin of an invalidated key: hit %+v, fill %v, err %v; want a Fill", hit, fl, err)
		}
		if err := fl.Commit([]byte("v2"), time.Hour, 0); err != nil {
			t.Fatal(err)
		}
		resub.release()
		waitServing(t, x)
		late := goBegin(x, key, nil) // starts after Commit(v2) returned
		awaitJoin(t, joined)
		fill.release()
		<-first
		r := <-late
		if r.err != nil || r.hit == nil || string(r.hit.Value) != "v2" {
			var v string
			if r.hit != nil {
				v = string(r.hit.Value)
			}
			t.Fatalf("a Begin that started after this process's Fill.Commit(v2) returned got %q (fill %v, err %v), want v2", v, r.fill, r.err)
		}
	})

	t.Run("GetMany's commit", func(t *testing.T) {
		x := newNearCache(t, srv.Client(t), NearOptions{Staleness: 2 * time.Second}, nil)
		z := newTestCache(t, srv.Client(t), nil)
		const key = "atk2-near-commit-many"
		slow := newGate() // x's subscriber, slow to handle what it reads
		fill, joined, first := setup(t, key, x, z, &nearHooks{receive: func(string, uint64, any, error) { slow.pass() }})
		slow.close()
		defer slow.release()
		if err := z.Invalidate(ctx, key); err != nil {
			t.Fatal(err)
		}
		got, err := x.GetMany(ctx, []string{key}, time.Hour, func(context.Context, []string) (map[string][]byte, error) {
			return map[string][]byte{key: []byte("v2")}, nil
		})
		if err != nil || string(got[key]) != "v2" {
			t.Fatalf("GetMany = %q, %v; want v2 (loaded and committed)", got[key], err)
		}
		late := goBegin(x, key, nil) // starts after GetMany returned v2
		awaitJoin(t, joined)
		fill.release()
		<-first
		r := <-late
		slow.release()
		if r.err != nil || r.hit == nil || string(r.hit.Value) != "v2" {
			var v string
			if r.hit != nil {
				v = string(r.hit.Value)
			}
			t.Fatalf("a Begin that started after this process committed v2 (GetMany returned it) got %q (fill %v, err %v), want v2", v, r.fill, r.err)
		}
	})
}

// The reverse index is bounded with the store and always leads a message
// to its copy: inserts (new keys and replacements), drops and flushes from
// many goroutines on a store far smaller than the key space (evictions
// all along). Afterwards every key the store holds is in the index under
// its own ID, the index holds nothing else, and a drop of each held key
// removes it.
func TestNearReverseIndexUnderChurn(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newNearCache(t, srv.Client(t), NearOptions{MaxEntries: 64}, nil)
	n := c.near
	var fence atomic.Uint64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range 20_000 {
				key := "churn" + strconv.Itoa(r.IntN(300))
				id := nearIDOf(key)
				switch op := r.IntN(100); {
				case op < 70:
					snap := n.snapshot(id)
					n.insert(key, nearEntry{id: id, val: []byte(key), fence: fence.Add(1), expires: time.Now().Add(time.Hour),
						deadline: n.mono() + int64(time.Hour), epoch: snap.epoch}, snap)
				case op < 99:
					n.drop(id, 0)
				default:
					n.flush()
				}
			}
		})
	}
	wg.Wait()
	n.store.CleanUp()
	held := 0
	for key := range n.store.Keys() {
		held++
		if k, ok := n.revKey(nearIDOf(key)); !ok || k != key {
			t.Errorf("the store holds %q, the reverse index maps its ID to %q (%v): a message would miss the copy", key, k, ok)
		}
	}
	if got := revLen(n); got != held || held > 64 {
		t.Fatalf("reverse index %d keys, store %d (bound 64)", got, held)
	}
	for key := range n.store.Keys() {
		n.drop(nearIDOf(key), 0)
		if nearHas(c, key) {
			t.Fatalf("a drop of %q left its copy", key)
		}
	}
	n.store.CleanUp()
	if got := revLen(n); got != 0 {
		t.Fatalf("after dropping every key the reverse index holds %d", got)
	}
}

// Options.InlineHits: the caller sends its hit's GET detached from its
// ctx, so a GET that a slow but healthy Redis answers within the client's
// timeouts is no failure, whatever the callers' deadlines: the breaker
// (threshold 1 here) must stay closed, and a later hit is one GET, not a
// probe.
func TestInlineHitsDeadlineIsNoRedisFailure(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.ReadTimeout = 5 * time.Second; o.MaxRetries = -1 })
	sent := make(chan struct{}, 64)
	rdb.AddHook(getSignal{sent})
	c := newTestCache(t, rdb, &Options{InlineHits: true, BreakerThreshold: 1, BreakerCooldown: time.Hour})
	bg := context.Background()
	if err := c.Set(bg, "k", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	for len(sent) > 0 {
		<-sent
	}
	srv.Pause(t)
	const callers = 8
	errs := make(chan error, callers)
	ctxs := make(chan context.Context, callers)
	for range callers {
		go func() {
			ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
			defer cancel()
			ctxs <- ctx
			v, err := c.Get(ctx, "k", time.Hour, noLoad(t))
			if err == nil && string(v) != "v" {
				err = errors.New("wrong value " + string(v))
			}
			errs <- err
		}()
	}
	for range 2 {
		<-sent // the GETs are on their way to the stopped server: the first caller's, and the one the others share
	}
	for range callers {
		<-(<-ctxs).Done() // every caller's deadline has passed (none returns before it)
	}
	srv.Resume(t)
	for range callers {
		if err := <-errs; err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Get: %v", err)
		}
	}
	if s := c.Stats(); s.BreakerOpens != 0 || c.brk.troubled.Load() {
		t.Fatalf("callers' deadlines on a slow Redis counted as Redis failures: breaker opens %d, troubled %v", s.BreakerOpens, c.brk.troubled.Load())
	}
	if v, err := c.Get(bg, "k", time.Hour, noLoad(t)); err != nil || string(v) != "v" {
		t.Fatalf("a later hit: %q, %v", v, err)
	}
}

// getSignal tells when a GET is sent.
type getSignal struct{ sent chan<- struct{} }

func (h getSignal) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h getSignal) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h getSignal) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "get" {
			select {
			case h.sent <- struct{}{}:
			default:
			}
		}
		return next(ctx, cmd)
	}
}

// Peek's doc: "ctx.Err() as soon as ctx ends". Peek reads through the hit
// path's shared read, so with Options.InlineHits a lone Peek whose ctx ends while
// Redis is stalled returns only when its GET gives up (ReadTimeout), as a
// Get does: the documented price of InlineHits reaches Peek too. This
// test pins the behaviour the docs must describe.
func TestInlineHitsPeek(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const readTimeout = 600 * time.Millisecond
	rdb := srv.Client(t, func(o *redis.Options) { o.ReadTimeout = readTimeout; o.MaxRetries = -1 })
	c := newTestCache(t, rdb, &Options{InlineHits: true})
	bg := context.Background()
	if err := c.Set(bg, "k", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	srv.Pause(t)
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := c.Peek(ctx, "k")
	took := time.Since(start)
	srv.Resume(t)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Peek past its deadline on a stalled Redis: %v", err)
	}
	t.Logf("Peek with InlineHits on a stalled Redis returned after %v (ctx 50ms, ReadTimeout %v)", took, readTimeout)
	if took < readTimeout/2 {
		t.Errorf("Peek left at its deadline (%v): then InlineHits does not reach Peek and its doc should not say so", took)
	}
}

func init() {
	workerRoles["atknearbegin"] = atkNearBeginWorker
}

// The near cache's promise through Begin (the middleware's entry point),
// across OS processes: three workers hold a near copy of one key and read
// it with Begin; each round one of them writes it, by Set, by
// Invalidate and a Fill's Commit, or by InvalidateTag and a Fill's
// Commit. The writer's own Begin after the write returned must see it at
// once; every other worker's Begin that starts once Staleness has passed
// since the write returned (its return travels by a bookkeeping key) must
// see it too; earlier ones may return either value, or a Fill (handed
// over) while the key is missing.
func TestNearBeginAcrossProcesses(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const procs, rounds = 3, 9
	prefix := cpNewPrefix()
	seed := New(rdb, &Options{Prefix: prefix})
	if err := seed.Set(context.Background(), cpKey(prefix, "hot"), []byte("v0"), time.Hour, "t"); err != nil {
		t.Fatal(err)
	}
	seed.Close()
	p := startWorkers(t, procs, "atknearbegin", cpEnvFor("redis", []string{srv.Addr()}, prefix, "", procs, 1, rounds)...)
	p.wait(2 * time.Minute)
	if t.Failed() {
		t.FailNow()
	}
	for _, r := range cpReports(t, rdb, prefix, procs) {
		if s := r.Stats; s.NearHits < 20*rounds {
			t.Errorf("worker %d: %d near hits, want at least %d", r.Inst, s.NearHits, 20*rounds)
		}
		t.Logf("worker %d: %v", r.Inst, r.Log)
	}
}

func atkNearBeginWorker(ctx context.Context, _ string) error {
	w, err := cpNewWorker()
	if err != nil {
		return err
	}
	defer w.rdb.Close()
	c := New(w.rdb, &Options{Prefix: w.prefix, Near: NearOptions{MaxEntries: 100, MaxAge: time.Hour, Staleness: nearProcStaleness}})
	defer c.Close()
	for deadline := time.Now().Add(cpBarrierTimeout); !nearServing(c); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("the near cache never served")
		}
	}
	key := w.key("hot")
	// begin returns the value a Begin found, or "" when it got a Fill
	// (handed over at once: the key is being rebuilt).
	begin := func() (string, error) {
		bctx, cancel := context.WithTimeout(ctx, cpGetTimeout)
		defer cancel()
		hit, fill, err := c.Begin(bctx, key, time.Hour, nil)
		switch {
		case err != nil:
			return "", err
		case fill != nil:
			fill.Handover()
			return "", nil
		}
		return string(hit.Value), nil
	}
	// build writes cur through a Fill, after an invalidation made the key
	// missing.
	build := func(cur string) error {
		for deadline := time.Now().Add(cpBarrierTimeout); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			hit, fill, err := c.Begin(ctx, key, time.Hour, nil)
			if err != nil {
				if errors.Is(err, ErrLoadFailed) {
					continue
				}
				return err
			}
			if fill != nil {
				if err := fill.SetTags("t"); err != nil {
					return err
				}
				return fill.Commit([]byte(cur), time.Hour, 0)
			}
			_ = hit // another worker's Begin found the key missing and handed over: look again
		}
		return errors.New("no Fill after the invalidation")
	}
	var worst time.Duration
	fills := 0
	for r := 1; r <= w.waves; r++ {
		prev, cur := "v"+strconv.Itoa(r-1), "v"+strconv.Itoa(r)
		for deadline := time.Now().Add(cpBarrierTimeout); ; time.Sleep(time.Millisecond) {
			v, err := begin()
			if err != nil || v != prev {
				return fmt.Errorf("round %d: before the write, Begin = %q, %v; want %q", r, v, err, prev)
			}
			if nearHas(c, key) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("round %d: no near copy", r)
			}
		}
		before := c.Stats()
		for range 20 {
			if v, err := begin(); err != nil || v != prev {
				return fmt.Errorf("round %d: from memory, Begin = %q, %v", r, v, err)
			}
		}
		if d := statsDelta(before, c.Stats()); d.NearHits != 20 {
			return fmt.Errorf("round %d: 20 Begins of a near copy made %d near hits", r, d.NearHits)
		}
		if err := w.barrier(ctx, "ready-"+strconv.Itoa(r)); err != nil {
			return err
		}
		written := w.key("written", strconv.Itoa(r))
		if w.inst == r%w.procs {
			var err error
			switch r % 3 {
			case 0:
				err = c.Set(ctx, key, []byte(cur), time.Hour, "t")
			case 1:
				if err = c.Invalidate(ctx, key); err == nil {
					err = build(cur)
				}
			case 2:
				if err = c.InvalidateTag(ctx, "t"); err == nil {
					err = build(cur)
				}
			}
			if err != nil {
				return fmt.Errorf("round %d: write: %w", r, err)
			}
			if v, err := begin(); err != nil || v != cur {
				return fmt.Errorf("round %d: the writer's own Begin after its write returned = %q, %v; want %q", r, v, err, cur)
			}
			if err := w.rdb.Set(ctx, written, "1", time.Hour).Err(); err != nil {
				return err
			}
		} else {
			for deadline := time.Now().Add(cpBarrierTimeout); ; time.Sleep(time.Millisecond) {
				n, err := w.rdb.Exists(ctx, written).Result()
				if err != nil {
					return err
				}
				if n == 1 {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("round %d: the write never returned", r)
				}
			}
			acked := time.Now()
			for {
				start := time.Now()
				v, err := begin()
				if err != nil && !errors.Is(err, ErrLoadFailed) || v != prev && v != cur && v != "" {
					return fmt.Errorf("round %d: after the write, Begin = %q, %v", r, v, err)
				}
				if v == "" {
					fills++
				}
				if v == prev {
					worst = max(worst, start.Sub(acked))
				}
				if start.Sub(acked) > nearProcStaleness {
					if v != cur {
						return fmt.Errorf("round %d: a Begin %v after the write returned got %q (bound %v)", r, start.Sub(acked), v, nearProcStaleness)
					}
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		if err := w.barrier(ctx, "done-"+strconv.Itoa(r)); err != nil {
			return err
		}
	}
	rep := &cpReport{Inst: w.inst, Pid: w.pid, Stats: c.Stats(),
		Log: []string{fmt.Sprintf("old value seen at most %v after a write returned; %d Fills handed over", worst, fills)}}
	return w.report(ctx, rep)
}

// MaxAge caps a copy from its read, on the monotonic clock too (see
// TestNearMaxAgeWallClockStep). The copy's monotonic deadline was
// taken when the fill inserted, not when it read: a fill held up between
// the two (here by a hook; a preempted goroutine, a GC pause) stretched
// MaxAge by that delay, and with the wall clock stepped back nothing else
// ended the copy.
func TestNearMaxAgeFromTheRead(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const maxAge = 300 * time.Millisecond
	c := newNearCache(t, srv.Client(t), NearOptions{MaxAge: maxAge, Staleness: 5 * time.Second}, nil)
	var step atomic.Int64
	c.now = func() time.Time { return time.Now().Add(-time.Duration(step.Load())) }
	const key = "atk2-near-maxage-read"
	rawSetEnv(t, rdb, key, c.newEnvelope(0, []byte("v1"), time.Hour, 0, 0))
	fill := newGate()
	setHooks(c, &nearHooks{beforeFill: func(string) { fill.pass() }})
	fill.close()
	defer fill.release()
	done := make(chan struct{})
	go func() { getString(t, c, key); close(done) }()
	waitFor(t, 5*time.Second, "the fill to read v1", func() bool { return fill.passed.Load() == 1 })
	read := time.Now()           // the fill read before this
	step.Store(int64(time.Hour)) // the wall clock steps back
	time.Sleep(2 * maxAge)       // the fill is held past MaxAge
	fill.release()
	<-done
	if !nearHas(c, key) {
		t.Fatal("the fill kept no copy (no write was made): the test proves nothing")
	}
	before := c.Stats()
	getString(t, c, key)
	if d := statsDelta(before, c.Stats()); d.NearHits != 0 {
		t.Fatalf("a near hit %v after the copy was read (MaxAge %v)", time.Since(read), maxAge)
	}
}
