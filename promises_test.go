package herd

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/faultproxy"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

// Regression tests for the promises of issue 12 ("Every promise true")
// that the flight keeps: read-your-writes, the default wait for a slow
// rebuild, Begin's caller deadline and idempotent writes. Each one failed
// on the code before the fix.

// TestReadYourWrites: a call that starts after a Set or Invalidate returned
// is never served a value loaded before it, even when it arrives while a
// slow rebuild that read the source before the write is still running in
// its own process (it would otherwise join that rebuild's flight). The
// callers that joined the old rebuild before the write may still get its
// value.
func TestReadYourWrites(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for _, write := range []string{"Invalidate", "Set"} {
				t.Run("Get after "+write, func(t *testing.T) { testReadYourWritesGet(t, b, write) })
			}
			t.Run("Begin after Invalidate", func(t *testing.T) { testReadYourWritesBegin(t, b) })
		})
	}
}

func testReadYourWritesGet(t *testing.T, b backend, write string) {
	c := newTestCache(t, b.rdb, nil)
	key := testKey(t)
	ctx := context.Background()
	old := newGatedLoader("v1") // read the source before the write
	oldDone := make(chan result, 1)
	go func() {
		v, err := c.Get(ctx, key, time.Minute, old.load)
		oldDone <- result{val: v, err: err}
	}()
	old.waitEntered(t)

	// The source now holds v2; the writer tells the cache, and the call
	// returns.
	var err error
	if write == "Set" {
		err = c.Set(ctx, key, []byte("v2"), time.Minute)
	} else {
		err = c.Invalidate(ctx, key)
	}
	if err != nil {
		t.Fatal(err)
	}
	// A Get that starts now, while the old rebuild still runs.
	var calls atomic.Int64
	afterDone := make(chan result, 1)
	go func() {
		v, err := c.Get(ctx, key, time.Minute, constLoader(&calls, "v2"))
		afterDone <- result{val: v, err: err}
	}()
	// It joins the old flight before the old load returns (on the old
	// code it then got v1), or, after Set, is answered by Set's value in
	// Redis without a flight.
	waitFor(t, 10*time.Second, "the Get to join the old flight or return", func() bool {
		return FlightJoiners(c, key) >= 1 || len(afterDone) > 0
	})
	close(old.gate)

	if r := <-oldDone; r.err != nil || string(r.val) != "v1" {
		t.Errorf("the old rebuild's own caller got (%q, %v), want its value v1", r.val, r.err)
	}
	r := <-afterDone
	if r.err != nil || string(r.val) != "v2" {
		t.Fatalf("a Get started after %s returned got (%q, %v), want v2", write, r.val, r.err)
	}
	if write == "Set" && calls.Load() != 0 {
		t.Errorf("after Set: %d loads, want 0 (Set's value is in Redis)", calls.Load())
	}
	if write == "Invalidate" && calls.Load() != 1 {
		t.Errorf("after Invalidate: %d loads, want 1", calls.Load())
	}
	if s := c.Stats(); s.Fenced != 1 {
		t.Errorf("Stats.Fenced = %d, want 1 (the old rebuild's commit)", s.Fenced)
	}
}

