package middleware

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestUnsafeMethodInvalidates: a non-error response to a PUT, DELETE or
// POST invalidates the stored entry of its target URI, and of the
// same-origin URI in its Location (RFC 9111 §4.4); an error response
// invalidates nothing. From the HTTP issue's hole 6: a successful PUT
// left the old entry.
func TestUnsafeMethodInvalidates(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var version atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch {
				case r.Method == http.MethodGet:
					fmt.Fprintf(w, "%s v%d", r.URL.Path, version.Load())
				case r.URL.Path == "/fail":
					w.WriteHeader(http.StatusConflict)
				default:
					version.Add(1)
					w.Header().Set("Location", "/other")
					w.WriteHeader(http.StatusNoContent)
				}
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			for _, method := range []string{http.MethodPut, http.MethodDelete, http.MethodPost} {
				for _, p := range []string{"/doc", "/other", "/fail"} {
					secGet(t, cl, srv.URL+p)
					if r := secGet(t, cl, srv.URL+p); !strings.HasPrefix(r.cacheStatus(), statusHit) {
						t.Fatalf("GET %s: %v, want a hit", p, r)
					}
				}
				secSend(t, cl, secNewReq(t, method, srv.URL+"/doc", nil))
				want := fmt.Sprintf("v%d", version.Load())
				for _, p := range []string{"/doc", "/other"} {
					if r := secGet(t, cl, srv.URL+p); !sameStatus(r.cacheStatus(), statusStored) || !strings.HasSuffix(r.body, want) {
						t.Errorf("GET %s after %s /doc: %v, want a new %s stored", p, method, r, want)
					}
				}
				secSend(t, cl, secNewReq(t, method, srv.URL+"/fail", nil))
				if r := secGet(t, cl, srv.URL+"/fail"); !strings.HasPrefix(r.cacheStatus(), statusHit) {
					t.Errorf("GET /fail after a 409 to %s: %v, want still a hit", method, r)
				}
			}
		})
	}
}
