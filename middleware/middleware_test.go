package middleware

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
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

// newCache returns a Cache on a fresh real redis-server. Most tests make
// several middlewares on it (one per router and case, each on URLs of its
// own) to spare redis-servers, so New's rule that the middlewares on one
// Cache have distinct scopes is off for it (shareScopes); the tests of
// the rule (scope_test.go) use Caches of their own.
func newCache(t testing.TB, opt *herd.Options) (*herd.Cache, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := herd.New(rdb, opt)
	t.Cleanup(func() { c.Close() })
	shareScopes(c)
	return c, rdb
}

// shareScopes lets any number of middlewares with any scopes be made on
// c: New skips its rule of distinct scopes for it.
func shareScopes(c *herd.Cache) {
	scopesMu.Lock()
	scopesOf(c).shared = true
	scopesMu.Unlock()
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

// TestStreamedServerErrorOneRunAtATime: a leader whose handler answers a
// 5xx and flushes (itself, or through httputil.ReverseProxy copying a
// chunked upstream error page) fails its rebuild like a 5xx that does not
// stream: one waiter leads again while the others wait for it, so the
// failing handler runs one request at a time, never one per waiter, and
// the URL is not marked hit-for-miss. From the HTTP issue's hole 3: the
// handler ran 21 times for 1 leader and 20 waiters, and the URL was then
// marked.
func TestStreamedServerErrorOneRunAtATime(t *testing.T) {
	c, _ := newCache(t, &herd.Options{WaitTimeout: secWait})
	failing := func(runs *atomic.Int64, gates []*secGate) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			n := runs.Add(1)
			if int(n) <= len(gates) {
				gates[n-1].wait(r)
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "down")
			http.NewResponseController(w).Flush()
			io.WriteString(w, " for maintenance")
		}
	}
	for _, via := range []string{"flush", "ReverseProxy"} {
		for _, rt := range secRouters {
			t.Run(via+"/"+rt.name, func(t *testing.T) {
				var runs atomic.Int64
				gates := []*secGate{newSecGate(t), newSecGate(t)}
				var h http.Handler = failing(&runs, gates)
				if via == "ReverseProxy" {
					up := httptest.NewServer(h)
					t.Cleanup(up.Close)
					target, _ := url.Parse(up.URL)
					h = httputil.NewSingleHostReverseProxy(target)
				}
				srv, cl := secServe(t, rt.build(New(c, nil), h))
				u := srv.URL + "/down"
				const waiters = 20
				reqs := make([]*http.Request, 1+waiters)
				for i := range reqs {
					reqs[i] = secNewReq(t, http.MethodGet, u, nil)
				}
				batch := secParallel(cl, reqs)
				secWaitForState(t, "the leader running and 20 requests waiting for it", func() (bool, string) {
					return runs.Load() == 1 && secWaiting() == waiters, fmt.Sprintf("%d runs, %d waiting", runs.Load(), secWaiting())
				})
				gates[0].open()
				// The second run (one waiter leading again) waits until the
				// other waiters wait for it, or until a run too many shows.
				secWaitForState(t, "a second leader and 19 requests waiting for it", func() (bool, string) {
					return runs.Load() > 2 || (runs.Load() == 2 && secWaiting() == waiters-1), fmt.Sprintf("%d runs, %d waiting", runs.Load(), secWaiting())
				})
				gates[1].open()
				rs := batch.wait(t)
				if n := runs.Load(); n != 2 {
					t.Errorf("the failing handler ran %d times for 1 leader and %d waiters, want 2 (the leader, then one waiter)", n, waiters)
				}
				for i, r := range rs {
					if r.status < 500 {
						t.Errorf("request %d: %v, want a 5xx", i, r)
					}
				}
				if r := secGet(t, cl, u); strings.Contains(r.cacheStatus(), "hit-for-miss") {
					t.Errorf("after the streamed 5xx: %v, want no hit-for-miss mark", r)
				}
			})
		}
	}
}

// sameStatus reports whether the Cache-Status got is want, or want with
// a detail parameter when want has none: for the tests that check what a
// request was (a bypass, a miss) and not why (status_test.go checks the
// details). Hit-for-miss, which only its detail tells from another
// bypass, must be asked for.
func sameStatus(got, want string) bool {
	if got == want {
		return true
	}
	if strings.Contains(want, "; detail=") {
		return false
	}
	rest, ok := strings.CutPrefix(got, want+"; detail=")
	return ok && rest != detailHitForMiss
}