func testReadYourWritesBegin(t *testing.T, b backend) {
	c := newTestCache(t, b.rdb, nil)
	key := testKey(t)
	ctx := context.Background()
	_, fill, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill == nil || !fill.Leased() {
		t.Fatalf("first Begin = (%v, %v), want a leased Fill", fill, err)
	}
	// The builder read v1; the writer invalidates; a Begin starts after.
	if err := c.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		hit  *Hit
		fill *Fill
		err  error
	}
	after := make(chan answer, 1)
	go func() {
		h, f, err := c.Begin(ctx, key, time.Minute, nil)
		after <- answer{h, f, err}
	}()
	waitLocalWaiters(t, c, key, 1) // it waits on the local Fill, built before the write
	if err := fill.Commit([]byte("v1"), time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	a := <-after
	if a.hit != nil {
		t.Fatalf("a Begin started after Invalidate returned got the old builder's value %q", a.hit.Value)
	}
	if a.err != nil || a.fill == nil || !a.fill.Leased() {
		t.Fatalf("a Begin started after Invalidate = (%v, %v), want a leased Fill of its own", a.fill, a.err)
	}
	if err := a.fill.Commit([]byte("v2"), time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	h, _, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || h == nil || string(h.Value) != "v2" {
		t.Errorf("Begin after the new commit = (%v, %v), want the hit v2", h, err)
	}
}

// TestReadYourWritesAcrossProcesses: the same promise when the write comes
// from another process while this process's lookup is on the wire: the
// reply to this process's GET is held back (a slow link), the other
// process's Invalidate lands and returns, and a Get that starts in this
// process after that must not be answered by the GET that ran before the
// write.
func TestReadYourWritesAcrossProcesses(t *testing.T) {
	r := newFaultRig(t)
	ctx := context.Background()
	key := "ryw-remote"
	slowClient := r.client(timeouts{read: 10 * time.Second})
	// One warm connection, so the GET goes out at once (a dial's handshake
	// would be held back by the proxy too).
	if err := slowClient.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	slow := r.cache(slowClient, nil)
	writer := r.cache(r.direct, nil)
	if err := writer.Set(ctx, key, []byte("v1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	const hold = 600 * time.Millisecond
	gets := serverCalls(t, r.direct, "get")
	r.proxy.SetLatency(faultproxy.Downstream, hold)
	first := make(chan result, 1)
	go func() {
		v, err := slow.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) { return []byte("loaded"), nil })
		first <- result{val: v, err: err}
	}()
	// The GET runs on the server at once; its reply is held by the proxy.
	waitFor(t, 5*time.Second, "the GET to run on the server", func() bool {
		return serverCalls(t, r.direct, "get") > gets
	})
	if err := writer.Set(ctx, key, []byte("v2"), time.Minute); err != nil {
		t.Fatal(err)
	}
	second := make(chan result, 1)
	go func() {
		v, err := slow.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) { return []byte("loaded"), nil })
		second <- result{val: v, err: err}
	}()
	time.Sleep(hold / 4) // lets the second Get join the first's flight
	r.proxy.SetLatency(faultproxy.Downstream, 0)
	if got := <-first; got.err != nil {
		t.Fatalf("first Get: %v", got.err)
	}
	if got := <-second; got.err != nil || string(got.val) != "v2" {
		t.Fatalf("a Get started after another process's Set returned got (%q, %v), want v2", got.val, got.err)
	}
}

// TestDefaultsWaitForSlowRebuild: with default Options, three Caches and
// a rebuild slower than twice the default lease: the followers wait while
// the leader's watchdog renews its lease (up to MaxHold), so the origin is
// called once, not three times.
func TestDefaultsWaitForSlowRebuild(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()
	key := testKey(t)
	var caches []*Cache
	for range 3 {
		caches = append(caches, newTestCache(t, srv.Client(t), nil))
	}
	lease := caches[0].leaseFor(key)
	rebuild := 2*lease + lease/2 // past the old budget of 2 leases
	var calls atomic.Int64
	load := func(ctx context.Context) ([]byte, error) {
		calls.Add(1)
		select {
		case <-time.After(rebuild):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []byte("slow"), nil
	}
	res := wave(ctx, caches, 2, key, load)
	for _, r := range res {
		if r.err != nil || string(r.val) != "slow" {
			t.Errorf("a caller got (%q, %v), want the one rebuild's value", r.val, r.err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("origin calls = %d, want 1 (lease %v, rebuild %v)", n, lease, rebuild)
	}
	st := sumStats(caches...)
	if st.WaitTimeouts != 0 || st.LocalLoads != 0 {
		t.Errorf("followers gave up: WaitTimeouts %d, LocalLoads %d", st.WaitTimeouts, st.LocalLoads)
	}
}

// TestBeginHonoursCallerDeadline: with every Redis reply 600 ms late, a
// Begin with a 50 ms deadline returns its context's error long before a
// reply could come. It leaves during its hit path's read, so it takes no
// lease at all; and when the read is fast and the acquire is what is
// late, the Fill its lookup wins after the caller left is given up (the
// lease is released without counting a failure).
func TestBeginHonoursCallerDeadline(t *testing.T) {
	r := newFaultRig(t)
	rdb := r.client(timeouts{read: 10 * time.Second})
	slowScripts := &scriptDelay{}
	rdb.AddHook(slowScripts)
	c := r.cache(rdb, nil)
	const late = 600 * time.Millisecond
	begin := func(key string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		hit, fill, err := c.Begin(ctx, key, time.Minute, nil)
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) || hit != nil || fill != nil {
			t.Fatalf("Begin = (%v, %v, %v), want context.DeadlineExceeded", hit, fill, err)
		}
		if took >= late {
			t.Errorf("Begin returned after %v, at or past the %v a Redis reply takes: it waited for Redis", took, late)
		}
	}

	// Every reply late: the caller leaves in the hit path's read.
	r.proxy.SetLatency(faultproxy.Downstream, late)
	begin("begin-deadline-read")
	r.proxy.SetLatency(faultproxy.Downstream, 0)

	// Only the scripts late: the caller leaves while its lookup acquires.
	key := "begin-deadline-acquire"
	keys := mustKeys(t, key)
	slowScripts.d.Store(int64(late))
	begin(key)
	if !until(10*time.Second, func() bool {
		return c.Stats().Leads == 1 && r.direct.Exists(context.Background(), keys.Lease).Val() == 0
	}) {
		t.Fatalf("the abandoned lookup's lease was not released: leads %d, lease exists %d",
			c.Stats().Leads, r.direct.Exists(context.Background(), keys.Lease).Val())
	}
	if s := c.Stats(); s.LoadErrors != 0 {
		t.Errorf("LoadErrors = %d, want 0: a caller leaving is not a failed rebuild", s.LoadErrors)
	}
}

// scriptDelay holds each script (EVALSHA, EVAL) for d before sending it.
type scriptDelay struct{ d atomic.Int64 }

func (h *scriptDelay) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptDelay) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *scriptDelay) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			time.Sleep(time.Duration(h.d.Load()))
		}
		return next(ctx, cmd)
	}
}

