package middleware

// Regression tests beside claims_test.go for what its fixes generalise:
// the forwarding rule under any spelling, identity headers as
// credentials, the key scope, Expires and Age without credentials,
// query names that backends merge, the handler's appended Vary, and
// declared per-user trailers. Each runs on http.ServeMux and chi, on a
// real redis-server, except the key-level ones.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestForwardingHeaderAnySpelling: any X-Forwarded-* a request carries
// is keyed, including names no list has and the '_' spelling that CGI,
// PHP, Rack and WSGI servers read as '-'. X-Forwarded-For is not keyed
// (it differs per client): a request with it hits the plain entry.
func TestForwardingHeaderAnySpelling(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		for _, name := range []string{"X-Forwarded-Base-Url", "x_forwarded_host", "X-Forwarded-Protocol"} {
			t.Run(rt.name+"/"+name, func(t *testing.T) {
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					var vs []string
					for k, v := range r.Header {
						if strings.EqualFold(strings.ReplaceAll(k, "_", "-"), strings.ReplaceAll(name, "_", "-")) {
							vs = append(vs, v...)
						}
					}
					fmt.Fprintf(w, "links to %q", vs)
				})
				srv, cl := secServe(t, rt.build(New(c, nil), h))
				url := srv.URL + "/spell/" + name
				req := secNewReq(t, http.MethodGet, url, nil)
				req.Header[name] = []string{"evil.example"} // as written, not canonicalised
				if a := secSend(t, cl, req); !strings.Contains(a.body, "evil") {
					t.Fatalf("the attacker's request: %v (the test's premise)", a)
				}
				if v := secGet(t, cl, url); strings.Contains(v.body, "evil") {
					t.Errorf("%s: the plain request got the attacker's page: %v", name, v)
				}
				if f := secGet(t, cl, url, "X-Forwarded-For", "192.0.2.7"); !strings.HasPrefix(f.cacheStatus(), statusHit) {
					t.Errorf("a request with only X-Forwarded-For: %v, want a hit on the plain entry", f)
				}
			})
		}
	}
}

// TestIdentityHeadersAreCredentials: the headers authenticating proxies
// set to name the user bypass the cache like Authorization; listed in
// KeyHeaders they are keyed instead (one entry per user).
func TestIdentityHeadersAreCredentials(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		for _, name := range []string{"X-Forwarded-Groups", "X-Forwarded-Preferred-Username", "X-Auth-Request-Email", "X-Amzn-Oidc-Data", "X-Ssl-Client-Cert"} {
			t.Run(rt.name+"/"+name, func(t *testing.T) {
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					fmt.Fprintf(w, "page for %q", r.Header.Get(name))
				})
				var bypassed atomic.Int64
				opt := &Options{OnBypass: func(r *http.Request, reason string) {
					if reason == BypassCredentials {
						bypassed.Add(1)
					}
				}}
				srv, cl := secServe(t, rt.build(New(c, opt), h))
				url := srv.URL + "/id/" + name
				for _, u := range []string{"alice", "alice", "bob"} {
					if r := secGet(t, cl, url, name, u); r.body != fmt.Sprintf("page for %q", u) || !sameStatus(r.cacheStatus(), statusBypass) {
						t.Errorf("%s: %s: %v, want her own page, bypassed", name, u, r)
					}
				}
				if runs.Load() != 3 || bypassed.Load() != 3 {
					t.Errorf("%s: %d runs, %d credential bypasses for 3 requests, want 3 and 3", name, runs.Load(), bypassed.Load())
				}

				keyed, kcl := secServe(t, rt.build(New(c, &Options{KeyHeaders: []string{name}}), h))
				kurl := keyed.URL + "/id/" + name
				secGet(t, kcl, kurl, name, "alice")
				if r := secGet(t, kcl, kurl, name, "alice"); !strings.HasPrefix(r.cacheStatus(), statusHit) {
					t.Errorf("%s in KeyHeaders: alice again: %v, want a hit on her entry", name, r)
				}
				if r := secGet(t, kcl, kurl, name, "bob"); r.body != `page for "bob"` {
					t.Errorf("%s in KeyHeaders: bob got %v", name, r)
				}
			})
		}
	}
}

