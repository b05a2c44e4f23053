package middleware

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"

	"bufio"
)

// scopeGet sends a GET of url with the Host host (the URL's own when
// empty).
func scopeGet(t *testing.T, cl *http.Client, url, host string) secResp {
	t.Helper()
	req := secNewReq(t, http.MethodGet, url, nil)
	if host != "" {
		req.Host = host
	}
	return secDo(cl, req)
}

// TestDefaultScopeSharesAcrossPorts: two instances of a service (two
// Caches on one Redis) listening on two ports of one host, with default
// options, share entries: concurrent requests for a cold URL, sent to
// both by their plain URLs (whose Hosts differ in the port), run the
// handler once.
func TestDefaultScopeSharesAcrossPorts(t *testing.T) {
	rs := redistest.Start(t)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			gate := newSecGate(t)
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				gate.wait(r)
				io.WriteString(w, "page")
			})
			var urls []string
			var clients []*http.Client
			for range 2 {
				c := herd.New(rs.Client(t), nil)
				t.Cleanup(func() { c.Close() })
				srv := httptest.NewServer(rt.build(New(c, nil), h))
				t.Cleanup(srv.Close)
				urls = append(urls, srv.URL+"/cold/"+rt.name) // http://127.0.0.1:port/...
				clients = append(clients, srv.Client())
			}
			if urls[0][:strings.LastIndexByte(urls[0], ':')] != urls[1][:strings.LastIndexByte(urls[1], ':')] {
				t.Fatalf("the instances do not listen on one host: %v", urls)
			}
			lead := secParallel(clients[0], []*http.Request{secNewReq(t, http.MethodGet, urls[0], nil)})
			secWaitFor(t, "the first request to run the handler", func() bool { return runs.Load() == 1 })
			var batches []*secBatch
			for i := range 2 {
				var reqs []*http.Request
				for range 5 {
					reqs = append(reqs, secNewReq(t, http.MethodGet, urls[i], nil))
				}
				batches = append(batches, secParallel(clients[i], reqs))
			}
			secWaitForState(t, "requests of both instances waiting for the first", func() (bool, string) {
				n := secWaiting()
				// A second run means the instances did not share: stop
				// waiting, the check below fails.
				return (n >= 2 && runs.Load() == 1) || runs.Load() > 1, fmt.Sprintf("%d waiting, %d runs", n, runs.Load())
			})
			gate.open()
			all := append(lead.wait(t), append(batches[0].wait(t), batches[1].wait(t)...)...)
			for i, r := range all {
				if r.err != nil || r.status != http.StatusOK || r.body != "page" {
					t.Errorf("request %d: %v, want 200 page", i, r)
				}
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("handler runs for one cold URL on two ports = %d, want 1", n)
			}
		})
	}
}

// TestMiddlewaresOnOneCacheNeedDistinctScopes: an internal and a public
// server in one process, each with its own middleware on one Cache, never
// serve each other's entries, whatever Host a client sends: New refuses a
// second middleware on a Cache without a Scope of its own, and with a
// Scope each, both cache, apart. One middleware may wrap several routes,
// and one server may listen on two ports: they share entries.
func TestMiddlewaresOnOneCacheNeedDistinctScopes(t *testing.T) {
	rs := redistest.Start(t)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			c := herd.New(rs.Client(t), nil)
			t.Cleanup(func() { c.Close() })
			pub := New(c, nil)
			for _, tc := range []struct {
				opt  *Options
				want string
			}{
				{nil, "a second middleware on this Cache without an Options.Scope"},
				{&Options{TTL: time.Hour}, "a second middleware on this Cache without an Options.Scope"},
				{&Options{Scope: "internal"}, ""},
				{&Options{Scope: "internal", TTL: time.Hour}, `Options.Scope "internal" is already the scope of another middleware on this Cache`},
			} {
				got := func() (msg string) {
					defer func() {
						if v := recover(); v != nil {
							msg = fmt.Sprint(v)
						}
					}()
					New(c, tc.opt)
					return ""
				}()
				if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
					t.Errorf("New(%+v) on a Cache that has middlewares without Scope and with Scope internal: panic %q, want one saying %q", tc.opt, got, tc.want)
				}
			}
			internal := New(c, &Options{Scope: "internal-" + rt.name})
			answer := func(body string) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) })
			}
			in := httptest.NewServer(rt.build(internal, answer("internal secret")))
			t.Cleanup(in.Close)
			out := httptest.NewServer(rt.build(pub, answer("public page")))
			t.Cleanup(out.Close)
			const host = "shop.example" // both get the same Host: the client picks it
			for _, s := range []struct {
				srv    *httptest.Server
				body   string
				status string
			}{
				{in, "internal secret", statusStored},
				{out, "public page", statusStored},
				{in, "internal secret", statusHit},
				{out, "public page", statusHit},
			} {
				if r := scopeGet(t, s.srv.Client(), s.srv.URL+"/p/"+rt.name, host); r.body != s.body || !strings.HasPrefix(r.cacheStatus(), s.status) {
					t.Errorf("%s: %v, want %q, %q", s.srv.URL, r, s.body, s.status)
				}
			}

			// One middleware on two routes, one server on two listeners.
			var runs atomic.Int64
			page := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				io.WriteString(w, "one server")
			})
			mux := http.NewServeMux()
			mux.Handle("/one/", rt.build(pub, page))
			mux.Handle("/two/", rt.build(pub, page))
			srv := &http.Server{Handler: mux}
			var addrs []string
			for range 2 {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				addrs = append(addrs, l.Addr().String())
				go srv.Serve(l)
			}
			t.Cleanup(func() { srv.Shutdown(context.Background()) })
			cl := &http.Client{Transport: &http.Transport{}}
			t.Cleanup(cl.CloseIdleConnections)
			for _, path := range []string{"/one/" + rt.name, "/two/" + rt.name} {
				for _, a := range addrs {
					if r := scopeGet(t, cl, "http://"+a+path, ""); r.body != "one server" {
						t.Errorf("%s%s: %v", a, path, r)
					}
				}
			}
			if n := runs.Load(); n != 2 {
				t.Errorf("one server on two ports, two URLs: %d handler runs, want 2", n)
			}
		})
	}
}

