package middleware

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
)

// benchBody is a typical small JSON response.
var benchBody = []byte(`{"id":42,"name":"Widget","price":"19.99","tags":["blue","small"],"description":"` + strings.Repeat("x", 900) + `"}`)

// BenchmarkHitOverhead compares, in-process (direct ServeHTTP calls into
// a writer that discards what it gets, as net/http's sends it: no
// network, and no copy of the header as httptest's recorder makes), the bare handler with the same
// handler behind the middleware on a hit, and a raw Redis GET of a value
// of the same size: what a hit costs beyond the one round trip it needs.
func BenchmarkHitOverhead(b *testing.B) {
	c, rdb := newCache(b, nil)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(benchBody)
	})
	// As a server receives it: an origin-form target and a Host.
	req := httptest.NewRequest(http.MethodGet, "/products/42", nil)
	req.Host = "catalog.example"

	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h.ServeHTTP(newDiscard(), req)
		}
	})

	b.Run("middleware-hit", func(b *testing.B) {
		mw := New(c, &Options{TTL: time.Hour})(h)
		rec := httptest.NewRecorder()
		mw.ServeHTTP(rec, req) // stores the entry (a run before this one, with -count, did)
		if cs := rec.Result().Header.Get("Cache-Status"); !sameStatus(cs, statusStored) && !strings.HasPrefix(cs, statusHit) {
			b.Fatalf("first request: Cache-Status %q, want %q or a hit", cs, statusStored)
		}
		rec = httptest.NewRecorder()
		mw.ServeHTTP(rec, req)
		if cs := rec.Result().Header.Get("Cache-Status"); !strings.HasPrefix(cs, statusHit) || rec.Body.Len() != len(benchBody) {
			b.Fatalf("second request: Cache-Status %q, %d bytes; want a hit of %d bytes", cs, rec.Body.Len(), len(benchBody))
		}
		b.ReportAllocs()
		for b.Loop() {
			mw.ServeHTTP(newDiscard(), req)
		}
	})

	b.Run("middleware-near-hit", func(b *testing.B) {
		nc, _ := newCache(b, &herd.Options{Near: herd.NearOptions{MaxEntries: 100}})
		mw := New(nc, &Options{TTL: time.Hour})(h)
		// Stored, then copied into the near cache once the store's own
		// invalidation message has been heard (a fill that raced it is
		// not kept).
		for deadline := time.Now().Add(5 * time.Second); nc.Stats().NearHits == 0; {
			if time.Now().After(deadline) {
				b.Fatal("no near hit after 5s of requests")
			}
			mw.ServeHTTP(httptest.NewRecorder(), req)
		}
		b.ReportAllocs()
		for b.Loop() {
			mw.ServeHTTP(newDiscard(), req)
		}
	})

	b.Run("redis-GET", func(b *testing.B) {
		ctx := context.Background()
		key := "bench:raw-get"
		if err := rdb.Set(ctx, key, benchBody, time.Hour).Err(); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := rdb.Get(ctx, key).Bytes(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// discard is a ResponseWriter that keeps nothing but the header map.
type discard struct{ h http.Header }

func newDiscard() *discard                     { return &discard{h: make(http.Header)} }
func (d *discard) Header() http.Header         { return d.h }
func (d *discard) WriteHeader(int)             {}
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkHotURL puts a slow handler (20 ms, a database query) on an
// httptest server and has many parallel clients request one hot URL
// whose entry lives 200 ms, so it expires and is rebuilt over and over.
// It reports the handler runs per 1000 requests and the p99 latency of a
// request, behind the middleware (without and with a stale window) and
// for the bare handler.
func BenchmarkHotURL(b *testing.B) {
	const (
		work = 20 * time.Millisecond
		ttl  = 200 * time.Millisecond
	)
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	c := herd.New(rdb, nil)
	b.Cleanup(func() { c.Close() })

	var runs atomic.Int64
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		time.Sleep(work)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(benchBody)
	})

	for _, bc := range []struct {
		name string
		h    http.Handler
	}{
		{"bare", slow},
		{"middleware", New(c, &Options{TTL: ttl})(slow)},
		{"middleware-stale", New(c, &Options{TTL: ttl, StaleFor: time.Second})(slow)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ts := httptest.NewServer(bc.h)
			defer ts.Close()
			const parallelism = 16 // clients per GOMAXPROCS
			tr := &http.Transport{MaxIdleConnsPerHost: 1024}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			// A fresh URL for each run of this function, so that every run
			// starts cold.
			url := ts.URL + "/products/hot-" + strconv.FormatInt(time.Now().UnixNano(), 36)

			runs.Store(0)
			var (
				requests, failures atomic.Int64
				mu                 sync.Mutex
				latencies          []time.Duration
				firstErr           error
			)
			b.SetParallelism(parallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var lat []time.Duration
				var errOnce error
				for pb.Next() {
					t0 := time.Now()
					resp, err := client.Get(url)
					if err == nil {
						_, err = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if err == nil && resp.StatusCode != http.StatusOK {
							err = fmt.Errorf("status %d", resp.StatusCode)
						}
					}
					lat = append(lat, time.Since(t0))
					requests.Add(1)
					if err != nil {
						failures.Add(1)
						if errOnce == nil {
							errOnce = err
						}
					}
				}
				mu.Lock()
				latencies = append(latencies, lat...)
				if firstErr == nil {
					firstErr = errOnce
				}
				mu.Unlock()
			})
			b.StopTimer()
			if n := failures.Load(); n > 0 {
				b.Errorf("%d of %d requests failed; first: %v", n, requests.Load(), firstErr)
			}
			if n := requests.Load(); n > 0 {
				b.ReportMetric(float64(runs.Load())*1000/float64(n), "runs/1000req")
			}
			if len(latencies) > 0 {
				slices.Sort(latencies)
				p99 := latencies[min(len(latencies)-1, len(latencies)*99/100)]
				b.ReportMetric(float64(p99)/float64(time.Millisecond), "p99-ms")
			}
		})
	}
}

