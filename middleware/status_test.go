package middleware

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// detailHandler answers each path of /d/ as its name says.
func detailHandler(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	h := w.Header()
	switch name {
	case "status":
		w.WriteHeader(http.StatusForbidden)
	case "server-error":
		w.WriteHeader(http.StatusServiceUnavailable)
	case "set-cookie":
		h.Set("Set-Cookie", "s=1")
	case "www-authenticate":
		h.Set("WWW-Authenticate", "Basic")
	case "private", "no-store", "no-cache":
		h.Set("Cache-Control", name)
	case "vary":
		h.Set("Vary", "X-Flavour")
	case "stale":
		h.Set("Cache-Control", "max-age=0")
	case "encoding":
		h.Set("Content-Encoding", "br")
	case "tags":
		tags := make([]string, herd.MaxTags+1)
		for i := range tags {
			tags[i] = fmt.Sprintf("t%d", i)
		}
		h.Set("Surrogate-Key", strings.Join(tags, " "))
	case "streamed":
		io.WriteString(w, "part")
		w.(http.Flusher).Flush()
	case "too-large":
		w.Write(make([]byte, 2048))
		return
	case "truncated":
		h.Set("Content-Length", "10") // and 4 bytes written
	}
	io.WriteString(w, "page")
}

// TestCacheStatusDetails: every bypass and every response that is not
// stored says why in Cache-Status's detail parameter (RFC 9211 §2.8).
func TestCacheStatusDetails(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			mw := New(c, &Options{MaxKeyBytes: 200, MaxBodyBytes: 1024, Scope: "details-" + rt.name})
			srv, cl := secServe(t, rt.build(mw, http.HandlerFunc(detailHandler)))
			base := srv.URL + "/d/"
			bypass := func(d string) string { return withDetail(statusBypass, d) }
			miss := func(d string) string { return withDetail(statusMiss, d) }
			for _, tc := range []struct {
				req  *http.Request
				want string
			}{
				{secNewReq(t, http.MethodPost, base+"m", nil), bypass("method")},
				{secNewReq(t, http.MethodGet, base+"o", nil, "X-HTTP-Method-Override", "DELETE"), bypass("method-override")},
				{secNewReq(t, http.MethodGet, base+"b", strings.NewReader("x")), bypass("body")},
				{secNewReq(t, http.MethodGet, base+"r", nil, "Range", "bytes=0-1"), bypass("range")},
				{secNewReq(t, http.MethodGet, base+"c", nil, "Cookie", "session=1"), bypass("cookie")},
				{secNewReq(t, http.MethodGet, base+"a", nil, "Authorization", "Bearer x"), bypass("authorization")},
				{secNewReq(t, http.MethodGet, base+"a", nil, "Authorization", "Bearer x", "Cookie", "s=1"), bypass("authorization")},
				{secNewReq(t, http.MethodGet, base+"i", nil, "X-Forwarded-User", "alice"), bypass("identity-header")},
				{secNewReq(t, http.MethodGet, base+"k?q="+strings.Repeat("x", 300), nil), bypass("key-too-large")},
				{secNewReq(t, http.MethodGet, base+"u", nil, "Upgrade", "websocket", "Connection", "Upgrade"), bypass("upgrade")},
				{secNewReq(t, http.MethodGet, base+"n", nil, "Cache-Control", "no-store"), bypass("no-store")},

				{secNewReq(t, http.MethodGet, base+"status", nil), miss("status")},
				{secNewReq(t, http.MethodGet, base+"server-error", nil), miss("status")},
				{secNewReq(t, http.MethodGet, base+"set-cookie", nil), miss("set-cookie")},
				{secNewReq(t, http.MethodGet, base+"set-cookie", nil), bypass("hit-for-miss")}, // the URL is marked now
				{secNewReq(t, http.MethodGet, base+"www-authenticate", nil), miss("per-user-field")},
				{secNewReq(t, http.MethodGet, base+"private", nil), miss("private")},
				{secNewReq(t, http.MethodGet, base+"no-store", nil), miss("no-store")},
				{secNewReq(t, http.MethodGet, base+"no-cache", nil), miss("no-cache")},
				{secNewReq(t, http.MethodGet, base+"vary", nil), miss("vary")},
				{secNewReq(t, http.MethodGet, base+"stale", nil), miss("stale-on-arrival")},
				{secNewReq(t, http.MethodGet, base+"encoding", nil), miss("encoding")},
				{secNewReq(t, http.MethodGet, base+"tags", nil), miss("tags-invalid")},
				{secNewReq(t, http.MethodGet, base+"streamed", nil), bypass("streamed")},
				{secNewReq(t, http.MethodGet, base+"too-large", nil), bypass("too-large")},
				{secNewReq(t, http.MethodGet, base+"truncated", nil), miss("truncated")},
				{secNewReq(t, http.MethodGet, base+"stored", nil), statusStored},
			} {
				if r := secDo(cl, tc.req); r.cacheStatus() != tc.want { // truncated: the body ends early

					t.Errorf("%s %s %v: Cache-Status %q, want %q", tc.req.Method, tc.req.URL.Path, tc.req.Header, r.cacheStatus(), tc.want)
				}
			}
		})
	}

	// Options that make a request bypass, or a response not stored.
	custom := New(c, &Options{Scope: "details-keyfunc", KeyFunc: func(*http.Request) (string, bool) { return "", false }})
	srv, cl := secServe(t, custom(http.HandlerFunc(detailHandler)))
	if r := secGet(t, cl, srv.URL+"/d/x"); r.cacheStatus() != withDetail(statusBypass, "keyfunc") {
		t.Errorf("KeyFunc said no: Cache-Status %q", r.cacheStatus())
	}
	authorized := New(c, &Options{Scope: "details-authorized", AllowAuthorized: true})
	srv, cl = secServe(t, authorized(http.HandlerFunc(detailHandler)))
	if r := secGet(t, cl, srv.URL+"/d/x", "Authorization", "Bearer x"); r.cacheStatus() != withDetail(statusMiss, "credentials") {
		t.Errorf("AllowAuthorized, a response without public: Cache-Status %q", r.cacheStatus())
	}
}

