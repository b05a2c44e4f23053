package middleware

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// TestTrailersNeverStoredAsHeaders: the fields a handler announces in
// Trailer and sets after writing its body (as net/http documents) reach
// the leader's client as trailers, never as header fields, and are never
// stored: a hit carries neither the first request's values nor the
// Trailer field (RFC 9111 §3.1 forbids combining trailer fields with
// header fields). From the HTTP issue's hole 1: every later hit carried
// the first request's Server-Timing and X-Request-Id as header fields.
func TestTrailersNeverStoredAsHeaders(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				w.Header().Set("Trailer", "Server-Timing, X-Request-Id")
				w.Header().Set("Content-Type", "text/plain")
				io.WriteString(w, "page")
				w.Header().Set("Server-Timing", "db;dur="+strconv.FormatInt(n, 10))
				w.Header().Set("X-Request-Id", "req-"+strconv.FormatInt(n, 10))
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			url := srv.URL + "/t"

			res, err := cl.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if string(body) != "page" || !sameStatus(res.Header.Get("Cache-Status"), statusStored) {
				t.Fatalf("first GET: %d %q (Cache-Status %q), want the stored page", res.StatusCode, body, res.Header.Get("Cache-Status"))
			}
			for _, f := range []string{"Server-Timing", "X-Request-Id"} {
				if v := res.Header.Values(f); len(v) > 0 {
					t.Errorf("leader's response carries trailer %s as a header field: %q", f, v)
				}
			}
			if got := res.Trailer.Get("Server-Timing"); got != "db;dur=1" {
				t.Errorf("leader's trailer Server-Timing = %q, want %q", got, "db;dur=1")
			}
			if got := res.Trailer.Get("X-Request-Id"); got != "req-1" {
				t.Errorf("leader's trailer X-Request-Id = %q, want %q", got, "req-1")
			}

			hit := secGet(t, cl, url)
			if !strings.HasPrefix(hit.cacheStatus(), statusHit) || hit.body != "page" {
				t.Fatalf("second GET: %v, want a hit", hit)
			}
			for _, f := range []string{"Server-Timing", "X-Request-Id", "Trailer"} {
				if v := hit.header.Values(f); len(v) > 0 {
					t.Errorf("hit carries %s: %q, want none (the first request's trailers)", f, v)
				}
			}
		})
	}
}

// TestTruncatedBodyNeverStored: a handler that declares a Content-Length
// and writes less is never stored nor served as complete (RFC 9111
// §3.3): its own client gets what net/http sends without herd (the
// declared length, then the connection ends early), and the next request
// runs the handler again. From the HTTP issue's hole 2: Content-Length
// 27, 14 bytes written, and herd stored and served 14 bytes as a complete
// 200.
func TestTruncatedBodyNeverStored(t *testing.T) {
	c, _ := newCache(t, nil)
	const part = "fourteen bytes"
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header().Set("Content-Length", "27")
				io.WriteString(w, part)
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			url := srv.URL + "/cut"
			for i := 1; i <= 2; i++ {
				r := secDo(cl, secNewReq(t, http.MethodGet, url, nil))
				if r.err == nil {
					t.Errorf("GET %d: %v, want the body cut short (an error reading it)", i, r)
				}
				if r.status == http.StatusOK && strings.HasPrefix(r.cacheStatus(), statusHit) {
					t.Errorf("GET %d: a hit of the truncated body: %v", i, r)
				}
			}
			if n := runs.Load(); n != 2 {
				t.Errorf("handler ran %d times for 2 GETs, want 2 (nothing stored)", n)
			}
		})
	}
}

// TestLongerBodyThanDeclared: writes past the declared Content-Length
// are refused with http.ErrContentLength, as net/http refuses them, and
// the declared bytes are what is stored and served.
func TestLongerBodyThanDeclared(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var werr atomic.Value
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "4")
				_, err := io.WriteString(w, "page and more")
				werr.Store(fmt.Sprint(err))
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			url := srv.URL + "/long"
			if r := secGet(t, cl, url); r.body != "page" {
				t.Errorf("first GET: %v, want %q", r, "page")
			}
			if got := werr.Load(); got != http.ErrContentLength.Error() {
				t.Errorf("the handler's Write returned %v, want %v", got, http.ErrContentLength)
			}
			if r := secGet(t, cl, url); r.body != "page" || !strings.HasPrefix(r.cacheStatus(), statusHit) {
				t.Errorf("second GET: %v, want a hit of %q", r, "page")
			}
		})
	}
}
