package middleware

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd"

	"io"
)

// standardServe serves h behind the middleware in the standard mode (or
// with opt) on each router, and returns a GET that reports whether the
// handler ran.
func standardRun(t *testing.T, opt *Options, h http.HandlerFunc, test func(t *testing.T, get func(path string, hdr ...string) (secResp, bool))) {
	t.Helper()
	standardRig(t, opt, h, func(t *testing.T, rig stdRig) { test(t, rig.get) })
}

// stdRig is what a standardRig test gets: get (as in standardRun), send
// for another method, and the Cache.
type stdRig struct {
	get  func(path string, hdr ...string) (secResp, bool)
	send func(method, path string) secResp
	c    *herd.Cache
}

// standardRig is standardRun with a stdRig.
func standardRig(t *testing.T, opt *Options, h http.HandlerFunc, test func(t *testing.T, rig stdRig)) {
	t.Helper()
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				h(w, r)
			})
			// Each router its own scope: one Cache for both.
			o := *opt
			o.Scope = rt.name
			srv, cl := secServe(t, rt.build(New(c, &o), counted))
			test(t, stdRig{
				get: func(path string, hdr ...string) (secResp, bool) {
					before := runs.Load()
					res := secGet(t, cl, srv.URL+path, hdr...)
					return res, runs.Load() > before
				},
				send: func(method, path string) secResp {
					return secSend(t, cl, secNewReq(t, method, srv.URL+path, nil))
				},
				c: c,
			})
		})
	}
}

// TestStandardStoresOnlyStatedFreshness: in the standard mode a response
// is stored for the freshness it states, or a heuristic one from its
// Last-Modified, whatever its status; one that states none is not
// stored; a targeted field (Herd-Cache-Control, CDN-Cache-Control) rules
// over Cache-Control unless it is not a valid Structured Field; an
// Expires that is no strict HTTP-date is in the past; must-understand
// lets a known status be stored despite no-store, never an unknown one.
func TestStandardStoresOnlyStatedFreshness(t *testing.T) {
	lastWeek := time.Now().Add(-7 * 24 * time.Hour).UTC().Format(http.TimeFormat)
	inAnHour := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
	cases := map[string]struct {
		status int
		header []string
		stored bool
	}{
		"/none":                {200, nil, false},
		"/max-age":             {200, []string{"Cache-Control", "max-age=60"}, true},
		"/s-maxage-0":          {200, []string{"Cache-Control", "max-age=60, s-maxage=0"}, false},
		"/heuristic":           {200, []string{"Last-Modified", lastWeek}, true},
		"/heuristic-403":       {403, []string{"Last-Modified", lastWeek}, false},
		"/heuristic-public":    {403, []string{"Last-Modified", lastWeek, "Cache-Control", "public"}, true},
		"/503-max-age":         {503, []string{"Cache-Control", "max-age=60"}, true},
		"/302-max-age":         {302, []string{"Cache-Control", "max-age=60", "Location", "/x"}, true},
		"/expires":             {200, []string{"Expires", inAnHour}, true},
		"/expires-two-spaces":  {200, []string{"Expires", strings.Replace(inAnHour, " ", "  ", 1)}, false},
		"/herd-cc":             {200, []string{"Herd-Cache-Control", "max-age=60", "Cache-Control", "no-store"}, true},
		"/cdn-cc":              {200, []string{"CDN-Cache-Control", "max-age=60", "Cache-Control", "no-store"}, true},
		"/cdn-cc-no-store":     {200, []string{"CDN-Cache-Control", "no-store", "Cache-Control", "max-age=60"}, false},
		"/cdn-cc-invalid":      {200, []string{"CDN-Cache-Control", `max-age="60"`, "Cache-Control", "no-store"}, false},
		"/herd-over-cdn":       {200, []string{"Herd-Cache-Control", "no-store", "CDN-Cache-Control", "max-age=60"}, false},
		"/must-understand":     {200, []string{"Cache-Control", "max-age=60, no-store, must-understand"}, true},
		"/must-understand-599": {599, []string{"Cache-Control", "max-age=60, no-store, must-understand"}, false},
		"/space-before-equals": {200, []string{"Cache-Control", "max-age =60"}, false},
	}
	standardRun(t, &Options{Standard: true}, func(w http.ResponseWriter, r *http.Request) {
		tc := cases[r.URL.Path]
		for i := 0; i+1 < len(tc.header); i += 2 {
			w.Header().Add(tc.header[i], tc.header[i+1])
		}
		w.WriteHeader(tc.status)
		fmt.Fprint(w, "body of ", r.URL.Path)
	}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
		for path, tc := range cases {
			get(path)
			res, ran := get(path)
			if ran == tc.stored {
				t.Errorf("GET %s twice (%d, %v): second ran the handler %v (%v), want stored %v", path, tc.status, tc.header, ran, res, tc.stored)
			}
		}
	})
}