// BenchmarkKey measures what building a request's key costs: a typical
// URL, one with raw bytes the key keeps as sent, and a 1 MiB query of
// '&' (an attacker's), which bypasses the cache before any work on it
// (before MaxKeyBytes, it was sorted as a million parameters).
func BenchmarkKey(b *testing.B) {
	hd := &handler{cfg: (&Options{}).resolve()}
	for _, tc := range []struct{ name, target string }{
		{"typical", "/products/42?color=blue&size=m&utm_source=news"},
		{"typical-behind-proxy", "/products/42?color=blue&size=m&utm_source=news"},
		{"raw-bytes", "/wiki/\xc3\xbc%2Fx?q=<svg>"},
		{"1MiB-query", "/search?q=" + strings.Repeat("&", 1<<20)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := httptest.NewRequest(http.MethodGet, tc.target, nil)
			r.Host = "catalog.example"
			b.ReportAllocs()
			if tc.name == "typical-behind-proxy" {
				// What a browser sends through a proxy: the header scan of
				// the forwarding rule reads every name.
				for k, v := range map[string]string{
					"Accept": "text/html,application/xhtml+xml", "Accept-Encoding": "gzip, br", "Accept-Language": "en-GB,en;q=0.9",
					"User-Agent": "Mozilla/5.0 (X11; Linux x86_64)", "Referer": "https://catalog.example/", "Sec-Fetch-Mode": "navigate",
					"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Dest": "document", "Upgrade-Insecure-Requests": "1",
					"X-Forwarded-For": "192.0.2.7", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "catalog.example", "X-Request-Id": "f00",
				} {
					r.Header.Set(k, v)
				}
			}
			for b.Loop() {
				hd.key(r)
			}
		})
	}
}

// BenchmarkCompress compares, in-process, storing a typical page as the
// handler wrote it (raw) with Options.Compress (gzip at the default
// level 6, and at level 1): for a 32 KiB HTML
// page and a 24 KiB JSON document, the bytes of its value in Redis
// (stored-bytes, STRLEN of the value key), a hit served to a gzip client
// and to an identity client (which Compress decodes on every hit), and a
// miss (a fresh URL per iteration: the lookup, the handler, the
// compression and the commit).
func BenchmarkCompress(b *testing.B) {
	c, rdb := newCache(b, nil)
	docs := []struct{ name, contentType, body string }{
		{"html-32KiB", "text/html; charset=utf-8", testPage(32 << 10)},
		{"json-24KiB", "application/json", testJSON(24 << 10)},
	}
	for _, doc := range docs {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", doc.contentType)
			_, _ = io.WriteString(w, doc.body)
		})
		for _, mode := range []struct {
			name string
			opt  *Options
		}{
			{"raw", &Options{TTL: time.Hour}},
			{"gzip", &Options{TTL: time.Hour, Compress: true}},
			{"gzip-level1", &Options{TTL: time.Hour, Compress: true, CompressLevel: 1}},
		} {
			mw := New(c, mode.opt)(h)
			target := "/bench/" + doc.name + "/" + mode.name
			request := func(target, ae string) *http.Request {
				r := httptest.NewRequest(http.MethodGet, target, nil)
				r.Host = "catalog.example"
				if ae != "" {
					r.Header.Set("Accept-Encoding", ae)
				}
				return r
			}
			rec := httptest.NewRecorder()
			mw.ServeHTTP(rec, request(target, ""))
			if cs := rec.Result().Header.Get("Cache-Status"); !sameStatus(cs, statusStored) {
				b.Fatalf("%s: first request: Cache-Status %q, want %q", target, cs, statusStored)
			}
			k := &handler{cfg: mode.opt.resolve()}
			key, _ := k.key(request(target, ""))
			stored, err := rdb.StrLen(context.Background(), secRedisKey(key, "v")).Result()
			if err != nil {
				b.Fatal(err)
			}
			for _, client := range []struct{ name, ae string }{{"gzip-client", "gzip, deflate, br"}, {"identity-client", ""}} {
				b.Run(doc.name+"/"+mode.name+"/hit-"+client.name, func(b *testing.B) {
					req := request(target, client.ae)
					rec := httptest.NewRecorder()
					mw.ServeHTTP(rec, req)
					if cs := rec.Result().Header.Get("Cache-Status"); !strings.HasPrefix(cs, statusHit) {
						b.Fatalf("Cache-Status %q, want a hit", cs)
					}
					b.ReportAllocs()
					for b.Loop() {
						rec := httptest.NewRecorder()
						mw.ServeHTTP(rec, req)
					}
					b.ReportMetric(float64(stored), "stored-bytes")
					b.ReportMetric(float64(rec.Body.Len()), "sent-bytes")
				})
			}
			b.Run(doc.name+"/"+mode.name+"/miss", func(b *testing.B) {
				run := strconv.FormatInt(time.Now().UnixNano(), 36) // a cold URL on every run
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					rec := httptest.NewRecorder()
					mw.ServeHTTP(rec, request(target+"?run="+run+"&miss="+strconv.Itoa(i), ""))
					if cs := rec.Result().Header.Get("Cache-Status"); !sameStatus(cs, statusStored) {
						b.Fatalf("Cache-Status %q, want %q", cs, statusStored)
					}
				}
			})
		}
	}
}

