package middleware

import (
	"context"
	"github.com/go-chi/chi/v5"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cmdCount counts the commands a client sends.
type cmdCount struct {
	mu    sync.Mutex
	names []string
}

func (h *cmdCount) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cmdCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.names = append(h.names, cmd.Name())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h *cmdCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		for _, c := range cmds {
			h.names = append(h.names, c.Name())
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (h *cmdCount) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.names
	h.names = nil
	return n
}

// TestNearCacheServesHTTPHits: with herd's near cache on, the
// middleware's hits come from process memory (no Redis command at all),
// on both routers, and a purge by another instance reaches them: the next
// request after it runs the handler again.
func TestNearCacheServesHTTPHits(t *testing.T) {
	srv := redistest.Start(t)
	log := &cmdCount{}
	rdb := srv.Client(t)
	rdb.AddHook(log)
	c := herd.New(rdb, &herd.Options{Near: herd.NearOptions{MaxEntries: 100}})
	other := herd.New(srv.Client(t), nil) // another instance
	t.Cleanup(func() { c.Close(); other.Close() })

	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Surrogate-Key", "pages")
		io.WriteString(w, "page "+r.URL.Path+" #"+string(rune('0'+n)))
	})
	mw := New(c, &Options{TTL: time.Hour})
	for _, router := range []struct {
		name string
		h    http.Handler
	}{
		{"ServeMux", func() http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /p/", mw(h))
			return mux
		}()},
		{"chi", func() http.Handler {
			r := chi.NewRouter()
			r.With(mw).Handle("/p/*", h)
			return r
		}()},
	} {
		t.Run(router.name, func(t *testing.T) {
			ts := httptest.NewServer(router.h)
			defer ts.Close()
			path := "/p/" + router.name
			runs.Store(0)
			first := ""
			base := c.Stats().NearHits
			deadline := time.Now().Add(10 * time.Second)
			for c.Stats().NearHits == base || first == "" {
				if time.Now().After(deadline) {
					t.Fatal("no near hit within 10s")
				}
				_, body := get(t, ts.URL+path)
				first = body
				time.Sleep(10 * time.Millisecond)
			}
			log.take()
			for range 50 {
				if _, body := get(t, ts.URL+path); body != first {
					t.Fatalf("near hit body %q, want %q", body, first)
				}
			}
			if cmds := log.take(); len(cmds) != 0 {
				t.Errorf("50 HTTP hits with the near cache sent %d Redis commands (%v), want 0", len(cmds), cmds[:min(len(cmds), 5)])
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}

			if err := InvalidateTag(context.Background(), other, "pages"); err != nil {
				t.Fatal(err)
			}
			deadline = time.Now().Add(10 * time.Second)
			for runs.Load() == 1 {
				if time.Now().After(deadline) {
					t.Fatal("the purge by another instance never reached the near copy")
				}
				get(t, ts.URL+path)
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// The middleware with herd's near cache on: a near hit answers a
// conditional request with 304 (evaluated on the stored entry), its Age
// is the value's, a must-revalidate response is never served from memory
// past the lifetime it states, and a purge by this instance reaches its
// own near copies before InvalidateTag returns (the next request runs the
// handler, with no wait for a message).
func TestNearMiddlewareNearHits(t *testing.T) {
	srv := redistest.Start(t)
	c := herd.New(srv.Client(t), &herd.Options{Near: herd.NearOptions{MaxEntries: 100, MaxAge: time.Hour}})
	t.Cleanup(func() { c.Close() })
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Cache-Control", "max-age=2, must-revalidate")
		w.Header().Set("ETag", `"e`+strconv.FormatInt(n, 10)+`"`)
		w.Header().Set("Surrogate-Key", "pages")
		io.WriteString(w, "#"+strconv.FormatInt(n, 10))
	})
	ts := httptest.NewServer(New(c, &Options{TTL: time.Hour, StaleFor: time.Hour})(h))
	defer ts.Close()
	url := ts.URL + "/p"

	_, first := get(t, url)
	stored := time.Now()
	deadline := time.Now().Add(10 * time.Second)
	for base := c.Stats().NearHits; c.Stats().NearHits == base; {
		if time.Now().After(deadline) {
			t.Fatal("no near hit within 10s")
		}
		if _, body := get(t, url); body != first {
			t.Fatalf("body %q, want %q", body, first)
		}
	}
	base := c.Stats().NearHits
	res, body := get(t, url, "If-None-Match", `"e1"`)
	if res.StatusCode != http.StatusNotModified || body != "" || c.Stats().NearHits == base {
		t.Fatalf("conditional request on a near hit: %d %q (near hits %d → %d), want 304 from memory", res.StatusCode, body, base, c.Stats().NearHits)
	}
	res, _ = get(t, url)
	age, err := strconv.Atoi(res.Header.Get("Age"))
	if err != nil || time.Duration(age)*time.Second > time.Since(stored)+time.Second {
		t.Fatalf("near hit Age %q, %v after the store", res.Header.Get("Age"), time.Since(stored))
	}

	// must-revalidate, max-age=2: never served stale, from Redis or
	// memory. Wait out the lifetime (the value's own, not a speed bound).
	time.Sleep(time.Until(stored.Add(2500 * time.Millisecond)))
	res, body = get(t, url)
	if body == first || strings.HasPrefix(res.Header.Get("Cache-Status"), "herd; hit") {
		t.Fatalf("a must-revalidate response %v after it was stored (max-age=2): %q, Cache-Status %q; want the handler's new response",
			time.Since(stored), body, res.Header.Get("Cache-Status"))
	}

	// This instance's purge: the next request runs the handler at once.
	deadline = time.Now().Add(10 * time.Second)
	for base := c.Stats().NearHits; c.Stats().NearHits == base; {
		if time.Now().After(deadline) {
			t.Fatal("no near hit of the second response within 10s")
		}
		get(t, url)
	}
	before := runs.Load()
	if err := InvalidateTag(context.Background(), c, "pages"); err != nil {
		t.Fatal(err)
	}
	if _, body := get(t, url); body == "#"+strconv.FormatInt(before, 10) {
		t.Fatalf("the request after this instance's InvalidateTag returned got the purged %q", body)
	}
}
