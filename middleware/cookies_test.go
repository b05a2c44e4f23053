package middleware

// Tests of Options.KeyCookies and Options.IgnoreCookies, behind
// http.ServeMux and behind chi (secRouters), on a real redis-server.

import (
	"context"
	"errors"
	"fmt"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	herdprom "github.com/herdkit/herd/prometheus"
	prom "github.com/prometheus/client_golang/prometheus"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// cookieValues is what a handler reads of the cookie name: every value,
// in order, as net/http parses them.
func cookieValues(r *http.Request, name string) string {
	var vs []string
	for _, c := range r.CookiesNamed(name) {
		vs = append(vs, c.Value)
	}
	return fmt.Sprintf("%q", vs)
}

// TestKeyCookiesShareAndSplit: with KeyCookies lang, requests whose lang
// is the same share one entry whatever their other cookies (analytics,
// consent) and their order; each distinct lang (absent, empty, without
// '=', repeated, quoted, another value, a name a lenient parser reads as
// lang) gets an entry of its own. Under IgnoreCookies all of them share
// one entry. The handler sees every cookie the request carried.
func TestKeyCookiesShareAndSplit(t *testing.T) {
	c, rdb := newCache(t, nil)
	shared := [][]string{ // lang=de, with other cookies
		{"Cookie", "lang=de"},
		{"Cookie", "_ga=GA1.2.111.222; lang=de; consent=yes"},
		{"Cookie", "consent=no; _ga=GA1.2.333.444; lang=de"},
		{"Cookie", "lang=de; _gid=GA1.2.9; theme=dark"},
		{"Cookie", "  lang=de;;_ga=x"},
	}
	distinct := [][]string{ // each a different lang, none of them lang=de
		nil,
		{"Cookie", "_ga=GA1.2.111.222"}, // no lang: the entry of nil
		{"Cookie", "lang="},
		{"Cookie", "lang"},
		{"Cookie", "lang=fr"},
		{"Cookie", "lang=de; lang=fr"},
		{"Cookie", "lang=fr; lang=de"},
		{"Cookie", "lang=de; lang=de"},
		{"Cookie", `lang="de"`},
		{"Cookie", "Lang=de"},
		{"Cookie", "%6Cang=de"},
		{"Cookie", "_ga=1", "Cookie", "lang=de"}, // two Cookie fields
	}
	// sameAs maps a distinct request to the earlier one whose entry it
	// shares: only the request without lang shares with the one without
	// cookies.
	sameAs := map[int]int{1: 0}
	for _, rt := range secRouters {
		for _, mode := range []string{"KeyCookies", "IgnoreCookies"} {
			t.Run(rt.name+"/"+mode, func(t *testing.T) {
				opt := &Options{KeyCookies: []string{"lang"}}
				if mode == "IgnoreCookies" {
					opt = &Options{IgnoreCookies: true}
				}
				var runs atomic.Int64
				var mu sync.Mutex
				var seen []string // the Cookie header of each run
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					mu.Lock()
					seen = append(seen, strings.Join(r.Header.Values("Cookie"), " | "))
					mu.Unlock()
					fmt.Fprintf(w, "page in %s", cookieValues(r, "lang"))
				})
				srv, cl := secServe(t, rt.build(New(c, opt), h))
				url := srv.URL + "/catalog"

				first := secGet(t, cl, url, shared[1]...)
				if first.status != http.StatusOK || !sameStatus(first.cacheStatus(), statusStored) || first.body != `page in ["de"]` {
					t.Fatalf("first request: %v, want the lang=de page, stored", first)
				}
				if len(seen) != 1 || seen[0] != shared[1][1] {
					t.Errorf("the handler saw Cookie %q, want the request's whole header %q", seen, shared[1][1])
				}
				for i, hdr := range shared {
					r := secGet(t, cl, url, hdr...)
					if !strings.HasPrefix(r.cacheStatus(), statusHit) || r.body != first.body {
						t.Errorf("lang=de request %d (%q): %v, want a hit on the first request's page", i, hdr, r)
					}
				}
				if n := runs.Load(); n != 1 {
					t.Errorf("handler ran %d times for %d requests with lang=de, want 1", n, len(shared)+1)
				}

				runs.Store(0)
				bodies := make([]string, len(distinct))
				for i, hdr := range distinct {
					r := secGet(t, cl, url, hdr...)
					bodies[i] = r.body
					want := statusStored
					if mode == "IgnoreCookies" {
						want = statusHit
					} else if _, ok := sameAs[i]; ok {
						want = statusHit
					}
					if !strings.HasPrefix(r.cacheStatus(), want) {
						t.Errorf("request %d (%q): %v, want Cache-Status %q", i, hdr, r, want)
					}
				}
				wantRuns := int64(len(distinct) - len(sameAs))
				if mode == "IgnoreCookies" {
					wantRuns = 0 // all of them are the lang=de entry
				}
				if n := runs.Load(); n != wantRuns {
					t.Errorf("handler ran %d times for %d requests, want %d", n, len(distinct), wantRuns)
				}
				for i, hdr := range distinct {
					r := secGet(t, cl, url, hdr...)
					if !strings.HasPrefix(r.cacheStatus(), statusHit) || r.body != bodies[i] {
						t.Errorf("request %d (%q) again: %v, want a hit on its own page %q", i, hdr, r, bodies[i])
					}
				}
				if mode == "KeyCookies" {
					// Each body is what that request's handler run read.
					for i, want := range []string{`[]`, `[]`, `[""]`, `[""]`, `["fr"]`, `["de" "fr"]`, `["fr" "de"]`, `["de" "de"]`, `["de"]`, `[]`, `[]`, `["de"]`} {
						if bodies[i] != "page in "+want {
							t.Errorf("request %d (%q): body %q, want %q", i, distinct[i], bodies[i], "page in "+want)
						}
					}
					// The entries are the keys secKeyOfURL computes.
					for i, hdr := range distinct {
						if !secStored(t, rdb, secKeyOfURL(t, opt, url, hdr...)) {
							t.Errorf("request %d (%q): no entry under its key", i, hdr)
						}
					}
				}
			})
		}
	}
}

