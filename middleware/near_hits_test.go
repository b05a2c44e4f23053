package middleware

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
)

// The middleware with herd's near cache on: a near hit answers a
// conditional request with 304 (evaluated on the stored entry), its Age
// is the value's, a must-revalidate response is never served from memory
// past the lifetime it states, and a purge by this instance reaches its
// own near copies before InvalidateTag returns (the next request runs the
// handler, with no wait for a message).
func TestNearMiddlewareNearHits(t *testing.T) {
	srv := redistest.Start(t)
	c := herd.New(srv.Client(t), &herd.Options{Near: herd.NearOptions{MaxEntries: 100, MaxAge: time.Hour}})
	t.Cleanup(func() { c.Close() })
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Cache-Control", "max-age=2, must-revalidate")
		w.Header().Set("ETag", `"e`+strconv.FormatInt(n, 10)+`"`)
		w.Header().Set("Surrogate-Key", "pages")
		io.WriteString(w, "#"+strconv.FormatInt(n, 10))
	})
	ts := httptest.NewServer(New(c, &Options{TTL: time.Hour, StaleFor: time.Hour})(h))
	defer ts.Close()
	url := ts.URL + "/p"

	_, first := get(t, url)
	stored := time.Now()
	deadline := time.Now().Add(10 * time.Second)
	for base := c.Stats().NearHits; c.Stats().NearHits == base; {
		if time.Now().After(deadline) {
			t.Fatal("no near hit within 10s")
		}
		if _, body := get(t, url); body != first {
			t.Fatalf("body %q, want %q", body, first)
		}
	}
	base := c.Stats().NearHits
	res, body := get(t, url, "If-None-Match", `"e1"`)
	if res.StatusCode != http.StatusNotModified || body != "" || c.Stats().NearHits == base {
		t.Fatalf("conditional request on a near hit: %d %q (near hits %d → %d), want 304 from memory", res.StatusCode, body, base, c.Stats().NearHits)
	}
	res, _ = get(t, url)
	age, err := strconv.Atoi(res.Header.Get("Age"))
	if err != nil || time.Duration(age)*time.Second > time.Since(stored)+time.Second {
		t.Fatalf("near hit Age %q, %v after the store", res.Header.Get("Age"), time.Since(stored))
	}

	// must-revalidate, max-age=2: never served stale, from Redis or
	// memory. Wait out the lifetime (the value's own, not a speed bound).
	time.Sleep(time.Until(stored.Add(2500 * time.Millisecond)))
	res, body = get(t, url)
	if body == first || strings.HasPrefix(res.Header.Get("Cache-Status"), "herd; hit") {
		t.Fatalf("a must-revalidate response %v after it was stored (max-age=2): %q, Cache-Status %q; want the handler's new response",
			time.Since(stored), body, res.Header.Get("Cache-Status"))
	}

	// This instance's purge: the next request runs the handler at once.
	deadline = time.Now().Add(10 * time.Second)
	for base := c.Stats().NearHits; c.Stats().NearHits == base; {
		if time.Now().After(deadline) {
			t.Fatal("no near hit of the second response within 10s")
		}
		get(t, url)
	}
	before := runs.Load()
	if err := InvalidateTag(context.Background(), c, "pages"); err != nil {
		t.Fatal(err)
	}
	if _, body := get(t, url); body == "#"+strconv.FormatInt(before, 10) {
		t.Fatalf("the request after this instance's InvalidateTag returned got the purged %q", body)
	}
}
