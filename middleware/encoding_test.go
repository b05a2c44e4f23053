package middleware

// Accept-Encoding buckets and the shared entry (encoding.go), and gzip
// storage (compress.go): each HTTP test runs on http.ServeMux and on chi
// (secRouters), on a real redis-server.

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/redis/go-redis/v9"
)

// testPage is a product listing of about size bytes of HTML: markup and
// text as a real page has them, compressible as much as one is (4-6x).
func testPage(size int) string {
	words := strings.Fields("widget gadget blue small large steel oak linen premium classic " +
		"delivery returns stock warranty colour size review rating price offer bundle")
	rng := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	b.WriteString("<!doctype html><html><head><title>Catalog</title></head><body><ul class=\"products\">\n")
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, `<li class="product" data-id="%d"><a href="/products/%d">`, 1000+rng.IntN(9000), i)
		for range 3 + rng.IntN(4) {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "</a><span class=\"price\">%d.%02d</span><p>", rng.IntN(500), rng.IntN(100))
		for range 8 + rng.IntN(12) {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(' ')
		}
		b.WriteString("</p></li>\n")
	}
	b.WriteString("</ul></body></html>\n")
	return b.String()
}

func gzipString(t testing.TB, s string) string {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := io.WriteString(zw, s); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// gunzipString decodes s, or returns a description of why it does not.
func gunzipString(s string) string {
	zr, err := gzip.NewReader(strings.NewReader(s))
	if err != nil {
		return "(not gzip: " + err.Error() + ")"
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		return "(bad gzip: " + err.Error() + ")"
	}
	return string(b)
}

// storedBytes is the length of the Redis value of the middleware key of
// a GET of url under opt (0 when there is none).
func storedBytes(t *testing.T, rdb *redis.Client, opt *Options, url string, hdr ...string) int64 {
	t.Helper()
	key := secKeyOfURL(t, opt, url, hdr...)
	if !secStored(t, rdb, key) {
		return 0 // nothing, or a hit-for-miss mark
	}
	n, err := rdb.StrLen(context.Background(), secRedisKey(key, "v")).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestParseAcceptEncoding(t *testing.T) {
	const (
		none = accepted(0)
		gz   = acceptsGzip
		br   = acceptsBr
		both = acceptsGzip | acceptsBr
	)
	for _, tc := range []struct {
		values []string
		want   accepted
	}{
		{nil, none}, // no field: identity, although RFC 9110 allows any coding
		{[]string{""}, none},
		{[]string{"identity"}, none},
		{[]string{"gzip"}, gz},
		{[]string{"x-gzip"}, gz},
		{[]string{"GZip"}, gz},
		{[]string{" gzip ; q=0.5 "}, gz},
		{[]string{"br"}, br},
		{[]string{"gzip, deflate, br, zstd"}, both},
		{[]string{"br;q=1.0, gzip;q=0.8"}, both},
		{[]string{"gzip", "br"}, both},
		{[]string{"*"}, both},
		{[]string{"*;q=0.1"}, both},
		{[]string{"*, gzip;q=0"}, br},
		{[]string{"*;q=0, gzip"}, gz},
		{[]string{"*;q=0"}, none},
		{[]string{"gzip;q=0"}, none},
		{[]string{"gzip;Q=0"}, none},
		{[]string{"gzip;q=0.0"}, none},
		{[]string{"gzip;q=0.000"}, none},
		{[]string{"gzip;q=0.001"}, gz},
		{[]string{"gzip;q=1.000"}, gz},
		{[]string{"gzip;q=1.001"}, none},  // not a qvalue: in doubt, not accepted
		{[]string{"gzip;q=0.0000"}, none}, // four decimals: not a qvalue
		{[]string{"gzip;q=2"}, none},
		{[]string{"gzip;q=abc"}, none},
		{[]string{"gzip;q="}, none},
		{[]string{"gzip;q=.5"}, none},
		{[]string{"gzip;level=9"}, gz},
		{[]string{"gzip, gzip;q=0"}, none}, // listed twice, once refused
		{[]string{"gzip;q=0, br;q=0", "*"}, none},
		{[]string{"identity;q=0"}, none},
		{[]string{"gzip, identity;q=0"}, gz},
		{[]string{"zstd, deflate, compress"}, none},
		{[]string{"gzipx, xbr, br2"}, none},
		{[]string{",,gzip,,"}, gz},
	} {
		if got := parseAcceptEncoding(tc.values); got != tc.want {
			t.Errorf("Accept-Encoding %q: got %b, want %b", tc.values, got, tc.want)
		}
	}
}

// TestAcceptEncodingBuckets: with Accept-Encoding in KeyHeaders, the key
// holds the client's bucket, not its field. Every spelling of a bucket
// shares its entry (one handler run per bucket, however many spellings),
// the handler sees the bucket's codings, and each client gets a coding it
// accepts: a gzip client never gets br, an identity client never gets a
// coded body.
func TestAcceptEncodingBuckets(t *testing.T) {
	c, _ := newCache(t, nil)
	opt := &Options{KeyHeaders: []string{"Accept-Encoding"}}
	buckets := []struct {
		shown     string     // the Accept-Encoding the handler sees
		spellings [][]string // the clients' fields (nil: none)
	}{
		{"br, gzip", [][]string{{"gzip, deflate, br, zstd"}, {"br;q=1.0, gzip;q=0.8"}, {"*"}, {"GZIP , Br"}, {"gzip", "br"}, {"x-gzip;q=0.5, br"}}},
		{"br", [][]string{{"br"}, {"br, gzip;q=0"}, {"*, gzip;q=0"}, {"br;q=0.001"}}},
		{"gzip", [][]string{{"gzip"}, {"gzip, deflate"}, {"x-gzip"}, {"gzip;q=0.5, br;q=0"}, {"*;q=0, gzip"}}},
		{"identity", [][]string{nil, {""}, {"identity"}, {"zstd, deflate"}, {"gzip;q=0, br;q=0"}, {"*;q=0"}, {"identity;q=0"}, {"gzip;q=2"}, {"gzip;q=0.0000"}}},
	}
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			runs := map[string]*atomic.Int64{}
			for _, b := range buckets {
				runs[b.shown] = new(atomic.Int64)
			}
			// A handler that codes with the best coding it is offered.
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				shown := strings.Join(r.Header.Values("Accept-Encoding"), "|")
				if n, ok := runs[shown]; ok {
					n.Add(1)
				} else {
					t.Errorf("the handler saw Accept-Encoding %q", shown)
				}
				page := "page for " + shown
				w.Header().Set("Vary", "Accept-Encoding")
				switch {
				case strings.Contains(shown, "br"):
					w.Header().Set("Content-Encoding", "br")
					io.WriteString(w, "BR:"+page) // no client here decodes it
				case strings.Contains(shown, "gzip"):
					w.Header().Set("Content-Encoding", "gzip")
					io.WriteString(w, gzipString(t, page))
				default:
					io.WriteString(w, page)
				}
			})
			srv, cl := secServe(t, rt.build(New(c, opt), h))
			url := srv.URL + "/buckets"
			for _, b := range buckets {
				for i, values := range b.spellings {
					req := secNewReq(t, http.MethodGet, url, nil)
					for _, v := range values {
						req.Header.Add("Accept-Encoding", v)
					}
					r := secSend(t, cl, req)
					want := statusHit
					if i == 0 {
						want = statusStored
					}
					ce := r.header.Get("Content-Encoding")
					page := "page for " + b.shown
					var ok bool
					switch b.shown {
					case "br, gzip", "br":
						ok = ce == "br" && r.body == "BR:"+page
					case "gzip":
						ok = ce == "gzip" && gunzipString(r.body) == page
					default:
						ok = ce == "" && r.body == page
					}
					if !strings.HasPrefix(r.cacheStatus(), want) || !ok {
						t.Errorf("Accept-Encoding %q (bucket %q): %v, Content-Encoding %q; want %q, coded for the bucket", values, b.shown, r, ce, want)
					}
				}
				if got := runs[b.shown].Load(); got != 1 {
					t.Errorf("bucket %q: the handler ran %d times for %d spellings, want 1", b.shown, got, len(b.spellings))
				}
			}
		})
	}
}