// TestAgeFromTheResponse: in every mode the Age a handler's response
// came with is sent on, whether the response is stored or not (the
// origin's Age: 7200 was sent as 0), read as its first member ("0,
// 7200" is 0), and counts against its freshness.
func TestAgeFromTheResponse(t *testing.T) {
	for _, mode := range []struct {
		name string
		opt  *Options
	}{{"default", &Options{RespectCacheControl: true}}, {"standard", &Options{Standard: true}}} {
		t.Run(mode.name, func(t *testing.T) {
			standardRun(t, mode.opt, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Cache-Control", "max-age=3600")
				w.Header()["Age"] = []string{strings.TrimPrefix(r.URL.Path, "/")}
				fmt.Fprint(w, "page")
			}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
				// Stale on arrival: not stored, its Age passed on.
				for range 2 {
					if res, ran := get("/7200"); !ran || res.header.Get("Age") != "7200" {
						t.Errorf("GET /7200: ran %v, Age %q; want the handler run and Age 7200", ran, res.header.Get("Age"))
					}
				}
				get("/0,%207200")
				if res, ran := get("/0,%207200"); ran || res.header.Get("Age") != "0" {
					t.Errorf(`GET with Age "0, 7200" again: ran %v, Age %q; want a hit of Age 0`, ran, res.header.Get("Age"))
				}
				get("/600")
				if res, ran := get("/600"); ran || res.header.Get("Age") != "600" {
					t.Errorf("GET with Age 600 again: ran %v, Age %q; want a hit of Age 600", ran, res.header.Get("Age"))
				}
			})
		})
	}
}

// TestStandardKeepsDate: in the standard mode a hit carries the Date of
// the response it was stored from, not the time it is served.
func TestStandardKeepsDate(t *testing.T) {
	date := time.Now().Add(-time.Minute).UTC().Format(http.TimeFormat)
	standardRun(t, &Options{Standard: true}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=3600")
		if r.URL.Path == "/dated" {
			w.Header().Set("Date", date)
		}
		fmt.Fprint(w, "page")
	}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
		get("/dated")
		if res, ran := get("/dated"); ran || res.header.Get("Date") != date {
			t.Errorf("hit: ran %v, Date %q; want a hit with the handler's Date %q", ran, res.header.Get("Date"), date)
		}
		first, _ := get("/undated")
		if res, ran := get("/undated"); ran || res.header.Get("Date") != first.header.Get("Date") {
			t.Errorf("hit: ran %v, Date %q; want a hit with the first response's Date %q", ran, res.header.Get("Date"), first.header.Get("Date"))
		}
	})
}

// TestStandardRevalidatesWithTheHandler: in the standard mode a stored
// response that must be revalidated (no-cache, or stale) is revalidated
// with the handler by a conditional request (If-None-Match with its ETag,
// If-Modified-Since with its Last-Modified); the handler's 304 updates
// the stored header fields and the client gets the stored body with
// them, and the updated response is stored for the freshness the 304
// gives it.
func TestStandardRevalidatesWithTheHandler(t *testing.T) {
	lm := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	var conditionals atomic.Int64
	standardRun(t, &Options{Standard: true}, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("If-None-Match") == `"v1"` && r.Header.Get("If-Modified-Since") == lm {
			conditionals.Add(1)
			w.Header().Set("Cache-Control", "max-age=60")
			w.Header().Set("X-Version", "2")
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Etag", `"v1"`)
		w.Header().Set("Last-Modified", lm)
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Version", "1")
		fmt.Fprint(w, "the body of v1")
	}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
		before := conditionals.Load()
		if res, _ := get("/doc"); res.body != "the body of v1" || res.header.Get("X-Version") != "1" {
			t.Fatalf("first GET: %v, want v1", res)
		}
		res, ran := get("/doc")
		if !ran || conditionals.Load() != before+1 {
			t.Fatalf("second GET: ran %v, conditional requests %d; want one conditional request", ran, conditionals.Load()-before)
		}
		if res.status != http.StatusOK || res.body != "the body of v1" || res.header.Get("X-Version") != "2" {
			t.Errorf("second GET: %v; want 200, the stored body, X-Version 2 from the 304", res)
		}
		if res, ran := get("/doc"); ran || res.body != "the body of v1" || res.header.Get("X-Version") != "2" {
			t.Errorf("third GET: ran %v, %v; want a hit of the updated response", ran, res)
		}
	})
}