// TestCookieKey: the key component of KeyCookies, request by request.
// Requests in a "same" row must share a key, those in a "differ" row
// must not; under IgnoreCookies every request shares the cookieless key.
func TestCookieKey(t *testing.T) {
	opt := &Options{KeyCookies: []string{"lang", "currency"}}
	key := func(opt *Options, lines []string) string {
		r := httptest.NewRequest(http.MethodGet, "/p?q=1", nil)
		for _, l := range lines {
			r.Header.Add("Cookie", l)
		}
		return secKeyFor(t, opt, r)
	}
	for _, tc := range []struct {
		same bool
		a, b []string
	}{
		{true, []string{"lang=de"}, []string{"_ga=1; lang=de"}},
		{true, []string{"lang=de; currency=EUR"}, []string{"currency=EUR; x=1; lang=de"}},
		{true, []string{"lang=de"}, []string{"lang=de;"}},
		{true, []string{" lang=de"}, []string{"\tlang=de"}},
		{true, nil, []string{"_ga=1; consent=yes"}},
		{true, nil, []string{""}},
		{false, nil, []string{"lang="}},
		{false, []string{"lang"}, []string{"lang="}},
		{false, []string{"lang=de"}, []string{"lang=de; lang=de"}},
		{false, []string{"lang=de; lang=fr"}, []string{"lang=fr; lang=de"}},
		{false, []string{"lang=de"}, []string{`lang="de"`}},
		{false, []string{"lang=de"}, []string{"lang=de "}},
		{false, []string{"lang=de"}, []string{"lang=%64e"}},
		{false, nil, []string{"Lang=de"}},
		{false, nil, []string{"LANG=de"}},
		{false, nil, []string{"%6Cang=de"}},
		{false, nil, []string{"lang =de"}},
		{false, nil, []string{"lang[]=de"}},
		{false, []string{"lang=de"}, []string{"lang=de; Lang=fr"}},
		{false, []string{"x=1; lang=de"}, []string{"x=1", "lang=de"}},
		{false, []string{"lang=de", "currency=EUR"}, []string{"currency=EUR", "lang=de"}},
		{false, []string{"lang=de; currency=EUR"}, []string{"lang=EUR; currency=de"}},
	} {
		ka, kb := key(opt, tc.a), key(opt, tc.b)
		if (ka == kb) != tc.same {
			t.Errorf("Cookie %q and %q: same key %v, want %v\n%q\n%q", tc.a, tc.b, ka == kb, tc.same, ka, kb)
		}
		ignore := &Options{IgnoreCookies: true}
		if ka, kb := key(ignore, tc.a), key(ignore, nil); ka != kb {
			t.Errorf("IgnoreCookies: Cookie %q has key %q, want the cookieless %q", tc.a, ka, kb)
		}
	}
	// Listing a name twice, or in another order, is one configuration.
	again := &Options{KeyCookies: []string{"currency", "lang", "lang"}}
	if a, b := key(opt, []string{"lang=de; currency=EUR"}), key(again, []string{"lang=de; currency=EUR"}); a != b {
		t.Errorf("KeyCookies [lang currency] and [currency lang lang] key differently: %q, %q", a, b)
	}
}

