package middleware

// A second hostile reading of the middleware's security claims
// (docs/security.md, the package doc, Options, README), by a reader who
// did not write the code. Each test is named after the claim it attacks;
// each runs on http.ServeMux and on chi (secRouters), on a real
// redis-server. The tests that fail show a claim that does not hold.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
)

// TestClaimEveryForwardingHeaderKeyed attacks docs/security.md's row
// "every forwarding header a request carries is part of its key
// (X-Forwarded-*, ...)". Only a fixed list of X-Forwarded-* names is
// keyed. X-Forwarded-Protocol (what Echo's Context.Scheme reads), and the
// identity headers that authenticating proxies set on every request
// (oauth2-proxy's X-Forwarded-User, -Email, -Access-Token; Envoy's mTLS
// X-Forwarded-Client-Cert) are X-Forwarded-* too, and are neither keyed
// nor treated as credentials: the first requester's page is everyone's
// (alice's account page to bob behind oauth2-proxy; an attacker's forged
// scheme in every visitor's links).
func TestClaimEveryForwardingHeaderKeyed(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		for _, name := range []string{"X-Forwarded-Protocol", "X-Forwarded-User", "X-Forwarded-Email", "X-Forwarded-Access-Token", "X-Forwarded-Client-Cert"} {
			t.Run(rt.name+"/"+name, func(t *testing.T) {
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					fmt.Fprintf(w, "page for %q", r.Header.Get(name))
				})
				srv, cl := secServe(t, rt.build(New(c, nil), h))
				url := srv.URL + "/fwd2/" + name
				if a := secGet(t, cl, url, name, "alice"); a.body != `page for "alice"` {
					t.Fatalf("first request: %v", a)
				}
				if r := secGet(t, cl, url, name, "bob"); r.body != `page for "bob"` {
					t.Errorf("%s: bob got %v, want his own page: the header is not keyed", name, r)
				}
				if r := secGet(t, cl, url); r.body != `page for ""` {
					t.Errorf("%s: a request without it got %v, want its own page", name, r)
				}
			})
		}
	}
}

// TestClaimMaxAgeZeroNeverStored attacks "s-maxage=0 (or max-age=0
// without s-maxage) is never stored" (docs/security.md, A4) with a
// repeated directive. parseCacheControl keeps the last value of a
// directive, but RFC 9111 §4.2.1 says a cache uses the first one or
// treats the response as stale. "max-age=0, must-revalidate" from the
// handler followed by a "max-age=60" added by another layer (or on one
// line) is stored and served, with AllowAuthorized: alice's page to bob.
func TestClaimMaxAgeZeroNeverStored(t *testing.T) {
	c, _ := newCache(t, nil)
	opt := &Options{AllowAuthorized: true, TTL: time.Hour}
	for _, rt := range secRouters {
		for i, lines := range [][]string{
			{"max-age=0, must-revalidate", "max-age=60"},
			{"max-age=0, max-age=60, must-revalidate"},
			{"s-maxage=0, must-revalidate", "s-maxage=60"},
		} {
			t.Run(fmt.Sprintf("%s/%q", rt.name, lines), func(t *testing.T) {
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					for _, l := range lines {
						w.Header().Add("Cache-Control", l)
					}
					io.WriteString(w, "page of "+r.Header.Get("Authorization"))
				})
				srv, cl := secServe(t, rt.build(New(c, opt), h))
				url := fmt.Sprintf("%s/dup/%d", srv.URL, i)
				a := secGet(t, cl, url, "Authorization", "alice")
				if bob := secGet(t, cl, url, "Authorization", "bob"); bob.body != "page of bob" {
					t.Errorf("Cache-Control %q: bob got %v, want his own page (alice's: %v)", lines, bob, a)
				}
			})
		}
	}
}