// TestStandardRevalidationOnceAcrossInstances: the requests for a URL
// whose stored response must be revalidated, sent to two instances on
// one Redis while the handler is slow, make one conditional request to
// the handler between them.
func TestStandardRevalidationOnceAcrossInstances(t *testing.T) {
	c1, rdb := newCache(t, nil)
	c2 := herd.New(rdb, nil)
	t.Cleanup(func() { c2.Close() })
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var full, conditionals atomic.Int64
			first := make(chan struct{}, 1)
			gate := newSecGate(t)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("If-None-Match") == `"v1"` {
					if conditionals.Add(1) == 1 {
						first <- struct{}{}
					}
					<-gate.ch
					w.Header().Set("Cache-Control", "max-age=60")
					w.WriteHeader(http.StatusNotModified)
					return
				}
				full.Add(1)
				w.Header().Set("Etag", `"v1"`)
				w.Header().Set("Cache-Control", "no-cache")
				fmt.Fprint(w, "v1")
			})
			opt := &Options{Standard: true, Scope: rt.name}
			srv1, cl := secServe(t, rt.build(New(c1, opt), h))
			srv2, _ := secServe(t, rt.build(New(c2, opt), h))
			warm := secNewReq(t, http.MethodGet, srv1.URL+"/doc", nil)
			warm.Host = "www.example.test" // one site behind both instances
			secSend(t, cl, warm)
			var reqs []*http.Request
			for i := range 8 {
				req := secNewReq(t, http.MethodGet, []string{srv1.URL, srv2.URL}[i%2]+"/doc", nil)
				req.Host = "www.example.test"
				reqs = append(reqs, req)
			}
			b := secParallel(cl, reqs[:1])
			<-first
			rest := secParallel(cl, reqs[1:])
			gate.open()
			b.wg.Wait()
			rest.wg.Wait()
			for _, res := range append(b.out, rest.out...) {
				if res.err != nil || res.body != "v1" {
					t.Errorf("GET: %v, want v1", res)
				}
			}
			if c, f := conditionals.Load(), full.Load(); c != 1 || f != 1 {
				t.Errorf("handler runs: %d conditional, %d full; want 1 and 1 (the first GET) for %d requests on two instances", c, f, len(reqs))
			}
		})
	}
}

// TestStandardServesRangesFromTheWholeResponse: in the standard mode a
// GET with one byte range is served from the whole stored response (the
// handler runs without the Range field, once): 206 with Content-Range,
// 416 past the end, the whole response for several ranges or an If-Range
// that does not match.
func TestStandardServesRangesFromTheWholeResponse(t *testing.T) {
	var ranged atomic.Int64
	standardRun(t, &Options{Standard: true}, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Range") != "" {
			ranged.Add(1)
		}
		w.Header().Set("Cache-Control", "max-age=60")
		w.Header().Set("Etag", `"e"`)
		fmt.Fprint(w, "01234567890")
	}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
		for i, tc := range []struct {
			hdr          []string
			status       int
			body, cRange string
		}{
			{[]string{"Range", "bytes=0-1"}, 206, "01", "bytes 0-1/11"},
			{[]string{"Range", "bytes=-3"}, 206, "890", "bytes 8-10/11"},
			{[]string{"Range", "bytes=5-"}, 206, "567890", "bytes 5-10/11"},
			{[]string{"Range", "bytes=100-"}, 416, "", "bytes */11"},
			{[]string{"Range", "bytes=0-1,3-4"}, 200, "01234567890", ""},
			{[]string{"Range", "bytes=0-1", "If-Range", `"other"`}, 200, "01234567890", ""},
			{[]string{"Range", "bytes=0-1", "If-Range", `"e"`}, 206, "01", "bytes 0-1/11"},
		} {
			res, ran := get("/file", tc.hdr...)
			if ran != (i == 0) || res.status != tc.status || res.body != tc.body || res.header.Get("Content-Range") != tc.cRange {
				t.Errorf("GET with %v: ran %v, %d %q Content-Range %q; want %d %q %q from the stored response", tc.hdr, ran, res.status, res.body, res.header.Get("Content-Range"), tc.status, tc.body, tc.cRange)
			}
		}
		if n := ranged.Load(); n != 0 {
			t.Errorf("the handler got %d requests with Range, want none", n)
		}
	})
}