// TestCookieOptionsResponseRules: under KeyCookies and IgnoreCookies a
// request's cookies no longer bypass the cache, but the response's own
// rules still hold: a response that sets a cookie, is private or no-store,
// or varies on Cookie is never stored nor served to another request, and
// no Set-Cookie is replayed.
func TestCookieOptionsResponseRules(t *testing.T) {
	c, rdb := newCache(t, nil)
	for _, rt := range secRouters {
		for _, mode := range []string{"KeyCookies", "IgnoreCookies"} {
			for _, resp := range []struct {
				name   string
				header []string
			}{
				{"Set-Cookie", nil}, // set from the run number below
				{"private", []string{"Cache-Control", "private, max-age=60"}},
				{"no-store", []string{"Cache-Control", "no-store"}},
				{"Vary Cookie", []string{"Vary", "Cookie"}},
			} {
				t.Run(rt.name+"/"+mode+"/"+resp.name, func(t *testing.T) {
					opt := &Options{KeyCookies: []string{"lang"}}
					if mode == "IgnoreCookies" {
						opt = &Options{IgnoreCookies: true}
					}
					var runs atomic.Int64
					h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						n := runs.Add(1)
						if resp.header == nil {
							http.SetCookie(w, &http.Cookie{Name: "session", Value: fmt.Sprintf("run%d", n)})
						}
						for i := 0; i+1 < len(resp.header); i += 2 {
							w.Header().Set(resp.header[i], resp.header[i+1])
						}
						fmt.Fprintf(w, "run%d", n)
					})
					srv, cl := secServe(t, rt.build(New(c, opt), h))
					url := srv.URL + "/page"
					const n = 3
					for i := range n {
						cookie := fmt.Sprintf("lang=de; _ga=GA1.2.%d", i)
						r := secGet(t, cl, url, "Cookie", cookie)
						want, status := fmt.Sprintf("run%d", i+1), statusMiss
						if i > 0 {
							status = statusHitForMiss // the first response marked the URL
						}
						if r.body != want || !sameStatus(r.cacheStatus(), status) {
							t.Errorf("request %d: %v, want its own run %q, not stored (%q)", i, r, want, status)
						}
						if got := r.header.Get("Set-Cookie"); resp.header == nil && !strings.HasPrefix(got, "session="+want) {
							t.Errorf("request %d: Set-Cookie %q, want the cookie of its own run", i, got)
						}
					}
					if got := runs.Load(); got != n {
						t.Errorf("handler ran %d times for %d requests, want %d (nothing shared)", got, n, n)
					}
					if secStored(t, rdb, secKeyOfURL(t, opt, url, "Cookie", "lang=de")) {
						t.Errorf("the response is stored")
					}
				})
			}
		}
	}
}

