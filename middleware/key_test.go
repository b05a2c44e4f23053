package middleware

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"github.com/go-chi/chi/v5"
	"github.com/herdkit/herd"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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

// secTLSServe starts h on an HTTP/2 TLS server (closed when the test
// ends) and returns it with its client. configure, if not nil, edits the
// server's TLS config before it starts.
func secTLSServe(t *testing.T, h http.Handler, configure func(*tls.Config)) (*httptest.Server, *http.Client) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.EnableHTTP2 = true
	if configure != nil {
		srv.TLS = &tls.Config{}
		configure(srv.TLS)
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	cl := srv.Client()
	cl.Timeout = secWait
	return srv, cl
}

// TestRawTargetKey is A1: the key is the request target as the server
// received it, not r.URL re-encoded. A raw "<" in a path does not share
// the entry of the browser's %3C form (stored XSS through a 404 page that
// prints the target), and under chi, which routes on the raw path, a raw
// byte with %2F does not share (and so cannot poison with a 404) the
// valid article's entry (CPDoS).
func TestRawTargetKey(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name+"/stored XSS", func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprintf(w, "no page at %s", r.RequestURI)
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			host := strings.TrimPrefix(srv.URL, "http://")
			attack := secRaw(t, srv, "GET /docs/<img/src/onerror=alert:1> HTTP/1.1\r\nHost: "+host)
			if attack.status != http.StatusNotFound || !sameStatus(attack.cacheStatus(), statusStored) {
				t.Fatalf("the attacker's request: %v, want a stored 404", attack)
			}
			victim := secGet(t, cl, srv.URL+"/docs/%3Cimg/src/onerror=alert:1%3E")
			if strings.Contains(victim.body, "<img") {
				t.Errorf("the browser-encoded URL got the attacker's raw payload: %v", victim)
			}
		})
		t.Run(rt.name+"/CPDoS", func(t *testing.T) {
			article := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "the article")
			})
			// The router behind the middleware: the article's route.
			var inner http.Handler
			if rt.name == "chi" {
				r := chi.NewRouter()
				r.Get("/wiki/{a}/{b}", article)
				inner = r
			} else {
				mux := http.NewServeMux()
				mux.Handle("GET /wiki/{a}/{b}", article)
				inner = mux
			}
			srv, cl := secServe(t, rt.build(New(c, nil), inner))
			host := strings.TrimPrefix(srv.URL, "http://")
			attack := secRaw(t, srv, "GET /wiki/\xc3\xbc%2Fx HTTP/1.1\r\nHost: "+host)
			t.Logf("the attacker's request: %v", attack)
			victim := secGet(t, cl, srv.URL+"/wiki/%C3%BC/x")
			if victim.status != http.StatusOK || victim.body != "the article" {
				t.Errorf("the valid article after the attack: %v, want 200 \"the article\"", victim)
			}
		})
		t.Run(rt.name+"/absolute-form", func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "scheme=%q user=%q", r.URL.Scheme, r.URL.User.String())
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			host := strings.TrimPrefix(srv.URL, "http://")
			for _, target := range []string{"https://u:p@" + host + "/y", "javascript://" + host + "/y"} {
				if a := secRaw(t, srv, "GET "+target+" HTTP/1.1\r\nHost: "+host); a.status != http.StatusOK {
					t.Fatalf("%s: %v", target, a)
				}
				victim := secGet(t, cl, srv.URL+"/y")
				if victim.body != `scheme="" user=""` {
					t.Errorf("origin-form request after %q: %v, want its own page", target, victim)
				}
			}
		})
	}
}

// TestStripPrefixKeys is A2: two handlers mounted behind http.StripPrefix,
// each with its own New on one Cache, see the same stripped path; their
// entries must not be shared.
func TestStripPrefixKeys(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			page := func(body string) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					io.WriteString(w, body+" "+r.URL.Path)
				})
			}
			internal := http.StripPrefix("/internal", New(c, nil)(page("internal")))
			public := http.StripPrefix("/public", New(c, nil)(page("public")))
			mounts := func(http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if strings.HasPrefix(r.URL.Path, "/internal/") {
						internal.ServeHTTP(w, r)
						return
					}
					public.ServeHTTP(w, r)
				})
			}
			srv, cl := secServe(t, rt.build(mounts, nil))
			if r := secGet(t, cl, srv.URL+"/internal/report"); r.body != "internal /report" || !sameStatus(r.cacheStatus(), statusStored) {
				t.Fatalf("internal: %v", r)
			}
			if r := secGet(t, cl, srv.URL+"/public/report"); r.body != "public /report" {
				t.Errorf("public after internal: %v, want the public page", r)
			}
		})
	}
}

