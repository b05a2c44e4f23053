package herd

// Attacks on the loader's error as other processes see it: what a
// failure message carries (text cut to 1 KiB, ErrValueTooLarge), and a
// loader error whose Error method panics. Each Cache is one instance on
// its own Redis client, so what reaches the follower crossed Redis as it
// would between processes (the NoShare cases, which need the retry of
// several processes, are waves of TestLoadErrorAcrossProcesses).

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// attackErrFollow starts a Get of key on c whose loader counts its calls
// and fails, and waits until it follows another instance's rebuild.
func attackErrFollow(t *testing.T, c *Cache, key string) (res <-chan error, calls *atomic.Int64) {
	t.Helper()
	ch, n := make(chan error, 1), new(atomic.Int64)
	before := c.Stats().Waits
	go func() {
		_, err := c.Get(context.Background(), key, time.Minute, func(context.Context) ([]byte, error) {
			n.Add(1)
			return nil, errors.New("the follower's own loader ran")
		})
		ch <- err
	}()
	waitFor(t, 10*time.Second, "the follower to wait", func() bool { return c.Stats().Waits > before })
	return ch, n
}

// attackErrLeaseHeld reports whether key's lease is held.
func attackErrLeaseHeld(t *testing.T, rdb *redis.Client, key string) bool {
	t.Helper()
	keys, _ := makeKeys(DefaultPrefix, key)
	n, err := rdb.Exists(context.Background(), keys.Lease).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// panickyErr is a loader's error whose Error method panics, as one of a
// custom type with a nil field does.
type panickyErr struct{ inner error }

func (e *panickyErr) Error() string { return "query: " + e.inner.Error() }

// An error whose Error method panics is the loader's panic: the lease is
// released at once and the follower in another instance gets a remote
// *PanicError, without loading. On main the panic struck in the leader's
// settle, after the loader's recover: its callers got a PanicError, but
// the lease stayed held until it ran out, and the follower then took
// over and called its own loader. Get and GetMany (whose per-key errors
// a *ManyError carries).
func TestLoadErrorPanickingErrorMethod(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const lease = 2 * time.Second
	opt := &Options{MinLease: lease, MaxLease: lease, DefaultLease: lease}
	a := newTestCache(t, srv.Client(t), opt)
	b := newTestCache(t, srv.Client(t), opt)
	for _, tc := range []struct {
		name string
		lead func(ctx context.Context, key string, gate <-chan struct{}) error
	}{
		{"Get", func(ctx context.Context, key string, gate <-chan struct{}) error {
			_, err := a.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) {
				<-gate
				return nil, &panickyErr{}
			})
			return err
		}},
		{"GetMany", func(ctx context.Context, key string, gate <-chan struct{}) error {
			_, err := a.GetMany(ctx, []string{key}, time.Minute, func(context.Context, []string) (map[string][]byte, error) {
				<-gate
				return nil, &ManyError{Errs: map[string]error{key: &panickyErr{}}}
			})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "panicky-" + tc.name
			gate, done := make(chan struct{}), make(chan error, 1)
			leads := a.Stats().Leads
			go func() { done <- tc.lead(context.Background(), key, gate) }()
			waitFor(t, 10*time.Second, "a to lead", func() bool { return a.Stats().Leads > leads })
			res, calls := attackErrFollow(t, b, key)
			close(gate)
			var pe *PanicError
			if err := recvOne(t, "a", done); !errors.As(err, &pe) || !errors.Is(err, ErrLoadFailed) {
				t.Errorf("a: %v, want a *LoadError holding a *PanicError", err)
			}
			if attackErrLeaseHeld(t, rdb, key) {
				t.Errorf("the lease is still held after the leader returned: not released at once")
			}
			err := recvOne(t, "b", res)
			var le *LoadError
			if !errors.As(err, &le) || !le.Remote || !errors.As(err, &pe) || !pe.Remote {
				t.Errorf("b: %v, want a remote *LoadError holding a remote *PanicError", err)
			}
			if n := calls.Load(); n != 0 {
				t.Errorf("b's loader ran %d times, want 0 (it took the lease over instead of hearing the failure)", n)
			}
		})
	}
}

// The text a failure message carries is cut to 1 KiB at a character
// boundary: a follower's Msg is valid UTF-8 (a JSON log line or a gRPC
// status needs it) and a prefix of the leader's. On main the cut fell
// inside a 2-byte character.
func TestLoadErrorFailTextCutAtCharacter(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	b := newTestCache(t, srv.Client(t), nil)
	cause := "x" + strings.Repeat("é", 1000) // byte 1024 is inside an é
	release, done := failingLeader(t, a, "long", errors.New(cause))
	res, _ := attackErrFollow(t, b, "long")
	release()
	recvOne(t, "a", done)
	var le *LoadError
	if err := recvOne(t, "b", res); !errors.As(err, &le) || !le.Remote {
		t.Fatalf("b: %v, want a remote *LoadError", err)
	}
	if len(le.Msg) > maxFailText || len(le.Msg) < maxFailText-utf8.UTFMax || !strings.HasPrefix(cause, le.Msg) {
		t.Errorf("b: Msg of %d bytes, want a prefix of the cause of at most %d", len(le.Msg), maxFailText)
	}
	if !utf8.ValidString(le.Msg) {
		t.Errorf("b: Msg is not valid UTF-8: it ends %q", le.Msg[len(le.Msg)-4:])
	}
}

// A loader's value above MaxValueBytes is ErrValueTooLarge for every
// caller: in a follower of another instance (on main a remote LoadError
// that errors.Is did not find it in) and in a load without a lease while
// Redis is unreachable (on main a bare ErrValueTooLarge, not the
// *LoadError a leader's callers get).
func TestLoadErrorValueTooLargeEverywhere(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	opt := &Options{MaxValueBytes: 8}
	a := newTestCache(t, srv.Client(t), opt)
	b := newTestCache(t, srv.Client(t), opt)
	gate, done := make(chan struct{}), make(chan error, 1)
	big := func(context.Context) ([]byte, error) { <-gate; return make([]byte, 64), nil }
	go func() { _, err := a.Get(context.Background(), "big", time.Minute, big); done <- err }()
	waitFor(t, 10*time.Second, "a to lead", func() bool { return a.Stats().Leads == 1 })
	res, _ := attackErrFollow(t, b, "big")
	close(gate)
	check := func(who string, err error, remote bool) {
		t.Helper()
		var le *LoadError
		if !errors.As(err, &le) || le.Remote != remote || !errors.Is(err, ErrValueTooLarge) {
			t.Errorf("%s: %v, want a *LoadError (Remote %v) that is ErrValueTooLarge", who, err, remote)
		}
	}
	check("a (leader)", recvOne(t, "a", done), false)
	check("b (follower)", recvOne(t, "b", res), true)

	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { dead.Close() })
	down := newTestCache(t, dead, opt)
	_, err := down.Get(context.Background(), "big", time.Minute, func(context.Context) ([]byte, error) { return make([]byte, 64), nil })
	check("a load without Redis", err, false)
}