// TestCookieOptionsCredentials: KeyCookies and IgnoreCookies take the
// Cookie header, and only it, out of the credentials. Authorization still
// bypasses, and with AllowAuthorized its responses are stored only if they
// say public. Without either option a request with any cookie bypasses
// as before, whatever else is keyed.
func TestCookieOptionsCredentials(t *testing.T) {
	c, _ := newCache(t, nil)
	type step struct {
		hdr        []string
		cc         string // the response's Cache-Control
		wantStatus string // Cache-Status prefix
		wantBypass string // the OnBypass reason, "" for none
	}
	const cookie = "lang=de; _ga=GA1.2.3"
	cases := []struct {
		name  string
		opt   Options
		steps []step
	}{
		{"default", Options{}, []step{
			{[]string{"Cookie", cookie}, "", statusBypass, BypassCredentials},
			{[]string{"Cookie", cookie}, "public", statusBypass, BypassCredentials},
		}},
		{"default KeyHeaders Accept-Language", Options{KeyHeaders: []string{"Accept-Language"}}, []step{
			{[]string{"Cookie", cookie, "Accept-Language", "de"}, "", statusBypass, BypassCredentials},
		}},
		{"default AllowAuthorized", Options{AllowAuthorized: true}, []step{
			{[]string{"Cookie", cookie}, "", statusMiss, ""}, // credentials outside the key: not stored without public
		}},
		{"KeyCookies", Options{KeyCookies: []string{"lang"}}, []step{
			{[]string{"Cookie", cookie}, "", statusStored, ""},
			{[]string{"Cookie", cookie, "Authorization", "Bearer A"}, "public", statusBypass, BypassCredentials},
			{[]string{"Authorization", "Bearer A"}, "public", statusBypass, BypassCredentials},
			{[]string{"Cookie", cookie, "X-Forwarded-User", "alice"}, "public", statusBypass, BypassCredentials},
		}},
		{"IgnoreCookies", Options{IgnoreCookies: true}, []step{
			{[]string{"Cookie", cookie}, "", statusStored, ""},
			{[]string{"Cookie", cookie, "Authorization", "Bearer A"}, "public", statusBypass, BypassCredentials},
		}},
		{"KeyCookies AllowAuthorized", Options{KeyCookies: []string{"lang"}, AllowAuthorized: true}, []step{
			{[]string{"Cookie", cookie}, "", statusStored, ""},                            // the cookies are all accounted for
			{[]string{"Cookie", cookie, "Authorization", "Bearer A"}, "", statusMiss, ""}, // Authorization is not
			{[]string{"Cookie", cookie, "Authorization", "Bearer A"}, "public", statusStored, ""},
		}},
		{"IgnoreCookies KeyFunc", Options{IgnoreCookies: true, KeyFunc: func(r *http.Request) (string, bool) { return r.URL.Path, true }}, []step{
			{[]string{"Cookie", cookie}, "", statusStored, ""},
		}},
	}
	for _, rt := range secRouters {
		for _, tc := range cases {
			t.Run(rt.name+"/"+tc.name, func(t *testing.T) {
				var mu sync.Mutex
				var reasons []string
				opt := tc.opt
				opt.OnBypass = func(r *http.Request, reason string) {
					mu.Lock()
					defer mu.Unlock()
					reasons = append(reasons, reason)
				}
				var cc atomic.Value
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if v := cc.Load().(string); v != "" {
						w.Header().Set("Cache-Control", v)
					}
					fmt.Fprintf(w, "page for %q", r.Header.Get("Authorization"))
				})
				opt.Scope = rt.name + "/" + tc.name // KeyFunc's keys hold no host: a scope per case
				srv, cl := secServe(t, rt.build(New(c, &opt), h))
				for i, s := range tc.steps {
					mu.Lock()
					reasons = nil
					mu.Unlock()
					cc.Store(s.cc)
					// A path per step: each starts cold.
					url := fmt.Sprintf("%s/step%d", srv.URL, i)
					r := secGet(t, cl, url, s.hdr...)
					mu.Lock()
					got := strings.Join(reasons, ",")
					mu.Unlock()
					if !strings.HasPrefix(r.cacheStatus(), s.wantStatus) || got != s.wantBypass {
						t.Errorf("step %d (%q, response %q): %v, OnBypass %q; want Cache-Status %q, OnBypass %q", i, s.hdr, s.cc, r, got, s.wantStatus, s.wantBypass)
					}
				}
			})
		}
	}
}