// TestHTTP2GetBody is A3: a GET with a body over HTTP/2 (DATA frames, no
// content-length: ContentLength -1) bypasses the cache like an HTTP/1.1
// one; the plain GET that follows never gets the page built from it.
func TestHTTP2GetBody(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				b, _ := io.ReadAll(r.Body)
				fmt.Fprintf(w, "body=%q", b)
			})
			srv, cl := secTLSServe(t, rt.build(New(c, nil), h), nil)
			url := srv.URL + "/h2/" + rt.name
			req := secNewReq(t, http.MethodGet, url, io.NopCloser(strings.NewReader("evil")))
			req.ContentLength = -1
			res, err := cl.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.ProtoMajor != 2 {
				t.Fatalf("the test server spoke %s, want HTTP/2", res.Proto)
			}
			if string(b) != `body="evil"` || !sameStatus(res.Header.Get("Cache-Status"), statusBypass) {
				t.Errorf("GET with a body over HTTP/2: %q (Cache-Status %q), want the handler's answer, bypassed", b, res.Header.Get("Cache-Status"))
			}
			plain := secGet(t, cl, url)
			if plain.body != `body=""` {
				t.Errorf("plain GET after the GET with a body: %v, want its own page", plain)
			}
			if again := secGet(t, cl, url); !strings.HasPrefix(again.cacheStatus(), statusHit) {
				t.Errorf("a bodiless HTTP/2 GET is not cached: %v", again)
			}
		})
	}
}

// TestMustRevalidate is A4: max-age=0 and s-maxage=0 make a response
// stale at once, so it is never stored (with AllowAuthorized, alice's
// page was served to bob); must-revalidate and proxy-revalidate are never
// served stale, nor past the lifetime they state.
func TestMustRevalidate(t *testing.T) {
	c, rdb := newCache(t, nil)
	opt := &Options{AllowAuthorized: true, TTL: time.Hour, StaleFor: time.Hour}
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Cache-Control", r.URL.Query().Get("cc"))
				io.WriteString(w, "page of "+r.Header.Get("Authorization"))
			})
			srv, cl := secServe(t, rt.build(New(c, opt), h))
			for _, cc := range []string{"max-age=0, must-revalidate", "public, max-age=0", "s-maxage=0, max-age=60, must-revalidate"} {
				url := srv.URL + "/account?cc=" + strings.ReplaceAll(cc, " ", "")
				secGet(t, cl, url, "Authorization", "alice")
				if bob := secGet(t, cl, url, "Authorization", "bob"); bob.body != "page of bob" {
					t.Errorf("Cache-Control %q: bob got %v, want his own page", cc, bob)
				}
			}
			for _, tc := range []struct {
				cc  string
				max time.Duration // the hard TTL in Redis may not exceed it
			}{
				{"public,max-age=30,must-revalidate", 30 * time.Second},
				{"public,proxy-revalidate", time.Hour},
				{"public,s-maxage=20,proxy-revalidate", 20 * time.Second},
			} {
				url := srv.URL + "/doc?cc=" + tc.cc
				if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusStored) {
					t.Fatalf("Cache-Control %q: %v, want it stored", tc.cc, r)
				}
				pttl, err := rdb.PTTL(context.Background(), secRedisKey(secKeyOfURL(t, opt, url), "v")).Result()
				if err != nil {
					t.Fatal(err)
				}
				if pttl <= 0 || pttl > tc.max {
					t.Errorf("Cache-Control %q: stored for %v (TTL 1h + StaleFor 1h), want at most %v: no stale serving past must-revalidate", tc.cc, pttl, tc.max)
				}
			}
		})
	}
}