// TestHTTP2HostField: an HTTP/2 request may carry a Host field beside
// :authority (net/http puts :authority in r.Host and leaves the field in
// r.Header); a handler that reads r.Header.Get("Host") reads the
// client's choice, so it is keyed. An HTTP/1 request never has it in
// r.Header (net/http moves it to r.Host).
func TestHTTP2HostField(t *testing.T) {
	mk := func(host string) *http.Request {
		r := &http.Request{Method: http.MethodGet, Host: "shop.example", URL: &url.URL{Path: "/"}, Header: http.Header{}, RequestURI: "/"}
		if host != "" {
			r.Header["Host"] = []string{host}
		}
		return r
	}
	plain := secKeyFor(t, nil, mk(""))
	if evil := secKeyFor(t, nil, mk("evil.example")); evil == plain {
		t.Error("a request with a Host field beside :authority shares the plain request's key")
	}
	if ign := secKeyFor(t, &Options{IgnoreForwardedHeaders: true}, mk("evil.example")); ign != secKeyFor(t, &Options{IgnoreForwardedHeaders: true}, mk("")) {
		t.Error("IgnoreForwardedHeaders still keys the Host field")
	}
}

// TestKeyScope: by default the listener is no part of the key, so
// instances of a service share keys whatever their address and port; a
// Scope is a namespace of its own, and KeyFunc keys are scoped too. Over
// HTTP: two listeners with one Scope share entries.
func TestKeyScope(t *testing.T) {
	at := func(opt *Options, addr string) string {
		r := &http.Request{Method: http.MethodGet, Host: "shop.example", URL: &url.URL{Path: "/"}, Header: http.Header{}, RequestURI: "/"}
		if addr != "" {
			a, err := net.ResolveTCPAddr("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			r = r.WithContext(context.WithValue(context.Background(), http.LocalAddrContextKey, a))
		}
		return secKeyFor(t, opt, r)
	}
	custom := &Options{KeyFunc: func(r *http.Request) (string, bool) { return "k", true }}
	for _, opt := range []*Options{nil, custom} {
		if at(opt, "10.0.0.1:8080") != at(opt, "10.0.0.2:8080") {
			t.Errorf("KeyFunc %v: two instances on port 8080 have different keys", opt != nil)
		}
		if at(opt, "10.0.0.1:8080") != at(opt, "10.0.0.1:9090") {
			t.Errorf("KeyFunc %v: listeners on ports 8080 and 9090 have different keys", opt != nil)
		}
	}
	scoped := &Options{Scope: "catalog"}
	if at(scoped, "10.0.0.1:8080") != at(scoped, "10.0.0.2:9090") {
		t.Error("one Scope, two ports: different keys")
	}
	if at(scoped, "10.0.0.1:8080") == at(&Options{Scope: "admin"}, "10.0.0.1:8080") {
		t.Error("two Scopes, one port: the same key")
	}

	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				io.WriteString(w, "catalog")
			})
			a, acl := secServe(t, rt.build(New(c, scoped), h))
			_, bcl := secServe(t, rt.build(New(c, scoped), h))
			url := a.URL + "/scope/" + rt.name
			secGet(t, acl, url)
			if r := secGet(t, bcl, url); !strings.HasPrefix(r.cacheStatus(), statusHit) || runs.Load() != 1 {
				t.Errorf("the other listener of Scope %q: %v after %d runs, want a hit after 1", scoped.Scope, r, runs.Load())
			}
		})
	}
}

