package middleware

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
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
