package middleware

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	runWorkerIfAsked() // a re-run worker process (process_test.go) exits here
	goleak.VerifyTestMain(m)
}

// newCache returns a Cache on a fresh real redis-server.
func newCache(t testing.TB, opt *herd.Options) (*herd.Cache, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := herd.New(rdb, opt)
	t.Cleanup(func() { c.Close() })
	return c, rdb
}

func get(t testing.TB, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func TestMiddlewareBasics(t *testing.T) {
	c, _ := newCache(t, nil)
	var calls atomic.Int64
	gate := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		<-gate
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "hello "+r.URL.Path)
	})
	for _, router := range []struct {
		name string
		h    http.Handler
	}{
		{"ServeMux", func() http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /p/", New(c, nil)(h))
			return mux
		}()},
		{"chi", func() http.Handler {
			r := chi.NewRouter()
			r.Use(chimw.Recoverer)
			r.With(New(c, nil)).Handle("/p/*", h)
			return r
		}()},
	} {
		t.Run(router.name, func(t *testing.T) {
			calls.Store(0)
			gate = make(chan struct{})
			srv := httptest.NewServer(router.h)
			defer srv.Close()
			url := srv.URL + "/p/" + router.name
			const n = 20
			var wg sync.WaitGroup
			statuses := make(chan string, n)
			for range n {
				wg.Go(func() {
					res, body := get(t, url)
					if body != "hello /p/"+router.name {
						t.Errorf("body %q", body)
					}
					statuses <- res.Header.Get("Cache-Status")
				})
			}
			for calls.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond) // let the others queue; the count below does not depend on it
			close(gate)
			wg.Wait()
			close(statuses)
			counts := map[string]int{}
			for s := range statuses {
				counts[s]++
			}
			if calls.Load() != 1 {
				t.Errorf("handler ran %d times for %d concurrent requests, want 1 (Cache-Status %v)", calls.Load(), n, counts)
			}
			if counts[statusStored] != 1 {
				t.Errorf("Cache-Status counts %v, want exactly one %q", counts, statusStored)
			}
			res, body := get(t, url)
			if !strings.HasPrefix(res.Header.Get("Cache-Status"), statusHit) || body != "hello /p/"+router.name || res.Header.Get("Etag") == "" || res.Header.Get("Age") == "" {
				t.Errorf("second GET: Cache-Status %q, ETag %q, Age %q, body %q; want a hit with ETag and Age", res.Header.Get("Cache-Status"), res.Header.Get("Etag"), res.Header.Get("Age"), body)
			}
			res, _ = get(t, url, "If-None-Match", res.Header.Get("Etag"))
			if res.StatusCode != http.StatusNotModified {
				t.Errorf("If-None-Match: status %d, want 304", res.StatusCode)
			}
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodHead, url, nil)
			hres, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			hres.Body.Close()
			if !strings.HasPrefix(hres.Header.Get("Cache-Status"), statusHit) || hres.ContentLength != int64(len("hello /p/"+router.name)) {
				t.Errorf("HEAD: Cache-Status %q, Content-Length %d; want a hit with the GET entry's length", hres.Header.Get("Cache-Status"), hres.ContentLength)
			}
		})
	}
}