// TestClaimMustRevalidateNeverServedStale attacks "must-revalidate or
// proxy-revalidate is never served stale" (package doc, security.md A4).
// herd takes a response's freshness only from max-age and s-maxage; a
// response whose Expires is in the past (or the invalid "0", which RFC
// 9111 §5.3 says is in the past) has no freshness at all (§4.2.1), so a
// must-revalidate response is stale at once and may not be served
// without revalidation; so is a must-revalidate response whose Age (from
// an upstream cache behind a proxying handler) exceeds its max-age
// (§4.2.3). With AllowAuthorized, must-revalidate lets a
// response to alice be stored (§3.5), and bob is served it.
func TestClaimMustRevalidateNeverServedStale(t *testing.T) {
	c, _ := newCache(t, nil)
	opt := &Options{AllowAuthorized: true, TTL: time.Hour}
	for _, rt := range secRouters {
		for i, hdr := range [][]string{
			{"Cache-Control", "must-revalidate", "Expires", "0"},
			{"Cache-Control", "must-revalidate", "Expires", "Thu, 01 Jan 1970 00:00:00 GMT"},
			// An upstream cache's response through a proxying handler: its
			// Age (3600 s) is past its max-age (60 s), so it is stale.
			{"Cache-Control", "max-age=60, must-revalidate", "Age", "3600"},
		} {
			t.Run(fmt.Sprintf("%s/%q", rt.name, hdr), func(t *testing.T) {
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					for j := 0; j+1 < len(hdr); j += 2 {
						w.Header().Set(hdr[j], hdr[j+1])
					}
					io.WriteString(w, "page of "+r.Header.Get("Authorization"))
				})
				srv, cl := secServe(t, rt.build(New(c, opt), h))
				url := fmt.Sprintf("%s/expired/%d", srv.URL, i)
				a := secGet(t, cl, url, "Authorization", "alice")
				if bob := secGet(t, cl, url, "Authorization", "bob"); bob.body != "page of bob" {
					t.Errorf("%q: bob got %v, want his own page (alice's: %v)", hdr, bob, a)
				}
			})
		}
	}
}

// TestClaimPerUserFieldsNeverStored attacks "every value under any case
// is checked; a response with any per-user field is not stored, and those
// fields are never stored nor replayed" (security.md A5). A handler sets
// a field as a trailer with net/http's TrailerPrefix
// (w.Header()["Trailer:Set-Cookie"]): net/http sends it as Set-Cookie in
// the trailer section. isPerUser does not see "Trailer:Set-Cookie", so the
// response is stored with it and every later visitor gets alice's
// session cookie (as a trailer over HTTP/2).
func TestClaimPerUserFieldsNeverStored(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		for _, field := range []string{"Set-Cookie", "Authentication-Info"} {
			t.Run(rt.name+"/"+field, func(t *testing.T) {
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if u := r.Header.Get("X-User"); u != "" {
						w.Header().Set(http.TrailerPrefix+field, "sid="+u)
					}
					io.WriteString(w, "the page")
				})
				srv, cl := secTLSServe(t, rt.build(New(c, nil), h), nil)
				url := srv.URL + "/trailer/" + rt.name + "/" + field
				req := secNewReq(t, http.MethodGet, url, nil, "X-User", "alice")
				res, err := cl.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.Trailer.Get(field) != "sid=alice" {
					t.Fatalf("alice's response: trailer %q, want her %s (the test's premise)", res.Trailer, field)
				}
				aliceStatus := res.Header.Get("Cache-Status")
				res, err = cl.Do(secNewReq(t, http.MethodGet, url, nil))
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if v := res.Trailer.Get(field) + res.Header.Get(field); strings.Contains(v, "alice") {
					t.Errorf("the next visitor got alice's %s %q (alice's response: Cache-Status %q; this one %q)", field, v, aliceStatus, res.Header.Get("Cache-Status"))
				}
			})
		}
	}
}

// TestClaimDistinctHandlersNeverShare attacks "two requests share an
// entry only if every router and handler sees the same request" (package
// doc) and the A2 defence (StripPrefix mounts). An internal listener (an
// admin port, reachable only from inside) and a public one each wrap
// their own handler with New on one Cache. The key holds the Host, which
// the client chooses: an attacker on the public port sends the internal
// host name and is served the internal listener's stored page, unless
// the two middlewares have distinct Scopes, which New requires of the
// middlewares on one Cache (TestMiddlewaresOnOneCacheNeedDistinctScopes).
func TestClaimDistinctHandlersNeverShare(t *testing.T) {
	c := herd.New(redistest.Start(t).Client(t), nil) // New's rule of distinct scopes applies
	t.Cleanup(func() { c.Close() })
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			internal := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "internal: salaries")
			})
			public := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusNotFound)
				io.WriteString(w, "public: no such page")
			})
			inSrv, inCl := secServe(t, rt.build(New(c, &Options{Scope: "internal-" + rt.name}), internal))
			pubSrv, _ := secServe(t, rt.build(New(c, &Options{Scope: "public-" + rt.name}), public))
			url := inSrv.URL + "/report/" + rt.name
			if r := secGet(t, inCl, url); !sameStatus(r.cacheStatus(), statusStored) {
				t.Fatalf("internal request: %v, want it stored", r)
			}
			host := strings.TrimPrefix(inSrv.URL, "http://")
			if a := secRaw(t, pubSrv, "GET /report/"+rt.name+" HTTP/1.1\r\nHost: "+host); strings.Contains(a.body, "internal") {
				t.Errorf("the public listener served the internal page to a request with Host %s: %v", host, a)
			}
		})
	}
}

