package herd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

// TestPeek runs the Peek suite on miniredis, a real redis-server and a
// real 3-master Redis Cluster.
func TestPeek(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Run("Answers", func(t *testing.T) { testPeekAnswers(t, b) })
			t.Run("NoValue", func(t *testing.T) { testPeekNoValue(t, b) })
			t.Run("BadInput", func(t *testing.T) { testPeekBadInput(t, b) })
		})
	}
}

// peekWant is what one Peek must return.
type peekWant struct {
	val     string
	found   bool
	err     error
	outcome Outcome
}

func checkPeek(t *testing.T, c *Cache, key, what string, want peekWant) {
	t.Helper()
	o := Outcome(255) // Peek must set it whatever it finds
	v, found, err := c.Peek(WithOutcome(context.Background(), &o), key)
	if string(v) != want.val || found != want.found || !errors.Is(err, want.err) || (want.err == nil && err != nil) || o != want.outcome {
		t.Errorf("%s: Peek = (%q, %v, %v), outcome %v; want (%q, %v, %v), outcome %v",
			what, v, found, err, o, want.val, want.found, want.err, want.outcome)
	}
}

// A fresh value, a stale one, a negative entry: Peek returns each as Get
// would, starts no refresh, takes no lease and counts no lookup.
func testPeekAnswers(t *testing.T, b backend) {
	ctx := context.Background()
	clk := newFakeClock()
	c := withClock(newTestCache(t, b.rdb, &Options{StaleFor: time.Hour, NegativeTTL: time.Minute}), clk)
	key := testKey(t)
	if err := c.Set(ctx, key, []byte("v1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	checkPeek(t, c, key, "fresh", peekWant{"v1", true, nil, OutcomeHit})
	v, _, _ := c.Peek(ctx, key)
	v[0] = 'X'
	checkPeek(t, c, key, "after the caller changed its slice", peekWant{"v1", true, nil, OutcomeHit})

	clk.Advance(2 * time.Minute)
	checkPeek(t, c, key, "stale (within StaleFor)", peekWant{"v1", true, nil, OutcomeStale})
	if n := b.rdb.Exists(ctx, mustKeys(t, key).Lease).Val(); n != 0 {
		t.Errorf("after a Peek of a stale value the key's lease is held: Peek must take no lease")
	}
	c.refreshMu.Lock()
	busy := len(c.refreshing)
	c.refreshMu.Unlock()
	if s := c.Stats(); busy != 0 || s.Refreshes != 0 || s.Leads != 0 || s.Hits != 0 || s.StaleServed != 0 || s.Misses != 0 {
		t.Errorf("after Peeks: %d refreshes running, Stats %+v; want no refresh, no lease and no lookup counted", busy, s)
	}
	clk.Advance(time.Hour)
	checkPeek(t, c, key, "past its stale window", peekWant{"", false, nil, OutcomeUnknown})

	neg := key + "neg"
	if _, err := c.Get(ctx, neg, time.Minute, func(context.Context) ([]byte, error) { return nil, ErrNotFound }); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	checkPeek(t, c, neg, "negative entry", peekWant{"", true, ErrNotFound, OutcomeNegative})
	clk.Advance(2 * time.Minute)
	checkPeek(t, c, neg, "stale negative entry", peekWant{"", true, ErrNotFound, OutcomeStale})

	// Soft-invalidated: stale at once.
	soft := key + "soft"
	if err := c.Set(ctx, soft, []byte("s1"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := c.InvalidateSoft(ctx, soft); err != nil {
		t.Fatal(err)
	}
	checkPeek(t, c, soft, "after InvalidateSoft", peekWant{"s1", true, nil, OutcomeStale})
}

// No key, a pass mark, corrupt bytes and a foreign type are all "not
// found", with no error.
func testPeekNoValue(t *testing.T, b backend) {
	ctx := context.Background()
	c := newTestCache(t, b.rdb, nil)
	key := testKey(t)
	checkPeek(t, c, key, "never written", peekWant{"", false, nil, OutcomeUnknown})

	pass := key + "pass"
	_, fill, err := c.Begin(ctx, pass, time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin = (%v, %v), want a Fill", fill, err)
	}
	if err := fill.Pass(errors.New("per user"), time.Minute); err != nil {
		t.Fatal(err)
	}
	checkPeek(t, c, pass, "pass mark", peekWant{"", false, nil, OutcomePass})

	bad := key + "corrupt"
	if err := b.rdb.Set(ctx, mustKeys(t, bad).Value, "\x01garbage", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	checkPeek(t, c, bad, "corrupt bytes", peekWant{"", false, nil, OutcomeUnknown})
	if n := c.Stats().Corrupt; n != 1 {
		t.Errorf("Stats.Corrupt = %d, want 1", n)
	}

	foreign := key + "foreign"
	if err := b.rdb.HSet(ctx, mustKeys(t, foreign).Value, "a", "b").Err(); err != nil {
		t.Fatal(err)
	}
	checkPeek(t, c, foreign, "a hash at the value key", peekWant{"", false, nil, OutcomeUnknown})
}

func testPeekBadInput(t *testing.T, b backend) {
	c := New(b.rdb, nil)
	ctx := context.Background()
	if _, _, err := c.Peek(ctx, ""); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Peek(\"\") = %v, want ErrInvalidKey", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := c.Peek(cctx, testKey(t)); !errors.Is(err, context.Canceled) {
		t.Errorf("Peek with a cancelled ctx = %v, want context.Canceled", err)
	}
	c.Close()
	if _, _, err := c.Peek(ctx, testKey(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("Peek after Close = %v, want ErrClosed", err)
	}
}

// TestPeekRedisDown: with Redis gone, Peek returns an error wrapping
// ErrUnavailable and the cause (there is no loader to fail open to), also
// while the breaker is open, and works again once Redis is back.
func TestPeekRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t, shortTimeouts), &Options{BreakerThreshold: 2, BreakerCooldown: 300 * time.Millisecond})
	ctx := context.Background()
	if err := c.Set(ctx, "k", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	srv.Kill(t)
	_, found, err := c.Peek(ctx, "k")
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) || found {
		t.Fatalf("Peek with Redis killed = (found %v, %v), want ErrUnavailable wrapping the connection error", found, err)
	}
	_, _, _ = c.Peek(ctx, "k") // the second failure opens the breaker
	if s := c.Stats(); s.BreakerOpens != 1 {
		t.Fatalf("BreakerOpens = %d, want 1 after %d failed Peeks", s.BreakerOpens, 2)
	}
	if _, _, err := c.Peek(ctx, "k"); !errors.Is(err, ErrUnavailable) || !errors.Is(err, errBreakerOpen) {
		t.Errorf("Peek with the breaker open = %v, want ErrUnavailable wrapping the open breaker", err)
	}
	srv.Restart(t) // empty
	waitFor(t, 10*time.Second, "Peek to reach Redis again", func() bool {
		_, found, err := c.Peek(ctx, "k")
		return err == nil && !found
	})
	if err := c.Set(ctx, "k", []byte("v2"), time.Hour); err != nil {
		t.Fatal(err)
	}
	checkPeek(t, c, "k", "after the restart", peekWant{"v2", true, nil, OutcomeHit})
}

// TestPeekReadYourWrites: a Peek in one Cache that starts after a write
// of another Cache returned sees that write, every time.
func TestPeekReadYourWrites(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()
	w := newTestCache(t, srv.Client(t), nil)
	r := newTestCache(t, srv.Client(t), nil)
	for i := range 50 {
		val := fmt.Sprint("v", i)
		if err := w.Set(ctx, "k", []byte(val), time.Hour); err != nil {
			t.Fatal(err)
		}
		checkPeek(t, r, "k", "after Set", peekWant{val, true, nil, OutcomeHit})
		if err := w.InvalidateSoft(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		checkPeek(t, r, "k", "after InvalidateSoft", peekWant{val, true, nil, OutcomeStale})
		if err := w.Invalidate(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		checkPeek(t, r, "k", "after Invalidate", peekWant{"", false, nil, OutcomeUnknown})
	}
}

// TestPeekReplicaReadsNoStale: a Cache on a cluster client that routes
// reads to replicas must Peek from the master: its replica is cut off and
// still holds v1 after Set(v2), InvalidateSoft and Invalidate returned.
func TestPeekReplicaReadsNoStale(t *testing.T) {
	t.Parallel()
	cl := redistest.StartClusterReplicas(t, 3, 1)
	ctx := context.Background()
	ro := cl.Client(t, func(o *redis.ClusterOptions) { o.ReadOnly = true })
	c := newTestCache(t, ro, &Options{ReplicaAcks: -1}) // the replica is cut off on purpose
	key := "replicated"
	vkey := mustKeys(t, key).Value
	master, replica := slotNodes(t, ro, vkey)
	if err := c.Set(ctx, key, []byte("v1"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if n, err := master.Wait(ctx, 1, 10_000).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v: the replica did not get v1", n, err)
	}
	for _, kv := range [][2]string{{"masteruser", "herd-test-nobody"}, {"masterauth", "wrong"}} {
		if err := replica.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := replica.Do(ctx, "CLIENT", "KILL", "TYPE", "master").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the replica's master link to go down", func() bool {
		return bytes.Contains([]byte(replica.Info(ctx, "replication").Val()), []byte("master_link_status:down"))
	})
	stale := func(what string) {
		t.Helper()
		if b, _ := ro.Get(ctx, vkey).Bytes(); !bytesHavePayload(b, "v1") {
			t.Fatalf("%s: the ReadOnly client's own GET does not reach the stale replica (the test proves nothing)", what)
		}
		if env, ok := wire.DecodeEnvelope([]byte(replica.Get(ctx, vkey).Val())); !ok || env.SoftExp.Equal(env.WrittenAt) {
			t.Fatalf("%s: the replica does not hold the fresh v1 (the test proves nothing)", what)
		}
	}
	if err := c.Set(ctx, key, []byte("v2"), time.Hour); err != nil {
		t.Fatal(err)
	}
	stale("after Set(v2)")
	checkPeek(t, c, key, "after Set(v2)", peekWant{"v2", true, nil, OutcomeHit})
	if err := c.InvalidateSoft(ctx, key); err != nil {
		t.Fatal(err)
	}
	stale("after InvalidateSoft")
	checkPeek(t, c, key, "after InvalidateSoft", peekWant{"v2", true, nil, OutcomeStale})
	if err := c.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	stale("after Invalidate")
	checkPeek(t, c, key, "after Invalidate", peekWant{"", false, nil, OutcomeUnknown})
}

// getHook signals each GET the client sends, and counts their replies.
type getHook struct {
	sent    chan<- struct{}
	replies *atomic.Int64
}

func (h getHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h getHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "get" {
			return next(ctx, cmd)
		}
		h.sent <- struct{}{}
		err := next(ctx, cmd)
		// A GET that Close's cancellation ended (in the pool's wait or a
		// dial) is not a reply of Redis.
		if !errors.Is(err, context.Canceled) {
			h.replies.Add(1)
		}
		return err
	}
}
func (h getHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// BenchmarkPeek compares Peek with a raw go-redis GET of the same bytes
// and with Cache.Get's hit, on a real redis-server, in the same run.
func BenchmarkPeek(b *testing.B) {
	rdb := redistest.Start(b).Client(b)
	c := newTestCache(b, rdb, nil)
	ctx := context.Background()
	payload := make([]byte, 512)
	if err := c.Set(ctx, "k", payload, time.Hour); err != nil {
		b.Fatal(err)
	}
	if err := rdb.Set(ctx, "raw", (&envelope{Payload: payload}).Encode(), time.Hour).Err(); err != nil {
		b.Fatal(err)
	}
	fail := func(context.Context) ([]byte, error) { panic("a hit called the loader") }
	b.Run("RawGET", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := rdb.Get(ctx, "raw").Bytes(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Peek", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok, err := c.Peek(ctx, "k"); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
	})
	b.Run("CacheGet", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Get(ctx, "k", time.Hour, fail); err != nil {
				b.Fatal(err)
			}
		}
	})
}