// TestPerUserHeadersAnyCase is A5: the Set-Cookie, private and Vary checks
// look at every value under any case of the field name, and the per-user
// fields (Set-Cookie, Set-Cookie2, Clear-Site-Data, Authentication-Info,
// WWW-Authenticate) make a response unstorable: the next visitor never
// gets the first one's response.
func TestPerUserHeadersAnyCase(t *testing.T) {
	c, _ := newCache(t, nil)
	cases := map[string]func(h http.Header){
		"lowercase set-cookie": func(h http.Header) { h["set-cookie"] = []string{"sid=USER"} },
		"empty first cookie":   func(h http.Header) { h["Set-Cookie"] = []string{"", "sid=USER"} },
		"empty cookie":         func(h http.Header) { h["Set-Cookie"] = []string{""} },
		"lowercase private":    func(h http.Header) { h["cache-control"] = []string{"private"} },
		"lowercase vary":       func(h http.Header) { h["vary"] = []string{"X-User"} },
		"Set-Cookie2":          func(h http.Header) { h.Set("Set-Cookie2", "sid=USER") },
		"Clear-Site-Data":      func(h http.Header) { h.Set("Clear-Site-Data", `"cookies"`) },
		"Authentication-Info":  func(h http.Header) { h.Set("Authentication-Info", `nextnonce="USER"`) },
		"WWW-Authenticate":     func(h http.Header) { h.Set("WWW-Authenticate", "Negotiate USER") },
	}
	for _, rt := range secRouters {
		for name, set := range cases {
			t.Run(rt.name+"/"+name, func(t *testing.T) {
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					user := r.Header.Get("X-User")
					if user != "" {
						set(w.Header())
						for k, vs := range w.Header() {
							for i := range vs {
								vs[i] = strings.ReplaceAll(vs[i], "USER", user)
							}
							w.Header()[k] = vs
						}
					}
					io.WriteString(w, "page of "+user)
				})
				srv, cl := secServe(t, rt.build(New(c, nil), h))
				url := srv.URL + "/u/" + strings.ReplaceAll(name, " ", "-")
				secGet(t, cl, url, "X-User", "alice")
				r := secGet(t, cl, url)
				if strings.Contains(r.body, "alice") {
					t.Errorf("the next visitor got alice's page: %v", r)
				}
				for k, vs := range r.header {
					if strings.Contains(strings.Join(vs, " "), "alice") {
						t.Errorf("the next visitor got alice's %s: %q", k, vs)
					}
				}
			})
		}
	}
}

// TestConditionalLeader is A6's leader part: the first request for a
// cold URL is a browser's revalidation. The handler builds the shared
// entry from the request without its conditional header fields, so it
// runs once for the leader and 9 waiters; herd answers the leader's
// conditional (304 or 412) from the entry.
func TestConditionalLeader(t *testing.T) {
	c, rdb := newCache(t, &herd.Options{WaitTimeout: secWait})
	modified := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, rt := range secRouters {
		for _, tc := range []struct {
			field, value string
			want         int // the leader's status
		}{
			{"If-None-Match", `"v1"`, http.StatusNotModified},
			{"If-Modified-Since", modified.Add(time.Hour).Format(http.TimeFormat), http.StatusNotModified},
			{"If-Match", `"other"`, http.StatusPreconditionFailed},
			{"If-Unmodified-Since", modified.Add(-time.Hour).Format(http.TimeFormat), http.StatusPreconditionFailed},
		} {
			t.Run(rt.name+"/"+tc.field, func(t *testing.T) {
				var runs atomic.Int64
				gate := newSecGate(t)
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) == 1 {
						gate.wait(r)
					}
					w.Header().Set("ETag", `"v1"`)
					http.ServeContent(w, r, "page.txt", modified, strings.NewReader("the page"))
				})
				srv, cl := secServe(t, rt.build(New(c, nil), h))
				url := srv.URL + "/cond/" + tc.field
				leader := secParallel(cl, []*http.Request{secNewReq(t, http.MethodGet, url, nil, tc.field, tc.value)})
				secWaitFor(t, "the leader in the handler", func() bool { return runs.Load() == 1 })
				const n = 9
				reqs := make([]*http.Request, n)
				for i := range reqs {
					reqs[i] = secNewReq(t, http.MethodGet, url, nil)
				}
				waiters := secParallel(cl, reqs)
				secWaitFor(t, "9 waiting requests", func() bool { return secWaiting() == n })
				gate.open()
				if l := leader.wait(t)[0]; l.status != tc.want {
					t.Errorf("the leader: %v, want %d", l, tc.want)
				}
				for i, r := range waiters.wait(t) {
					if r.status != http.StatusOK || r.body != "the page" {
						t.Errorf("waiter %d: %v, want 200 \"the page\"", i, r)
					}
				}
				if got := runs.Load(); got != 1 {
					t.Errorf("the handler ran %d times for 10 requests, want 1", got)
				}
				if !secStored(t, rdb, secKeyOfURL(t, nil, url)) {
					t.Errorf("the page is not stored")
				}
			})
		}
	}
}