// TestCookieOptionsInvalid: New panics, naming the option, on a
// KeyCookies name that is not a token and on cookie options that
// contradict each other or the key.
func TestCookieOptionsInvalid(t *testing.T) {
	c, _ := newCache(t, nil)
	keyFunc := func(r *http.Request) (string, bool) { return "k", true }
	for _, tc := range []struct {
		name string
		opt  Options
		want string // in the panic message
	}{
		{"empty name", Options{KeyCookies: []string{""}}, "KeyCookies"},
		{"space", Options{KeyCookies: []string{"my lang"}}, "KeyCookies"},
		{"semicolon", Options{KeyCookies: []string{"a;b"}}, "KeyCookies"},
		{"equals", Options{KeyCookies: []string{"lang=de"}}, "KeyCookies"},
		{"comma", Options{KeyCookies: []string{"a,b"}}, "KeyCookies"},
		{"quote", Options{KeyCookies: []string{`"lang"`}}, "KeyCookies"},
		{"control", Options{KeyCookies: []string{"lang\r\n"}}, "KeyCookies"},
		{"non-ASCII", Options{KeyCookies: []string{"längd"}}, "KeyCookies"},
		{"one good one bad", Options{KeyCookies: []string{"lang", "a b"}}, "KeyCookies"},
		{"both", Options{KeyCookies: []string{"lang"}, IgnoreCookies: true}, "IgnoreCookies"},
		{"KeyCookies KeyFunc", Options{KeyCookies: []string{"lang"}, KeyFunc: keyFunc}, "KeyFunc"},
		{"KeyCookies KeyHeaders Cookie", Options{KeyCookies: []string{"lang"}, KeyHeaders: []string{"cookie"}}, "KeyHeaders"},
		{"IgnoreCookies KeyHeaders Cookie", Options{IgnoreCookies: true, KeyHeaders: []string{"Cookie"}}, "KeyHeaders"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				s, _ := recover().(string)
				if !strings.HasPrefix(s, "herd/middleware: ") || !strings.Contains(s, "Options."+tc.want) {
					t.Errorf("New panicked with %q, want a message with the package prefix naming Options.%s", s, tc.want)
				}
			}()
			New(c, &tc.opt)
			t.Errorf("New did not panic")
		})
	}
	// Valid names: every token character.
	New(c, &Options{KeyCookies: []string{"lang", "__Host-sid", "a!#$%&'*+-.^_`|~9Z"}})
}

// BenchmarkKeyCookies measures what KeyCookies adds to building a key: a
// typical URL without cookies and default options (the baseline), then
// with a browser's Cookie header (analytics, consent and two listed
// preferences) under IgnoreCookies and under KeyCookies, and a 4 KiB
// header of 100 cookies under KeyCookies.
func BenchmarkKeyCookies(b *testing.B) {
	const browser = "_ga=GA1.2.1234567890.1700000000; _gid=GA1.2.987654321.1700000000; _fbp=fb.1.1700000000.123; consent=analytics%2Cads; lang=de; currency=EUR"
	var many []string
	for i := range 100 {
		many = append(many, fmt.Sprintf("c%03d=%032d", i, i))
	}
	keyed := &Options{KeyCookies: []string{"lang", "currency"}}
	for _, tc := range []struct {
		name   string
		opt    *Options
		cookie string
	}{
		{"baseline-no-cookie", nil, ""},
		{"IgnoreCookies-browser", &Options{IgnoreCookies: true}, browser},
		{"KeyCookies-browser", keyed, browser},
		{"KeyCookies-100-cookies", keyed, strings.Join(many, "; ") + "; lang=de"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			hd := &handler{cfg: tc.opt.resolve()}
			r := httptest.NewRequest(http.MethodGet, "/products/42?color=blue&size=m", nil)
			r.Host = "catalog.example"
			if tc.cookie != "" {
				r.Header.Set("Cookie", tc.cookie)
			}
			if _, ok := hd.key(r); !ok {
				b.Fatal("the request bypasses the cache")
			}
			b.ReportAllocs()
			for b.Loop() {
				hd.key(r)
			}
		})
	}
}

// rackCookie reads a cookie as Rack 2 (Ruby) does, and RFC 2965 parsers
// did: pairs separated by ';' or ',', each trimmed. It returns the first
// value of name.
func rackCookie(r *http.Request, name string) string {
	for _, line := range r.Header.Values("Cookie") {
		for _, part := range regexp.MustCompile(`[;,] *`).Split(line, -1) {
			if n, v, ok := strings.Cut(strings.TrimSpace(part), "="); ok && n == name {
				return v
			}
		}
	}
	return ""
}

// pyCookie reads a cookie as Python's http.cookies.SimpleCookie does for
// plain tokens: pairs end at ';' or at whitespace.
func pyCookie(r *http.Request, name string) string {
	for _, line := range r.Header.Values("Cookie") {
		for _, part := range strings.FieldsFunc(line, func(c rune) bool { return c == ';' || c == ' ' || c == '\t' }) {
			if n, v, ok := strings.Cut(part, "="); ok && n == name {
				return v
			}
		}
	}
	return ""
}