// TestStandardServesStaleIfError: in the standard mode, when the handler
// fails (a 5xx) and the kept response's stale-if-error covers how stale
// it is, the client gets the kept response instead (RFC 5861); without
// stale-if-error it gets the failure, and so it does once the response
// was invalidated, by an unsafe method or a purge of its tag.
func TestStandardServesStaleIfError(t *testing.T) {
	var failing atomic.Bool
	standardRig(t, &Options{Standard: true}, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if failing.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		// Stale on arrival: kept, not stored fresh.
		w.Header().Set("Age", "100")
		w.Header().Set("Surrogate-Key", "tag"+r.URL.Path)
		if strings.HasPrefix(r.URL.Path, "/sie") {
			w.Header().Set("Cache-Control", "max-age=60, stale-if-error=600")
		} else {
			w.Header().Set("Cache-Control", "max-age=60")
			w.Header().Set("Last-Modified", "Mon, 02 Jan 2006 15:04:05 GMT")
		}
		fmt.Fprint(w, "good "+r.URL.Path)
	}, func(t *testing.T, rig stdRig) {
		get := rig.get
		failing.Store(false)
		for _, p := range []string{"/sie", "/sie-put", "/sie-purged", "/plain"} {
			get(p)
		}
		failing.Store(true)
		if res, _ := get("/sie"); res.status != http.StatusOK || res.body != "good /sie" || res.cacheStatus() != statusStale {
			t.Errorf("GET /sie, the handler failing: %v; want the kept response, %q", res, statusStale)
		}
		if res, _ := get("/plain"); res.status != http.StatusServiceUnavailable {
			t.Errorf("GET /plain (no stale-if-error), the handler failing: %v; want the 503", res)
		}
		rig.send(http.MethodPut, "/sie-put")
		if err := InvalidateTag(context.Background(), rig.c, "tag/sie-purged"); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"/sie-put", "/sie-purged"} {
			if res, _ := get(p); res.status != http.StatusServiceUnavailable {
				t.Errorf("GET %s, invalidated, the handler failing: %v; want the 503, never the invalidated response", p, res)
			}
		}
	})
}

// TestStandardOnlyIfCached: in the standard mode a request with
// Cache-Control: only-if-cached gets the stored response, or a 504, and
// never runs the handler (RFC 9111 §5.2.1.7).
func TestStandardOnlyIfCached(t *testing.T) {
	standardRun(t, &Options{Standard: true}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60")
		fmt.Fprint(w, "page")
	}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
		if res, ran := get("/cold", "Cache-Control", "only-if-cached"); ran || res.status != http.StatusGatewayTimeout {
			t.Errorf("only-if-cached, nothing stored: ran %v, %v; want 504 without the handler", ran, res)
		}
		get("/warm")
		if res, ran := get("/warm", "Cache-Control", "only-if-cached"); ran || res.status != http.StatusOK || res.body != "page" {
			t.Errorf("only-if-cached, stored: ran %v, %v; want the stored page", ran, res)
		}
	})
}