// TestConditionalRefresh is A6's refresh part: a stale hit carrying
// If-Match starts the refresh, which must not get the handler's 412 (and
// back off, keeping the stale page for all of StaleFor).
func TestConditionalRefresh(t *testing.T) {
	c, rdb := newCache(t, nil)
	const ttl = time.Second
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				w.Header().Set("ETag", fmt.Sprintf(`"v%d"`, n))
				http.ServeContent(w, r, "page.txt", time.Time{}, strings.NewReader(fmt.Sprintf("version %d", n)))
			})
			srv, cl := secServe(t, rt.build(New(c, &Options{TTL: ttl, StaleFor: time.Minute}), h))
			url := srv.URL + "/refresh/" + rt.name
			if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusStored) {
				t.Fatalf("first request: %v", r)
			}
			// Revalidations until one finds the entry stale (and starts
			// the refresh).
			secWaitFor(t, "a stale hit", func() bool {
				r := secGet(t, cl, url, "If-Match", `"nomatch"`)
				return sameStatus(r.cacheStatus(), statusStale)
			})
			secWaitFor(t, "the refresh to end", func() bool { return runs.Load() == 2 && len(secScan(t, rdb, "herd:*:l")) == 0 })
			if r := secGet(t, cl, url); !strings.HasPrefix(r.cacheStatus(), statusHit) || r.body != "version 2" {
				t.Errorf("after the refresh: %v, want a fresh hit of version 2", r)
			}
		})
	}
}

// TestLeaderClientGoneFleet is A7, and issue 12's defect 11: clients that
// disconnect while they lead a rebuild fail nobody. Attackers lead one
// after another and hang up; a victim waiting in the same instance and
// one waiting in another instance both get the complete page, and no
// failure is counted (a disconnect spends no waiter's retry).
func TestLeaderClientGoneFleet(t *testing.T) {
	opt := &herd.Options{WaitTimeout: secWait}
	c, rdb := newCache(t, opt)
	c2 := herd.New(rdb, opt)
	t.Cleanup(func() { c2.Close() })
	shareScopes(c2) // a middleware per router
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			leading := make(chan string, 64)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				id := r.Header.Get("X-Attacker")
				if id == "" {
					io.WriteString(w, "complete")
					return
				}
				leading <- id
				io.WriteString(w, "partial")
				<-r.Context().Done()
			})
			// Two instances of one service on different ports (of one
			// host): they share entries through one Scope.
			fleet := &Options{Scope: "gone-fleet"}
			srvA, clA := secServe(t, rt.build(New(c, fleet), h))
			_, clB := secServe(t, rt.build(New(c2, fleet), h))
			url := "/gone/" + rt.name
			const attackers = 8
			cancels := map[string]context.CancelFunc{}
			send := func(id string) {
				ctx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)
				cancels[id] = cancel
				req := secNewReq(t, http.MethodGet, srvA.URL+url, nil, "X-Attacker", id).WithContext(ctx)
				go secDo(clA, req)
			}
			send("0")
			var first string
			select {
			case first = <-leading:
			case <-time.After(secWait):
				t.Fatal("the first attacker does not lead")
			}
			for i := 1; i < attackers; i++ {
				send(fmt.Sprint(i))
			}
			victims := []*secBatch{
				secParallel(clA, []*http.Request{secNewReq(t, http.MethodGet, srvA.URL+url, nil)}),
				// Instance B's client dials B; the URL has A's host, which
				// the key holds.
				secParallel(clB, []*http.Request{secNewReq(t, http.MethodGet, srvA.URL+url, nil)}),
			}
			secWaitForState(t, "7 attackers and 2 victims waiting", func() (bool, string) {
				n := secWaiting()
				return n == attackers+1, fmt.Sprintf("%d waiting", n)
			})
			cancels[first]()
			done := make(chan struct{})
			go func() {
				for _, v := range victims {
					v.wg.Wait()
				}
				close(done)
			}()
			limit := time.NewTimer(2 * secWait)
			defer limit.Stop()
			for finished := false; !finished; {
				select {
				case id := <-leading: // the next attacker leads: it hangs up too
					cancels[id]()
				case <-done:
					finished = true
				case <-limit.C:
					t.Fatal("the victims are still waiting")
				}
			}
			for i, v := range victims {
				if r := v.out[0]; r.status != http.StatusOK || r.body != "complete" {
					t.Errorf("victim %d: %v, want 200 \"complete\"", i, r)
				}
			}
			for name, cc := range map[string]*herd.Cache{"A": c, "B": c2} {
				if n := cc.Stats().LoadErrors; n != 0 {
					t.Errorf("instance %s counted %d failed rebuilds, want 0: a client's disconnect is not a failure", name, n)
				}
			}
		})
	}
}