// TestSharedEntryHandlerGzip: by default all clients share one entry. A
// handler that compresses itself (chi's Compress middleware inside the
// cache) is shown gzip or identity as its own client accepts, and its
// Vary: Accept-Encoding response is stored; a gzip client gets its gzip
// bytes, any other client the decoded page: each representation with its
// own ETag, Content-Length, 304 and HEAD.
func TestSharedEntryHandlerGzip(t *testing.T) {
	c, rdb := newCache(t, nil)
	page := testPage(32 << 10)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			var shownMu sync.Mutex
			var shown []string // the Accept-Encoding of each run
			h := chimw.Compress(5)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				shownMu.Lock()
				shown = append(shown, r.Header.Get("Accept-Encoding"))
				shownMu.Unlock()
				w.Header().Set("Content-Type", "text/html; charset=utf-8")
				io.WriteString(w, page)
			}))
			srv, cl := secServe(t, rt.build(New(c, nil), h))

			t.Run("gzip leader", func(t *testing.T) {
				runs.Store(0)
				shownMu.Lock()
				shown = nil
				shownMu.Unlock()
				url := srv.URL + "/shared/gzip-first"
				gz := secGet(t, cl, url, "Accept-Encoding", "gzip, deflate, br")
				if !sameStatus(gz.cacheStatus(), statusStored) || gz.header.Get("Content-Encoding") != "gzip" || gunzipString(gz.body) != page {
					t.Fatalf("gzip client: %v, Content-Encoding %q; want stored gzip of the page", gz, gz.header.Get("Content-Encoding"))
				}
				if n := storedBytes(t, rdb, nil, url); n == 0 || n > int64(len(page)/3) {
					t.Errorf("%d bytes in Redis for a %d-byte page the handler compressed, want the compressed size", n, len(page))
				}
				checkRepresentations(t, cl, url, page, gz)
				shownMu.Lock()
				defer shownMu.Unlock()
				if runs.Load() != 1 || shown[0] != "gzip" {
					t.Errorf("the handler ran %d times, shown Accept-Encoding %q; want once, shown gzip", runs.Load(), shown)
				}
			})

			t.Run("identity leader", func(t *testing.T) {
				runs.Store(0)
				shownMu.Lock()
				shown = nil
				shownMu.Unlock()
				url := srv.URL + "/shared/identity-first"
				id := secGet(t, cl, url, "Accept-Encoding", "br") // a client without gzip
				if !sameStatus(id.cacheStatus(), statusStored) || id.header.Get("Content-Encoding") != "" || id.body != page {
					t.Fatalf("br-only client: %v, Content-Encoding %q; want the page, stored", id, id.header.Get("Content-Encoding"))
				}
				// Compress is off: the handler's identity body is stored and
				// served to everyone as it is.
				gz := secGet(t, cl, url, "Accept-Encoding", "gzip")
				if !strings.HasPrefix(gz.cacheStatus(), statusHit) || gz.header.Get("Content-Encoding") != "" || gz.body != page || gz.header.Get("Etag") != id.header.Get("Etag") {
					t.Errorf("gzip client: %v, Content-Encoding %q, ETag %q; want a hit of the identity page, ETag %q", gz, gz.header.Get("Content-Encoding"), gz.header.Get("Etag"), id.header.Get("Etag"))
				}
				shownMu.Lock()
				defer shownMu.Unlock()
				if runs.Load() != 1 || shown[0] != "identity" {
					t.Errorf("the handler ran %d times, shown Accept-Encoding %q; want once, shown identity", runs.Load(), shown)
				}
			})
		})
	}
}

