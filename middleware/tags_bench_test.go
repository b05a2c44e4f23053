package middleware

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd"
)

// benchTags is a product page's Surrogate-Key: a dozen tags.
const benchTags = "product:42 category:7 brand:3 shelf:1 price-list:eu all page:product " +
	"stock:42 review:42 related:41 related:43 promo:spring"

// BenchmarkTagHit compares, in-process, a hit of an entry stored with
// tags (a Surrogate-Key and a Cache-Tag of a dozen tags) with a hit of
// the same entry without them, alternating the two in one loop so that
// both see the same machine: tagged/untagged is their time ratio. Tags
// cost nothing on a hit: the entry does not hold them.
func BenchmarkTagHit(b *testing.B) {
	c, _ := newCache(b, nil)
	run := strconv.FormatInt(time.Now().UnixNano(), 10) // -count runs share the Cache
	prepare := func(tags bool) (http.Handler, *http.Request) {
		mw := New(c, &Options{TTL: time.Hour})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if tags {
				w.Header().Set("Surrogate-Key", benchTags)
				w.Header().Set("Cache-Tag", strings.ReplaceAll(benchTags, " ", ","))
			}
			_, _ = w.Write(benchBody)
		}))
		req := httptest.NewRequest(http.MethodGet, "/products/42?"+strconv.FormatBool(tags)+run, nil)
		req.Host = "catalog.example"
		rec := httptest.NewRecorder()
		mw.ServeHTTP(rec, req)
		if cs := rec.Result().Header.Get("Cache-Status"); !sameStatus(cs, statusStored) {
			b.Fatalf("first request: Cache-Status %q, want %q", cs, statusStored)
		}
		return mw, req
	}
	plain, plainReq := prepare(false)
	tagged, taggedReq := prepare(true)
	hit := func(h http.Handler, req *http.Request) time.Duration {
		start := time.Now()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if !strings.HasPrefix(rec.Header().Get("Cache-Status"), statusHit) {
			b.Fatalf("Cache-Status %q, want a hit", rec.Header().Get("Cache-Status"))
		}
		return time.Since(start)
	}
	var tp, tt time.Duration
	b.ReportAllocs()
	for b.Loop() {
		tp += hit(plain, plainReq)
		tt += hit(tagged, taggedReq)
	}
	b.ReportMetric(float64(tp.Nanoseconds())/float64(b.N), "untagged-ns/hit")
	b.ReportMetric(float64(tt.Nanoseconds())/float64(b.N), "tagged-ns/hit")
	b.ReportMetric(float64(tt)/float64(tp), "tagged/untagged")
}

// BenchmarkTagMiss is a miss that runs the handler and stores its
// response (one URL per op) in three variants, alternated in one loop:
// untagged on a Cache that never saw a tag (the path before tags), the
// same on a Cache that has ("tags-on": its ACQUIRE also reads the purge
// generation), and with a dozen tags in Surrogate-Key (one pipelined
// round trip of TAGADD scripts before the COMMIT). It reports each
// variant's time per miss and its ratio to the first.
func BenchmarkTagMiss(b *testing.B) {
	type variant struct {
		name string
		h    http.Handler
		c    *herd.Cache
		took time.Duration
	}
	var vs []*variant
	for _, bc := range []struct {
		name         string
		tagsOn, tags bool
	}{{"untagged", false, false}, {"tags-on", true, false}, {"tagged", true, true}} {
		c, _ := newCache(b, nil)
		if bc.tagsOn {
			if err := c.InvalidateTag(b.Context(), "warm-up"); err != nil {
				b.Fatal(err)
			}
		}
		tags := bc.tags
		vs = append(vs, &variant{name: bc.name, c: c, h: New(c, &Options{TTL: time.Hour})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if tags {
				w.Header().Set("Surrogate-Key", benchTags)
			}
			_, _ = w.Write(benchBody)
		}))})
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 10) // -count runs share no URL
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		n++
		for _, v := range vs {
			req := httptest.NewRequest(http.MethodGet, "/products/"+run+"-"+strconv.Itoa(n), nil)
			req.Host = "catalog.example"
			rec := httptest.NewRecorder()
			start := time.Now()
			v.h.ServeHTTP(rec, req)
			v.took += time.Since(start)
			if cs := rec.Result().Header.Get("Cache-Status"); !sameStatus(cs, statusStored) {
				b.Fatalf("%s: Cache-Status %q, want %q", v.name, cs, statusStored)
			}
		}
	}
	for _, v := range vs {
		if s := v.c.Stats(); s.Fenced+s.CommitErrors > 0 {
			b.Fatalf("%s: responses not stored: %+v", v.name, s)
		}
		b.ReportMetric(float64(v.took.Microseconds())/float64(n), v.name+"-µs/miss")
		if v != vs[0] {
			b.ReportMetric(float64(v.took)/float64(vs[0].took), v.name+"/untagged")
		}
	}
}
