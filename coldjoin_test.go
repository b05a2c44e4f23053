package herd

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/faultproxy"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// holdAcquireReply holds the first ACQUIRE its client runs AFTER Redis has
// run it (its reply is in), until release closes: the reply of a script
// that already took effect on the server is still on its way to the
// flight.
type holdAcquireReply struct {
	once    atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func newHoldAcquireReply() *holdAcquireReply {
	return &holdAcquireReply{held: make(chan struct{}), release: make(chan struct{})}
}

func (h *holdAcquireReply) after(cmds ...redis.Cmder) {
	for _, cmd := range cmds {
		if isAcquireCmd(cmd) && h.once.CompareAndSwap(false, true) {
			close(h.held)
			<-h.release
			return
		}
	}
}

func (h *holdAcquireReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdAcquireReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.after(cmd)
		return err
	}
}
func (h *holdAcquireReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.after(cmds...)
		return err
	}
}

// A cold read's ACQUIRE wins the lease on the server; before its reply
// reaches the flight, another process Sets the key, the Set returns, and
// only then a second cold read of the key begins in this process and
// joins the first one's flight (its gate is still open: the reply has
// not been read). No look of that flight comes after the joiner began, so
// the flight sends it away once the ACQUIRE's reply is in, and it reads
// the Set's value at once: not the load's error, nor after the load
// (read-your-writes, as TestColdReadDoesNotJoinAnOlderFlight asks of a
// Get that starts after a Set while an older load runs).
func TestColdJoinerOfAWonLeaseReadsAWriteAtOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name string
		err  error // the load's error; nil: the load blocks until the test ends
	}{{"load fails", errors.New("source down")}, {"load blocks", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bg := context.Background()
			rdb := srv.Client(t)
			c := newTestCache(t, rdb, nil)
			w := newTestCache(t, srv.Client(t), nil) // another process: the writer
			missOnce(t, c, "first-miss-"+tc.name)
			h := newHoldAcquireReply()
			rdb.AddHook(h)
			key := testKey(t)
			gate := make(chan struct{})
			aDone := make(chan struct{})
			go func() {
				defer close(aDone)
				c.Get(bg, key, time.Hour, func(context.Context) ([]byte, error) {
					if tc.err != nil {
						return nil, tc.err
					}
					<-gate
					return []byte("loaded"), nil
				})
			}()
			defer func() { close(gate); <-aDone }()
			select {
			case <-h.held: // the cold read's ACQUIRE took the lease; its reply is held
			case <-time.After(10 * time.Second):
				t.Fatal("no cold ACQUIRE")
			}
			if err := w.Set(bg, key, []byte("set"), time.Hour); err != nil {
				t.Fatal(err)
			}
			if !c.warm.cold() || c.warm.known(warmID(mustKeys(t, key).Value)) {
				t.Fatal("the test needs a cold read of the key")
			}
			res := startJoiner(t, c, key, 3*time.Second)
			close(h.release)
			r := res()
			if r.err != nil || string(r.v) != "set" {
				t.Fatalf("a cold read begun after the Set returned: (%q, %v) after %v; want the Set's value at once", r.v, r.err, r.took)
			}
		})
	}
}

// A cold read finds the lease held (another process loads) and follows;
// its subscription's confirmation is slow to come (a slow link), so its
// flight admits cold reads until the look the confirmation starts.
// Meanwhile another process Sets the key and, after the Set returned, a
// second cold read begins and joins. The wait budget (WaitTimeout,
// Fallback ReturnError) runs out before the confirmation: the flight ends
// with no look sent after the joiner came, so the joiner does not take
// its ErrWaitTimeout but reads the key, and gets the Set's value.
func TestColdJoinerOfAFollowerThatDidNotLookAgainReadsAWrite(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	bg := context.Background()
	const lease = 10 * time.Second
	quiet := func(o *Options) *Options {
		o.MinLease, o.MaxLease, o.DefaultLease = lease, lease, lease
		o.PollMin, o.PollMax = 10*time.Second, 10*time.Second
		return o
	}
	l := r.cache(r.direct, quiet(&Options{}))
	w := r.cache(r.direct, quiet(&Options{}))
	slow := r.client(timeouts{dial: 5 * time.Second, read: 10 * time.Second, write: 10 * time.Second})
	a := r.cache(slow, quiet(&Options{WaitTimeout: 400 * time.Millisecond, Fallback: ReturnError}))
	missOnce(t, a, "first-miss")
	// A's pub/sub connection is up before the link slows down.
	warm, _, err := a.notify.Subscribe(bg, "warm-channel")
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Release()
	key := testKey(t)
	g := newGatedLoader("from L")
	lDone := make(chan struct{})
	go func() { defer close(lDone); l.Get(bg, key, time.Hour, g.load) }()
	g.waitEntered(t)
	defer func() { close(g.gate); <-lDone }()

	r.proxy.SetLatency(faultproxy.Downstream, 1500*time.Millisecond)
	defer r.proxy.SetLatency(faultproxy.Downstream, 0)
	f1 := make(chan error, 1)
	go func() {
		_, err := a.Get(bg, key, time.Hour, noLoad(t))
		f1 <- err
	}()
	waitFor(t, 10*time.Second, "A's first cold read to follow", func() bool { return a.Stats().Waits == 1 })
	if err := w.Set(bg, key, []byte("set"), time.Hour); err != nil {
		t.Fatal(err)
	}
	res := startJoiner(t, a, key, 10*time.Second)()
	t.Logf("first cold read: %v", <-f1)
	if res.err != nil || string(res.v) != "set" {
		t.Fatalf("a cold read begun after the Set returned: (%q, %v) after %v; want the Set's value", res.v, res.err, res.took)
	}
}

// joinerResult is what startJoiner's Get returned, and how long it took.
type joinerResult struct {
	v    []byte
	err  error
	took time.Duration
}

// startJoiner starts a Get of key in c, under timeout, and waits until it
// has joined the key's running flight (it fails t if the Get returns
// first: the test's case was not set up). The returned function waits for
// the Get's result.
func startJoiner(t *testing.T, c *Cache, key string, timeout time.Duration) func() joinerResult {
	t.Helper()
	done := make(chan joinerResult, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		v, err := c.Get(ctx, key, time.Hour, noLoad(t))
		done <- joinerResult{v, err, time.Since(start).Round(time.Millisecond)}
	}()
	waitFor(t, 10*time.Second, "the cold read to join the running flight", func() bool {
		select {
		case r := <-done:
			t.Fatalf("the cold read returned (%q, %v) before it joined the flight: the test did not set up its case", r.v, r.err)
		default:
		}
		return FlightJoiners(c, key) >= 1
	})
	return func() joinerResult { return <-done }
}