// TestHostKeyDropsThePort: the key holds the Host in lower case without
// its port, so every port of one name shares (a default port, an empty
// one, an IPv6 literal's); anything after a ':' that is not a port is
// kept, and an unbracketed IPv6 address keeps every digit.
func TestHostKeyDropsThePort(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"shop.example", "shop.example"},
		{"shop.example:8080", "shop.example"},
		{"shop.example:", "shop.example"},
		{"Shop.Example:443", "shop.example"},
		{"127.0.0.1:8081", "127.0.0.1"},
		{"shop.example:80", "shop.example"},
		{"[::1]:8080", "[::1]"},
		{"[::1]", "[::1]"},
		{"[fe80::1%25eth0]:8081", "[fe80::1%25eth0]"},
		{"::1", "::1"},
		{"2001:db8::8080", "2001:db8::8080"},
		{"fe80::1:8080", "fe80::1:8080"},
		{"shop.example:80x", "shop.example:80x"},
		{"[::1:8080", "[::1:8080"},
		{"", ""},
	} {
		if got := hostKey(tc.in); got != tc.want {
			t.Errorf("hostKey(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// userCache is a Cache on a redis-server of its own, with New's
// rule of distinct scopes on (no shareScopes): what a user gets.
func userCache(t *testing.T) *herd.Cache {
	t.Helper()
	c := herd.New(redistest.Start(t).Client(t), nil)
	t.Cleanup(func() { c.Close() })
	return c
}

// rawGet sends one raw HTTP/1.1 request line and Host to addr and
// returns the response body.
func rawGet(t *testing.T, addr, target, host string) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, host)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.Header.Get("Cache-Status") + " " + string(b)
}

// TestHostCaseDoesNotSplitEntries: hostKey's comment says the key holds
// the Host "as nginx's $host has it", and nginx lower-cases $host; host
// names are case-insensitive (RFC 9110 §4.2.3). Two instances asked for
// one URL with Host "Shop.Example" and "shop.example" must share one
// handler run.
func TestHostCaseDoesNotSplitEntries(t *testing.T) {
	c := userCache(t)
	var runs atomic.Int64
	h := New(c, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.WriteString(w, "page")
	}))
	a, b := httptest.NewServer(h), httptest.NewServer(h)
	defer a.Close()
	defer b.Close()
	first := rawGet(t, a.Listener.Addr().String(), "/case", "Shop.Example:8080")
	second := rawGet(t, b.Listener.Addr().String(), "/case", "shop.example:8081")
	if got := runs.Load(); got != 1 {
		t.Errorf("handler ran %d times for one URL whose Host differs only in case, want 1 (%q, %q)", got, first, second)
	}
}

// TestErrorHandlerAnswerCarriesCacheStatus: the package doc says "Every
// response carries Cache-Status", with a detail for every degraded
// answer. A waiter whose second wait also ends in a failure gets
// ErrorHandler's 502: that answer must say what happened too.
func TestErrorHandlerAnswerCarriesCacheStatus(t *testing.T) {
	c, _ := newCache(t, &herd.Options{WaitTimeout: secWait})
	var runs atomic.Int64
	var first, second *secGate
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch runs.Add(1) {
		case 1:
			first.wait(r)
		case 2:
			second.wait(r)
		}
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, "failed")
	})
	srv, cl := secServe(t, secOuter{New(c, nil)(h)})
	first, second = newSecGate(t), newSecGate(t)
	const n = 6
	reqs := make([]*http.Request, n)
	for i := range reqs {
		reqs[i] = secNewReq(t, http.MethodGet, srv.URL+"/eh", nil)
	}
	batches := []*secBatch{secParallel(cl, reqs[:1])}
	secWaitFor(t, "the leader in the handler", func() bool { return runs.Load() == 1 })
	batches = append(batches, secParallel(cl, reqs[1:]))
	secWaitFor(t, "the waiters", func() bool { return secWaiting() == n-1 })
	first.open()
	secWaitFor(t, "the retry leader and its waiters", func() bool { return runs.Load() == 2 && secWaiting() == n-2 })
	second.open()
	var rs []secResp
	for _, b := range batches {
		rs = append(rs, b.wait(t)...)
	}
	seen := 0
	for _, r := range rs {
		if r.status != http.StatusBadGateway {
			continue
		}
		seen++
		if cs := r.cacheStatus(); !strings.Contains(cs, "detail=") {
			t.Errorf("ErrorHandler's %d has Cache-Status %q, want a detail saying the response failed", r.status, cs)
		}
	}
	if seen == 0 {
		t.Fatalf("no request got ErrorHandler's answer: %v", rs)
	}
}

// TestReloadRebuildingHandlersOnOneCache: a server that rebuilds its
// handlers on a reload (same Cache, same Options) calls New again. The
// Options.Scope godoc says a scope stays taken for the life of the
// Cache, so this panics: the test records that a reload must keep the
// middleware it made, or make a new Cache.
func TestReloadRebuildingHandlersOnOneCache(t *testing.T) {
	c := userCache(t)
	build := func() http.Handler {
		return New(c, &Options{Scope: "public"})(http.NotFoundHandler())
	}
	build()
	defer func() {
		if recover() == nil {
			t.Errorf("a second New with the same Scope on one Cache did not panic")
		}
	}()
	build()
}