// checkRepresentations checks the two representations of a gzip-coded
// entry of page at url, of which gz is the gzip one a gzip client got:
// every kind of client gets the one it accepts from the one entry (a
// hit), each with its own ETag, Content-Length, Vary: Accept-Encoding,
// If-None-Match (a 304 for its own ETag only) and HEAD.
func checkRepresentations(t *testing.T, cl *http.Client, url, page string, gz secResp) {
	t.Helper()
	gzTag := gz.header.Get("Etag")
	if gzTag == "" || !strings.HasSuffix(gzTag, `-gzip"`) {
		t.Errorf("gzip representation: ETag %q, want one ending in -gzip", gzTag)
	}
	var idTag string
	for _, ae := range []string{"", "identity", "br", "gzip;q=0, br", "zstd", "*;q=0"} {
		hdr := []string{"Accept-Encoding", ae}
		if ae == "" {
			hdr = nil // no field
		}
		r := secGet(t, cl, url, hdr...)
		if !strings.HasPrefix(r.cacheStatus(), statusHit) || r.header.Get("Content-Encoding") != "" || r.body != page {
			t.Errorf("Accept-Encoding %q: %v, Content-Encoding %q; want a hit of the exact page", ae, r, r.header.Get("Content-Encoding"))
		}
		if cl := r.header.Get("Content-Length"); cl != fmt.Sprint(len(page)) {
			t.Errorf("Accept-Encoding %q: Content-Length %s, want %d", ae, cl, len(page))
		}
		if idTag == "" {
			idTag = r.header.Get("Etag")
		}
		if tag := r.header.Get("Etag"); tag == "" || tag == gzTag || tag != idTag {
			t.Errorf("Accept-Encoding %q: ETag %q, want one identity ETag %q, not the gzip one %q", ae, tag, idTag, gzTag)
		}
		if !strings.Contains(strings.Join(r.header.Values("Vary"), ","), "Accept-Encoding") {
			t.Errorf("Accept-Encoding %q: Vary %q, want Accept-Encoding", ae, r.header.Values("Vary"))
		}
	}
	again := secGet(t, cl, url, "Accept-Encoding", "gzip")
	if !strings.HasPrefix(again.cacheStatus(), statusHit) || again.body != gz.body || again.header.Get("Etag") != gzTag ||
		again.header.Get("Content-Length") != fmt.Sprint(len(gz.body)) || !strings.Contains(strings.Join(again.header.Values("Vary"), ","), "Accept-Encoding") {
		t.Errorf("gzip client again: %v, ETag %q, Content-Length %q, Vary %q; want a hit of the same %d gzip bytes, ETag %q",
			again, again.header.Get("Etag"), again.header.Get("Content-Length"), again.header.Values("Vary"), len(gz.body), gzTag)
	}
	for _, tc := range []struct {
		ae, inm string
		want    int
	}{
		{"gzip", gzTag, http.StatusNotModified},
		{"identity", idTag, http.StatusNotModified},
		{"gzip", idTag, http.StatusOK}, // another representation's validator
		{"identity", gzTag, http.StatusOK},
		{"gzip", "W/" + gzTag, http.StatusNotModified}, // If-None-Match compares weakly
	} {
		r := secGet(t, cl, url, "Accept-Encoding", tc.ae, "If-None-Match", tc.inm)
		if r.status != tc.want {
			t.Errorf("Accept-Encoding %q, If-None-Match %s: status %d, want %d", tc.ae, tc.inm, r.status, tc.want)
		}
		if r.status == http.StatusNotModified && (r.header.Get("Etag") != tc.inm && "W/"+r.header.Get("Etag") != tc.inm || r.body != "") {
			t.Errorf("304 for %q: ETag %q, body %q", tc.ae, r.header.Get("Etag"), r.body)
		}
		if r.status == http.StatusOK && tc.ae == "identity" && r.body != page {
			t.Errorf("200 for identity after a foreign ETag: %d bytes, want the page", len(r.body))
		}
	}
	for _, tc := range []struct {
		ae   string
		want int
	}{{"gzip", len(gz.body)}, {"identity", len(page)}} {
		r := secSend(t, cl, secNewReq(t, http.MethodHead, url, nil, "Accept-Encoding", tc.ae))
		if !strings.HasPrefix(r.cacheStatus(), statusHit) || r.header.Get("Content-Length") != fmt.Sprint(tc.want) || r.body != "" {
			t.Errorf("HEAD, Accept-Encoding %q: %v, Content-Length %q; want a hit with Content-Length %d", tc.ae, r, r.header.Get("Content-Length"), tc.want)
		}
	}
}