// TestKeyCookiesSeparatorPoisoning: a listed cookie that a lenient
// parser finds after a ',' or a space inside another cookie's pair
// ("x=1, lang=de": Rack 2 and RFC 2965 parsers split on ','; Python's
// SimpleCookie on spaces) must be keyed, as a listed name in another
// spelling is: otherwise the request shares the entry of the requests
// without it and poisons it with the page for its language.
func TestKeyCookiesSeparatorPoisoning(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		for _, tc := range []struct {
			name   string
			read   func(*http.Request, string) string
			cookie string
		}{
			{"comma", rackCookie, "x=1, lang=de"},
			{"comma-nospace", rackCookie, "x=1,lang=de"},
			{"space", pyCookie, "x=1 lang=de"},
			{"tab", pyCookie, "x=1\tlang=de"},
		} {
			t.Run(rt.name+"/"+tc.name, func(t *testing.T) {
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					lang := tc.read(r, "lang")
					if lang == "" {
						lang = "en"
					}
					fmt.Fprintf(w, "page in %s", lang)
				})
				srv, cl := secServe(t, rt.build(New(c, &Options{KeyCookies: []string{"lang"}}), h))
				url := srv.URL + "/sep/" + tc.name
				if a := secGet(t, cl, url, "Cookie", tc.cookie); a.body != "page in de" {
					t.Fatalf("the attacker's request: %v (the test's premise)", a)
				}
				for _, hdr := range [][]string{nil, {"Cookie", "x=1"}} {
					if v := secGet(t, cl, url, hdr...); v.body != "page in en" {
						t.Errorf("a victim (%q): %v, want the English page", hdr, v)
					}
				}
			})
		}
	}
}

// TestCookieKeySeparators: at the key level, a listed name after ',' or
// whitespace in an unlisted pair is keyed; an unlisted cookie whose value
// holds such separators but no listed name is not.
func TestCookieKeySeparators(t *testing.T) {
	opt := &Options{KeyCookies: []string{"lang"}}
	key := func(line string) string {
		r := secNewReq(t, http.MethodGet, "http://k.test/p", nil)
		r.RequestURI = "/p"
		if line != "" {
			r.Header.Set("Cookie", line)
		}
		return secKeyFor(t, opt, r)
	}
	plain := key("")
	for _, line := range []string{"x=1, lang=de", "x=1,lang=de", "x=1 lang=de", "x=1\tlang=de", "x=a, Lang=de", "x=1 , %6Cang=de"} {
		if key(line) == plain {
			t.Errorf("Cookie %q has the key of a request without lang", line)
		}
	}
	for _, line := range []string{"x=1, y=2", "_ga=GA1.2 3", "x=1 , language=de"} {
		if key(line) != plain {
			t.Errorf("Cookie %q: keyed, though no parser reads lang in it", line)
		}
	}
}

// TestClassCutIsValidUTF8: Options.Class is cut to 128 bytes; the cut
// must not split a character, and a class that is not UTF-8 must not
// reach the metrics as it is: Prometheus label values must be UTF-8, and
// herd's adapter panics on one that is not (in a request, or in the
// Cache's background work). A route of non-ASCII segments longer than
// 128 bytes is enough.
func TestClassCutIsValidUTF8(t *testing.T) {
	long := "/" + strings.Repeat("a", 125) + "/é/{id}" // 'é' spans bytes 127 and 128
	for _, rt := range secRouters {
		for name, class := range map[string]string{"cut": long, "invalid": "/caf\xe9/{id}"} {
			t.Run(rt.name+"/"+name, func(t *testing.T) {
				reg := prom.NewRegistry()
				c, _ := newCache(t, &herd.Options{Observer: herdprom.NewObserver(reg, nil), KeyClass: KeyClass(nil)})
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "page") })
				mw := New(c, &Options{Class: func(*http.Request) string { return class }})
				srv, cl := secServe(t, rt.build(mw, h))
				for i := range 2 {
					if a := secGet(t, cl, srv.URL+"/class/"+name); a.status != http.StatusOK || a.body != "page" {
						t.Fatalf("request %d: %v", i, a)
					}
				}
				mfs, err := reg.Gather()
				if err != nil {
					t.Fatal(err)
				}
				var classes []string
				for _, mf := range mfs {
					if mf.GetName() != "herd_lookups_total" {
						continue
					}
					for _, m := range mf.GetMetric() {
						for _, lp := range m.GetLabel() {
							if lp.GetName() == "class" {
								classes = append(classes, lp.GetValue())
								if !utf8.ValidString(lp.GetValue()) {
									t.Errorf("class label %q is not UTF-8", lp.GetValue())
								}
							}
						}
					}
				}
				if len(classes) == 0 {
					t.Errorf("no lookups counted")
				}
			})
		}
	}
}