// TestKeyBound is A8's middleware part: a request whose key would exceed
// MaxKeyBytes (8 KiB by default) bypasses the cache before any work on its
// query: it is served, never stored, and keeps nothing in memory.
func TestKeyBound(t *testing.T) {
	c, rdb := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				fmt.Fprintf(w, "%d bytes of query", len(r.URL.RawQuery))
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			before := len(secScan(t, rdb, "herd:*"))
			for i := range 3 {
				url := fmt.Sprintf("%s/big/%s?r=%d&q=%s", srv.URL, rt.name, i, strings.Repeat("&", 512<<10))
				if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusBypass) || r.status != http.StatusOK {
					t.Errorf("a 512 KiB query: %v, want it served, bypassed", r)
				}
			}
			if after := len(secScan(t, rdb, "herd:*")); after != before {
				t.Errorf("%d Redis keys written for over-long keys", after-before)
			}
			if got := runs.Load(); got != 3 {
				t.Errorf("handler ran %d times for 3 requests", got)
			}
			if r := secGet(t, cl, srv.URL+"/big/ok?q="+strings.Repeat("a", 4<<10)); !sameStatus(r.cacheStatus(), statusStored) {
				t.Errorf("a 4 KiB query: %v, want it stored", r)
			}
		})
	}
}

// TestOuterVaryOrigin is A9: an outer CORS middleware adds Vary: Origin
// (and its per-request Access-Control-Allow-Origin) before calling next.
// That is not the handler's Vary: the response is stored and shared,
// and every response still carries the outer middleware's fields.
func TestOuterVaryOrigin(t *testing.T) {
	c, rdb := newCache(t, &herd.Options{WaitTimeout: secWait})
	cors := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Add("Vary", "Origin")
			if o := r.Header.Get("Origin"); o != "" {
				w.Header().Set("Access-Control-Allow-Origin", o)
			}
			next.ServeHTTP(w, r)
		})
	}
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			gate := newSecGate(t)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					gate.wait(r)
				}
				w.Header().Add("Vary", "Accept-Encoding")
				io.WriteString(w, "catalog")
			})
			mw := New(c, &Options{KeyHeaders: []string{"Accept-Encoding"}})
			srv, cl := secServe(t, rt.build(func(next http.Handler) http.Handler { return cors(mw(next)) }, h))
			url := srv.URL + "/cors/" + rt.name
			const n = 6
			reqs := make([]*http.Request, n)
			for i := range reqs {
				reqs[i] = secNewReq(t, http.MethodGet, url, nil, "Origin", fmt.Sprintf("https://site%d.example", i))
			}
			leader := secParallel(cl, reqs[:1])
			secWaitFor(t, "the leader in the handler", func() bool { return runs.Load() == 1 })
			waiters := secParallel(cl, reqs[1:])
			secWaitFor(t, "5 waiting requests", func() bool { return secWaiting() == n-1 })
			gate.open()
			rs := append(leader.wait(t), waiters.wait(t)...)
			for i, r := range rs {
				origin := fmt.Sprintf("https://site%d.example", i)
				if r.body != "catalog" || r.header.Get("Access-Control-Allow-Origin") != origin || !strings.Contains(strings.Join(r.header.Values("Vary"), ","), "Origin") {
					t.Errorf("request %d: %v, Vary %q, ACAO %q; want the page with Vary: Origin and ACAO %s", i, r, r.header.Values("Vary"), r.header.Get("Access-Control-Allow-Origin"), origin)
				}
			}
			if got := runs.Load(); got != 1 {
				t.Errorf("the handler ran %d times for %d requests, want 1", got, n)
			}
			if !secStored(t, rdb, secKeyOfURL(t, &Options{KeyHeaders: []string{"Accept-Encoding"}}, url)) {
				t.Errorf("the page is not stored")
			}
		})
	}
}

