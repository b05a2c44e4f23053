package middleware

// Security and robustness tests of the middleware: TESTCATALOG §4 and
// rows H01–H11 of §6.4, on a real redis-server (newCache), each behind
// http.ServeMux and behind chi with its Recoverer.
//
// Requests are sequenced with gates (channels) and by waiting for
// observable state: handler run counters, the goroutines waiting inside
// herd for another request's response (secWaiting), and Redis keys. No
// test sleeps to coordinate, and every wait is bounded by secWait.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/herdkit/herd"
	"github.com/redis/go-redis/v9"
)

// secWait bounds every wait of these tests: for a response, for a
// goroutine to reach a state, for a gate.
const secWait = 20 * time.Second

// secRouter mounts the middleware mw around h on a router, behind
// secOuter.
type secRouter struct {
	name  string
	build func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler
}

var secRouters = []secRouter{
	{"ServeMux", func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("/", mw(h))
		return secOuter{mux}
	}},
	{"chi", func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
		r := chi.NewRouter()
		r.Use(chimw.Recoverer)
		r.With(mw).Handle("/*", h)
		return secOuter{r}
	}},
}

// secOuter is the outermost handler of every server in this file. It
// answers a panic nothing inside recovered with a 500, as a production
// server's recoverer would (chi's Recoverer recovers first on the chi
// router), and its frame marks this file's request goroutines for
// secWaiting.
type secOuter struct{ next http.Handler }

func (o secOuter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			w.WriteHeader(http.StatusInternalServerError)
		}
	}()
	o.next.ServeHTTP(w, r)
}

// secServers numbers the servers of this file.
var secServers atomic.Int64

// secListeners maps a secServe server's host name to its listener's
// address, which the default key scope is derived from (Options.Scope):
// secKeyOfURL computes the key a request to that server gets.
var secListeners sync.Map

// secServe starts a server for h, closed when the test ends, and returns
// it with a client that gives up after secWait, follows no redirect and
// sends no Accept-Encoding of its own. The server's URL has a host name
// of its own, which the client dials at the server's address: keys hold
// the host, and a port may be reused by a later test's server.
func secServe(t *testing.T, h http.Handler) (*httptest.Server, *http.Client) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // semicolon and panic notices
	srv.Start()
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()
	srv.URL = fmt.Sprintf("http://s%d.test", secServers.Add(1))
	secListeners.Store(strings.TrimPrefix(srv.URL, "http://"), srv.Listener.Addr())
	cl := srv.Client()
	cl.Timeout = secWait
	cl.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	tr := cl.Transport.(*http.Transport)
	tr.DisableCompression = true
	var d net.Dialer
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
	return srv, cl
}

// secGate holds handler runs until it is opened. It opens when the test
// ends, so no handler outlives it; a held run gives up after secWait or
// when its request's context ends.
type secGate struct {
	once sync.Once
	ch   chan struct{}
}

func newSecGate(t *testing.T) *secGate {
	g := &secGate{ch: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *secGate) open() { g.once.Do(func() { close(g.ch) }) }

// wait reports whether the gate opened (false: the request ended or the
// bound passed first).
func (g *secGate) wait(r *http.Request) bool {
	limit := time.NewTimer(secWait)
	defer limit.Stop()
	select {
	case <-g.ch:
		return true
	case <-r.Context().Done():
	case <-limit.C:
	}
	return false
}

// secResp is a response read to its end.
type secResp struct {
	status int
	header http.Header
	body   string
	err    error
}

func (r secResp) cacheStatus() string { return r.header.Get("Cache-Status") }

func (r secResp) String() string {
	if r.err != nil {
		return "error: " + r.err.Error()
	}
	body := r.body
	if len(body) > 80 {
		body = body[:80] + "…"
	}
	return fmt.Sprintf("%d %q (Cache-Status %q)", r.status, body, r.cacheStatus())
}

// secDo sends req and reads the whole response. It may run in any
// goroutine.
func secDo(cl *http.Client, req *http.Request) secResp {
	res, err := cl.Do(req)
	if err != nil {
		return secResp{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return secResp{status: res.StatusCode, header: res.Header, body: string(b), err: err}
}

// secNewReq builds a request with the given header name/value pairs.
func secNewReq(t *testing.T, method, url string, body io.Reader, hdr ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	return req
}

// secGet sends a GET from the test goroutine; a transport error fails
// the test.
func secGet(t *testing.T, cl *http.Client, url string, hdr ...string) secResp {
	t.Helper()
	return secSend(t, cl, secNewReq(t, http.MethodGet, url, nil, hdr...))
}

func secSend(t *testing.T, cl *http.Client, req *http.Request) secResp {
	t.Helper()
	r := secDo(cl, req)
	if r.err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, r.err)
	}
	return r
}

// secRaw sends head (a request line and header fields, CRLF-separated,
// without the final blank line) on a new connection and reads the
// response. It lets a test send what http.Client would not: an
// absolute-form target, raw bytes in the path.
func secRaw(t *testing.T, srv *httptest.Server, head string) secResp {
	t.Helper()
	conn, err := net.DialTimeout("tcp", srv.Listener.Addr().String(), secWait)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(secWait))
	if _, err := io.WriteString(conn, head+"\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%q: %v", head, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%q: %v", head, err)
	}
	return secResp{status: res.StatusCode, header: res.Header, body: string(b)}
}

// secBatch is requests sent at once, each in its own goroutine.
type secBatch struct {
	out      []secResp
	wg       sync.WaitGroup
	finished atomic.Int64
}

// secParallel sends every request in its own goroutine at once.
func secParallel(cl *http.Client, reqs []*http.Request) *secBatch {
	b := &secBatch{out: make([]secResp, len(reqs))}
	for i, req := range reqs {
		b.wg.Go(func() {
			b.out[i] = secDo(cl, req)
			b.finished.Add(1)
		})
	}
	return b
}

// wait waits for the responses (2 × secWait at most) and returns them in
// the order of the requests.
func (b *secBatch) wait(t *testing.T) []secResp {
	t.Helper()
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	limit := time.NewTimer(2 * secWait)
	defer limit.Stop()
	select {
	case <-done:
	case <-limit.C:
		t.Fatalf("requests still running after %v", 2*secWait)
	}
	return b.out
}

// secWaitFor polls cond until it holds; after secWait it fails the test.
func secWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	secWaitForState(t, what, func() (bool, string) { return cond(), "" })
}

// secWaitForState is secWaitFor with a description of the state the
// failure reports.
func secWaitForState(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(secWait)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after %v for %s (%s)", secWait, what, state)
		}
		time.Sleep(time.Millisecond)
	}
}

// secWaiting counts the request goroutines of this file's servers that
// wait inside herd for another request's response: blocked on a Fill of
// this process (Cache.waitLocalFill, in a select: one that the Fill's end
// has woken is runnable and no longer counts), or following a lease
// holder through Redis (Cache.follow, in any state: it polls Redis).
// Begin may run its lookup in a goroutine of its own: that goroutine
// counts for the request goroutine that created it.
func secWaiting() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := map[string]string{} // goroutine id → its stack
	for _, g := range strings.Split(string(buf), "\n\n") {
		if id, _, ok := strings.Cut(strings.TrimPrefix(g, "goroutine "), " "); ok {
			stacks[id] = g
		}
	}
	const createdByBegin = "created by github.com/herdkit/herd.(*Cache).Begin in goroutine "
	n := 0
	for _, g := range stacks {
		ours := strings.Contains(g, "secOuter")
		if i := strings.Index(g, createdByBegin); i >= 0 {
			parent, _, _ := strings.Cut(g[i+len(createdByBegin):], "\n")
			ours = strings.Contains(stacks[strings.TrimSpace(parent)], "secOuter")
		}
		if !ours {
			continue
		}
		local := strings.Contains(g, "herd.(*Cache).waitLocalFill(")
		blocked := strings.Contains(g[:strings.IndexByte(g+"\n", '\n')], "[select")
		if (local && blocked) || strings.Contains(g, "herd.(*Cache).follow(") {
			n++
		}
	}
	return n
}

// secKeyFor is the middleware key of r under opt.
func secKeyFor(t *testing.T, opt *Options, r *http.Request) string {
	t.Helper()
	h := &handler{cfg: opt.resolve()}
	k, ok := h.key(r)
	if !ok {
		t.Fatalf("request %s %s bypasses the cache", r.Method, r.URL)
	}
	return k
}

// secKeyOfURL is the middleware key of a plain GET of rawURL under opt.
// The request is the one a server receives from a client given rawURL: an
// origin-form target, with the URL's host in Host.
func secKeyOfURL(t *testing.T, opt *Options, rawURL string, hdr ...string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, u.RequestURI(), nil)
	r.Host = u.Host
	if addr, ok := secListeners.Load(u.Host); ok {
		// As the server received it: on its listener (the key's scope).
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, addr))
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	return secKeyFor(t, opt, r)
}

// secRedisKey is the Redis name herd gives role ("v" the value, "l" the
// lease) of key: "herd:{" + base64url(sha256(key)) + "}:" + role.
func secRedisKey(key, role string) string {
	sum := sha256.Sum256([]byte(key))
	return "herd:{" + base64.RawURLEncoding.EncodeToString(sum[:]) + "}:" + role
}

// secStored reports whether Redis holds a value for the middleware key
// that is not a hit-for-miss mark. A mark is an envelope whose flags byte
// (its second) has herd's pass bit (1<<1) set; it holds no response.
func secStored(t *testing.T, rdb *redis.Client, key string) bool {
	t.Helper()
	b, err := rdb.Get(context.Background(), secRedisKey(key, "v")).Bytes()
	if errors.Is(err, redis.Nil) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return len(b) < 2 || b[1]&(1<<1) == 0
}