// TestClassCutAtCharacter: the 128-byte cut of a class never splits a
// character (KeyClass reads back a UTF-8 prefix of the class).
func TestClassCutAtCharacter(t *testing.T) {
	class := "/" + strings.Repeat("a", 125) + "/é/{id}"
	h := &handler{cfg: (&Options{Class: func(*http.Request) string { return class }}).resolve()}
	got := KeyClass(nil)(h.classKey(secNewReq(t, http.MethodGet, "http://k.test/", nil)) + "rest")
	if !utf8.ValidString(got) || !strings.HasPrefix(class, got) || len(got) < 120 {
		t.Errorf("class %q read back as %q: want a UTF-8 prefix of it", class, got)
	}
}

// gzipHandler answers a text body, gzip-coded when the request it is
// shown accepts gzip (as chi's Compress middleware inside the cache).
func gzipHandler(body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(gzipBytes([]byte(body), 6))
			return
		}
		io.WriteString(w, body)
	})
}

// TestGzipRepresentationETagWhenNotStored: a gzip response the handler
// coded itself carries the gzip representation's ETag (its own, not the
// identity one) even when it is not stored (here: larger than the
// Cache's MaxValueBytes), so that two representations never share a
// strong validator, and an If-None-Match of the identity ETag is no 304
// for the gzip bytes.
func TestGzipRepresentationETagWhenNotStored(t *testing.T) {
	c, _ := newCache(t, &herd.Options{MaxValueBytes: 1024})
	body := strings.Repeat("x", 8000) // and digits that gzip leaves above MaxValueBytes
	for i := range 2000 {
		body += strconv.Itoa(i * 7919 % 1000003)
	}
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			srv, cl := secServe(t, rt.build(New(c, nil), gzipHandler(body)))
			url := srv.URL + "/gz/unstored"
			id := secGet(t, cl, url)
			gz := secGet(t, cl, url, "Accept-Encoding", "gzip")
			if id.body != body || gz.header.Get("Content-Encoding") != "gzip" {
				t.Fatalf("identity %v, gzip %v (the test's premise)", id, gz)
			}
			if again := secGet(t, cl, url); strings.HasPrefix(again.cacheStatus(), statusHit) {
				t.Fatalf("stored: %v (the test's premise)", again)
			}
			tid, tgz := id.header.Get("Etag"), gz.header.Get("Etag")
			if tid == "" || tid == tgz {
				t.Errorf("identity ETag %q, gzip ETag %q: want two validators", tid, tgz)
			}
			if r := secGet(t, cl, url, "Accept-Encoding", "gzip", "If-None-Match", tid); r.status == http.StatusNotModified {
				t.Errorf("gzip request with the identity ETag: %v, want the gzip body", r)
			}
		})
	}
}

// TestForeignNegativeEntryReplaced: a negative entry at a middleware key
// (another writer's Cache.Get whose loader said ErrNotFound, for an hour)
// is a value the middleware cannot serve: it is replaced by the next
// rebuild, as a corrupt value is, not bypassed until it expires, with
// every request running the handler uncoalesced.
func TestForeignNegativeEntryReplaced(t *testing.T) {
	srv := redistest.Start(t)
	c := herd.New(srv.Client(t), nil)
	shareScopes(c) // a middleware per router
	other := herd.New(srv.Client(t), &herd.Options{NegativeTTL: time.Hour})
	t.Cleanup(func() { c.Close(); other.Close() })
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				io.WriteString(w, "page")
			})
			s, cl := secServe(t, rt.build(New(c, nil), h))
			url := s.URL + "/negative"
			key := secKeyOfURL(t, nil, url)
			_, err := other.Get(context.Background(), key, time.Hour, func(context.Context) ([]byte, error) { return nil, herd.ErrNotFound })
			if !errors.Is(err, herd.ErrNotFound) {
				t.Fatalf("the foreign writer's Get: %v (the test's premise)", err)
			}
			if a := secGet(t, cl, url); a.body != "page" {
				t.Fatalf("first request: %v", a)
			}
			if b := secGet(t, cl, url); !strings.HasPrefix(b.cacheStatus(), statusHit) {
				t.Errorf("second request: %v, want a hit on the entry that replaced the negative one", b)
			}
		})
	}
}