// TestExpiresAndAge: without credentials, a response whose Expires is
// "0", past or given twice differently is stale at once and not stored
// (RFC 9111 §5.3); Expires counts from the handler's Date, not herd's
// clock; an Age counts against max-age; the TTL, with
// RespectCacheControl, is what is left; a hit's Age includes the Age the
// handler gave.
func TestExpiresAndAge(t *testing.T) {
	c, rdb := newCache(t, nil)
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	for _, rt := range secRouters {
		for i, tc := range []struct {
			hdr    []string
			stored bool
			maxTTL time.Duration // with RespectCacheControl
		}{
			{[]string{"Expires", "0"}, false, 0},
			{[]string{"Expires", "Thu, 01 Jan 1970 00:00:00 GMT"}, false, 0},
			{[]string{"Expires", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat), "Expires", "0"}, false, 0},
			{[]string{"Date", old.Format(http.TimeFormat), "Expires", old.Add(40 * time.Second).Format(http.TimeFormat)}, true, 40 * time.Second},
			{[]string{"Cache-Control", "max-age=60", "Age", "30"}, true, 30 * time.Second},
			{[]string{"Cache-Control", "max-age=60", "Age", "90"}, false, 0},
			{[]string{"Cache-Control", "max-age=60", "Cache-Control", "max-age=0"}, false, 0},
		} {
			t.Run(fmt.Sprintf("%s/%q", rt.name, tc.hdr), func(t *testing.T) {
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					for j := 0; j+1 < len(tc.hdr); j += 2 {
						w.Header().Add(tc.hdr[j], tc.hdr[j+1])
					}
					io.WriteString(w, "page")
				})
				opt := &Options{RespectCacheControl: true, TTL: time.Hour}
				srv, cl := secServe(t, rt.build(New(c, opt), h))
				url := fmt.Sprintf("%s/exp/%d", srv.URL, i)
				first := secGet(t, cl, url)
				second := secGet(t, cl, url)
				if !tc.stored {
					if runs.Load() != 2 || sameStatus(first.cacheStatus(), statusStored) {
						t.Errorf("%q: %v then %v, %d runs; want not stored, 2 runs", tc.hdr, first, second, runs.Load())
					}
					return
				}
				if !sameStatus(first.cacheStatus(), statusStored) || !strings.HasPrefix(second.cacheStatus(), statusHit) {
					t.Fatalf("%q: %v then %v, want stored then a hit", tc.hdr, first, second)
				}
				pttl, err := rdb.PTTL(context.Background(), secRedisKey(secKeyOfURL(t, opt, url), "v")).Result()
				if err != nil || pttl <= 0 || pttl > tc.maxTTL {
					t.Errorf("%q: stored for %v (%v), want at most %v", tc.hdr, pttl, err, tc.maxTTL)
				}
				if a, err := strconv.Atoi(second.header.Get("Age")); tc.hdr[len(tc.hdr)-2] == "Age" && (err != nil || a < 30) {
					t.Errorf("%q: a hit's Age %q, want at least the handler's 30", tc.hdr, second.header.Get("Age"))
				}
			})
		}
	}
}

// TestQueryNamesThatBackendsMerge: parameters whose names a backend
// merges (ASCII case, '.' and ' ' as '_', a[x]) are never reordered
// against each other, so requests that such a backend reads differently
// never share a key; differently named ones still sort.
func TestQueryNamesThatBackendsMerge(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"/q?b=1&a=2", "/q?a=2&b=1", true},
		{"/q?a=1&A=2", "/q?A=2&a=1", false},
		{"/q?a.b=1&a_b=2", "/q?a_b=2&a.b=1", false},
		{"/q?a+b=1&a_b=2", "/q?a_b=2&a+b=1", false},
		{"/q?x[a]=1&x[b]=2", "/q?x[b]=2&x[a]=1", false},
		{"/q?x[a]=1&y=2", "/q?y=2&x[a]=1", true},
	} {
		ka := secKeyOfURL(t, nil, "http://shop.example"+tc.a)
		kb := secKeyOfURL(t, nil, "http://shop.example"+tc.b)
		if (ka == kb) != tc.same {
			t.Errorf("%s and %s: same key %v, want %v", tc.a, tc.b, ka == kb, tc.same)
		}
	}
}

// TestHandlerAppendedVary: the handler's Header.Add to the Vary an outer
// middleware set is judged on what it added: Vary: Origin from outside is
// the outer middleware's, the handler's X-Forwarded-Host is keyed, so the
// response is stored.
func TestHandlerAppendedVary(t *testing.T) {
	c, _ := newCache(t, nil)
	outer := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Add("Vary", "Origin")
			next.ServeHTTP(w, r)
		})
	}
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Add("Vary", "X-Forwarded-Host")
				io.WriteString(w, "page")
			})
			mw := New(c, nil)
			srv, cl := secServe(t, rt.build(func(next http.Handler) http.Handler { return outer(mw(next)) }, h))
			if r := secGet(t, cl, srv.URL+"/vary-add/"+rt.name); !sameStatus(r.cacheStatus(), statusStored) {
				t.Errorf("%v, want stored: the handler added only a keyed Vary", r)
			}
		})
	}
}

// TestDeclaredPerUserTrailer: a response that declares a per-user
// trailer (Trailer: Authentication-Info) is not stored, whether the
// handler then sets it or not.
func TestDeclaredPerUserTrailer(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		for _, set := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/set=%v", rt.name, set), func(t *testing.T) {
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Trailer", "Authentication-Info")
					io.WriteString(w, "page")
					if set {
						w.Header().Set("Authentication-Info", "sid="+r.Header.Get("X-User"))
					}
				})
				srv, cl := secServe(t, rt.build(New(c, nil), h))
				url := fmt.Sprintf("%s/declared/%v", srv.URL, set)
				if r := secGet(t, cl, url, "X-User", "alice"); sameStatus(r.cacheStatus(), statusStored) {
					t.Errorf("%v, want not stored: it declares a per-user trailer", r)
				}
			})
		}
	}
}