// secScan returns the Redis keys matching pattern.
func secScan(t *testing.T, rdb *redis.Client, pattern string) []string {
	t.Helper()
	var keys []string
	iter := rdb.Scan(context.Background(), 0, pattern, 1000).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

func secCount(rs []secResp, pred func(secResp) bool) int {
	n := 0
	for _, r := range rs {
		if pred(r) {
			n++
		}
	}
	return n
}

// TestUnkeyedHeaderPoisoning is H01: a handler reflects a request header
// into its page (the classic X-Forwarded-Host script-URL poisoning). An
// attacker's request with a forged header comes first; a plain request
// must not get its page.
func TestUnkeyedHeaderPoisoning(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		for _, tc := range []struct {
			name   string
			opt    *Options
			header string // the header the handler reflects
			// poisoned: the documented limitation, a header outside the
			// key that the handler must not read; the plain request gets
			// the attacker's page.
			poisoned bool
		}{
			{"default/X-Forwarded-Host", nil, "X-Forwarded-Host", false},
			{"default/X-Forwarded-Proto", nil, "X-Forwarded-Proto", false},
			{"default/X-Forwarded-Scheme", nil, "X-Forwarded-Scheme", false},
			{"default/X-Forwarded-Prefix", nil, "X-Forwarded-Prefix", false},
			{"default/X-Forwarded-Port", nil, "X-Forwarded-Port", false},
			{"default/X-Forwarded-Server", nil, "X-Forwarded-Server", false},
			{"default/X-Host", nil, "X-Host", false},
			{"default/X-Original-URL", nil, "X-Original-URL", false},
			{"default/X-Rewrite-URL", nil, "X-Rewrite-URL", false},
			{"default/Forwarded", nil, "Forwarded", false},
			{"KeyHeaders", &Options{KeyHeaders: []string{"x-forwarded-host"}}, "X-Forwarded-Host", false},
			{"IgnoreForwardedHeaders/documented limitation", &Options{IgnoreForwardedHeaders: true}, "X-Forwarded-Host", true},
			{"unlisted header/documented limitation", nil, "X-Evil-Host", true},
		} {
			t.Run(rt.name+"/"+tc.name, func(t *testing.T) {
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					host := r.Host
					if v := r.Header.Get(tc.header); v != "" {
						host = v
					}
					fmt.Fprintf(w, `<script src="//%s/app.js"></script>`, host)
				})
				srv, cl := secServe(t, rt.build(New(c, tc.opt), h))
				url := srv.URL + "/page"
				forged := "host=evil.example"
				if r := secGet(t, cl, url, tc.header, forged); !strings.Contains(r.body, "evil") || !sameStatus(r.cacheStatus(), statusStored) {
					t.Fatalf("attacker's request: %v, want its own page, stored", r)
				}
				plain := secGet(t, cl, url)
				if tc.poisoned {
					if !strings.Contains(plain.body, "evil") {
						t.Errorf("plain request after the forged one: %v; the documented limitation (the forged page is served to everyone) no longer holds: update the package doc", plain)
					}
					return
				}
				if strings.Contains(plain.body, "evil") || !sameStatus(plain.cacheStatus(), statusStored) {
					t.Fatalf("plain request after the forged one: %v, want its own page, stored (POISONED if it says evil)", plain)
				}
				if r := secGet(t, cl, url); sameStatus(r.cacheStatus(), statusStored) || strings.Contains(r.body, "evil") || !strings.HasPrefix(r.cacheStatus(), statusHit) {
					t.Errorf("second plain request: %v, want a hit on the plain page", r)
				}
				if r := secGet(t, cl, url, tc.header, forged); !strings.Contains(r.body, "evil") || !strings.HasPrefix(r.cacheStatus(), statusHit) {
					t.Errorf("second forged request: %v, want a hit on the attacker's own entry", r)
				}
				if got := runs.Load(); got != 2 {
					t.Errorf("handler ran %d times, want 2 (one entry per header value)", got)
				}
			})
		}
	}

	// The per-client parts of the forwarding headers do not split the
	// cache: Forwarded's for= and X-Forwarded-For are not keyed.
	t.Run("per-client values are not keyed", func(t *testing.T) {
		var runs atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			io.WriteString(w, "page")
		})
		srv, cl := secServe(t, secRouters[1].build(New(c, nil), h))
		url := srv.URL + "/clients"
		steps := []struct {
			hdr  []string
			want string
		}{
			{[]string{"Forwarded", "for=192.0.2.1;proto=https;host=shop.example"}, statusStored},
			{[]string{"Forwarded", `for="[2001:db8::1]:4711";proto=https;host=shop.example`}, statusHit},
			{[]string{"Forwarded", "proto=https;host=shop.example, for=198.51.100.7"}, statusHit},
			{[]string{"Forwarded", "For=203.0.113.9;Proto=https;Host=shop.example"}, statusHit},
			{[]string{"Forwarded", "for=192.0.2.1;proto=https;host=evil.example"}, statusStored},
			{[]string{"X-Forwarded-For", "192.0.2.1"}, statusStored},
			{[]string{"X-Forwarded-For", "198.51.100.7"}, statusHit},
			{[]string{"Forwarded", "for=203.0.113.50"}, statusHit},
			{nil, statusHit},
		}
		for i, s := range steps {
			r := secGet(t, cl, url, s.hdr...)
			if !strings.HasPrefix(r.cacheStatus(), s.want) {
				t.Errorf("step %d %q: %v, want Cache-Status %q", i, s.hdr, r, s.want)
			}
		}
	})
}

// TestVary is H02: a response is stored only if every header it varies
// on is part of the key, and then once per value of those headers.
func TestVary(t *testing.T) {
	c, rdb := newCache(t, nil)
	opt := &Options{KeyHeaders: []string{"Accept-Encoding"}}
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				for _, v := range r.URL.Query()["vary"] {
					w.Header().Add("Vary", v)
				}
				fmt.Fprintf(w, "encoding=%q run=%d", r.Header.Get("Accept-Encoding"), n)
			})
			srv, cl := secServe(t, rt.build(New(c, opt), h))

			t.Run("keyed", func(t *testing.T) {
				url := srv.URL + "/v?vary=Accept-Encoding"
				first := map[string]string{}
				// The handler is shown the bucket's codings (encoding.go).
				shown := map[string]string{"gzip": "gzip", "br": "br", "": "identity", "gzip, br": "br, gzip"}
				for _, enc := range []string{"gzip", "br", "", "gzip, br"} {
					r := secGet(t, cl, url, "Accept-Encoding", enc)
					if !sameStatus(r.cacheStatus(), statusStored) || !strings.Contains(r.body, strconv.Quote(shown[enc])) {
						t.Errorf("Accept-Encoding %q: %v, want its own entry, stored", enc, r)
					}
					first[enc] = r.body
					if k := secKeyOfURL(t, opt, url, "Accept-Encoding", enc); !secStored(t, rdb, k) {
						t.Errorf("Accept-Encoding %q: no value in Redis", enc)
					}
				}
				for enc, body := range first {
					r := secGet(t, cl, url, "Accept-Encoding", enc)
					if !strings.HasPrefix(r.cacheStatus(), statusHit) || r.body != body {
						t.Errorf("Accept-Encoding %q again: %v, want a hit with %q", enc, r, body)
					}
				}
				if r := secGet(t, cl, srv.URL+"/v?vary=accept-encoding", "Accept-Encoding", "gzip"); !sameStatus(r.cacheStatus(), statusStored) {
					t.Errorf("Vary: accept-encoding (lower case): %v, want stored", r)
				}
				// The forwarding headers are keyed by default (H01).
				for i, want := range []string{statusStored, statusStored, statusHit} {
					r := secGet(t, cl, srv.URL+"/v?vary=X-Forwarded-Host", "X-Forwarded-Host", []string{"a", "b", "a"}[i])
					if !strings.HasPrefix(r.cacheStatus(), want) {
						t.Errorf("Vary: X-Forwarded-Host, request %d: %v, want %q", i, r, want)
					}
				}
			})

			for _, vary := range []string{"*", "X-Unlisted", "Accept-Encoding&vary=X-Unlisted", "Accept-Encoding,%20X-Unlisted", "Accept-Encoding,*", "Forwarded", "X-Forwarded-For"} {
				t.Run("not stored/"+vary, func(t *testing.T) {
					url := srv.URL + "/nv?vary=" + vary
					before := runs.Load()
					for i, want := range []string{statusMiss, statusHitForMiss} {
						r := secGet(t, cl, url, "Accept-Encoding", "gzip", "X-Unlisted", "v")
						if !sameStatus(r.cacheStatus(), want) {
							t.Errorf("request %d: %v, want Cache-Status %q", i, r, want)
						}
					}
					if got := runs.Load() - before; got != 2 {
						t.Errorf("handler ran %d times for 2 requests, want 2", got)
					}
					if secStored(t, rdb, secKeyOfURL(t, opt, url, "Accept-Encoding", "gzip")) {
						t.Errorf("a value is stored for a response with Vary %q", vary)
					}
				})
			}
		})
	}
}