// TestStandardStoresEachVariant: in the standard mode a response that
// varies on a request field outside the key is stored per value of that
// field (normalised: "de, en" and "de,en" are one variant), each built
// once; an unsafe method's invalidation retires every variant.
func TestStandardStoresEachVariant(t *testing.T) {
	var version atomic.Int64
	standardRig(t, &Options{Standard: true}, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			version.Add(1)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("Cache-Control", "max-age=60")
		w.Header().Set("Vary", "X-Lang")
		fmt.Fprintf(w, "v%d %s", version.Load(), r.Header.Get("X-Lang"))
	}, func(t *testing.T, rig stdRig) {
		version.Store(0) // each router's run its own
		for i, tc := range []struct {
			lang string
			ran  bool
			body string
		}{
			{"de", true, "v0 de"},
			{"de", false, "v0 de"},
			{"fr", true, "v0 fr"},
			{"fr", false, "v0 fr"},
			{"de", false, "v0 de"},
			{"de, en", true, "v0 de, en"},
			{"de,en", false, "v0 de, en"},
		} {
			res, ran := rig.get("/page", "X-Lang", tc.lang)
			if ran != tc.ran || res.body != tc.body {
				t.Errorf("GET %d, X-Lang %q: ran %v, %q; want ran %v, %q", i, tc.lang, ran, res.body, tc.ran, tc.body)
			}
		}
		rig.send(http.MethodPut, "/page")
		for _, lang := range []string{"fr", "de"} {
			if res, ran := rig.get("/page", "X-Lang", lang); !ran || res.body != "v1 "+lang {
				t.Errorf("GET, X-Lang %q, after a PUT: ran %v, %q; want the handler's v1", lang, ran, res.body)
			}
		}
	})
}

// TestStandardSuffixRangeOfAnEmptyBodyIsUnsatisfiable: RFC 9110
// §14.1.3: if the selected representation has zero length, a
// suffix-range is unsatisfiable (416), and a Content-Range must be
// valid (§14.4: "bytes 0--1/0" is not).
func TestStandardSuffixRangeOfAnEmptyBodyIsUnsatisfiable(t *testing.T) {
	standardRun(t, &Options{Standard: true}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60")
		w.WriteHeader(http.StatusOK)
	}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
		get("/empty")
		res, _ := get("/empty", "Range", "bytes=-5")
		if res.status != http.StatusRequestedRangeNotSatisfiable {
			t.Errorf("Range bytes=-5 of an empty response: %d, Content-Range %q; want 416", res.status, res.header.Get("Content-Range"))
		}
	})
}

// TestStandard304SetCookieIsNotStored: a 304 that sets a cookie
// must not smuggle it into the stored response, nor turn caching off.
func TestStandard304SetCookieIsNotStored(t *testing.T) {
	standardRun(t, &Options{Standard: true}, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("If-None-Match") == `"v1"` {
			http.SetCookie(w, &http.Cookie{Name: "session", Value: "alice"})
			w.Header().Set("Cache-Control", "max-age=60")
			w.Header().Set("Content-Length", "999")
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Etag", `"v1"`)
		w.Header().Set("Cache-Control", "no-cache")
		io.WriteString(w, "v1")
	}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
		get("/doc")
		get("/doc") // revalidated: alice's 304
		for i := range 2 {
			res, _ := get("/doc")
			if res.header.Get("Set-Cookie") != "" || res.body != "v1" {
				t.Errorf("GET %d after alice's 304: %v; want v1 without her cookie", i, res)
			}
		}
	})
}

// TestStandardAuthorizedResponseNeedsPublic: RFC 9111 §3.5: a
// response to a request with Authorization is stored only with public,
// s-maxage or must-revalidate; max-age alone must not share it.
func TestStandardAuthorizedResponseNeedsPublic(t *testing.T) {
	standardRun(t, &Options{Standard: true, AllowAuthorized: true}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60")
		io.WriteString(w, "account of "+r.Header.Get("Authorization"))
	}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
		get("/account", "Authorization", "Bearer alice")
		if res, _ := get("/account", "Authorization", "Bearer bob"); strings.Contains(res.body, "alice") {
			t.Errorf("bob got %v", res)
		}
		if res, _ := get("/account"); strings.Contains(res.body, "alice") {
			t.Errorf("an anonymous client got %v", res)
		}
	})
}

