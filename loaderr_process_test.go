package herd

// The loader's error across OS processes (*LoadError, NoShare) and the
// followers' retry (Options.RetryFailedLoad). The parent starts 3 worker
// processes × g goroutines on one real redis-server; each wave is one
// cold key that every goroutine of every process Gets at once (the
// barriers and hooks of cache_process_test.go). The first loader call of
// a wave waits until every caller has entered Get and the other processes
// follow the rebuild, so that every caller belongs to that wave.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func init() {
	workerRoles["loaderr"] = loadErrWorker
}

// loadErrWaves are the waves of TestLoadErrorAcrossProcesses, in order.
var loadErrWaves = []struct {
	name  string
	retry bool // Options.RetryFailedLoad
	// many: the callers call GetMany, whose loader fails the key with
	// NoShare(&ManyError{the key: the loader's error})
	many bool
	// the first loader call fails with first; later calls return value,
	// or fail with later when it is set
	first, later func() error
	value        string
	// the text of the loader's error and an error it wraps, when not
	// loadErrCause and errDB
	cause string
	is    error
}{
	{name: "error", first: func() error { return fmt.Errorf("query users: %w", errDB) }},
	{name: "noshare", first: func() error { return NoShare(fmt.Errorf("query users: %w", errDB)) },
		later: func() error { return NoShare(fmt.Errorf("query users: %w", errDB)) }},
	{name: "retry-once", retry: true, first: func() error { return fmt.Errorf("query users: %w", errDB) }, value: "v2"},
	{name: "retry-dead", retry: true, first: func() error { return fmt.Errorf("query users: %w", errDB) },
		later: func() error { return fmt.Errorf("query users: %w", errDB) }},
	{name: "noshare-many", many: true, first: func() error { return fmt.Errorf("query users: %w", errDB) }, value: "v2"},
	{name: "noshare-notfound", first: func() error { return NoShare(fmt.Errorf("replica lags: %w", ErrNotFound)) },
		value: "v2", cause: "replica lags: herd: not found", is: ErrNotFound},
}

// loadErrCause is the text of the loader's error, unless a wave says.
const loadErrCause = "query users: db: connection reset"

// TestLoadErrorAcrossProcesses: 3 processes × 10 goroutines, one wave per
// case. What each caller got is checked in its own process (the worker
// fails on anything else) and counted here:
//   - error: one load; the 10 callers of the loader's process get a
//     *LoadError that unwraps to the loader's error (errors.Is); the 20
//     others get one with Remote set, Err nil, the cause's text, and the
//     key and cause once in the message (no repeated prefix);
//   - noshare: the loader's error is marked NoShare: the callers of the
//     two processes that ran a loader (the first leader and the retry's)
//     get their own error; the third process's callers get a remote
//     *LoadError without the error's text; the source is called twice;
//   - retry-once (RetryFailedLoad): one bad load, then the retry's value:
//     the followers of the other two processes are served by the retry;
//   - retry-dead (RetryFailedLoad): the source keeps failing: 2 calls in
//     the wave, and every caller gets a *LoadError;
//   - noshare-many: GetMany, whose loader marks its *ManyError NoShare:
//     that marks the key's error, so the other processes retry and get
//     the retry's value (on main the key's error reached them);
//   - noshare-notfound: the loader's ErrNotFound is marked NoShare: its
//     own callers get it in a *LoadError, no negative entry is stored,
//     and the other processes retry and get the retry's value (on main
//     every caller got ErrNotFound, cached for NegativeTTL).
//
// Each runs on one server and on a 3-master Cluster (sharded pub/sub).
func TestLoadErrorAcrossProcesses(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		loadErrAcrossProcesses(t, "redis", []string{srv.Addr()}, srv.Client(t))
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		loadErrAcrossProcesses(t, "cluster", cl.Addrs(), cl.Client(t))
	})
}