// TestCredentialedRequests is H03: requests with Authorization or a
// session cookie of users A and B, and a handler that greets the user.
func TestCredentialedRequests(t *testing.T) {
	c, rdb := newCache(t, nil)
	const (
		bypass  = iota // neither read from nor stored in the cache
		private        // looked up, not stored
		public         // stored once for every credential
		perCred        // stored once per credential
	)
	type tc struct {
		name string
		opt  *Options
		cred string // "auth" or "cookie"
		cc   string // the response's Cache-Control
		want int
	}
	var cases []tc
	for _, cred := range []string{"auth", "cookie"} {
		cases = append(cases,
			tc{"default", nil, cred, "", bypass},
			tc{"default public", nil, cred, "public", bypass},
			tc{"AllowAuthorized", &Options{AllowAuthorized: true}, cred, "", private},
			tc{"AllowAuthorized max-age", &Options{AllowAuthorized: true}, cred, "max-age=60", private},
			tc{"AllowAuthorized public", &Options{AllowAuthorized: true}, cred, "public", public},
			tc{"AllowAuthorized s-maxage", &Options{AllowAuthorized: true}, cred, "s-maxage=60", public},
			tc{"AllowAuthorized must-revalidate", &Options{AllowAuthorized: true}, cred, "must-revalidate", public},
		)
	}
	cases = append(cases,
		tc{"KeyHeaders Authorization", &Options{KeyHeaders: []string{"Authorization"}}, "auth", "", perCred},
		tc{"KeyHeaders Authorization", &Options{KeyHeaders: []string{"Authorization"}}, "cookie", "", bypass},
		tc{"KeyHeaders Cookie", &Options{KeyHeaders: []string{"Cookie"}}, "cookie", "", perCred},
		tc{"KeyHeaders Cookie", &Options{KeyHeaders: []string{"Cookie"}}, "auth", "", bypass},
		tc{"KeyHeaders Authorization AllowAuthorized", &Options{KeyHeaders: []string{"Authorization"}, AllowAuthorized: true}, "cookie", "", private},
	)
	for _, rt := range secRouters {
		for _, tc := range cases {
			t.Run(rt.name+"/"+tc.name+"/"+tc.cred, func(t *testing.T) {
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					user := "anonymous"
					if a := r.Header.Get("Authorization"); a != "" {
						user = strings.TrimPrefix(a, "Bearer ")
					} else if ck, err := r.Cookie("session"); err == nil {
						user = ck.Value
					}
					if tc.cc != "" {
						w.Header().Set("Cache-Control", tc.cc)
					}
					fmt.Fprintf(w, "hello %s", user)
				})
				srv, cl := secServe(t, rt.build(New(c, tc.opt), h))
				url := srv.URL + "/account"
				cred := func(user string) []string {
					if tc.cred == "auth" {
						return []string{"Authorization", "Bearer " + user}
					}
					return []string{"Cookie", "theme=dark; session=" + user}
				}
				var got []secResp
				for _, user := range []string{"A", "B", "A", "B"} {
					got = append(got, secGet(t, cl, url, cred(user)...))
				}
				// Before the anonymous request, which may store under the same key.
				keyOpt := Options{AllowAuthorized: true} // the key, even of a request that bypasses
				if tc.opt != nil {
					keyOpt.KeyHeaders = tc.opt.KeyHeaders
				}
				stored := secStored(t, rdb, secKeyOfURL(t, &keyOpt, url, cred("A")...)) || secStored(t, rdb, secKeyOfURL(t, &keyOpt, url, cred("B")...))
				anon := secGet(t, cl, url)
				switch tc.want {
				case bypass, private:
					status := statusBypass
					if tc.want == private {
						status = statusMiss
					}
					for i, user := range []string{"A", "B", "A", "B"} {
						if got[i].body != "hello "+user || !sameStatus(got[i].cacheStatus(), status) {
							t.Errorf("request %d by %s: %v, want its own page with Cache-Status %q", i, user, got[i], status)
						}
					}
					if stored {
						t.Errorf("a response to a credentialed request is stored")
					}
					if anon.body != "hello anonymous" {
						t.Errorf("anonymous request: %v, want its own page", anon)
					}
					if n := runs.Load(); n != 5 {
						t.Errorf("handler ran %d times for 5 requests, want 5", n)
					}
				case public:
					// The handler declared its page public: B gets A's.
					want := []string{statusStored, statusHit, statusHit, statusHit}
					for i := range got {
						if got[i].body != "hello A" || !strings.HasPrefix(got[i].cacheStatus(), want[i]) {
							t.Errorf("request %d: %v, want the stored public page (Cache-Status %q)", i, got[i], want[i])
						}
					}
					if !strings.HasPrefix(anon.cacheStatus(), statusHit) || !stored {
						t.Errorf("anonymous request: %v; stored %v; want a hit on the public page", anon, stored)
					}
				case perCred:
					want := []string{statusStored, statusStored, statusHit, statusHit}
					for i, user := range []string{"A", "B", "A", "B"} {
						if got[i].body != "hello "+user || !strings.HasPrefix(got[i].cacheStatus(), want[i]) {
							t.Errorf("request %d by %s: %v, want its own page (Cache-Status %q)", i, user, got[i], want[i])
						}
					}
					if anon.body != "hello anonymous" || !sameStatus(anon.cacheStatus(), statusStored) {
						t.Errorf("anonymous request: %v, want its own entry", anon)
					}
				}
			})
		}
	}

	t.Run("concurrent users", func(t *testing.T) {
		var runs atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			fmt.Fprintf(w, "hello %s", r.Header.Get("Authorization"))
		})
		srv, cl := secServe(t, secRouters[1].build(New(c, nil), h))
		var reqs []*http.Request
		for i := range 20 {
			reqs = append(reqs, secNewReq(t, http.MethodGet, srv.URL+"/concurrent", nil, "Authorization", "user-"+strconv.Itoa(i%2)))
		}
		for i, r := range secParallel(cl, reqs).wait(t) {
			if want := "hello user-" + strconv.Itoa(i%2); r.err != nil || r.body != want {
				t.Errorf("request %d: %v, want %q", i, r, want)
			}
		}
		if n := runs.Load(); n != 20 {
			t.Errorf("handler ran %d times for 20 credentialed requests, want 20", n)
		}
	})

	// With AllowAuthorized, users' requests for one URL share a key and
	// wait for one another: a private response must not reach the
	// waiters.
	for _, cred := range []string{"Authorization", "Cookie"} {
		t.Run("AllowAuthorized waiters/"+cred, func(t *testing.T) {
			var runs atomic.Int64
			var gate *secGate
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					gate.wait(r)
				}
				fmt.Fprintf(w, "hello %s", r.Header.Get(cred))
			})
			srv, cl := secServe(t, secRouters[1].build(New(c, &Options{AllowAuthorized: true}), h))
			gate = newSecGate(t)
			const n = 10
			reqs := make([]*http.Request, n)
			for i := range reqs {
				reqs[i] = secNewReq(t, http.MethodGet, srv.URL+"/waiters", nil, cred, "user-"+strconv.Itoa(i))
			}
			leader := secParallel(cl, reqs[:1])
			secWaitFor(t, "user-0's request in the handler", func() bool { return runs.Load() == 1 })
			others := secParallel(cl, reqs[1:])
			secWaitFor(t, "9 requests waiting for user-0's", func() bool { return secWaiting() == n-1 })
			gate.open()
			for i, r := range append(leader.wait(t), others.wait(t)...) {
				if want := "hello user-" + strconv.Itoa(i); r.body != want {
					t.Errorf("request of user-%d: %v, want %q", i, r, want)
				}
			}
			if got := runs.Load(); got != n {
				t.Errorf("handler ran %d times, want %d", got, n)
			}
		})
	}
}

// TestSetCookieWhileWaiting: the leader's response sets a cookie while
// nine other requests wait for it. None of them may get the leader's
// cookie or body: each runs the handler itself (ErrNotShared; or, for a
// waiter that wins the lease the leader releases before its notice
// arrives, as a leader whose response is not stored either), and nothing
// is stored.
func TestSetCookieWhileWaiting(t *testing.T) {
	c, rdb := newCache(t, &herd.Options{WaitTimeout: secWait})
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			var gate *secGate
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				if n == 1 {
					gate.wait(r)
				}
				http.SetCookie(w, &http.Cookie{Name: "session", Value: "run" + strconv.FormatInt(n, 10)})
				fmt.Fprintf(w, "run%d", n)
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			gate = newSecGate(t)
			const n = 10
			reqs := make([]*http.Request, n)
			for i := range reqs {
				reqs[i] = secNewReq(t, http.MethodGet, srv.URL+"/login", nil)
			}
			batch := secParallel(cl, reqs)
			secWaitFor(t, "one handler run and 9 waiting requests", func() bool { return runs.Load() == 1 && secWaiting() == n-1 })
			gate.open()
			rs := batch.wait(t)
			seen := map[string]bool{}
			for i, r := range rs {
				if r.err != nil || r.status != http.StatusOK {
					t.Errorf("request %d: %v", i, r)
					continue
				}
				cookie := r.header.Get("Set-Cookie")
				if want := "session=" + r.body; !strings.HasPrefix(cookie, want) {
					t.Errorf("request %d: body %q with Set-Cookie %q: the cookie is not from the run that made the body", i, r.body, cookie)
				}
				if seen[r.body] {
					t.Errorf("request %d: %q was served to two clients", i, r.body)
				}
				seen[r.body] = true
			}
			if got := runs.Load(); got != n {
				t.Errorf("handler ran %d times, want %d (every waiter runs it itself)", got, n)
			}
			bypass := secCount(rs, func(r secResp) bool { return sameStatus(r.cacheStatus(), statusBypass) })
			miss := secCount(rs, func(r secResp) bool { return sameStatus(r.cacheStatus(), statusMiss) })
			if bypass+miss != n || miss < 1 {
				t.Errorf("Cache-Status: %d %q and %d %q, want %d in all, the leader's %q among them: %v", bypass, statusBypass, miss, statusMiss, n, statusMiss, rs)
			}
			if secStored(t, rdb, secKeyOfURL(t, nil, srv.URL+"/login")) {
				t.Errorf("a response with Set-Cookie is stored")
			}
		})
	}
}