// TestCompress: with Options.Compress a compressible page is stored
// gzip-coded, whichever client leads its rebuild, and served to each
// client as it accepts it, from one entry. Redis holds the compressed
// size.
func TestCompress(t *testing.T) {
	c, rdb := newCache(t, nil)
	opt := &Options{Compress: true}
	page := testPage(32 << 10)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header().Set("Content-Type", "text/html; charset=utf-8")
				if tag := r.URL.Query().Get("etag"); tag != "" {
					w.Header().Set("Etag", tag)
				}
				io.WriteString(w, page)
			})
			srv, cl := secServe(t, rt.build(New(c, opt), h))
			for _, leader := range []string{"identity", "gzip"} {
				t.Run(leader+" leader", func(t *testing.T) {
					runs.Store(0)
					url := srv.URL + "/compress/" + leader
					first := secGet(t, cl, url, "Accept-Encoding", leader)
					wantCE, wantBody := "", page
					if leader == "gzip" {
						wantCE = "gzip"
						wantBody = first.body
						if gunzipString(first.body) != page {
							t.Errorf("the leading gzip client's body does not decode to the page")
						}
					}
					if !sameStatus(first.cacheStatus(), statusStored) || first.header.Get("Content-Encoding") != wantCE || first.body != wantBody {
						t.Fatalf("leader: %v, Content-Encoding %q; want stored, Content-Encoding %q", first, first.header.Get("Content-Encoding"), wantCE)
					}
					if n := storedBytes(t, rdb, opt, url); n == 0 || n > int64(len(page)/3) {
						t.Errorf("%d bytes in Redis for a %d-byte page, want it compressed", n, len(page))
					}
					gz := first
					if leader != "gzip" {
						gz = secGet(t, cl, url, "Accept-Encoding", "gzip, br")
						if gunzipString(gz.body) != page || gz.header.Get("Content-Encoding") != "gzip" {
							t.Fatalf("gzip client: %v, Content-Encoding %q; want the gzip page", gz, gz.header.Get("Content-Encoding"))
						}
					}
					checkRepresentations(t, cl, url, page, gz)
					if got := runs.Load(); got != 1 {
						t.Errorf("the handler ran %d times, want 1", got)
					}
				})
			}
			t.Run("handler ETag", func(t *testing.T) {
				for _, tc := range []struct{ tag, gzip string }{
					{`"v1"`, `"v1-gzip"`},
					{`W/"v1"`, `W/"v1-gzip"`},
				} {
					url := srv.URL + "/compress/etag?etag=" + tc.tag
					if r := secGet(t, cl, url, "Accept-Encoding", "identity"); r.header.Get("Etag") != tc.tag {
						t.Errorf("identity: ETag %q, want the handler's %q", r.header.Get("Etag"), tc.tag)
					}
					if r := secGet(t, cl, url, "Accept-Encoding", "gzip"); r.header.Get("Etag") != tc.gzip {
						t.Errorf("gzip: ETag %q, want %q", r.header.Get("Etag"), tc.gzip)
					}
				}
			})
		})
	}
}