// TestWriteRetryIsNoOp: go-redis sends a script again when its reply was
// lost, and by then a newer write may have landed. A retried Set or
// Invalidate (the same write id) must not undo it.
func TestWriteRetryIsNoOp(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			c := newTestCache(t, b.rdb, nil)
			key := testKey(t)
			k := mustKeys(t, key)
			env := func(v string) []byte {
				return c.newEnvelope(0, []byte(v), time.Minute, 0, 0).Encode()
			}
			set := func(id, v string) string {
				t.Helper()
				n, err := setScript.rs.Run(ctx, b.rdb, []string{k.Value, k.Fence, k.Writes + id},
					env(v), 60000, 60000, c.notify.PublishCmd(ctx), k.Channel, 1<<14, 60000).Text()
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			stored := func() string {
				t.Helper()
				e, ok := wire.DecodeEnvelope([]byte(b.rdb.Get(ctx, k.Value).Val()))
				if !ok {
					return "<none>"
				}
				return string(e.Payload)
			}
			first := set("a", "old")
			set("b", "new")
			fence := b.rdb.HGet(ctx, k.Fence, "n").Val()
			if again := set("a", "old"); again != first {
				t.Errorf("retried Set returned fence %s, want its first answer %s", again, first)
			}
			if got := stored(); got != "new" {
				t.Errorf("after a retried Set the value is %q, want the newer Set's %q", got, "new")
			}
			if got := b.rdb.HGet(ctx, k.Fence, "n").Val(); got != fence {
				t.Errorf("a retried Set advanced the fence from %s to %s", fence, got)
			}

			inv := func(id string) {
				t.Helper()
				if err := invalidateScript.rs.Run(ctx, b.rdb, []string{k.Value, k.Fence, k.Writes + id}, 60000, 60000).Err(); err != nil {
					t.Fatal(err)
				}
			}
			inv("c")
			set("d", "after")
			inv("c")
			if got := stored(); got != "after" {
				t.Errorf("a retried Invalidate deleted the newer Set's value (now %q)", got)
			}
		})
	}
}

// TestWritesHonourCallerDeadline: with every Redis reply 600 ms late, Set
// and Invalidate with a 50 ms deadline return their context's error long
// before a reply could come (go-redis itself waits for the reply of a
// command it sent).
func TestWritesHonourCallerDeadline(t *testing.T) {
	r := newFaultRig(t)
	c := r.cache(r.client(timeouts{read: 10 * time.Second}), nil)
	const late = 600 * time.Millisecond
	r.proxy.SetLatency(faultproxy.Downstream, late)
	for _, write := range []string{"Set", "Invalidate"} {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		start := time.Now()
		var err error
		if write == "Set" {
			err = c.Set(ctx, "w-deadline", []byte("v"), time.Minute)
		} else {
			err = c.Invalidate(ctx, "w-deadline")
		}
		took := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s = %v, want context.DeadlineExceeded", write, err)
		}
		if took >= late {
			t.Errorf("%s returned after %v, at or past the %v a Redis reply takes: it waited for Redis", write, took, late)
		}
	}
	r.proxy.SetLatency(faultproxy.Downstream, 0)
	r.finish()
}
