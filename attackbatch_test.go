package herd

// Attacks on the batch reads (GetMany, FetchMany), Peek and
// InvalidateSoft: each test tries to break one documented claim against
// a real redis-server (or a 3-master Cluster, or several OS processes).

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// atkLeaseOpts are Options with a fixed lease of d.
func atkLeaseOpts(d time.Duration) *Options {
	return &Options{MinLease: d, MaxLease: d, DefaultLease: d}
}

// atkLeaseHeld reports whether key's lease exists in Redis.
func atkLeaseHeld(t *testing.T, rdb redis.UniversalClient, key string) bool {
	t.Helper()
	keys, err := makeKeys(DefaultPrefix, key)
	if err != nil {
		t.Fatal(err)
	}
	n, err := rdb.Exists(context.Background(), keys.lease).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// A ManyLoadFunc that fails nothing but returns its *ManyError variable,
// still nil, as the error (a typed nil in a non-nil error: the classic Go
// slip) must not turn into a failure of herd's own. It is a *ManyError
// with no failed key: every key's value is served and stored, and no
// lease outlives the call. Before the fix, pick dereferenced the nil
// pointer: the batch failed with a PanicError of herd's, and the leases
// stayed held, renewed by their watchdogs up to MaxHold, so every other
// process waited for keys that were already loaded. FetchMany's wrapper
// had the same dereference (inside the loader: every key failed as a
// panic).
func TestAttackGetManyTypedNilManyError(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	opt := atkLeaseOpts(time.Second)
	opt.MaxHold = 30 * time.Second
	opt.LoadTimeout = 30 * time.Second
	c := newTestCache(t, rdb, opt)

	keys := manyKeys(t, 3)
	vals, err := c.GetMany(ctx, keys, time.Minute, func(_ context.Context, keys []string) (map[string][]byte, error) {
		var failed *ManyError // set only when a key fails; none does
		out := make(map[string][]byte, len(keys))
		for _, k := range keys {
			out[k] = []byte("v-" + k)
		}
		return out, failed
	})
	for _, k := range keys {
		if atkLeaseHeld(t, rdb, k) {
			t.Errorf("GetMany returned but the lease of %q is still held", k)
		}
	}
	if err != nil {
		t.Errorf("GetMany with a loader returning a nil *ManyError: %v", err)
	}
	checkValues(t, vals, keys, func(k string) string { return "v-" + k })

	fkeys := []string{t.Name() + "/f0", t.Name() + "/f1"}
	fvals, err := FetchMany(ctx, c, fkeys, time.Minute, func(_ context.Context, keys []string) (map[string]int, error) {
		var failed *ManyError
		out := make(map[string]int, len(keys))
		for i, k := range keys {
			out[k] = 40 + i
		}
		return out, failed
	})
	if err != nil {
		t.Errorf("FetchMany with a loader returning a nil *ManyError: %v", err)
	}
	if len(fvals) != 2 {
		t.Errorf("FetchMany = %v, want both keys", fvals)
	}
	// A nil *ManyError prints and unwraps without a panic.
	var nilME *ManyError
	if s := nilME.Error(); s == "" {
		t.Error("(*ManyError)(nil).Error() is empty")
	}
	if errs := nilME.Unwrap(); len(errs) != 0 {
		t.Errorf("(*ManyError)(nil).Unwrap() = %v", errs)
	}
}

// ManyLoadFunc's doc: keys are "in the order the caller gave them". A
// key whose first flight's answer is not current for the batch (a local
// Invalidate came after that flight's load began) takes a second round;
// keys that go round again must still reach the loader in the caller's
// order, not in the order their first flights happened to end.
func TestAttackGetManySecondRoundKeepsOrder(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	c := newTestCache(t, rdb, atkLeaseOpts(2*time.Second))
	keys := manyKeys(t, 3)

	// Three Gets lead the keys, each held at its own gate.
	gates := make([]*gatedLoader, len(keys))
	var gets sync.WaitGroup
	for i, k := range keys {
		gates[i] = newGatedLoader("old-" + k)
		gets.Go(func() { _, _ = c.Get(ctx, k, time.Minute, gates[i].load) })
		gates[i].waitEntered(t)
	}
	// Invalidations after those loads began: their commits are fenced,
	// and their values are not current for a batch that starts now.
	for _, k := range keys {
		if err := c.Invalidate(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	l := newManyLoader()
	type res struct {
		vals map[string][]byte
		err  error
	}
	done := make(chan res, 1)
	go func() {
		vals, err := c.GetMany(ctx, keys, time.Minute, l.load)
		done <- res{vals, err}
	}()
	// The batch joins the three running flights...
	waitFor(t, 10*time.Second, "the batch to join the Gets' flights", func() bool {
		c.group.mu.Lock()
		defer c.group.mu.Unlock()
		for _, k := range keys {
			if call := c.group.m[k]; call == nil || call.dups != 1 {
				return false
			}
		}
		return true
	})
	// ...which end in the reverse order of the keys.
	for i := len(keys) - 1; i >= 0; i-- {
		close(gates[i].gate)
		waitFor(t, 10*time.Second, "the flight to end", func() bool {
			c.group.mu.Lock()
			defer c.group.mu.Unlock()
			call := c.group.m[keys[i]]
			return call == nil || call.dups == 0
		})
	}
	gets.Wait()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	checkValues(t, r.vals, keys, func(k string) string { return "v-" + k })
	calls := l.got()
	if len(calls) != 1 || !slices.Equal(calls[0], keys) {
		t.Errorf("loader calls %q, want one call with the caller's keys in order %q", calls, keys)
	}
}

// closeHook blocks the first command whose arguments contain mark until
// release is closed, and tells entered when it got there.
type closeHook struct {
	mark    string
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (h *closeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *closeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.Contains(s, h.mark) {
				h.once.Do(func() {
					close(h.entered)
					<-h.release
				})
				break
			}
		}
		return next(ctx, cmd)
	}
}
func (h *closeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
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
func TestAttackGetManyCloseWhileCommitting(t *testing.T) {
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

// One master of a 3-master Cluster is killed. GetMany is Get for a set
// of keys, and the breaker's rule is that a probe's success is "any
// answer from Redis": a batch whose read was answered by the two live
// masters is an answer. So the keys on the dead master fail open (or fail
// with ErrUnavailable under FailClosed) and the keys on the live masters
// stay hits, batch after batch. Before the fix a batch read counted as a
// failure whenever any one reply was an infrastructure error, however
// many were answered: after BreakerThreshold batches the breaker opened,
// and since every probe batch again held a dead-master key it never
// closed; from then on every key of every batch, cached on a live master
// or not, was loaded locally (or failed, with FailClosed): one dead
// master in three disabled the cache for batches altogether.
func TestAttackGetManyMasterDownKeepsLiveHits(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	for _, s := range cl.Servers() {
		if err := s.Client(t).ConfigSet(ctx, "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
	}
	tune := func(o *redis.ClusterOptions) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
		o.MaxRetries, o.MaxRedirects, o.DialerRetries = 1, 3, 1
		o.MinRetryBackoff, o.MaxRetryBackoff = 8*time.Millisecond, 64*time.Millisecond
	}
	direct := cl.Client(t)
	victim := cl.Servers()[0]
	var live, dead []string
	for i := 0; len(live) < 4 || len(dead) < 2; i++ {
		k := fmt.Sprintf("%s/%d", t.Name(), i)
		if masterOf(t, direct, k) == victim.Addr() {
			if len(dead) < 2 {
				dead = append(dead, k)
			}
		} else if len(live) < 4 {
			live = append(live, k)
		}
	}
	keys := append(slices.Clone(live), dead...)
	open := newTestCache(t, cl.Client(t, tune), &Options{BreakerCooldown: 200 * time.Millisecond})
	closed := newTestCache(t, cl.Client(t, tune), &Options{BreakerCooldown: 200 * time.Millisecond, FailClosed: true})
	warm := newManyLoader()
	if _, err := open.GetMany(ctx, keys, time.Hour, warm.load); err != nil {
		t.Fatal(err)
	}
	victim.Kill(t)

	isLive := func(k string) bool { return slices.Contains(live, k) }
	for _, tc := range []struct {
		name string
		c    *Cache
	}{{"fail open", open}, {"FailClosed", closed}} {
		l := newManyLoader()
		l.entered = nil
		bad := 0
		for i := range 20 {
			vals, err := tc.c.GetMany(ctx, keys, time.Hour, l.load)
			var me *ManyError
			if err != nil && !errors.As(err, &me) {
				t.Fatalf("%s, batch %d: %v", tc.name, i, err)
			}
			for _, k := range live {
				if string(vals[k]) != "v-"+k || me != nil && me.Errs[k] != nil {
					bad++
					break
				}
			}
			for _, k := range dead {
				switch {
				case tc.c.cfg.FailClosed && (me == nil || !errors.Is(me.Errs[k], ErrUnavailable)):
					t.Errorf("%s, batch %d: dead-master key %s: (%q, %v), want ErrUnavailable", tc.name, i, k, vals[k], err)
				case !tc.c.cfg.FailClosed && string(vals[k]) != "v-"+k:
					t.Errorf("%s, batch %d: dead-master key %s = %q, want it loaded locally", tc.name, i, k, vals[k])
				}
			}
		}
		var liveLoads int
		for _, call := range l.got() {
			for _, k := range call {
				if isLive(k) {
					liveLoads++
				}
			}
		}
		s := tc.c.Stats()
		t.Logf("%s: %s", tc.name, cpStatsLine(s))
		if bad != 0 || liveLoads != 0 || s.BreakerOpens != 0 {
			t.Errorf("%s: in %d of 20 batches the live masters' cached keys were not served from Redis (%d loads of them, breaker opened %d times); want every batch to serve them", tc.name, bad, liveLoads, s.BreakerOpens)
		}
	}
	// go-redis keeps redialling the dead node (once a second) until it
	// answers: bring it back, so that those goroutines end.
	victim.Restart(t)
	waitFor(t, 10*time.Second, "go-redis to stop redialling the restarted node", func() bool {
		buf := make([]byte, 1<<20)
		return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*ConnPool).tryDial")
	})
}

// Ensure fmt and atomic stay used while tests are added.
var _ = fmt.Sprint
var _ atomic.Int64
