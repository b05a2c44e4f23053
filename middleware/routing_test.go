package middleware

// How the middleware sits in the routers it documents: path parameters in
// a stale refresh, and HEAD through chi.

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/herdkit/herd"
)

// TestStaleRefreshPathParams: a stale hit refreshes in the background, on
// a snapshot of the request, after the request that started it returned.
// The refreshed page must be built from the request's own path
// parameters, read the recommended way on each router: r.PathValue under
// ServeMux; chi.URLParam or r.PathValue under chi (chi v5 sets both), with
// the middleware on the route or in front of the router. The refresh is
// held until other requests have run on the router, so that chi reuses the
// route context it pools for them.
func TestStaleRefreshPathParams(t *testing.T) {
	c, _ := newCache(t, nil)
	const ttl = 300 * time.Millisecond
	opt := &Options{TTL: ttl, StaleFor: time.Minute}
	pathValue := func(r *http.Request) string { return r.PathValue("id") }
	urlParam := func(r *http.Request) string { return chi.URLParam(r, "id") }
	for _, tc := range []struct {
		name   string
		prefix string // of the product paths
		param  func(r *http.Request) string
		build  func(h http.HandlerFunc) http.Handler
	}{
		{"ServeMux/PathValue", "/products/", pathValue, func(h http.HandlerFunc) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /products/{id}", New(c, opt)(h))
			return secOuter{mux}
		}},
		{"chi route/URLParam", "/products/", urlParam, chiRoute(c, opt)},
		{"chi route/PathValue", "/products/", pathValue, chiRoute(c, opt)},
		{"chi in front/URLParam", "/products/", urlParam, chiInFront(c, opt)},
		{"chi in front/PathValue", "/products/", pathValue, chiInFront(c, opt)},
		{"chi mounted/URLParam", "/shop/products/", urlParam, func(h http.HandlerFunc) http.Handler {
			r := chi.NewRouter()
			r.Use(chimw.Recoverer)
			r.Route("/shop", func(sr chi.Router) {
				sr.With(New(c, opt)).Get("/products/{id}", h)
			})
			return secOuter{r}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			runs := map[string]int{} // handler runs by path
			gate := newSecGate(t)
			h := func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				runs[r.URL.Path]++
				n := runs[r.URL.Path]
				mu.Unlock()
				if r.URL.Path == tc.prefix+"1" && n == 2 {
					gate.wait(r) // the refresh: held while other requests run
				}
				fmt.Fprintf(w, "product %s", tc.param(r))
			}
			srv, cl := secServe(t, tc.build(h))
			one := srv.URL + tc.prefix + "1"
			if r := secGet(t, cl, one); r.body != "product 1" || !sameStatus(r.cacheStatus(), statusStored) {
				t.Fatalf("first GET: %v, want product 1, stored", r)
			}
			stored := time.Now()
			// Past the TTL the next GET is served stale and starts the refresh.
			secWaitForState(t, "a stale hit", func() (bool, string) {
				r := secGet(t, cl, one)
				if r.body != "product 1" {
					t.Fatalf("GET before the refresh: %v", r)
				}
				if time.Since(stored) < ttl {
					time.Sleep(ttl / 10)
				}
				return sameStatus(r.cacheStatus(), statusStale), r.cacheStatus()
			})
			secWaitFor(t, "the refresh in the handler", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return runs[tc.prefix+"1"] == 2
			})
			for i := 2; i < 6; i++ {
				want := "product " + strconv.Itoa(i)
				if r := secGet(t, cl, srv.URL+tc.prefix+strconv.Itoa(i)); r.body != want {
					t.Fatalf("GET of another product: %v, want %q", r, want)
				}
			}
			gate.open()
			secWaitForState(t, "the refreshed entry", func() (bool, string) {
				mu.Lock()
				n := runs[tc.prefix+"1"]
				mu.Unlock()
				r := secGet(t, cl, one)
				if r.body != "product 1" {
					t.Fatalf("after the refresh %s serves %v, want product 1", tc.prefix+"1", r)
				}
				// Once the refresh has landed, a hit; a run after it would
				// be a refresh that failed.
				return strings.HasPrefix(r.cacheStatus(), statusHit) && n == 2, fmt.Sprintf("%v, %d runs", r, n)
			})
		})
	}
}

// chiRoute mounts the middleware on a chi route.
func chiRoute(c *herd.Cache, opt *Options) func(h http.HandlerFunc) http.Handler {
	return func(h http.HandlerFunc) http.Handler {
		r := chi.NewRouter()
		r.Use(chimw.Recoverer)
		r.With(New(c, opt)).Get("/products/{id}", h)
		return secOuter{r}
	}
}

// chiInFront puts the middleware in front of chi's routing (Use on the
// router): a refresh routes its snapshot again.
func chiInFront(c *herd.Cache, opt *Options) func(h http.HandlerFunc) http.Handler {
	return func(h http.HandlerFunc) http.Handler {
		r := chi.NewRouter()
		r.Use(chimw.Recoverer, New(c, opt))
		r.Get("/products/{id}", h)
		return secOuter{r}
	}
}

// TestChiGetHead: chi answers HEAD on a Get route with 405 unless chi's
// middleware.GetHead routes it there; with GetHead, a HEAD for a cold URL
// runs the handler as a GET, stores the GET entry and answers without a
// body, and later GETs and HEADs are served from that entry.
func TestChiGetHead(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, getHead := range []bool{false, true} {
		t.Run(fmt.Sprintf("GetHead=%v", getHead), func(t *testing.T) {
			var mu sync.Mutex
			var methods []string
			r := chi.NewRouter()
			r.Use(chimw.Recoverer)
			if getHead {
				r.Use(chimw.GetHead)
			}
			r.With(New(c, nil)).Get("/products/{id}", func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				methods = append(methods, r.Method)
				mu.Unlock()
				fmt.Fprintf(w, "product %s", chi.URLParam(r, "id"))
			})
			srv, cl := secServe(t, secOuter{r})
			url := srv.URL + "/products/7"
			head := secSend(t, cl, secNewReq(t, http.MethodHead, url, nil))
			if !getHead {
				if head.status != http.StatusMethodNotAllowed || len(methods) != 0 {
					t.Errorf("HEAD without GetHead: %v, handler runs %v; want chi's 405 and no run", head, methods)
				}
				return
			}
			if head.status != http.StatusOK || !sameStatus(head.cacheStatus(), statusStored) || head.body != "" || head.header.Get("Content-Length") != strconv.Itoa(len("product 7")) {
				t.Errorf("HEAD: %v, Content-Length %q; want 200, stored, no body, the GET's length", head, head.header.Get("Content-Length"))
			}
			if get := secGet(t, cl, url); get.body != "product 7" || !strings.HasPrefix(get.cacheStatus(), statusHit) {
				t.Errorf("GET after the HEAD: %v, want a hit on the GET entry", get)
			}
			if again := secSend(t, cl, secNewReq(t, http.MethodHead, url, nil)); again.body != "" || !strings.HasPrefix(again.cacheStatus(), statusHit) {
				t.Errorf("HEAD again: %v, want a hit without a body", again)
			}
			if len(methods) != 1 || methods[0] != http.MethodGet {
				t.Errorf("handler runs %v, want one, as a GET", methods)
			}
		})
	}
}
