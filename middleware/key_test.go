package middleware

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestMethodOverrideAnySpelling: a GET carrying a method-override header
// under any case and with '_' for '-' bypasses the cache, so that a
// backend that folds '_' into '-' (CGI, PHP, Rack, WSGI) and answers the
// override never has its answer stored for plain GETs. From the HTTP
// issue's hole 7: X_HTTP_Method_Override: DELETE was not recognised, and
// the backend's 404 for the DELETE was stored for the URL.
func TestMethodOverrideAnySpelling(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				method := r.Method
				for name, vs := range r.Header {
					folded := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
					switch folded {
					case "x-http-method-override", "x-http-method", "x-method-override":
						method = vs[0]
					}
				}
				if method == http.MethodDelete {
					http.NotFound(w, r) // what was deleted
					return
				}
				fmt.Fprintf(w, "%s %s", method, r.URL.Path)
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			for i, name := range []string{"X_HTTP_Method_Override", "X_HTTP_METHOD", "x_method_override", "x-HTTP_method-override"} {
				path := fmt.Sprintf("/o/%d", i)
				req := secNewReq(t, http.MethodGet, srv.URL+path, nil)
				req.Header[name] = []string{"DELETE"} // as written, not canonicalised
				if a := secSend(t, cl, req); !sameStatus(a.cacheStatus(), statusBypass) {
					t.Errorf("%s: %v, want it bypassed", name, a)
				}
				if r := secGet(t, cl, srv.URL+path); r.status != http.StatusOK || r.body != "GET "+path {
					t.Errorf("plain GET after one with %s: DELETE: %v, want 200 %q", name, r, "GET "+path)
				}
			}
		})
	}
}