// TestClaimHandlerVaryJudged attacks "only what the handler set is
// judged" (security.md A9; package doc: a Vary an outer middleware set
// is that middleware's). handlerValues skips a Vary whose values equal
// the snapshot taken before the handler ran, even when the handler set
// it itself. An outer middleware adds Vary: Origin to every response
// (without CORS fields of its own); the handler does CORS itself:
// w.Header().Set("Vary", "Origin") and an Access-Control-Allow-Origin
// reflecting the request's Origin. The handler's Vary is ignored, and its
// ACAO is stored: the attacker's origin is allowed on every visitor's
// response, and a legitimate origin is refused (a CORS CPDoS).
func TestClaimHandlerVaryJudged(t *testing.T) {
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
				w.Header().Set("Vary", "Origin")
				if o := r.Header.Get("Origin"); o != "" {
					w.Header().Set("Access-Control-Allow-Origin", o)
				}
				io.WriteString(w, `{"data":1}`)
			})
			mw := New(c, nil)
			srv, cl := secServe(t, rt.build(func(next http.Handler) http.Handler { return outer(mw(next)) }, h))
			url := srv.URL + "/api/" + rt.name
			a := secGet(t, cl, url, "Origin", "https://evil.example")
			v := secGet(t, cl, url, "Origin", "https://app.example")
			if got := v.header.Get("Access-Control-Allow-Origin"); got != "https://app.example" {
				t.Errorf("the app's origin got Access-Control-Allow-Origin %q, want its own (attacker's response: %v; this one: %v)", got, a, v)
			}
		})
	}
}

// TestClaimEveryHerdKeyHasTTL attacks security.md's bound on Redis
// memory: "every herd key has a TTL" (so volatile-lru can evict any of
// them) and a key's counter lives at most the fence TTL (24 h). After a stored page, a not-stored page (302), a 404 and a
// failing handler, every key under the Cache's prefix must have a TTL.
func TestClaimEveryHerdKeyHasTTL(t *testing.T) {
	c, rdb := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/ok":
					io.WriteString(w, "ok")
				case "/redirect":
					http.Redirect(w, r, "/ok", http.StatusFound)
				case "/fail":
					w.WriteHeader(http.StatusInternalServerError)
				default:
					http.NotFound(w, r)
				}
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			for _, p := range []string{"/ok", "/redirect", "/missing", "/fail"} {
				secGet(t, cl, srv.URL+p)
			}
			ctx := context.Background()
			keys := secScan(t, rdb, "herd*")
			if len(keys) == 0 {
				t.Fatal("no herd key in Redis after four requests")
			}
			for _, k := range keys {
				ttl, err := rdb.PTTL(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				if ttl < 0 {
					t.Errorf("Redis key %q has no TTL (%v): volatile-lru can never evict it", k, ttl)
				}
				if ttl > 24*time.Hour {
					t.Errorf("Redis key %q lives %v, above the documented 24 h bound of a fencing counter", k, ttl)
				}
			}
		})
	}
}

// TestCPDoSWebSocketUpgrade attacks the threat model's CPDoS promise (no
// attacker's response stored for a page others need) with an Upgrade
// request. A GET with "Connection: Upgrade" and "Upgrade: websocket" is
// neither bypassed nor keyed apart from a plain GET. A WebSocket endpoint
// that answers a plain GET with a short page (a common fallback) has that
// page stored by an attacker's plain GET, and then every WebSocket client
// is served the stored 200 instead of its 101 Switching Protocols until
// the TTL ends.
func TestCPDoSWebSocketUpgrade(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
					io.WriteString(w, "this endpoint speaks WebSocket")
					return
				}
				conn, rw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				defer conn.Close()
				rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
				rw.Flush()
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			url := srv.URL + "/ws/" + rt.name
			if a := secGet(t, cl, url); !sameStatus(a.cacheStatus(), statusStored) {
				t.Fatalf("the attacker's plain GET: %v", a)
			}
			host := strings.TrimPrefix(srv.URL, "http://")
			ws := secRaw(t, srv, "GET /ws/"+rt.name+" HTTP/1.1\r\nHost: "+host+
				"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")
			if ws.status != http.StatusSwitchingProtocols {
				t.Errorf("a WebSocket handshake after the attacker's plain GET: %v, want 101", ws)
			}
		})
	}
}
