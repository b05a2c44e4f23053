package middleware

// Attacks on the features of issue 15 (cookies, hit-for-miss, encodings,
// metrics), each with the defence that makes it fail. Every end-to-end
// test runs on http.ServeMux and chi, on a real redis-server.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	herdprom "github.com/herdkit/herd/prometheus"
	prom "github.com/prometheus/client_golang/prometheus"
)

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