func loadErrAcrossProcesses(t *testing.T, mode string, addrs []string, rdb redis.UniversalClient) {
	const procs, g = 3, 10
	ctx := context.Background()
	prefix := cpNewPrefix()
	p := startWorkers(t, procs, "loaderr", cpEnvFor(mode, addrs, prefix, "", procs, g, len(loadErrWaves))...)
	p.wait(90 * time.Second)
	if t.Failed() {
		t.FailNow()
	}
	want := map[string]struct{ loads, local, remote, value int }{
		"error":      {1, g, 2 * g, 0},
		"noshare":    {2, 2 * g, g, 0},
		"retry-once": {2, g, 0, 2 * g},
		"retry-dead": {2, 2 * g, g, 0},
		// Both fail on main: the ManyError's key error was shared (1
		// load, 2g remote errors), NoShare(ErrNotFound) a negative entry.
		"noshare-many":     {2, g, 0, 2 * g},
		"noshare-notfound": {2, g, 0, 2 * g},
	}
	for _, wv := range loadErrWaves {
		count := func(what string) int {
			n, _ := rdb.Get(ctx, cpKey(prefix, wv.name, what)).Int()
			return n
		}
		got := struct{ loads, local, remote, value int }{count("loads"), count("local"), count("remote"), count("value")}
		if got != want[wv.name] {
			t.Errorf("wave %s: loads %d, local errors %d, remote errors %d, values %d; want %+v",
				wv.name, got.loads, got.local, got.remote, got.value, want[wv.name])
		}
		if sample, err := rdb.Get(ctx, cpKey(prefix, wv.name, "sample")).Result(); err == nil {
			t.Logf("wave %s: a remote caller's error: %s", wv.name, sample)
		}
		t.Logf("wave %s: %d loads; %d local errors, %d remote, %d values", wv.name, got.loads, got.local, got.remote, got.value)
	}
}

// loadErrWorker is one process of TestLoadErrorAcrossProcesses.
func loadErrWorker(ctx context.Context, _ string) error {
	w, err := cpNewWorker()
	if err != nil {
		return err
	}
	defer w.rdb.Close()
	const lease = 2 * time.Second
	opt := func(retry bool) *Options {
		return &Options{MinLease: lease, MaxLease: lease, DefaultLease: lease, WaitTimeout: 10 * time.Second, RetryFailedLoad: retry}
	}
	plain, retrying := New(w.rdb, opt(false)), New(w.rdb, opt(true))
	defer plain.Close()
	defer retrying.Close()

	for _, wv := range loadErrWaves {
		c := plain
		if wv.retry {
			c = retrying
		}
		name := wv.name
		key := w.key("user", name)
		cause, is := loadErrCause, error(errDB)
		if wv.cause != "" {
			cause, is = wv.cause, wv.is
		}
		var ranHere atomic.Bool // a loader of this wave ran in this process
		load := func(ctx context.Context) ([]byte, error) {
			n, err := w.rdb.Incr(ctx, w.key(name, "loads")).Result()
			if err != nil {
				return nil, err
			}
			if n == 1 {
				if err := w.waitEntered(ctx, name); err != nil {
					return nil, err
				}
				if err := w.waitFollowers(ctx, name, key); err != nil {
					return nil, err
				}
				if err := w.waitJoined(ctx, name); err != nil {
					return nil, err
				}
				ranHere.Store(true)
				return nil, wv.first()
			}
			ranHere.Store(true)
			if wv.later != nil {
				return nil, wv.later()
			}
			return []byte(wv.value), nil
		}
		go w.markJoined(ctx, c, name, key)
		err := w.runWave(ctx, name, func(i int) {
			if err := w.enter(ctx, name, i); err != nil {
				w.fail("wave %s: %v", name, err)
				return
			}
			gctx, cancel := context.WithTimeout(ctx, cpGetTimeout)
			defer cancel()
			var v []byte
			var err error
			if wv.many {
				var vals map[string][]byte
				vals, err = c.GetMany(gctx, []string{key}, cpValueTTL, func(ctx context.Context, keys []string) (map[string][]byte, error) {
					v, err := load(ctx)
					if err != nil {
						return nil, NoShare(&ManyError{Errs: map[string]error{key: err}})
					}
					return map[string][]byte{key: v}, nil
				})
				v = vals[key]
			} else {
				v, err = c.Get(gctx, key, cpValueTTL, load)
			}
			if what, bad := loadErrVerdict(key, v, err, ranHere.Load(), wv.value, cause, is); bad != "" {
				w.fail("wave %s goroutine %d: %s", name, i, bad)
			} else {
				if what == "remote" {
					w.rdb.SetNX(ctx, w.key(name, "sample"), err.Error(), 0)
					if name == "noshare" && !strings.Contains(err.Error(), notSharedText) {
						w.fail("wave %s goroutine %d: %v, want the not-shared LoadError", name, i, err)
					}
				}
				w.rdb.Incr(ctx, w.key(name, what))
			}
		})
		if err != nil {
			return err
		}
	}
	return w.err()
}