// forwardedHost is a lenient Forwarded parser, as some frameworks have:
// the first host= anywhere in the field.
var forwardedHost = regexp.MustCompile(`host=([^;,\s"]+)`)

// TestForwardedSyntax is A10: Forwarded values that herd cannot parse
// as RFC 7239, or whose for= pair hides pairs in quotes, are keyed whole,
// so a lenient parser behind the middleware never poisons the entry of
// requests without them.
func TestForwardedSyntax(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				host := r.Host
				if m := forwardedHost.FindStringSubmatch(r.Header.Get("Forwarded")); m != nil {
					host = m[1]
				}
				io.WriteString(w, `<script src="//`+host+`/app.js">`)
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			for i, fwd := range []string{
				"for=1.2.3.4 proto=http host=evil.example",
				`for="1.2.3.4;host=evil.example"`,
				"for=1.2.3.4,host=evil.example",
			} {
				url := fmt.Sprintf("%s/fwd/%d", srv.URL, i)
				secGet(t, cl, url, "Forwarded", fwd)
				if r := secGet(t, cl, url); strings.Contains(r.body, "evil") {
					t.Errorf("Forwarded %q poisoned the plain request's entry: %v", fwd, r)
				}
			}
			// A well-formed for= alone still shares the plain entry.
			url := srv.URL + "/fwd/shared"
			secGet(t, cl, url)
			if r := secGet(t, cl, url, "Forwarded", `for=192.0.2.1, for="[2001:db8::1]:4711"`); !strings.HasPrefix(r.cacheStatus(), statusHit) {
				t.Errorf("a request whose Forwarded has only for= pairs: %v, want a hit on the plain entry", r)
			}
		})
	}
}

// TestOverrideAndURIHeaders is A11: X-HTTP-Method-Override and its
// family make a GET bypass (it may not be a read), and X-Original-URI,
// X-Forwarded-Uri and X-Forwarded-Path are keyed like the other
// forwarding headers.
func TestOverrideAndURIHeaders(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				method := r.Method
				for _, f := range []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"} {
					if v := r.Header.Get(f); v != "" {
						method = v
					}
				}
				path := r.URL.Path
				for _, f := range []string{"X-Original-Uri", "X-Forwarded-Uri", "X-Forwarded-Path"} {
					if v := r.Header.Get(f); v != "" {
						path = v
					}
				}
				fmt.Fprintf(w, "%s %s", method, path)
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			for i, hdr := range [][2]string{
				{"X-HTTP-Method-Override", "DELETE"},
				{"X-HTTP-Method", "DELETE"},
				{"X-Method-Override", "DELETE"},
				{"X-Original-URI", "/admin"},
				{"X-Forwarded-Uri", "/admin"},
				{"X-Forwarded-Path", "/admin"},
			} {
				path := fmt.Sprintf("/o/%d", i)
				a := secGet(t, cl, srv.URL+path, hdr[0], hdr[1])
				if strings.HasPrefix(hdr[0], "X-HTTP-Method") || hdr[0] == "X-Method-Override" {
					if !sameStatus(a.cacheStatus(), statusBypass) {
						t.Errorf("%s: %v, want it bypassed", hdr[0], a)
					}
				}
				if r := secGet(t, cl, srv.URL+path); r.body != "GET "+path {
					t.Errorf("plain request after one with %s: %v, want %q", hdr[0], r, "GET "+path)
				}
			}
		})
	}
}

