package middleware

// A value the middleware cannot serve is replaced by the next rebuild
// (replaceCorrupt), at most once per request, and once per key for the
// concurrent requests of a process. TestCorruptEntries (security_test.go)
// has the kinds of bad values.

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// invalidateHook watches a client's runs of herd's INVALIDATE script
// (Cache.Invalidate): before, if set, is called before each attempt;
// done counts the runs that succeeded, and after, if set, is called after
// each.
type invalidateHook struct {
	sha, src      string
	before, after func()
	done          atomic.Int64
}

func newInvalidateHook(t *testing.T) *invalidateHook {
	t.Helper()
	src, err := os.ReadFile("../scripts/invalidate.lua")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum(src)
	return &invalidateHook{sha: hex.EncodeToString(sum[:]), src: string(src)}
}

func (hk *invalidateHook) is(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	name, _ := args[0].(string)
	body, _ := args[1].(string)
	return (strings.EqualFold(name, "evalsha") && body == hk.sha) || (strings.EqualFold(name, "eval") && body == hk.src)
}

func (hk *invalidateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (hk *invalidateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !hk.is(cmd) {
			return next(ctx, cmd)
		}
		if hk.before != nil {
			hk.before()
		}
		err := next(ctx, cmd)
		if err == nil {
			hk.done.Add(1)
			if hk.after != nil {
				hk.after()
			}
		}
		return err
	}
}

func (hk *invalidateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// hookedCache returns a Cache whose client runs hk, and another Cache on
// the same redis-server: another writer of the same keys.
func hookedCache(t *testing.T, hk *invalidateHook) (c, other *herd.Cache) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	rdb.AddHook(hk)
	c, other = herd.New(rdb, nil), herd.New(srv.Client(t), nil)
	t.Cleanup(func() { c.Close(); other.Close() })
	shareScopes(c) // a middleware per router
	return c, other
}

// TestCorruptEntryReplacedOncePerRequest: a writer that puts its own
// value back as soon as the middleware deleted it cannot make a request
// delete it over and over: the request deletes it once, finds it again,
// and is served by the handler, uncached. Once the writer stops, the next
// request stores a good entry, and the one after is a hit.
func TestCorruptEntryReplacedOncePerRequest(t *testing.T) {
	hk := newInvalidateHook(t)
	c, other := hookedCache(t, hk)
	foreign := []byte("another writer's value")
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				io.WriteString(w, "fresh")
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			url := srv.URL + "/rewritten"
			key := secKeyOfURL(t, nil, url)
			var rewrite atomic.Bool
			rewrite.Store(true)
			var setErr atomic.Value
			hk.after = func() {
				if rewrite.Load() {
					if err := other.Set(context.Background(), key, foreign, time.Minute); err != nil {
						setErr.Store(err)
					}
				}
			}
			t.Cleanup(func() { hk.after = nil })
			hk.done.Store(0)
			if err := other.Set(context.Background(), key, foreign, time.Minute); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				r := secGet(t, cl, url)
				if r.cacheStatus() != withDetail(statusBypass, detailUnservable) || r.body != "fresh" {
					t.Errorf("request %d while the writer rewrites: %v, want the handler's, bypassed (detail %s)", i, r, detailUnservable)
				}
				if got := hk.done.Load(); got != int64(i+1) {
					t.Errorf("after request %d: %d deletions, want %d (one per request)", i, got, i+1)
				}
			}
			if err, _ := setErr.Load().(error); err != nil {
				t.Fatal(err)
			}
			rewrite.Store(false)
			for i, want := range []string{statusStored, statusHit} {
				if r := secGet(t, cl, url); !strings.HasPrefix(r.cacheStatus(), want) || r.body != "fresh" {
					t.Errorf("request %d after the writer stopped: %v, want %q", i, r, want)
				}
			}
			if got := runs.Load(); got != 3 {
				t.Errorf("the handler ran %d times, want 3", got)
			}
		})
	}
}

// TestCorruptEntryReplacedOnce: the concurrent requests of a process that
// find one bad value share its deletion: one Redis write, not one per
// request, and one rebuild, which they all get.
func TestCorruptEntryReplacedOnce(t *testing.T) {
	hk := newInvalidateHook(t)
	c, other := hookedCache(t, hk)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				io.WriteString(w, "fresh")
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			url := srv.URL + "/corrupt-many"
			if err := other.Set(context.Background(), secKeyOfURL(t, nil, url), []byte("junk"), time.Minute); err != nil {
				t.Fatal(err)
			}
			hk.done.Store(0)
			gate := newSecGate(t)
			var first sync.Once
			hk.before = func() { first.Do(func() { <-gate.ch }) } // holds the first deletion
			t.Cleanup(func() { hk.before = nil })
			const n = 8
			reqs := make([]*http.Request, n)
			for i := range reqs {
				reqs[i] = secNewReq(t, http.MethodGet, url, nil)
			}
			batch := secParallel(cl, reqs)
			secWaitForState(t, "every request in replaceCorrupt", func() (bool, string) {
				got := inReplaceCorrupt()
				return got == n, strings.Repeat("|", got)
			})
			gate.open()
			out := batch.wait(t)
			if got := secCount(out, func(r secResp) bool { return r.status == 200 && r.body == "fresh" }); got != n {
				t.Errorf("%d of %d responses are the page: %v", got, n, out)
			}
			if got := secCount(out, func(r secResp) bool { return sameStatus(r.cacheStatus(), statusStored) }); got != 1 {
				t.Errorf("%d responses stored, want 1: %v", got, out)
			}
			if got := hk.done.Load(); got != 1 {
				t.Errorf("%d deletions for %d requests, want 1", got, n)
			}
			if got := runs.Load(); got != 1 {
				t.Errorf("the handler ran %d times, want 1", got)
			}
			if r := secGet(t, cl, url); !strings.HasPrefix(r.cacheStatus(), statusHit) {
				t.Errorf("next request: %v, want a hit", r)
			}
		})
	}
}

// inReplaceCorrupt counts the goroutines in handler.replaceCorrupt.
func inReplaceCorrupt() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), "middleware.(*handler).replaceCorrupt(")
}