// TestUncacheableResponses is H04: Set-Cookie, private, no-store and
// no-cache responses are never written to Redis, every request reaches
// the handler, and no cookie is replayed.
func TestUncacheableResponses(t *testing.T) {
	c, rdb := newCache(t, nil)
	for _, rt := range secRouters {
		for _, tc := range []struct {
			name   string
			header []string
		}{
			{"Set-Cookie", []string{"Set-Cookie", "session=%d; Path=/; HttpOnly"}},
			{"Set-Cookie public", []string{"Set-Cookie", "session=%d", "Cache-Control", "public, max-age=60"}},
			{"private", []string{"Cache-Control", "private"}},
			{"PRIVATE max-age", []string{"Cache-Control", "max-age=60, PRIVATE"}},
			{"private field", []string{"Cache-Control", `private="X-User"`}},
			{"no-store", []string{"Cache-Control", "no-store"}},
			{"no-cache", []string{"Cache-Control", "no-cache"}},
			{"no-cache field", []string{"Cache-Control", `no-cache="Set-Cookie"`}},
			{"second Cache-Control line", []string{"Cache-Control", "public", "Cache-Control", "no-store"}},
		} {
			t.Run(rt.name+"/"+tc.name, func(t *testing.T) {
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					n := runs.Add(1)
					for i := 0; i+1 < len(tc.header); i += 2 {
						v := tc.header[i+1]
						if strings.Contains(v, "%d") {
							v = fmt.Sprintf(v, n)
						}
						w.Header().Add(tc.header[i], v)
					}
					fmt.Fprintf(w, "run%d", n)
				})
				srv, cl := secServe(t, rt.build(New(c, nil), h))
				url := srv.URL + "/u"
				// The first response marks the URL: the second runs at once.
				for i := int64(1); i <= 2; i++ {
					want := []string{statusMiss, statusHitForMiss}[i-1]
					r := secGet(t, cl, url)
					if r.body != fmt.Sprintf("run%d", i) || !sameStatus(r.cacheStatus(), want) {
						t.Errorf("request %d: %v, want the handler's run %d with Cache-Status %q", i, r, i, want)
					}
					if ck := r.header.Get("Set-Cookie"); ck != "" && !strings.HasPrefix(ck, fmt.Sprintf("session=%d", i)) {
						t.Errorf("request %d: Set-Cookie %q replayed from another run", i, ck)
					}
				}
				if secStored(t, rdb, secKeyOfURL(t, nil, url)) {
					t.Errorf("the response is stored")
				}
			})
		}
	}

	// Hop-by-hop fields, Date and Age are not stored, and header fields
	// an outer middleware set for one request are not replayed to others.
	t.Run("stored header fields", func(t *testing.T) {
		var reqID atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "X-Hop")
			w.Header().Set("X-Hop", "secret")
			w.Header().Set("Keep-Alive", "timeout=5")
			w.Header().Set("Date", "Mon, 01 Jan 2001 00:00:00 GMT")
			w.Header().Set("Age", "9999")
			w.Header().Set("X-Kept", "yes")
			io.WriteString(w, "page")
		})
		for _, rt := range secRouters {
			t.Run(rt.name, func(t *testing.T) {
				outer := func(next http.Handler) http.Handler {
					return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						w.Header().Set("X-Request-Id", strconv.FormatInt(reqID.Add(1), 10))
						next.ServeHTTP(w, r)
					})
				}
				mw := New(c, nil)
				srv, cl := secServe(t, rt.build(func(h http.Handler) http.Handler { return outer(mw(h)) }, h))
				url := srv.URL + "/headers"
				secGet(t, cl, url)
				r := secGet(t, cl, url)
				if !strings.HasPrefix(r.cacheStatus(), statusHit) {
					t.Fatalf("second request: %v, want a hit", r)
				}
				if got := r.header.Get("X-Request-Id"); got != strconv.FormatInt(reqID.Load(), 10) {
					t.Errorf("hit: X-Request-Id %q, want this request's %d (not the stored request's)", got, reqID.Load())
				}
				for _, f := range []string{"X-Hop", "Keep-Alive"} {
					if v := r.header.Get(f); v != "" {
						t.Errorf("hit: %s: %q was stored", f, v)
					}
				}
				if d := r.header.Get("Date"); d == "" || strings.Contains(d, "2001") {
					t.Errorf("hit: Date %q, want a current date", d)
				}
				// RFC 9111 §4.2.3: the Age served is the Age the response came
				// with (the handler's 9999, as from an upstream cache) plus the
				// time herd held it, never the stored field replayed as is nor
				// less than what it came with.
				if a, err := strconv.Atoi(r.header.Get("Age")); err != nil || a < 9999 {
					t.Errorf("hit: Age %q, want the computed age: at least the 9999 the handler gave", r.header.Get("Age"))
				}
				if r.header.Get("X-Kept") != "yes" {
					t.Errorf("hit: X-Kept missing: %v", r.header)
				}
			})
		}
	})
}

// TestErrorResponses is H05 (CPDoS): error statuses are never stored, a
// 404 is stored for NotFoundTTL.
func TestErrorResponses(t *testing.T) {
	c, rdb := newCache(t, nil)
	const notFoundTTL = 5 * time.Second
	opt := &Options{NotFoundTTL: notFoundTTL}
	for _, rt := range secRouters {
		for _, tc := range []struct {
			status int
			stored bool
		}{
			{200, true}, {404, true},
			{400, false}, {403, false}, {405, false}, {410, false}, {413, false}, {414, false}, {431, false},
			{206, false}, {204, false}, {302, false}, {304, false},
			{500, false}, {501, false}, {502, false}, {503, false}, {504, false},
		} {
			t.Run(rt.name+"/"+strconv.Itoa(tc.status), func(t *testing.T) {
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					if tc.status == 206 {
						w.Header().Set("Content-Range", "bytes 0-3/10")
					}
					w.WriteHeader(tc.status)
					io.WriteString(w, "body")
				})
				srv, cl := secServe(t, rt.build(New(c, opt), h))
				url := srv.URL + "/e"
				r1 := secGet(t, cl, url)
				r2 := secGet(t, cl, url)
				key := secKeyOfURL(t, opt, url)
				if r1.status != tc.status || r2.status != tc.status {
					t.Fatalf("statuses %d, %d, want %d", r1.status, r2.status, tc.status)
				}
				if !tc.stored {
					if runs.Load() != 2 || secStored(t, rdb, key) {
						t.Errorf("handler ran %d times for 2 requests, stored %v; want 2 runs, not stored (%v, %v)", runs.Load(), secStored(t, rdb, key), r1, r2)
					}
					return
				}
				if runs.Load() != 1 || !strings.HasPrefix(r2.cacheStatus(), statusHit) {
					t.Errorf("handler ran %d times, second request %v; want 1 run and a hit", runs.Load(), r2)
				}
				if tc.status == 404 {
					pttl, err := rdb.PTTL(context.Background(), secRedisKey(key, "v")).Result()
					if err != nil || pttl <= 0 || pttl > notFoundTTL {
						t.Errorf("404 entry expires in %v (%v), want within NotFoundTTL %v", pttl, err, notFoundTTL)
					}
				}
			})
		}
	}
}

// TestFailedLeaderNoStampede is H05's second half: the leader of ten
// requests answers 500. As the package doc says, each waiter asks once
// more: one leads the retry while the others wait for it, and get its
// response, or ErrorHandler's 502 if it fails too. The handler never
// runs for two requests at once, a 5xx is never shared, and a retry that
// succeeds serves everyone: two runs, not ten.
//
// When the retry fails too, a waiter that follows it through Redis may
// win the lease it releases before the failure notice reaches it (herd's
// takeover): it then runs the handler once more, still alone. So failing
// retries may take more than two runs, one at a time.
//
// In the "settled" variant the leader starts alone and the others wait
// for it in this process, so each wave is complete before the next gate
// opens. The "burst" variant sends all ten at once: some of them then
// follow the leader through Redis.
//
// Each runs with and without herd.Options.RetryFailedLoad: the Cache's
// retry does not apply to Begin, so it never adds to the middleware's own
// (two runs per wave, not three or four).
func TestFailedLeaderNoStampede(t *testing.T) {
	for _, retry := range []bool{false, true} {
		t.Run(fmt.Sprintf("RetryFailedLoad=%v", retry), func(t *testing.T) {
			testFailedLeaderNoStampede(t, retry)
		})
	}
}

func testFailedLeaderNoStampede(t *testing.T, retry bool) {
	c, rdb := newCache(t, &herd.Options{WaitTimeout: secWait, RetryFailedLoad: retry})
	for _, rt := range secRouters {
		for _, burst := range []bool{false, true} {
			for _, retryStatus := range []int{http.StatusOK, http.StatusInternalServerError, http.StatusBadGateway} {
				mode := "settled"
				if burst {
					mode = "burst"
				}
				t.Run(fmt.Sprintf("%s/%s/retry %d", rt.name, mode, retryStatus), func(t *testing.T) {
					var runs, inFlight, maxInFlight atomic.Int64
					var first, second *secGate
					h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						cur := inFlight.Add(1)
						defer inFlight.Add(-1)
						for m := maxInFlight.Load(); cur > m && !maxInFlight.CompareAndSwap(m, cur); m = maxInFlight.Load() {
						}
						switch runs.Add(1) {
						case 1:
							first.wait(r)
							w.WriteHeader(http.StatusInternalServerError)
							io.WriteString(w, "leader failed")
							return
						case 2:
							second.wait(r)
						}
						w.WriteHeader(retryStatus)
						io.WriteString(w, "retry")
					})
					srv, cl := secServe(t, rt.build(New(c, nil), h))
					first, second = newSecGate(t), newSecGate(t)
					const n = 10
					reqs := make([]*http.Request, n)
					for i := range reqs {
						reqs[i] = secNewReq(t, http.MethodGet, srv.URL+"/fail", nil)
					}
					var batches []*secBatch
					if burst {
						batches = append(batches, secParallel(cl, reqs))
					} else {
						batches = append(batches, secParallel(cl, reqs[:1]))
						secWaitFor(t, "the leader in the handler", func() bool { return runs.Load() == 1 })
						batches = append(batches, secParallel(cl, reqs[1:]))
					}
					secWaitFor(t, "the leader in the handler and 9 waiting requests", func() bool { return runs.Load() == 1 && secWaiting() == n-1 })
					first.open()
					// The retry leader is in the handler, and every other
					// request waits for it (or, in a burst, is done).
					settled := func() (bool, string) {
						done := 0
						for _, b := range batches {
							done += int(b.finished.Load())
						}
						r, w := runs.Load(), secWaiting()
						ok := r == 2 && w+done == n-1
						return ok, fmt.Sprintf("%d runs, %d waiting, %d done", r, w, done)
					}
					secWaitForState(t, "the retry leader in the handler and the others waiting", settled)
					second.open()
					var rs []secResp
					for _, b := range batches {
						rs = append(rs, b.wait(t)...)
					}
					count := func(status int, body string) int {
						return secCount(rs, func(r secResp) bool { return r.status == status && strings.Contains(r.body, body) })
					}
					errorHandler := count(http.StatusBadGateway, "502 bad gateway")
					if m := maxInFlight.Load(); m != 1 {
						t.Errorf("the handler ran for %d requests at once, want 1", m)
					}
					if got := runs.Load(); got != 2 && (retryStatus == http.StatusOK || got < 2) && !burst {
						t.Errorf("handler ran %d times, want 2 (the leader and one retry leader)", got)
					}
					if got := secCount(rs, func(r secResp) bool { return r.err != nil }); got != 0 {
						t.Errorf("%d requests failed: %v", got, rs)
					}
					if got := count(500, "leader failed"); got != 1 {
						t.Errorf("%d responses are the leader's 500, want 1 (a 5xx is not shared): %v", got, rs)
					}
					retried := count(retryStatus, "retry")
					if retryStatus != http.StatusOK && int64(retried) != runs.Load()-1 {
						t.Errorf("%d responses are a retry's %d, want one per retry run (%d): a 5xx was shared: %v", retried, retryStatus, runs.Load()-1, rs)
					}
					switch {
					case burst:
						// Every request gets the leader's 500, the retry's
						// response, or ErrorHandler's 502. A waiter that
						// followed the leader through Redis and is woken by
						// its failure notice must not find the failed Fill
						// still registered in this process (Fill.Abort
						// unregisters it before it publishes): it waits for
						// the retry instead of answering 502 at once.
						if 1+retried+errorHandler != n {
							t.Errorf("responses: %d of the leader, %d of the retry, %d of ErrorHandler, want %d in all: %v", 1, retried, errorHandler, n, rs)
						}
						if got := runs.Load(); got > 2 && retryStatus == http.StatusOK {
							t.Errorf("handler ran %d times, want at most 2", got)
						}
						if retryStatus == http.StatusOK && errorHandler > 0 {
							t.Errorf("%d waiters got ErrorHandler's 502 after one failure (%d handler runs)", errorHandler, runs.Load())
						}
					case retryStatus == http.StatusOK:
						if retried != n-1 {
							t.Errorf("%d responses are the retry's 200, want %d: %v", retried, n-1, rs)
						}
						if got := secCount(rs, func(r secResp) bool { return sameStatus(r.cacheStatus(), statusCollapsed) }); got != n-2 {
							t.Errorf("%d responses were collapsed onto the retry, want %d: %v", got, n-2, rs)
						}
					default:
						if retried+errorHandler != n-1 {
							t.Errorf("%d responses are a retry's %d and %d ErrorHandler's 502, want %d in all: %v", retried, retryStatus, errorHandler, n-1, rs)
						}
					}
					if retryStatus != http.StatusOK && secStored(t, rdb, secKeyOfURL(t, nil, srv.URL+"/fail")) {
						t.Errorf("a 5xx response is stored")
					}
					if ls := secScan(t, rdb, "herd:*:l"); len(ls) != 0 {
						t.Errorf("leases left in Redis: %v", ls)
					}
				})
			}
		}
	}
}

