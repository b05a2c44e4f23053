package herd

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// closeAtkTimeout is the client timeout of the Close attacks below: go-redis
// keeps its default MaxRetries (3), so a command Close waits for must not
// be re-sent once Close began, or Close waits out the timeouts once per
// try. Through the proxy's blackhole a retry dials a new connection (the
// one that timed out is dropped) whose HELLO waits out the read timeout;
// where connects hang too, each of the MaxRetries dials waits out the
// dial timeout.
const closeAtkTimeout = time.Second

// closeAtkBound is how long Close may take with one command in a
// blackhole: the rest of the read timeout of its one try, with slack for
// a loaded machine. A retry is caught by the dial it makes (closeTakes),
// not by this bound, which only stops a hang.
const closeAtkBound = 3 * closeAtkTimeout

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

// closeAtkRig is a fault rig with a client through the proxy (1 s
// timeouts, default retries) whose first EVALSHA of sha blackholes Redis.
func closeAtkRig(t *testing.T, sha string) (*faultRig, *redis.Client, *blackholeOn) {
	r := newFaultRig(t)
	rdb := r.client(timeouts{dial: closeAtkTimeout, read: closeAtkTimeout, write: closeAtkTimeout})
	h := &blackholeOn{sha: sha, on: func() { r.proxy.SetBlackhole(true) }, entered: make(chan struct{})}
	rdb.AddHook(cmdHook{before: h.see})
	return r, rdb, h
}

// closeTakes closes c and fails when go-redis dialed for a retry while
// Close waited (a new connection to the proxy), or when Close took longer
// than closeAtkBound.
func closeTakes(t *testing.T, r *faultRig, what string, c interface{ Close() error }) {
	t.Helper()
	start, dialed := time.Now(), r.proxy.Stats().Accepted
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(closeAtkBound):
		<-done
		t.Errorf("%s: Close with one command in a blackhole took %v, past the client's %v timeouts",
			what, time.Since(start).Round(time.Millisecond), closeAtkTimeout)
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
			r, rdb, h := closeAtkRig(t, tc.sha)
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
			r, rdb, h := closeAtkRig(t, commitScript.rs.Hash())
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