// loadErrVerdict classifies what a caller got: "value", "local" (the
// loader ran in this process) or "remote"; bad says what is wrong with it.
// The loader's error says cause and wraps is.
func loadErrVerdict(key string, v []byte, err error, ranHere bool, value, cause string, is error) (what, bad string) {
	if err == nil {
		if value == "" || string(v) != value {
			return "", fmt.Sprintf("Get = %q, nil; want an error or %q", v, value)
		}
		return "value", ""
	}
	var le *LoadError
	if !errors.As(err, &le) || !errors.Is(err, ErrLoadFailed) {
		return "", fmt.Sprintf("Get = %v (%T); want a *LoadError, errors.Is ErrLoadFailed", err, err)
	}
	msg := err.Error()
	if le.Key != key || strings.Count(msg, "load failed") != 1 || !strings.Contains(msg, strconv.Quote(key)) {
		return "", fmt.Sprintf("%q: want the key %q and \"load failed\" once", msg, key)
	}
	switch {
	case ranHere:
		if le.Remote || !errors.Is(err, is) || le.Msg != cause || strings.Count(msg, cause) != 1 {
			return "", fmt.Sprintf("%q (Remote %v): the loader ran here: want Remote false, errors.Is %v, the cause once", msg, le.Remote, is)
		}
		return "local", ""
	case le.Remote && le.Err == nil && !errors.Is(err, is) && (le.Msg == cause || le.Msg == notSharedText):
		// The unshared error's own text, not a bare "db:": the key's random
		// run prefix can hold that (cp-…usdb:user:noshare failed CI).
		if le.Msg == notSharedText && strings.Contains(msg, errDB.Error()) {
			return "", fmt.Sprintf("%q: an unshared error's text reached another process", msg)
		}
		if strings.Count(msg, le.Msg) != 1 {
			return "", fmt.Sprintf("%q: want the cause once", msg)
		}
		return "remote", ""
	}
	return "", fmt.Sprintf("%q (%+v): want a remote *LoadError with the cause, Err nil", msg, *le)
}

// markJoined records, under name:joined, that all g callers of this
// process have joined c's local flight of key (so none can start a
// second flight after the first one ends). Bounded by cpBarrierTimeout.
func (w *cpWorker) markJoined(ctx context.Context, c *Cache, name, key string) {
	for deadline := time.Now().Add(cpBarrierTimeout); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		c.group.mu.Lock()
		call := c.group.m[key]
		n := 0
		if call != nil {
			n = call.callers()
		}
		c.group.mu.Unlock()
		if n == w.g {
			w.rdb.SAdd(ctx, w.key(name, "joined"), w.inst)
			return
		}
	}
}

// waitJoined is the first loader call's hook: it waits until the callers
// of every process have joined their process's flight.
func (w *cpWorker) waitJoined(ctx context.Context, name string) error {
	for deadline := time.Now().Add(cpBarrierTimeout); ; time.Sleep(time.Millisecond) {
		n, err := w.rdb.SCard(ctx, w.key(name, "joined")).Result()
		if err != nil {
			return err
		}
		if n >= int64(w.procs) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d processes joined their flight of wave %s within %v", n, w.procs, name, cpBarrierTimeout)
		}
	}
}