// secView is what the normalisation handler answers: the path and query
// as the handler sees them (what chi routes on, and the parsed values).
func secView(r *http.Request) string {
	q, _ := url.ParseQuery(r.URL.RawQuery)
	return r.URL.EscapedPath() + " " + q.Encode()
}

// TestKeyNormalisation is H09's key part (web cache deception, parameter
// cloaking): two requests share an entry only if the handler sees the
// same path and query values. Query strings that differ only by encoding
// or delimiters do not share; the order of different parameters does not
// matter, the order of a repeated one does.
func TestKeyNormalisation(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				io.WriteString(w, secView(r))
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			steps := []struct {
				target string
				shares bool // with an earlier step
			}{
				{"/q?a=1&b=2", false},
				{"/q?a=1%26b=2", false},
				{"/q?a=1;b=2", false},
				{"/q?a=1%3Bb=2", false},
				{"/q?a=%31&b=2", false},
				{"/q?a=1&b=2&", false},
				{"/q?b=2&a=1", true},
				{"/q?a=1&a=2", false},
				{"/q?a=2&a=1", false},
				{"/q?a=1&%61=2", false},
				{"/q?%61=2&a=1", false},
				{"/q?a=1&%61=2&b=2", false},
				{"/q?b=2&a=1&%61=2", true},
				{"/q?a+b=1&a%20b=2", false},
				{"/q?a%20b=2&a+b=1", false},
				{"/q?A=1&b=2", false},
				{"/q?b=2&a=1&b=2", false},
				{"/q?a=1&b=2&b=2", true},
				{"/a/b", false},
				{"/a%2Fb", false},
				{"/a%2fb", false},
				{"/a//b", false},
				{"/a/./b", false},
				{"/a/b/", false},
				{"/a/b;x=1", false},
				{"/A/b", false},
				{"/a/%62", false},
				{"/a/b", true},
			}
			for _, s := range steps {
				before := runs.Load()
				r := secGet(t, cl, srv.URL+s.target)
				if r.status/100 == 3 && rt.name == "ServeMux" {
					// ServeMux redirects unclean paths before the middleware.
					if r.cacheStatus() != "" {
						t.Errorf("%s: redirect %v went through the middleware", s.target, r)
					}
					continue
				}
				want := secView(httptest.NewRequest(http.MethodGet, srv.URL+s.target, nil))
				if r.status != 200 || r.body != want {
					t.Errorf("%s: %v, want the handler's view %q", s.target, r, want)
				}
				ran := runs.Load() != before
				switch {
				case s.shares && (ran || !strings.HasPrefix(r.cacheStatus(), statusHit)):
					t.Errorf("%s: %v, want a hit on an earlier step's entry", s.target, r)
				case !s.shares && (!ran || !sameStatus(r.cacheStatus(), statusStored)):
					t.Errorf("%s: %v, want its own entry (it shared one)", s.target, r)
				}
			}
		})
	}
}

// secKeyRE is every Redis key herd may write for the middleware: the
// prefix, the hash tag of base64url(sha256(key)) first, a role letter.
var secKeyRE = regexp.MustCompile(`^herd:\{[A-Za-z0-9_-]{43}\}:[a-z]$`)

// TestKeyInjection is H08: request bytes that mean something in Redis
// keys ({hash tags}, ':' delimiters, CR LF, NUL, long values) never reach
// a Redis key: every key has the fixed form, and every request is served
// and then served from the cache.
func TestKeyInjection(t *testing.T) {
	c, rdb := newCache(t, nil)
	long := strings.Repeat("{}:", 16<<10/3)
	targets := []string{
		"/k/{tag}", // http.Client sends /k/%7Btag%7D
		"/k/a}{b}",
		"/k/x{}{y}",
		"/k/a:b:c",
		"/k/herd:{x}:v",
		"/k/%0d%0aSet-Cookie:%20x=1",
		"/k/%00nul",
		"/k/ünïcødé/✓",
		"/k/%F0%9F%92%A9",
		"/k?{a}=:{b}",
		"/k?a=%0d%0a&b=%00&c=%ff",
		"/k?x=" + long,
		"/k?x=" + url.QueryEscape(long),
	}
	raw := []string{ // sent byte for byte; %s is a host of this router's own
		"GET /k/{raw}:x HTTP/1.1\r\nHost: %s",
		"GET /k/raw?{q}=}{ HTTP/1.1\r\nHost: %s",
		"GET http://%s/k/{abs}:y HTTP/1.1\r\nHost: other.example",
		"GET /k/\xc3\xbc HTTP/1.1\r\nHost: %s",
		"GET /k/raw HTTP/1.1\r\nHost: %s\r\nX-Forwarded-Host: {evil}:1\r\nForwarded: host=\"{x}\";proto=https",
	}
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				io.WriteString(w, "ok "+r.Host)
			})
			// Keys far above the default MaxKeyBytes, to show their bytes
			// never reach Redis either.
			srv, cl := secServe(t, rt.build(New(c, &Options{MaxKeyBytes: 1 << 20}), h))
			for pass, want := range []string{statusStored, statusHit} {
				for _, target := range targets {
					r := secGet(t, cl, srv.URL+target)
					if r.status != 200 || !strings.HasPrefix(r.cacheStatus(), want) {
						t.Errorf("pass %d: %.60q: %v, want Cache-Status %q", pass, target, r, want)
					}
				}
				for _, head := range raw {
					r := secRaw(t, srv, fmt.Sprintf(head, "h-"+strings.ToLower(rt.name)+".example"))
					if r.status != 200 || !strings.HasPrefix(r.cacheStatus(), want) {
						t.Errorf("pass %d: %q: %v, want Cache-Status %q", pass, head, r, want)
					}
				}
			}
			if got, want := runs.Load(), int64(len(targets)+len(raw)); got != want {
				t.Errorf("handler ran %d times for %d distinct targets", got, want)
			}
		})
	}
	keys := secScan(t, rdb, "*")
	if len(keys) == 0 {
		t.Fatal("no keys in Redis")
	}
	for _, k := range keys {
		if !secKeyRE.MatchString(k) {
			t.Errorf("Redis key %.80q is not of the form herd:{<43 base64url>}:<role>", k)
		}
	}
}

// FuzzDefaultKey is H08's key builder property: the key is deterministic
// and injective on what the handler sees. Two requests get the same key
// exactly when host, escaped path, canonical query and key headers
// (KeyHeaders and the forwarding headers) are the same, and then the
// handler sees the same query values.
func FuzzDefaultKey(f *testing.F) {
	f.Add("h", "/a", "a=1&b=2", "x", "", "h", "/a", "b=2&a=1", "x", "")
	f.Add("h", "/a", "a=1&%61=2", "", "", "h", "/a", "%61=2&a=1", "", "")
	f.Add("h", "/a", "a+b=1&a%20b=2", "", "", "h", "/a", "a%20b=2&a+b=1", "", "")
	f.Add("h", "/a/b", "", "", "", "h", "/a%2Fb", "", "", "")
	f.Add("h:1", "/", "", "", "", "h", ":1/", "", "", "")
	f.Add("h", "/a", "b", "", "", "h", "/a?b", "", "", "")
	f.Add("h", "/a", "", "1:x", "", "h", "/a", "", "1", ":x")
	f.Add("h", "/", "", "", "evil", "h", "/", "", "", "")
	f.Add("h", "/", "", "", "", "h", "/", "", "", "")
	f.Add("{h}", "/{a}", "{b}=}", "\r\n", "\x00", "{h}", "/{a}", "{b}=}", "\r\n", "\x00")
	opt := &Options{KeyHeaders: []string{"X-Key"}}
	hd := &handler{cfg: opt.resolve()}
	mk := func(host, path, query, keyHdr, fwd string) *http.Request {
		r := &http.Request{Method: http.MethodGet, Host: host, URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{}}
		if keyHdr != "" {
			r.Header.Set("X-Key", keyHdr)
		}
		if fwd != "" {
			r.Header.Set("X-Forwarded-Host", fwd)
		}
		return r
	}
	f.Fuzz(func(t *testing.T, h1, p1, q1, k1, f1, h2, p2, q2, k2, f2 string) {
		r1, r2 := mk(h1, p1, q1, k1, f1), mk(h2, p2, q2, k2, f2)
		if defaultKey(r1, "", []string{"X-Key"}) != defaultKey(r1.Clone(context.Background()), "", []string{"X-Key"}) {
			t.Fatal("defaultKey is not deterministic")
		}
		key1, ok1 := hd.key(r1)
		key2, ok2 := hd.key(r2)
		if !ok1 || !ok2 {
			t.Fatal("a plain GET bypasses the cache")
		}
		if again, _ := hd.key(r1.Clone(context.Background())); again != key1 {
			t.Fatal("the key is not deterministic")
		}
		same := h1 == h2 && r1.URL.EscapedPath() == r2.URL.EscapedPath() &&
			canonicalQuery(q1) == canonicalQuery(q2) && k1 == k2 && f1 == f2
		if (key1 == key2) != same {
			t.Fatalf("same key %v, same inputs %v:\n%q\n%q", key1 == key2, same, key1, key2)
		}
		if key1 == key2 {
			v1, _ := url.ParseQuery(q1)
			v2, _ := url.ParseQuery(q2)
			if !reflect.DeepEqual(v1, v2) {
				t.Fatalf("queries %q and %q share a key but the handler sees %v and %v", q1, q2, v1, v2)
			}
		}
	})
}