// testJSON is an API response of about size bytes: an array of product
// records.
func testJSON(size int) string {
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":%d,"sku":"W-%05d","name":"Widget %d","price":{"amount":%d.%02d,"currency":"EUR"},"stock":%d,"tags":["blue","small"],"updated":"2025-06-%02dT10:%02d:00Z"}`,
			1000+i, (i*7919)%100000, i, 5+(i*37)%400, (i*13)%100, (i*17)%250, 1+i%28, i%60)
	}
	b.WriteString(`],"next":null}`)
	return b.String()
}

// BenchmarkHitForMiss sends waves of 100 concurrent requests to a route
// that sets a cookie (its responses are never shared) with a handler of
// fixed duration, to the bare handler and behind the middleware with
// hit-for-miss off and on. Each iteration is one wave. It reports the
// median request latency, and its ratio to the bare handler's median
// measured in the same run (p50/bare): without the mark a wave's requests
// wait for a leader whose response they cannot take, then run the handler
// themselves (about 2x); with it they run at once (about 1x).
func BenchmarkHitForMiss(b *testing.B) {
	const (
		work = 90 * time.Millisecond // the handler of the trial this reproduces
		wave = 100
	)
	c, _ := newCache(b, nil)
	cookie := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(work)
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "s"})
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(benchBody)
	})
	tr := &http.Transport{MaxIdleConnsPerHost: 2 * wave}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	// send runs one wave and returns its latencies.
	send := func(b *testing.B, url string) []time.Duration {
		lat := make([]time.Duration, wave)
		var wg sync.WaitGroup
		for i := range lat {
			wg.Go(func() {
				t0 := time.Now()
				res, err := client.Get(url)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				lat[i] = time.Since(t0)
			})
		}
		wg.Wait()
		return lat
	}
	p50 := func(lat []time.Duration) time.Duration {
		slices.Sort(lat)
		return lat[len(lat)/2]
	}
	servers := map[string]*httptest.Server{}
	for name, h := range map[string]http.Handler{
		"bare":         cookie,
		"hit-for-miss": New(c, &Options{HitForMiss: time.Minute})(cookie),
		"off":          New(c, &Options{HitForMiss: -1})(cookie),
	} {
		servers[name] = httptest.NewServer(h)
		defer servers[name].Close()
	}
	url := func(name string) string { return servers[name].URL + "/account" }
	for name := range servers {
		send(b, url(name)) // connections open; the hit-for-miss route is marked
	}
	var base []time.Duration
	for range 3 {
		base = append(base, send(b, url("bare"))...)
	}
	bare := p50(base)
	for _, name := range []string{"bare", "off", "hit-for-miss"} {
		b.Run(name, func(b *testing.B) {
			var lat []time.Duration
			for b.Loop() {
				lat = append(lat, send(b, url(name))...)
			}
			m := p50(lat)
			b.ReportMetric(float64(m)/float64(time.Millisecond), "p50-ms")
			b.ReportMetric(float64(m)/float64(bare), "p50/bare")
		})
	}
}