// TestStandardVaryStarIsNeverServed: a response with Vary: * is
// never served from the cache (RFC 9111 §4.1).
func TestStandardVaryStarIsNeverServed(t *testing.T) {
	var n atomic.Int64
	standardRun(t, &Options{Standard: true}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60")
		w.Header().Set("Vary", "*")
		fmt.Fprintf(w, "n=%d", n.Add(1))
	}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
		get("/v")
		if _, ran := get("/v"); !ran {
			t.Errorf("a Vary: * response was served from the cache")
		}
	})
}

// TestStandardRevalidationKeepsVariantsApart: a no-cache (or
// stale on arrival) response that varies on Accept-Language is kept for
// revalidation; a request in another language must never be answered
// with it after the handler's 304 to a conditional request built from
// it (RFC 9111 §4.1: the stored response must match the request's
// Vary-listed fields; §4.3.1: the validators sent are those of matching
// stored responses). The handler here uses one Last-Modified for both
// languages, as a file server does.
func TestStandardRevalidationKeepsVariantsApart(t *testing.T) {
	lm := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	for _, cc := range []string{"no-cache", "max-age=0"} {
		t.Run(cc, func(t *testing.T) {
			standardRun(t, &Options{Standard: true}, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Last-Modified", lm)
				w.Header().Set("Vary", "Accept-Language")
				w.Header().Set("Cache-Control", cc)
				if r.Header.Get("If-Modified-Since") == lm {
					w.WriteHeader(http.StatusNotModified)
					return
				}
				if r.Header.Get("Accept-Language") == "fr" {
					io.WriteString(w, "bonjour")
					return
				}
				io.WriteString(w, "hello")
			}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
				if res, _ := get("/greet", "Accept-Language", "fr"); res.body != "bonjour" {
					t.Fatalf("fr: %v", res)
				}
				if res, _ := get("/greet", "Accept-Language", "en"); res.body != "hello" {
					t.Errorf("en after fr (%s): %v; want hello, not the French variant", cc, res)
				}
			})
		})
	}
}

func TestStandardVaryCookieIsNeverReplayed(t *testing.T) {
	lm := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	standardRun(t, &Options{Standard: true, KeyCookies: []string{"lang"}}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Last-Modified", lm)
		w.Header().Set("Vary", "Cookie")
		w.Header().Set("Cache-Control", "no-cache")
		if r.Header.Get("If-Modified-Since") == lm {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		s, _ := r.Cookie("session")
		io.WriteString(w, "account page of "+s.Value)
	}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
		if res, _ := get("/account", "Cookie", "lang=en; session=alice"); res.body != "account page of alice" {
			t.Fatalf("alice: %v", res)
		}
		if res, _ := get("/account", "Cookie", "lang=en; session=bob"); strings.Contains(res.body, "alice") {
			t.Errorf("bob got %v", res)
		}
	})
}

func TestStandardAuthorizedNoCacheIsNotKept(t *testing.T) {
	lm := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	standardRun(t, &Options{Standard: true, AllowAuthorized: true}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Last-Modified", lm)
		w.Header().Set("Cache-Control", "no-cache")
		if r.Header.Get("If-Modified-Since") == lm {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		io.WriteString(w, "account of "+r.Header.Get("Authorization"))
	}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
		get("/me", "Authorization", "Bearer alice")
		if res, _ := get("/me", "Authorization", "Bearer bob"); strings.Contains(res.body, "alice") {
			t.Errorf("bob got %v", res)
		}
	})
}

func TestStandardRevalidatedResponseHasTheNewDate(t *testing.T) {
	old := time.Now().Add(-2 * time.Hour).UTC().Format(http.TimeFormat)
	standardRun(t, &Options{Standard: true}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Etag", `"v1"`)
		w.Header().Set("Cache-Control", "max-age=60")
		if r.Header.Get("If-None-Match") == `"v1"` {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Date", old) // generated two hours ago: stale on arrival
		io.WriteString(w, "v1")
	}, func(t *testing.T, get func(string, ...string) (secResp, bool)) {
		get("/doc")
		get("/doc") // revalidated: 304
		res, ran := get("/doc")
		d, err := http.ParseTime(res.header.Get("Date"))
		if ran || err != nil || time.Since(d) > time.Minute {
			t.Errorf("hit after the 304: ran %v, Date %q Age %q (%s); want a Date of the revalidation", ran, res.header.Get("Date"), res.header.Get("Age"), res.cacheStatus())
		}
	})
}