// FuzzDecodeEntry is H11's decoder property: no input panics, and what
// decodes encodes back to the same entry.
func FuzzDecodeEntry(f *testing.F) {
	f.Add((&entry{status: 200, header: http.Header{"Etag": {`"x"`}, "Vary": {"A", "B"}}, body: []byte("body")}).encode())
	f.Add([]byte("H\x01\x00\xc8\x00"))
	f.Add([]byte("H\x01\x00\xc8\xff\xff\xff\xff\x0f"))
	f.Add([]byte("H\x01\x00\xc8\x01\x05ab"))
	f.Add([]byte("H\x02\x00\xc8\x00"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, p []byte) {
		e, err := decodeEntry(p)
		if err != nil {
			return
		}
		e2, err := decodeEntry(e.encode())
		if err != nil {
			t.Fatalf("re-encoded entry does not decode: %v", err)
		}
		if e2.status != e.status || !bytes.Equal(e2.body, e.body) || !reflect.DeepEqual(e2.header, e.header) {
			t.Fatalf("round trip: %+v, want %+v", e2, e)
		}
	})
}

// TestMethods is H06's method part: only GET and HEAD use the cache;
// HEAD is served from the GET entry without a body; a Range request
// bypasses it, and a 206 is never stored.
func TestMethods(t *testing.T) {
	c, rdb := newCache(t, nil)
	content := strings.Repeat("0123456789", 10)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			methods := make(chan string, 100)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				methods <- r.Method
				http.ServeContent(w, r, "data.txt", time.Unix(1e9, 0), strings.NewReader(content))
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))

			for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions} {
				url := srv.URL + "/m/" + m
				before := runs.Load()
				for i := range 2 {
					r := secSend(t, cl, secNewReq(t, m, url, strings.NewReader("x")))
					if !sameStatus(r.cacheStatus(), statusBypass) {
						t.Errorf("%s %d: %v, want Cache-Status %q", m, i, r, statusBypass)
					}
				}
				if got := runs.Load() - before; got != 2 {
					t.Errorf("%s: handler ran %d times for 2 requests", m, got)
				}
				if secStored(t, rdb, secKeyOfURL(t, nil, url)) {
					t.Errorf("%s: a response is stored", m)
				}
			}

			// HEAD first: the handler builds the GET entry.
			url := srv.URL + "/m/head"
			for len(methods) > 0 {
				<-methods
			}
			r := secSend(t, cl, secNewReq(t, http.MethodHead, url, nil))
			if r.status != 200 || r.body != "" || r.header.Get("Content-Length") != strconv.Itoa(len(content)) || !sameStatus(r.cacheStatus(), statusStored) {
				t.Errorf("cold HEAD: %v, Content-Length %q; want 200, no body, the GET's length, stored", r, r.header.Get("Content-Length"))
			}
			if m := <-methods; m != http.MethodGet {
				t.Errorf("cold HEAD: the handler saw %s, want GET", m)
			}
			if r := secGet(t, cl, url); r.body != content || !strings.HasPrefix(r.cacheStatus(), statusHit) {
				t.Errorf("GET after HEAD: %v, want a hit with the full body", r)
			}
			r = secSend(t, cl, secNewReq(t, http.MethodHead, url, nil))
			if r.body != "" || !strings.HasPrefix(r.cacheStatus(), statusHit) {
				t.Errorf("warm HEAD: %v, want a hit without body", r)
			}

			// Range: bypass, before and after the entry exists.
			url = srv.URL + "/m/range"
			before := runs.Load()
			for i, step := range []struct {
				rng    string
				status int
				want   string
			}{
				{"bytes=0-3", 206, statusBypass},
				{"", 200, statusStored},
				{"bytes=0-3", 206, statusBypass},
				{"bytes=-5", 206, statusBypass},
			} {
				var hdr []string
				if step.rng != "" {
					hdr = []string{"Range", step.rng}
				}
				r := secGet(t, cl, url, hdr...)
				if r.status != step.status || !sameStatus(r.cacheStatus(), step.want) {
					t.Errorf("step %d Range %q: %v, want %d with Cache-Status %q", i, step.rng, r, step.status, step.want)
				}
			}
			if got := runs.Load() - before; got != 4 {
				t.Errorf("Range: handler ran %d times for 4 requests, want 4", got)
			}
		})
	}
}

// TestStreaming is H06's streaming part: a handler that flushes (SSE)
// streams through uncached, chunk by chunk, and does not hold up other
// requests for the URL; Hijack through http.ResponseController works and
// marks the response uncacheable.
func TestStreaming(t *testing.T) {
	c, rdb := newCache(t, &herd.Options{WaitTimeout: secWait})
	for _, rt := range secRouters {
		t.Run(rt.name+"/Flush", func(t *testing.T) {
			var runs atomic.Int64
			var more *secGate
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprintf(w, "data: %d.1\n\n", n)
				if err := http.NewResponseController(w).Flush(); err != nil {
					fmt.Fprintf(w, "flush: %v\n\n", err)
				}
				more.wait(r)
				fmt.Fprintf(w, "data: %d.2\n\n", n)
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			more = newSecGate(t)
			url := srv.URL + "/events"
			type stream struct {
				res *http.Response
				rd  *bufio.Reader
			}
			open := func() stream {
				res, err := cl.Do(secNewReq(t, http.MethodGet, url, nil))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { res.Body.Close() })
				return stream{res, bufio.NewReader(res.Body)}
			}
			event := func(s stream) string {
				line, err := s.rd.ReadString('\n')
				if err != nil {
					t.Fatalf("reading the stream: %v", err)
				}
				s.rd.ReadString('\n')
				return strings.TrimSpace(line)
			}
			// Both streams deliver their first event while both handler
			// runs are held: the second request did not wait for the
			// first stream to end.
			s1 := open()
			if e := event(s1); e != "data: 1.1" {
				t.Errorf("first stream: first event %q", e)
			}
			s2 := open()
			if e := event(s2); e != "data: 2.1" {
				t.Errorf("second stream: first event %q", e)
			}
			// The first stream marked the URL: the second ran at once.
			for i, s := range []stream{s1, s2} {
				if cs, want := s.res.Header.Get("Cache-Status"), []string{statusBypass, statusHitForMiss}[i]; !sameStatus(cs, want) {
					t.Errorf("stream %d: Cache-Status %q, want %q", i+1, cs, want)
				}
			}
			more.open()
			for i, s := range []stream{s1, s2} {
				if e := event(s); e != fmt.Sprintf("data: %d.2", i+1) {
					t.Errorf("stream %d: second event %q", i+1, e)
				}
			}
			if secStored(t, rdb, secKeyOfURL(t, nil, url)) {
				t.Errorf("a streamed response is stored")
			}
		})

		t.Run(rt.name+"/Hijack", func(t *testing.T) {
			var runs atomic.Int64
			errs := make(chan error, 10)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				rc := http.NewResponseController(w)
				if err := rc.SetWriteDeadline(time.Now().Add(secWait)); err != nil {
					errs <- fmt.Errorf("SetWriteDeadline: %w", err)
				}
				conn, brw, err := rc.Hijack()
				if err != nil {
					errs <- fmt.Errorf("Hijack: %w", err)
					return
				}
				defer conn.Close()
				body := fmt.Sprintf("hijacked %d", n)
				fmt.Fprintf(brw, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
				if err := brw.Flush(); err != nil {
					errs <- err
				}
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			url := srv.URL + "/ws"
			for i := 1; i <= 2; i++ {
				r := secGet(t, cl, url)
				if r.body != fmt.Sprintf("hijacked %d", i) {
					t.Errorf("request %d: %v, want the handler's run %d", i, r, i)
				}
			}
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if secStored(t, rdb, secKeyOfURL(t, nil, url)) {
				t.Errorf("a hijacked response is stored")
			}
		})
	}
}