// TestCompressOnlyWhatPays: Compress leaves as they are the responses not
// worth compressing (small, already compressed, of no text type,
// incompressible) and those it may not transform; a gzip client gets
// them identity, one entry for all.
func TestCompressOnlyWhatPays(t *testing.T) {
	c, rdb := newCache(t, nil)
	opt := &Options{Compress: true}
	noise := make([]byte, 8<<10)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	text := testPage(8 << 10)
	cases := map[string]struct {
		contentType, cacheControl, body string
	}{
		"small":          {"text/plain", "", text[:1000]},
		"image":          {"image/png", "", text},
		"no type":        {"", "", text},
		"incompressible": {"text/plain", "", string(noise)},
		"no-transform":   {"text/html", "public, no-transform", text},
	}
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tc := cases[strings.TrimPrefix(r.URL.Path, "/as-is/")]
				if tc.contentType != "" {
					w.Header().Set("Content-Type", tc.contentType)
				} else {
					w.Header()["Content-Type"] = nil // no sniffing either
				}
				if tc.cacheControl != "" {
					w.Header().Set("Cache-Control", tc.cacheControl)
				}
				io.WriteString(w, tc.body)
			})
			srv, cl := secServe(t, rt.build(New(c, opt), h))
			for name, tc := range cases {
				url := srv.URL + "/as-is/" + name
				for i, ae := range []string{"gzip", "identity", "gzip, br"} {
					r := secGet(t, cl, url, "Accept-Encoding", ae)
					want := statusHit
					if i == 0 {
						want = statusStored
					}
					if !strings.HasPrefix(r.cacheStatus(), want) || r.header.Get("Content-Encoding") != "" || r.body != tc.body {
						t.Errorf("%s, Accept-Encoding %q: %v, Content-Encoding %q; want %q, as the handler wrote it", name, ae, r, r.header.Get("Content-Encoding"), want)
					}
				}
				if n := storedBytes(t, rdb, opt, url); n < int64(len(tc.body)) {
					t.Errorf("%s: %d bytes in Redis for a %d-byte body, want it stored as is", name, n, len(tc.body))
				}
			}
		})
	}
}