// TestGzipAlwaysHandlerIdentityLeader: a handler that gzips whatever
// Accept-Encoding it is shown (a precompressed asset) is stored gzip-coded
// and decoded for clients without gzip, the one that led the rebuild
// included, whether its entry was stored or not (here: too large for the
// Cache's MaxValueBytes): its response must not keep the handler's
// Content-Encoding (nor a digest of the gzip bytes) over the decoded body.
func TestGzipAlwaysHandlerIdentityLeader(t *testing.T) {
	stored, _ := newCache(t, nil)
	small, _ := newCache(t, &herd.Options{MaxValueBytes: 1024})
	body := strings.Repeat("precompressed ", 200)
	for i := range 2000 {
		body += strconv.Itoa(i * 7919 % 1000003) // gzip leaves this above 1 KiB
	}
	gz := gzipBytes([]byte(body), 6)
	for _, rt := range secRouters {
		for name, c := range map[string]*herd.Cache{"stored": stored, "unstored": small} {
			t.Run(rt.name+"/"+name, func(t *testing.T) {
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/plain")
					w.Header().Set("Content-Encoding", "gzip")
					w.Header().Set("Repr-Digest", "sha-256=:gzipbytes:")
					w.Write(gz)
				})
				srv, cl := secServe(t, rt.build(New(c, nil), h))
				url := srv.URL + "/gzalways/" + name
				for i := range 2 {
					a := secGet(t, cl, url)
					if a.body != body || a.header.Get("Content-Encoding") != "" || a.header.Get("Repr-Digest") != "" {
						t.Errorf("identity request %d: %v, Content-Encoding %q, Repr-Digest %q; want the decoded body without them", i, a, a.header.Get("Content-Encoding"), a.header.Get("Repr-Digest"))
					}
				}
			})
		}
	}
}

// TestLateSetCookieNotStored: a Set-Cookie the handler adds after
// WriteHeader, or after writing the body (net/http would not send it; a
// handler that relies on that is still one that sets a cookie), keeps
// the response out of the cache under IgnoreCookies: the next request
// gets its own response, and never the cookie.
func TestLateSetCookieNotStored(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		for _, when := range []string{"after-writeheader", "after-write"} {
			t.Run(rt.name+"/"+when, func(t *testing.T) {
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					n := runs.Add(1)
					if when == "after-writeheader" {
						w.WriteHeader(http.StatusOK)
						w.Header().Set("Set-Cookie", fmt.Sprintf("session=%d", n))
						fmt.Fprintf(w, "page %d", n)
						return
					}
					fmt.Fprintf(w, "page %d", n)
					w.Header().Set("Set-Cookie", fmt.Sprintf("session=%d", n))
				})
				srv, cl := secServe(t, rt.build(New(c, &Options{IgnoreCookies: true}), h))
				url := srv.URL + "/late/" + when
				secGet(t, cl, url, "Cookie", "a=1")
				b := secGet(t, cl, url)
				if b.body == "page 1" || strings.Contains(b.header.Get("Set-Cookie"), "session=1") {
					t.Errorf("second request: %v, Set-Cookie %q: the first response was shared", b, b.header.Get("Set-Cookie"))
				}
			})
		}
	}
}

// TestCookieKeyNULName: PHP decodes a cookie name's %-escapes and then
// reads it as a C string, up to its first NUL: "lang%00x=de" is lang=de
// to it. Such a pair must be keyed, as %6Cang is.
func TestCookieKeyNULName(t *testing.T) {
	opt := &Options{KeyCookies: []string{"lang"}}
	key := func(line string) string {
		r := secNewReq(t, http.MethodGet, "http://k.test/p", nil)
		r.RequestURI = "/p"
		if line != "" {
			r.Header.Set("Cookie", line)
		}
		return secKeyFor(t, opt, r)
	}
	plain := key("")
	for _, line := range []string{"lang%00=de", "lang%00x=de", "x=1, lang%00=de"} {
		if key(line) == plain {
			t.Errorf("Cookie %q has the key of a request without lang", line)
		}
	}
	if key("%00lang=de") != plain {
		t.Errorf("Cookie %%00lang: keyed, though PHP reads an empty name")
	}
}