// TestLargeBody is H07: a response past MaxBodyBytes streams to its own
// client uncached; the requests waiting for it run the handler
// themselves, and every client gets the whole body intact.
func TestLargeBody(t *testing.T) {
	c, rdb := newCache(t, &herd.Options{WaitTimeout: secWait})
	const size, chunk = 8 << 20, 32 << 10
	body := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{7})
	rng.Read(body)
	want := sha256.Sum256(body)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			var gate *secGate
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					gate.wait(r)
				}
				for p := body; len(p) > 0; p = p[chunk:] {
					if _, err := w.Write(p[:chunk]); err != nil {
						return
					}
				}
			})
			srv, cl := secServe(t, rt.build(New(c, &Options{MaxBodyBytes: 1 << 20}), h))
			gate = newSecGate(t)
			url := srv.URL + "/big"
			const n = 10
			out := make([]struct {
				n   int
				sum [32]byte
				cs  string
				err error
			}, n)
			var wg sync.WaitGroup
			start := time.Now()
			for i := range out {
				req := secNewReq(t, http.MethodGet, url, nil)
				wg.Go(func() {
					res, err := cl.Do(req)
					if err != nil {
						out[i].err = err
						return
					}
					defer res.Body.Close()
					hsh := sha256.New()
					m, err := io.Copy(hsh, res.Body)
					out[i].n, out[i].err, out[i].cs = int(m), err, res.Header.Get("Cache-Status")
					copy(out[i].sum[:], hsh.Sum(nil))
				})
			}
			secWaitFor(t, "the leader in the handler and 9 waiting requests", func() bool { return runs.Load() == 1 && secWaiting() == n-1 })
			gate.open()
			wg.Wait() // bounded by the client's Timeout
			for i, o := range out {
				if o.err != nil || o.n != size || o.sum != want {
					t.Errorf("request %d: %d bytes (want %d), intact %v, err %v", i, o.n, size, o.sum == want, o.err)
				}
				if !sameStatus(o.cs, statusBypass) {
					t.Errorf("request %d: Cache-Status %q, want %q", i, o.cs, statusBypass)
				}
			}
			if got := runs.Load(); got != n {
				t.Errorf("handler ran %d times, want %d", got, n)
			}
			if secStored(t, rdb, secKeyOfURL(t, nil, url)) {
				t.Errorf("a response past MaxBodyBytes is stored")
			}
			t.Logf("%d × %d MiB in %v", n, size>>20, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestTooLargeForTheCache: a response within MaxBodyBytes but above the
// Cache's MaxValueBytes cannot be stored; the requests that waited for
// it are served (they run the handler), never ErrorHandler's 502.
func TestTooLargeForTheCache(t *testing.T) {
	c, rdb := newCache(t, &herd.Options{WaitTimeout: secWait, MaxValueBytes: 64 << 10})
	body := strings.Repeat("x", 128<<10)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			var gate *secGate
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					gate.wait(r)
				}
				io.WriteString(w, body)
			})
			srv, cl := secServe(t, rt.build(New(c, &Options{MaxBodyBytes: 1 << 20}), h))
			gate = newSecGate(t)
			const n = 5
			reqs := make([]*http.Request, n)
			for i := range reqs {
				reqs[i] = secNewReq(t, http.MethodGet, srv.URL+"/toolarge", nil)
			}
			batch := secParallel(cl, reqs)
			secWaitFor(t, "the leader in the handler and 4 waiting requests", func() bool { return runs.Load() == 1 && secWaiting() == n-1 })
			gate.open()
			for i, r := range batch.wait(t) {
				if r.status != 200 || r.body != body {
					t.Errorf("request %d: %v, want the whole body", i, r)
				}
			}
			if secStored(t, rdb, secKeyOfURL(t, nil, srv.URL+"/toolarge")) {
				t.Errorf("a value above MaxValueBytes is stored")
			}
		})
	}
}

// TestRequestBodyAndHost is H09's parser-discrepancy part: a GET with a
// body is not cached, and the key takes the host from r.Host, which for
// an absolute-form target is the target's host, not the Host header.
func TestRequestBodyAndHost(t *testing.T) {
	c, rdb := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				b, _ := io.ReadAll(r.Body)
				fmt.Fprintf(w, "host=%s body=%q", r.Host, b)
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))

			url := srv.URL + "/fat"
			for i, mk := range []func() *http.Request{
				func() *http.Request { return secNewReq(t, http.MethodGet, url, strings.NewReader("cb=1")) },
				func() *http.Request {
					req := secNewReq(t, http.MethodGet, url, io.NopCloser(strings.NewReader("cb=2")))
					req.ContentLength = -1 // chunked
					return req
				},
			} {
				for j := range 2 {
					r := secSend(t, cl, mk())
					if !sameStatus(r.cacheStatus(), statusBypass) || !strings.Contains(r.body, "cb=") {
						t.Errorf("GET with a body (%d, %d): %v, want Cache-Status %q and the handler's answer", i, j, r, statusBypass)
					}
				}
			}
			if runs.Load() != 4 || secStored(t, rdb, secKeyOfURL(t, nil, url)) {
				t.Errorf("GET with a body: handler ran %d times for 4 requests; want 4, nothing stored", runs.Load())
			}

			steps := []struct {
				head, body, status string
			}{
				{"GET http://other.%[1]s/abs HTTP/1.1\r\nHost: victim.%[1]s", "host=other.%[1]s", statusStored},
				{"GET /abs HTTP/1.1\r\nHost: victim.%[1]s", "host=victim.%[1]s", statusStored},
				// An absolute-form target never shares the origin-form
				// entry: the handler may read its URL.Scheme and URL.User.
				{"GET /abs HTTP/1.1\r\nHost: other.%[1]s", "host=other.%[1]s", statusStored},
				{"GET http://victim.%[1]s/abs HTTP/1.1\r\nHost: other.%[1]s", "host=victim.%[1]s", statusStored},
				{"GET http://victim.%[1]s/abs HTTP/1.1\r\nHost: victim.%[1]s", "host=victim.%[1]s", statusHit},
				{"GET http://OTHER.%[1]s/abs HTTP/1.1\r\nHost: other.%[1]s", "host=OTHER.%[1]s", statusStored},
			}
			domain := strings.ToLower(rt.name) + ".example" // the key has the host, not the server's port
			for i, s := range steps {
				s.head, s.body = fmt.Sprintf(s.head, domain), fmt.Sprintf(s.body, domain)
				r := secRaw(t, srv, s.head)
				if !strings.HasPrefix(r.body, s.body) || !strings.HasPrefix(r.cacheStatus(), s.status) {
					t.Errorf("step %d %q: %v, want %q with Cache-Status %q", i, s.head, r, s.body, s.status)
				}
			}
		})
	}
}

// TestHandlerPanic is H10's panic part: the leader's handler panics
// behind chi's Recoverer (or the outer recoverer on ServeMux). Every
// request finishes quickly with a 5xx, the lease is released, nothing is
// stored, and the server keeps serving.
func TestHandlerPanic(t *testing.T) {
	c, rdb := newCache(t, &herd.Options{WaitTimeout: secWait})
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			var panicking atomic.Bool
			panicking.Store(true)
			var gate *secGate
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					gate.wait(r)
				}
				if panicking.Load() {
					w.Header().Set("X-Partial", "yes")
					panic("boom")
				}
				io.WriteString(w, "recovered")
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			gate = newSecGate(t)
			url := srv.URL + "/panic"
			const n = 10
			reqs := make([]*http.Request, n)
			for i := range reqs {
				reqs[i] = secNewReq(t, http.MethodGet, url, nil)
			}
			batch := secParallel(cl, reqs)
			secWaitFor(t, "the leader in the handler and 9 waiting requests", func() bool { return runs.Load() == 1 && secWaiting() == n-1 })
			start := time.Now()
			gate.open()
			rs := batch.wait(t)
			took := time.Since(start)
			for i, r := range rs {
				if r.err != nil || r.status/100 != 5 {
					t.Errorf("request %d: %v, want a 5xx", i, r)
				}
			}
			if took > secWait/2 {
				t.Errorf("the requests took %v to finish after the panic", took)
			}
			// One retry run is what the package doc describes; herd may
			// hand the waiters the leader's failure twice instead (see
			// TestFailedLeaderNoStampede), and then there is none.
			if got := runs.Load(); got < 1 || got > n {
				t.Errorf("handler ran %d times, want 1 to %d", got, n)
			}
			if ls := secScan(t, rdb, "herd:*:l"); len(ls) != 0 {
				t.Errorf("leases left in Redis after the panics: %v", ls)
			}
			if secStored(t, rdb, secKeyOfURL(t, nil, url)) {
				t.Errorf("a value is stored after the panics")
			}
			panicking.Store(false)
			if r := secGet(t, cl, url); r.body != "recovered" || !sameStatus(r.cacheStatus(), statusStored) || r.header.Get("X-Partial") != "" {
				t.Errorf("after the panics: %v, want a stored fresh response", r)
			}
			t.Logf("%d requests finished %v after the leader panicked; %d handler runs", n, took.Round(time.Millisecond), runs.Load())
		})
	}
}

// TestLeaderClientGone is H10's disconnect part: the leader's client
// goes away while the handler runs, and the handler then returns what it
// has. That partial response is never stored or shared: a waiter leads
// again and its complete response is stored.
func TestLeaderClientGone(t *testing.T) {
	c, rdb := newCache(t, &herd.Options{WaitTimeout: secWait})
	for _, rt := range secRouters {
		for _, waiters := range []int{0, 5} {
			t.Run(fmt.Sprintf("%s/%d waiters", rt.name, waiters), func(t *testing.T) {
				var runs atomic.Int64
				leaderDone := make(chan struct{})
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) == 1 {
						defer close(leaderDone)
						io.WriteString(w, "partial")
						limit := time.NewTimer(secWait)
						defer limit.Stop()
						select {
						case <-r.Context().Done():
						case <-limit.C:
						}
						return
					}
					io.WriteString(w, "complete")
				})
				srv, cl := secServe(t, rt.build(New(c, nil), h))
				url := srv.URL + "/gone"
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				leaderErr := make(chan error, 1)
				leaderReq := secNewReq(t, http.MethodGet, url, nil).WithContext(ctx)
				go func() {
					res, err := cl.Do(leaderReq)
					if err == nil {
						_, err = io.ReadAll(res.Body)
						res.Body.Close()
					}
					leaderErr <- err
				}()
				secWaitFor(t, "the leader in the handler", func() bool { return runs.Load() == 1 })
				reqs := make([]*http.Request, waiters)
				for i := range reqs {
					reqs[i] = secNewReq(t, http.MethodGet, url, nil)
				}
				batch := secParallel(cl, reqs)
				secWaitFor(t, "the waiting requests", func() bool { return secWaiting() == waiters })
				cancel()
				if err := <-leaderErr; err == nil {
					t.Errorf("the leader's request succeeded after its cancellation")
				}
				<-leaderDone
				for i, r := range batch.wait(t) {
					if r.body != "complete" {
						t.Errorf("waiter %d: %v, want the complete response", i, r)
					}
				}
				secWaitFor(t, "the leader's lease to be released", func() bool { return len(secScan(t, rdb, "herd:*:l")) == 0 })
				key := secKeyOfURL(t, nil, url)
				if waiters == 0 && secStored(t, rdb, key) {
					t.Errorf("the partial response is stored")
				}
				if r := secGet(t, cl, url); r.body != "complete" {
					t.Errorf("after the disconnect: %v, want the complete response", r)
				}
			})
		}
	}
}