// TestCacheStatusRedisUnavailable: with Redis gone, a response the
// handler built for its own request alone (fail-open) says so, and so
// does a request served uncached under FailClosed.
func TestCacheStatusRedisUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  *herd.Options
		want string
	}{
		{"fail-open", nil, withDetail(statusMiss, "redis-unavailable")},
		{"FailClosed", &herd.Options{FailClosed: true}, withDetail(statusBypass, "redis-unavailable")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := redistest.Start(t)
			c := herd.New(rs.Client(t, func(o *redis.Options) { o.MaxRetries = -1 }), tc.opt)
			t.Cleanup(func() { c.Close() })
			srv, cl := secServe(t, New(c, nil)(http.HandlerFunc(detailHandler)))
			if r := secGet(t, cl, srv.URL+"/d/up"); r.cacheStatus() != statusStored {
				t.Fatalf("Redis up: %v, want stored", r)
			}
			rs.Kill(t)
			for i := range 3 {
				if r := secGet(t, cl, srv.URL+"/d/down"); r.body != "page" || r.cacheStatus() != tc.want {
					t.Errorf("Redis killed, request %d: %v, want page with Cache-Status %q", i, r, tc.want)
				}
			}
			// go-redis redials a dead server once a second until it
			// answers: bring it back, so that the goroutine ends.
			rs.Restart(t)
			secWaitFor(t, "go-redis to stop redialling", func() bool {
				buf := make([]byte, 1<<20)
				return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*ConnPool).tryDial")
			})
		})
	}
}

// TestCacheStatusDetailsOfWaits: a request that waited for another says
// why it then ran the handler itself: the wait budget was spent, or the
// response it waited for could not be shared; a response whose tags
// could not be recorded says so.
func TestCacheStatusDetailsOfWaits(t *testing.T) {
	c, _ := newCache(t, &herd.Options{MaxTagEntries: 1})
	for _, tc := range []struct {
		name string
		opt  *Options
		hdr  string // what the leader's response sets
		want string // the waiter's Cache-Status
	}{
		{"wait budget spent", &Options{WaitTimeout: 50 * time.Millisecond}, "", withDetail(statusBypass, "wait-timeout")},
		{"not shared", &Options{HitForMiss: -1, WaitTimeout: secWait}, "Set-Cookie", withDetail(statusBypass, "not-shared")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gate := newSecGate(t)
			var runs atomic.Int64
			tc.opt.Scope = tc.name
			srv, cl := secServe(t, secOuter{New(c, tc.opt)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					gate.wait(r) // the leader, until the waiter waits (or gave up)
					if tc.hdr != "" {
						w.Header().Set(tc.hdr, "s=1")
					}
				}
				io.WriteString(w, "page")
			}))})
			lead := secParallel(cl, []*http.Request{secNewReq(t, http.MethodGet, srv.URL+"/w", nil)})
			secWaitFor(t, "the leader to run", func() bool { return runs.Load() == 1 })
			waiter := secParallel(cl, []*http.Request{secNewReq(t, http.MethodGet, srv.URL+"/w", nil)})
			if tc.hdr != "" {
				secWaitFor(t, "the waiter to wait", func() bool { return secWaiting() >= 1 })
			} else {
				secWaitFor(t, "the waiter to give up", func() bool { return runs.Load() == 2 })
			}
			gate.open()
			lead.wait(t)
			if r := waiter.wait(t)[0]; r.body != "page" || r.cacheStatus() != tc.want {
				t.Errorf("waiter: %v, want page with Cache-Status %q", r, tc.want)
			}
		})
	}

	t.Run("tag index full", func(t *testing.T) {
		srv, cl := secServe(t, New(c, &Options{Scope: "tags"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Surrogate-Key", "shelf")
			io.WriteString(w, "page")
		})))
		if r := secGet(t, cl, srv.URL+"/first"); r.cacheStatus() != statusStored {
			t.Fatalf("the tag's first entry: %v, want stored", r)
		}
		if r := secGet(t, cl, srv.URL+"/second"); r.cacheStatus() != withDetail(statusMiss, "tags-not-recorded") {
			t.Errorf("a second entry for a tag whose index holds 1: %v, want not stored, saying its tags were not recorded", r)
		}
	})
}