// secClientCert is a self-signed client certificate for cn.
func secClientCert(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestClientCertificate is A12: a TLS client certificate is a credential,
// like Authorization: alice's mTLS page is never stored for the next
// client.
func TestClientCertificate(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				who := "anonymous"
				if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
					who = r.TLS.PeerCertificates[0].Subject.CommonName
				}
				io.WriteString(w, "hello "+who)
			})
			srv, anon := secTLSServe(t, rt.build(New(c, nil), h), func(cfg *tls.Config) { cfg.ClientAuth = tls.RequestClientCert })
			tr := anon.Transport.(*http.Transport).Clone()
			tr.TLSClientConfig.Certificates = []tls.Certificate{secClientCert(t, "alice")}
			alice := &http.Client{Transport: tr, Timeout: secWait}
			t.Cleanup(tr.CloseIdleConnections)
			url := srv.URL + "/mtls/" + rt.name
			if r := secGet(t, alice, url); r.body != "hello alice" {
				t.Fatalf("alice: %v", r)
			}
			if r := secGet(t, anon, url); r.body != "hello anonymous" {
				t.Errorf("a client without a certificate after alice: %v, want its own page", r)
			}
		})
	}
}

// FuzzRawTargetKey is A1's property on raw request lines: two requests
// whose targets differ, byte for byte, never share a key (save for the
// order of differently named query parameters, which the key sorts), the
// same target always gives the same key, and no key exceeds MaxKeyBytes. Each target is
// parsed by net/http from a raw HTTP/1.1 request, as a server reads it.
func FuzzRawTargetKey(f *testing.F) {
	f.Add("/docs/<img/src/onerror=alert:1>", "/docs/%3Cimg/src/onerror=alert:1%3E")
	f.Add("/wiki/\xc3\xbc%2Fx", "/wiki/%C3%BC/x")
	f.Add("/wiki/\xc3\xbc", "/wiki/%C3%BC")
	f.Add("https://u:p@h/y", "/y")
	f.Add("javascript://h/x", "/x")
	f.Add("http://h/y", "/y")
	f.Add("/a%2Fb", "/a/b")
	f.Add("/a/%62", "/a/b")
	f.Add("/a?", "/a")
	f.Add("/q?b=2&a=1", "/q?a=1&b=2")
	f.Add("/q?a=1&a=2", "/q?a=2&a=1")
	f.Add("/a b", "/a%20b")
	f.Add("//x", "/x")
	hd := &handler{cfg: (&Options{}).resolve()}
	read := func(target string) *http.Request {
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader("GET " + target + " HTTP/1.1\r\nHost: h\r\n\r\n")))
		if err != nil || r.RequestURI != target {
			return nil
		}
		return r
	}
	f.Fuzz(func(t *testing.T, t1, t2 string) {
		r1, r2 := read(t1), read(t2)
		if r1 == nil || r2 == nil {
			return // not a request line net/http accepts
		}
		k1, ok1 := hd.key(r1)
		k2, ok2 := hd.key(r2)
		if !ok1 || !ok2 {
			return // bypassed (too long)
		}
		if again, _ := hd.key(read(t1)); again != k1 {
			t.Fatalf("target %q: the key is not deterministic", t1)
		}
		if len(k1) > hd.cfg.MaxKeyBytes {
			t.Fatalf("target %q: key of %d bytes, above MaxKeyBytes", t1, len(k1))
		}
		p1, q1, has1 := strings.Cut(t1, "?")
		p2, q2, has2 := strings.Cut(t2, "?")
		same := t1 == t2 || (p1 == p2 && has1 == has2 && canonicalQuery(q1) == canonicalQuery(q2))
		if (k1 == k2) != same {
			t.Fatalf("targets %q and %q: same key %v, want %v (only the order of differently named parameters may differ):\n%q\n%q", t1, t2, k1 == k2, same, k1, k2)
		}
	})
}

// TestKeyBoundHeap is A8's memory figure: 24 requests with 512 KiB
// queries (12 MiB of keys) leave the heap as it was after GC, since none
// of them is keyed. Before MaxKeyBytes the heap kept 12.3 MiB of them
// (the calibration's per-key classes).
func TestKeyBoundHeap(t *testing.T) {
	c, _ := newCache(t, nil)
	h := New(c, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "x") }))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range 24 {
		r := httptest.NewRequest(http.MethodGet, fmt.Sprintf("/heap?r=%d&q=%s", i, strings.Repeat("a", 512<<10)), nil)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 6<<20 {
		t.Errorf("the heap grew by %.1f MiB after 24 requests with 512 KiB queries, want under 6 MiB", float64(grew)/(1<<20))
	}
}
