package middleware

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestMaxKeyBytesBypass: every request that bypasses the cache before
// any lookup is reported to OnBypass with its reason, and MaxKeyBytes
// bounds default keys and KeyFunc's keys alike.
func TestMaxKeyBytesBypass(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var mu sync.Mutex
			var reasons []string
			opt := &Options{
				MaxKeyBytes: 256,
				OnBypass: func(r *http.Request, reason string) {
					mu.Lock()
					defer mu.Unlock()
					reasons = append(reasons, reason)
				},
			}
			custom := *opt
			custom.KeyFunc = func(r *http.Request) (string, bool) {
				return r.URL.Query().Get("k"), !strings.HasPrefix(r.URL.Path, "/custom/no")
			}
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "page") })
			dflt, custom2 := New(c, opt)(h), New(c, &custom)(h)
			mw := func(http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if strings.HasPrefix(r.URL.Path, "/custom/") {
						custom2.ServeHTTP(w, r)
						return
					}
					dflt.ServeHTTP(w, r)
				})
			}
			srv, cl := secServe(t, rt.build(mw, nil))
			long := strings.Repeat("x", 300)
			steps := []struct {
				req  *http.Request
				want string // the reason, "" for a lookup
			}{
				{secNewReq(t, http.MethodGet, srv.URL+"/short", nil), ""},
				{secNewReq(t, http.MethodGet, srv.URL+"/long?q="+long, nil), BypassKeyTooLarge},
				{secNewReq(t, http.MethodGet, srv.URL+"/hdr", nil, "X-Forwarded-Host", long), BypassKeyTooLarge},
				{secNewReq(t, http.MethodGet, srv.URL+"/custom/yes?k="+long, nil), BypassKeyTooLarge},
				{secNewReq(t, http.MethodGet, srv.URL+"/custom/yes?k=short", nil), ""},
				{secNewReq(t, http.MethodGet, srv.URL+"/custom/no", nil), BypassKeyFunc},
				{secNewReq(t, http.MethodPost, srv.URL+"/short", nil), BypassMethod},
				{secNewReq(t, http.MethodGet, srv.URL+"/short", nil, "X-HTTP-Method-Override", "PUT"), BypassMethodOverride},
				{secNewReq(t, http.MethodGet, srv.URL+"/short", strings.NewReader("b")), BypassBody},
				{secNewReq(t, http.MethodGet, srv.URL+"/short", nil, "Range", "bytes=0-1"), BypassRange},
				{secNewReq(t, http.MethodGet, srv.URL+"/short", nil, "Cookie", "a=b"), BypassCredentials},
				{secNewReq(t, http.MethodGet, srv.URL+"/short", nil, "X-Forwarded-User", "alice"), BypassCredentials},
				{secNewReq(t, http.MethodGet, srv.URL+"/short", nil, "X-Forwarded-Client-Cert", "Hash=ab;Subject=\"CN=alice\""), BypassCredentials},
				{secNewReq(t, http.MethodGet, srv.URL+"/short", nil, "Upgrade", "websocket", "Connection", "Upgrade"), BypassUpgrade},
				{secNewReq(t, http.MethodGet, srv.URL+"/short", nil, "Upgrade", "h2c", "Connection", "Upgrade, HTTP2-Settings", "HTTP2-Settings", "AAMAAABkAAQCAAAAAAIAAAAA"), BypassUpgrade},
				{secNewReq(t, http.MethodGet, srv.URL+"/short", nil, "Connection", "keep-alive, upgrade"), BypassUpgrade},
			}
			for i, s := range steps {
				mu.Lock()
				reasons = nil
				mu.Unlock()
				r := secSend(t, cl, s.req)
				mu.Lock()
				got := strings.Join(reasons, ",")
				mu.Unlock()
				if got != s.want {
					t.Errorf("step %d %s %.40s: OnBypass got %q, want %q", i, s.req.Method, s.req.URL, got, s.want)
				}
				if (s.want != "") != (sameStatus(r.cacheStatus(), statusBypass)) {
					t.Errorf("step %d: %v, want bypassed %v", i, r, s.want != "")
				}
			}
		})
	}
}