// TestCorruptEntries is H11: a value at the middleware's key that is a
// valid herd envelope but not a response it can serve (bad bytes, another
// writer's value, a gzip body that does not decode or decodes past
// MaxBodyBytes) is replaced, without panic: the next request deletes it
// and rebuilds, and the request after that is a hit.
func TestCorruptEntries(t *testing.T) {
	c, _ := newCache(t, nil)
	valid := (&entry{status: 200, header: http.Header{"X-A": {"b"}}, body: []byte("stored")}).encode()
	gzipped := func(body []byte) []byte {
		return (&entry{status: 200, header: http.Header{"Content-Encoding": {"gzip"}, "Etag": {`"t"`}}, body: body}).encode()
	}
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				io.WriteString(w, "fresh")
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			for i, junk := range [][]byte{
				{},
				[]byte("H"),
				[]byte("H\x01\x00"),
				[]byte("H\x02\x00\xc8\x00body"),
				[]byte("X\x01\x00\xc8\x00body"),
				[]byte("H\x01\x00\x00\x00body"),
				[]byte("H\x01\xff\xff\x00body"),
				[]byte("H\x01\x00\xc8\xff\xff\xff\xff\x0f"),
				[]byte("H\x01\x00\xc8\x01\x05ab"),
				[]byte("H\x01\x00\xc8\x02\x01a\x01b\x01c"),
				valid[:len(valid)-len("stored")-3],
				[]byte(`{"json":"value"}`),
				gzipped([]byte("not gzip")),
				gzipped([]byte(gzipString(t, strings.Repeat("\x00", 2<<20)))), // decodes past MaxBodyBytes
			} {
				url := fmt.Sprintf("%s/corrupt/%d", srv.URL, i)
				if err := c.Set(context.Background(), secKeyOfURL(t, nil, url), junk, time.Minute); err != nil {
					t.Fatal(err)
				}
				before := runs.Load()
				for j, m := range []string{http.MethodGet, http.MethodGet, http.MethodHead} {
					want, body := statusHit, "fresh"
					if j == 0 {
						want = statusStored
					}
					if m == http.MethodHead {
						body = ""
					}
					r := secSend(t, cl, secNewReq(t, m, url, nil))
					if r.status != 200 || !strings.HasPrefix(r.cacheStatus(), want) || r.body != body {
						t.Errorf("%s %d of %q: %v, want %q with the handler's response", m, j, junk, r, want)
					}
				}
				if got := runs.Load() - before; got != 1 {
					t.Errorf("%q: handler ran %d times for 3 requests, want 1", junk, got)
				}
			}
		})
	}
}

// TestCacheStatus checks the Cache-Status value of each path (RFC 9211),
// Age, Date and ETag on hits, and If-None-Match.
func TestCacheStatus(t *testing.T) {
	c, _ := newCache(t, &herd.Options{WaitTimeout: secWait})
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			var gate *secGate
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				switch r.URL.Path {
				case "/collapse":
					gate.wait(r)
				case "/bad":
					w.WriteHeader(http.StatusBadRequest)
				case "/etag":
					w.Header().Set("ETag", `"v1"`)
				}
				fmt.Fprintf(w, "run%d", n)
			})
			srv, cl := secServe(t, rt.build(New(c, &Options{TTL: 30 * time.Second}), h))
			gate = newSecGate(t)

			r := secGet(t, cl, srv.URL+"/s")
			if !sameStatus(r.cacheStatus(), statusStored) || r.header.Get("Age") != "0" || r.header.Get("Date") == "" || r.header.Get("Etag") == "" {
				t.Errorf("first request: %v, Age %q, Date %q, ETag %q; want stored, Age 0, a Date and an ETag", r, r.header.Get("Age"), r.header.Get("Date"), r.header.Get("Etag"))
			}
			etag := r.header.Get("Etag")
			r = secGet(t, cl, srv.URL+"/s")
			ttl, ok := strings.CutPrefix(r.cacheStatus(), statusHit+"; ttl=")
			if n, err := strconv.Atoi(ttl); !ok || err != nil || n < 20 || n > 30 {
				t.Errorf("hit: Cache-Status %q, want %q with ttl in [20, 30]", r.cacheStatus(), statusHit+"; ttl=N")
			}
			if age, err := strconv.Atoi(r.header.Get("Age")); err != nil || age < 0 || age > 10 {
				t.Errorf("hit: Age %q", r.header.Get("Age"))
			}
			if r.header.Get("Date") == "" || r.header.Get("Etag") != etag || r.body != "run1" {
				t.Errorf("hit: %v, Date %q, ETag %q; want run1, a Date, ETag %s", r, r.header.Get("Date"), r.header.Get("Etag"), etag)
			}
			for _, inm := range []string{etag, "W/" + etag, `"other", ` + etag, "*"} {
				r = secGet(t, cl, srv.URL+"/s", "If-None-Match", inm)
				if r.status != http.StatusNotModified || r.body != "" || r.header.Get("Etag") != etag || !strings.HasPrefix(r.cacheStatus(), statusHit) {
					t.Errorf("If-None-Match %s: %v, ETag %q; want 304 with the ETag", inm, r, r.header.Get("Etag"))
				}
			}
			if r = secGet(t, cl, srv.URL+"/s", "If-None-Match", `"other"`); r.status != 200 || r.body != "run1" {
				t.Errorf("If-None-Match with another tag: %v, want 200", r)
			}
			secGet(t, cl, srv.URL+"/etag")
			if r = secGet(t, cl, srv.URL+"/etag", "If-None-Match", `"v1"`); r.status != http.StatusNotModified || r.header.Get("Etag") != `"v1"` {
				t.Errorf("handler's ETag: %v, ETag %q; want 304 with \"v1\"", r, r.header.Get("Etag"))
			}

			const n = 5
			reqs := make([]*http.Request, n)
			for i := range reqs {
				reqs[i] = secNewReq(t, http.MethodGet, srv.URL+"/collapse", nil)
			}
			before := runs.Load()
			batch := secParallel(cl, reqs)
			secWaitFor(t, "the leader in the handler and 4 waiting requests", func() bool { return runs.Load() == before+1 && secWaiting() == n-1 })
			gate.open()
			rs := batch.wait(t)
			if got := secCount(rs, func(r secResp) bool { return sameStatus(r.cacheStatus(), statusCollapsed) }); got != n-1 {
				t.Errorf("%d of %d waiters say %q: %v", got, n-1, statusCollapsed, rs)
			}
			if got := secCount(rs, func(r secResp) bool { return sameStatus(r.cacheStatus(), statusStored) }); got != 1 {
				t.Errorf("%d requests say %q, want 1: %v", got, statusStored, rs)
			}

			if r = secSend(t, cl, secNewReq(t, http.MethodPost, srv.URL+"/s", nil)); !sameStatus(r.cacheStatus(), statusBypass) {
				t.Errorf("POST: %v, want %q", r, statusBypass)
			}
			if r = secGet(t, cl, srv.URL+"/bad"); !sameStatus(r.cacheStatus(), statusMiss) {
				t.Errorf("400: %v, want %q", r, statusMiss)
			}
		})
	}

	t.Run("stale", func(t *testing.T) {
		var runs atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "run%d", runs.Add(1))
		})
		srv, cl := secServe(t, secRouters[1].build(New(c, &Options{TTL: 100 * time.Millisecond, StaleFor: time.Minute}), h))
		url := srv.URL + "/stale"
		if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusStored) {
			t.Fatalf("first request: %v", r)
		}
		var stale secResp
		secWaitFor(t, "a stale hit", func() bool {
			stale = secGet(t, cl, url)
			return sameStatus(stale.cacheStatus(), statusStale)
		})
		if stale.body != "run1" || stale.header.Get("Age") == "" || stale.header.Get("Date") == "" {
			t.Errorf("stale hit: %v, Age %q; want run1 with Age and Date", stale, stale.header.Get("Age"))
		}
		secWaitFor(t, "the background refresh", func() bool { return runs.Load() == 2 })
		secWaitFor(t, "the refreshed response", func() bool { return secGet(t, cl, url).body == "run2" })
	})
}

// TestInvalidOptions: New panics on a nil Cache, a nil handler and
// invalid options, with the package's prefix.
func TestInvalidOptions(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, tc := range []struct {
		name  string
		cache *herd.Cache
		opt   *Options
	}{
		{"nil cache", nil, nil},
		{"negative TTL", c, &Options{TTL: -time.Second}},
		{"TTL below 1ms", c, &Options{TTL: time.Microsecond}},
		{"negative StaleFor", c, &Options{StaleFor: -1}},
		{"negative NotFoundTTL", c, &Options{NotFoundTTL: -1}},
		{"negative WaitTimeout", c, &Options{WaitTimeout: -1}},
		{"negative MaxBodyBytes", c, &Options{MaxBodyBytes: -1}},
		{"negative MaxKeyBytes", c, &Options{MaxKeyBytes: -1}},
		{"StatusTTL 500", c, &Options{StatusTTL: map[int]time.Duration{200: time.Minute, 500: time.Minute}}},
		{"StatusTTL 503", c, &Options{StatusTTL: map[int]time.Duration{503: time.Minute}}},
		{"StatusTTL 206", c, &Options{StatusTTL: map[int]time.Duration{206: time.Minute}}},
		{"StatusTTL 103", c, &Options{StatusTTL: map[int]time.Duration{103: time.Minute}}},
		{"StatusTTL 0s", c, &Options{StatusTTL: map[int]time.Duration{200: 0}}},
		{"KeyHeaders empty", c, &Options{KeyHeaders: []string{""}}},
		{"KeyHeaders space", c, &Options{KeyHeaders: []string{"X Bad"}}},
		{"KeyHeaders colon", c, &Options{KeyHeaders: []string{"X-Bad:"}}},
		{"KeyHeaders CRLF", c, &Options{KeyHeaders: []string{"X-A\r\nX-B"}}},
		{"negative CompressMinBytes", c, &Options{Compress: true, CompressMinBytes: -1}},
		{"CompressLevel 10", c, &Options{Compress: true, CompressLevel: 10}},
		{"CompressLevel -1", c, &Options{Compress: true, CompressLevel: -1}},
		{"Compress with Accept-Encoding keyed", c, &Options{Compress: true, KeyHeaders: []string{"accept-encoding"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				v := recover()
				if s, _ := v.(string); !strings.HasPrefix(s, "herd/middleware: ") {
					t.Errorf("New panicked with %#v, want a string starting with %q", v, "herd/middleware: ")
				}
			}()
			New(tc.cache, tc.opt)
			t.Errorf("New did not panic")
		})
	}
	t.Run("nil handler", func(t *testing.T) {
		defer func() {
			if s, _ := recover().(string); !strings.HasPrefix(s, "herd/middleware: ") {
				t.Errorf("panic %q, want the package prefix", s)
			}
		}()
		New(c, nil)(nil)
		t.Errorf("no panic")
	})
}