// TestCodingHerdCannotDecode: under a key all clients share, a response
// in a coding herd cannot decode for the clients that do not accept it
// (br, a gzip body that does not decode, a gzip one that may not be
// transformed) is not stored; its own client gets it as the handler
// wrote it.
func TestCodingHerdCannotDecode(t *testing.T) {
	c, rdb := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header().Set("Content-Type", "text/plain")
				switch r.URL.Path {
				case "/coded/br":
					w.Header().Set("Content-Encoding", "br")
					io.WriteString(w, "BR:page")
				case "/coded/broken-gzip":
					w.Header().Set("Content-Encoding", "gzip")
					io.WriteString(w, gzipString(t, "page")[:10])
				case "/coded/no-transform":
					w.Header().Set("Content-Encoding", "gzip")
					w.Header().Set("Cache-Control", "no-transform")
					io.WriteString(w, gzipString(t, "page"))
				}
			})
			srv, cl := secServe(t, rt.build(New(c, &Options{Compress: rt.name == "chi"}), h))
			for _, path := range []string{"/coded/br", "/coded/broken-gzip", "/coded/no-transform"} {
				before := runs.Load()
				for _, want := range []string{statusMiss, statusHitForMiss} { // the first marks the URL
					if r := secGet(t, cl, srv.URL+path, "Accept-Encoding", "gzip, br"); !sameStatus(r.cacheStatus(), want) || r.header.Get("Content-Encoding") == "" {
						t.Errorf("%s: %v, Content-Encoding %q; want the handler's coded response, not stored (%q)", path, r, r.header.Get("Content-Encoding"), want)
					}
				}
				if got := runs.Load() - before; got != 2 {
					t.Errorf("%s: the handler ran %d times for 2 requests, want 2", path, got)
				}
				if storedBytes(t, rdb, &Options{Compress: rt.name == "chi"}, srv.URL+path) != 0 {
					t.Errorf("%s: a value is stored", path)
				}
			}
		})
	}
}

func TestGunzipBounded(t *testing.T) {
	page := strings.Repeat("a", 1000)
	gz := gzipString(t, page)
	lying := []byte(gz)
	lying[len(lying)-4] = 1 // ISIZE says 1 byte
	for _, tc := range []struct {
		name  string
		in    string
		limit int
		ok    bool
	}{
		{"at the limit", gz, 1000, true},
		{"one past the limit", gz, 999, false},
		{"lying size", string(lying), 1000, false}, // the checksum still fails
		{"two members", gz + gzipString(t, "b"), 1001, true},
		{"two members past the limit", gz + gzipString(t, "b"), 1000, false},
		{"trailing garbage", gz + "x", 1000, false},
		{"truncated", gz[:len(gz)-1], 1000, false},
		{"not gzip", page, 1000, false},
		{"empty", "", 1000, false},
		{"bomb", gzipString(t, strings.Repeat("\x00", 8<<20)), 1 << 20, false},
	} {
		out, err := gunzip([]byte(tc.in), tc.limit)
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok %v", tc.name, err, tc.ok)
		}
		if err == nil && (out == nil || gunzipString(tc.in) != string(out)) {
			t.Errorf("%s: decoded %d bytes, not what gzip decodes", tc.name, len(out))
		}
		if cap(out) > tc.limit+1 {
			t.Errorf("%s: %d bytes allocated for a limit of %d", tc.name, cap(out), tc.limit)
		}
	}
}

