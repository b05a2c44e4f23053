package middleware

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
)

// A stale hit refreshes in the background on a snapshot of the request:
// chi recycles its route context when the request returns, so a refresh
// that read the live one could build another URL's page (here: product 2's
// page stored as product 1's).
func TestStaleRefreshKeepsItsRouteParams(t *testing.T) {
	c, _ := newCache(t, nil)
	r := chi.NewRouter()
	r.Use(chimw.Recoverer)
	r.With(New(c, &Options{TTL: 100 * time.Millisecond, StaleFor: time.Minute})).
		Get("/products/{id}", func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(20 * time.Millisecond) // the refresh outlives the request that started it
			fmt.Fprintf(w, "product %s", chi.URLParam(r, "id"))
		})
	srv := httptest.NewServer(r)
	defer srv.Close()

	for round := range 5 {
		one := fmt.Sprintf("%s/products/1?round=%d", srv.URL, round)
		two := fmt.Sprintf("%s/products/2?round=%d", srv.URL, round)
		if _, body := get(t, one); body != "product 1" {
			t.Fatalf("first GET: %q", body)
		}
		time.Sleep(150 * time.Millisecond) // past the TTL: the next GET is stale
		res, body := get(t, one)
		if !sameStatus(res.Header.Get("Cache-Status"), statusStale) || body != "product 1" {
			t.Fatalf("stale GET: Cache-Status %q, body %q", res.Header.Get("Cache-Status"), body)
		}
		get(t, two) // reuses chi's pooled route context while the refresh runs
		deadline := time.Now().Add(5 * time.Second)
		for {
			res, body := get(t, one)
			if strings.HasPrefix(res.Header.Get("Cache-Status"), statusHit) {
				if body != "product 1" {
					t.Fatalf("round %d: after the refresh /products/1 serves %q", round, body)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the refresh did not land (Cache-Status %q)", round, res.Header.Get("Cache-Status"))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// With KeyFunc, KeyHeaders are not part of the key: a response that varies
// on one of them must not be stored under a key that ignores it.
func TestKeyFuncIgnoresKeyHeadersForVary(t *testing.T) {
	c, _ := newCache(t, nil)
	var runs atomic.Int64
	h := New(c, &Options{
		KeyFunc:    func(r *http.Request) (string, bool) { return r.URL.Path, true },
		KeyHeaders: []string{"Accept-Language"},
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Vary", "Accept-Language")
		fmt.Fprintf(w, "page in %s", r.Header.Get("Accept-Language"))
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	if _, body := get(t, srv.URL+"/page", "Accept-Language", "en"); body != "page in en" {
		t.Fatalf("first: %q", body)
	}
	if _, body := get(t, srv.URL+"/page", "Accept-Language", "de"); body != "page in de" {
		t.Errorf("a de request got %q: a response varying on a header outside the KeyFunc key was stored", body)
	}
	if runs.Load() != 2 {
		t.Errorf("handler runs = %d, want 2 (nothing stored)", runs.Load())
	}
}
