package middleware

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/herdkit/herd"
)

// TestClassInKey: with Class set, a request's class is at the front of
// its key and KeyClass reads it back; keys without one are "http", and
// other keys go to next.
func TestClassInKey(t *testing.T) {
	long := strings.Repeat("r", 200)
	for _, tc := range []struct{ class, want string }{
		{"/products/{id}", "/products/{id}"},
		{"GET example.com/a/{x}", "GET example.com/a/{x}"},
		{"12:3|odd", "12:3|odd"},
		{long, long[:maxClassBytes]},
		{"", "http"},
	} {
		h := &handler{cfg: (&Options{Class: func(*http.Request) string { return tc.class }}).resolve()}
		r := httptest.NewRequest(http.MethodGet, "/products/1", nil)
		key, _ := h.key(r)
		if got := KeyClass(nil)(h.classKey(r) + key); got != tc.want {
			t.Errorf("class %.20q: KeyClass gives %.20q, want %.20q", tc.class, got, tc.want)
		}
	}
	next := func(key string) string { return "next:" + key }
	for key, want := range map[string]string{"user:1": "next:user:1", "herd-http/custom2|x": "http"} {
		if got := KeyClass(next)(key); got != want {
			t.Errorf("KeyClass(next)(%q) = %q, want %q", key, got, want)
		}
	}
	if got := KeyClass(nil)("user:1"); got != "" {
		t.Errorf("KeyClass(nil)(a key of its own) = %q, want \"\"", got)
	}
	if n := testing.AllocsPerRun(100, func() { KeyClass(nil)(classPrefix + "3:abc" + "herd-http/3|") }); n != 0 {
		t.Errorf("KeyClass allocates %v times per call", n)
	}
}

// TestRoutePattern: herd's metrics are labelled with the route's pattern
// when Class is RoutePattern: on http.ServeMux, on chi's r.With, and in
// chi's r.Use before the router matched (also in a mounted router); a
// HEAD gets its GET's class, so it is served from the GET entry.
func TestRoutePattern(t *testing.T) {
	var mu sync.Mutex
	classes := map[string]int{}
	c, _ := newCache(t, &herd.Options{
		KeyClass: KeyClass(nil),
		Observer: &herd.Observer{Lookup: func(class string, _ herd.Outcome) {
			mu.Lock()
			defer mu.Unlock()
			classes[class]++
		}},
	})
	mw := New(c, &Options{Class: RoutePattern})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "page") })
	for _, tc := range []struct {
		name  string
		h     http.Handler
		path  string
		class string
	}{
		{"ServeMux", func() http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /products/{id}", mw(h))
			return mux
		}(), "/products/1", "GET /products/{id}"},
		{"chi With", func() http.Handler {
			r := chi.NewRouter()
			r.With(mw).Get("/items/{id}", h.ServeHTTP)
			r.With(mw).Head("/items/{id}", h.ServeHTTP) // chi routes no HEAD to a GET route by itself
			return r
		}(), "/items/1", "/items/{id}"},
		{"chi Use", func() http.Handler {
			r := chi.NewRouter()
			r.Use(mw)
			r.Get("/orders/{id}", h.ServeHTTP)
			return r
		}(), "/orders/1", "/orders/{id}"},
		{"chi Use in a mounted router", func() http.Handler {
			api := chi.NewRouter()
			api.Use(mw)
			api.Get("/users/{id}", h.ServeHTTP)
			r := chi.NewRouter()
			r.Mount("/api", api)
			return r
		}(), "/api/users/1", "/api/users/{id}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.h)
			defer srv.Close()
			mu.Lock()
			clear(classes)
			mu.Unlock()
			if res, _ := get(t, srv.URL+tc.path); !sameStatus(res.Header.Get("Cache-Status"), statusStored) {
				t.Fatalf("GET: Cache-Status %q, want stored", res.Header.Get("Cache-Status"))
			}
			req, _ := http.NewRequest(http.MethodHead, srv.URL+tc.path, nil)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if !strings.HasPrefix(res.Header.Get("Cache-Status"), statusHit) {
				t.Errorf("HEAD: Cache-Status %q, want a hit on the GET entry", res.Header.Get("Cache-Status"))
			}
			mu.Lock()
			defer mu.Unlock()
			if classes[tc.class] != 2 || len(classes) != 1 {
				t.Errorf("lookups by class %v, want 2 of %q", classes, tc.class)
			}
		})
	}
}