// TestCompressKeepsOuterVary: the Vary: Accept-Encoding herd adds to a
// gzip-coded entry joins, on every hit, the Vary an outer middleware sets
// (CORS's Vary: Origin), never replaces it.
func TestCompressKeepsOuterVary(t *testing.T) {
	c, _ := newCache(t, nil)
	page := testPage(8 << 10)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				io.WriteString(w, page)
			})
			mw := func(next http.Handler) http.Handler {
				inner := New(c, &Options{Compress: true})(next)
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Add("Vary", "Origin")
					inner.ServeHTTP(w, r)
				})
			}
			srv, cl := secServe(t, rt.build(mw, h))
			for i, ae := range []string{"gzip", "gzip", "identity"} {
				r := secGet(t, cl, srv.URL+"/outer-vary", "Accept-Encoding", ae)
				vary := strings.Join(r.header.Values("Vary"), ", ")
				if i > 0 && (!strings.Contains(vary, "Origin") || !strings.Contains(vary, "Accept-Encoding") || !strings.HasPrefix(r.cacheStatus(), statusHit)) {
					t.Errorf("hit %d (%s): %v, Vary %q; want a hit varying on Origin and Accept-Encoding", i, ae, r, vary)
				}
			}
		})
	}
}

// TestCompressRefresh: a background refresh (a stale hit) is shown the
// Accept-Encoding of its bucket, not the client's field, and stores its
// response gzip-coded, as a miss does.
func TestCompressRefresh(t *testing.T) {
	c, rdb := newCache(t, nil)
	opt := &Options{Compress: true, TTL: 300 * time.Millisecond, StaleFor: time.Minute}
	page := testPage(16 << 10)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var mu sync.Mutex
			var shown []string
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				shown = append(shown, strings.Join(r.Header.Values("Accept-Encoding"), "|"))
				mu.Unlock()
				w.Header().Set("Content-Type", "text/html")
				io.WriteString(w, page)
			})
			srv, cl := secServe(t, rt.build(New(c, opt), h))
			url := srv.URL + "/refresh"
			if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusStored) || r.body != page {
				t.Fatalf("first request: %v, want the page, stored", r)
			}
			ae := "gzip, deflate, br"
			secWaitFor(t, "a stale hit", func() bool {
				r := secGet(t, cl, url, "Accept-Encoding", ae)
				return sameStatus(r.cacheStatus(), statusStale)
			})
			secWaitFor(t, "the refreshed entry", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(shown) == 2
			})
			secWaitFor(t, "a fresh hit", func() bool {
				return strings.HasPrefix(secGet(t, cl, url, "Accept-Encoding", ae).cacheStatus(), statusHit)
			})
			mu.Lock()
			if len(shown) != 2 || shown[0] != "identity" || shown[1] != "gzip" {
				t.Errorf("the handler was shown Accept-Encoding %q, want identity (the first client), then gzip (the refresh)", shown)
			}
			mu.Unlock()
			if n := storedBytes(t, rdb, opt, url); n == 0 || n > int64(len(page)/3) {
				t.Errorf("%d bytes in Redis after the refresh for a %d-byte page, want it compressed", n, len(page))
			}
			gz := secGet(t, cl, url, "Accept-Encoding", "gzip")
			if gz.header.Get("Content-Encoding") != "gzip" || gunzipString(gz.body) != page {
				t.Errorf("gzip client after the refresh: %v, Content-Encoding %q", gz, gz.header.Get("Content-Encoding"))
			}
			if id := secGet(t, cl, url); id.header.Get("Content-Encoding") != "" || id.body != page {
				t.Errorf("identity client after the refresh: %v, Content-Encoding %q", id, id.header.Get("Content-Encoding"))
			}
		})
	}
}
