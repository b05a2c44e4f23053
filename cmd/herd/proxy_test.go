package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// startProxy runs herd proxy with args until the test ends and returns
// its URL.
func startProxy(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lines := &lineWriter{ch: make(chan string, 1)}
	done := make(chan error, 1)
	e := &env{stdout: lines, stderr: io.Discard, getenv: func(string) string { return "" }}
	go func() { done <- dispatch(ctx, append([]string{"proxy", "-listen", "127.0.0.1:0"}, args...), e) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("proxy: %v", err)
		}
	})
	select {
	case line := <-lines.ch:
		addr, _, _ := strings.Cut(strings.TrimPrefix(line, "herd proxy: listening on "), ",")
		return addr
	case err := <-done:
		t.Fatalf("proxy ended at start: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("proxy did not start in 10s")
	}
	return ""
}

// lineWriter hands the first line written to it over ch.
type lineWriter struct {
	once sync.Once
	ch   chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { w.ch <- string(p) })
	return len(p), nil
}

// TestProxyOneOriginRequestAcrossInstances: two herd proxy instances on
// one Redis, each sent requests for the same cold URL while the origin
// is slow, send the origin one request between them, and every client
// gets its body; in either mode.
func TestProxyOneOriginRequestAcrossInstances(t *testing.T) {
	for _, mode := range []string{"default", "standard"} {
		t.Run(mode, func(t *testing.T) { testProxyOneOriginRequest(t, mode) })
	}
}

func testProxyOneOriginRequest(t *testing.T, mode string) {
	srv := redistest.Start(t)
	var calls atomic.Int64
	first := make(chan struct{}, 1)
	gate := make(chan struct{})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			first <- struct{}{}
		}
		<-gate
		w.Header().Set("Cache-Control", "max-age=60")
		fmt.Fprintf(w, "page %s", r.URL.Path)
	}))
	defer origin.Close()
	defer open() // before origin.Close waits for its handlers
	a := startProxy(t, "-redis", srv.Addr(), "-origin", origin.URL, "-mode", mode)
	b := startProxy(t, "-redis", srv.Addr(), "-origin", origin.URL, "-mode", mode)

	type result struct {
		status, cacheStatus, body string
		err                       error
	}
	const perProxy = 8
	results := make(chan result, 2*perProxy)
	var wg sync.WaitGroup
	send := func(base string) {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, base+"/cold", nil)
			req.Host = "www.example.test" // one site behind both, as behind a load balancer
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				results <- result{err: err}
				return
			}
			defer res.Body.Close()
			body, err := io.ReadAll(res.Body)
			results <- result{res.Status, res.Header.Get("Cache-Status"), string(body), err}
		})
	}
	send(a)
	<-first // the origin has proxy A's request; the others arrive while it is held
	for range perProxy - 1 {
		send(a)
	}
	for range perProxy {
		send(b)
	}
	open() // a request that reaches its proxy after the store is a hit
	wg.Wait()
	close(results)
	for r := range results {
		if r.err != nil || r.body != "page /cold" {
			t.Errorf("response %s %q (%s), err %v; want page /cold", r.status, r.body, r.cacheStatus, r.err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("origin requests: %d, want 1 for %d requests on two proxies", n, 2*perProxy)
	}
}

// TestProxyFlags: a Redis and -origin are required, -mode is checked.
func TestProxyFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-origin", "http://127.0.0.1:1"},
		{"-redis", "127.0.0.1:1"},
		{"-redis", "127.0.0.1:1", "-origin", "ftp://x"},
		{"-redis", "127.0.0.1:1", "-origin", "http://127.0.0.1:1", "-mode", "fast"},
	} {
		e := &env{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
		err := dispatch(context.Background(), append([]string{"proxy"}, args...), e)
		var u usageError
		if !errors.As(err, &u) {
			t.Errorf("proxy %v: %v, want a usage error", args, err)
		}
	}
}

// proxyGet sends a GET for www.example.test's path to the proxy at base.
func proxyGet(t *testing.T, base, path string, hdr ...string) (*http.Response, string, time.Duration) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	req.Host = "www.example.test"
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	cl := &http.Client{Timeout: 30 * time.Second}
	start := time.Now()
	res, err := cl.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v after %v", path, err, time.Since(start))
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b), time.Since(start)
}

// TestProxyFailsOpenWhenRedisStopsOrHangs: with its Redis gone
// (stopped, or hung: SIGSTOP) a running proxy still answers from the
// origin, within a few seconds.
func TestProxyFailsOpenWhenRedisStopsOrHangs(t *testing.T) {
	for _, how := range []string{"stopped", "paused"} {
		t.Run(how, func(t *testing.T) {
			srv := redistest.Start(t)
			origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Cache-Control", "max-age=60")
				fmt.Fprintf(w, "page %s", r.URL.Path)
			}))
			defer origin.Close()
			proxies := map[string]string{}
			for _, mode := range []string{"default", "standard"} {
				proxies[mode] = startProxy(t, "-redis", srv.Addr(), "-origin", origin.URL, "-mode", mode)
				proxyGet(t, proxies[mode], "/warm-"+mode)
			}
			if how == "stopped" {
				srv.Stop(t)
			} else {
				srv.Pause(t)
				defer srv.Resume(t)
			}
			// herd.Options.BreakerThreshold (5 Redis errors) opens the
			// breaker: the requests after the first few must not wait on
			// Redis at all.
			for _, mode := range []string{"default", "standard"} {
				var took []time.Duration
				for i := range 8 {
					path := fmt.Sprintf("/cold-%s-%d", mode, i)
					if i == 0 {
						path = "/warm-" + mode
					}
					res, body, d := proxyGet(t, proxies[mode], path)
					took = append(took, d.Round(time.Millisecond))
					if res.StatusCode != http.StatusOK || body != "page "+path {
						t.Errorf("Redis %s, -mode %s, GET %s: %d %q; want the origin's page", how, mode, path, res.StatusCode, body)
					}
				}
				t.Logf("Redis %s, -mode %s: 8 sequential GETs took %v", how, mode, took)
				for i, d := range took[5:] {
					if d > time.Second {
						t.Errorf("Redis %s, -mode %s: GET %d took %v; want the breaker open (fail fast) after 5 errors", how, mode, i+6, d)
					}
				}
			}
		})
	}
}

// TestProxyOriginTrailersAreNeverStoredAsHeaders: an origin's
// trailer fields (announced in Trailer, or not announced, which
// ReverseProxy passes with net/http's TrailerPrefix) reach the first
// client as trailers, and no later client gets them, as header fields
// or trailers.
func TestProxyOriginTrailersAreNeverStoredAsHeaders(t *testing.T) {
	srv := redistest.Start(t)
	var n atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := fmt.Sprint(n.Add(1))
		w.Header().Set("Cache-Control", "max-age=60")
		w.Header().Set("Trailer", "X-Request-Id")
		io.WriteString(w, "page")
		w.(http.Flusher).Flush() // chunked
		w.Header().Set("X-Request-Id", "req-"+id)
		w.Header().Set(http.TrailerPrefix+"Server-Timing", "db;dur="+id)
	}))
	defer origin.Close()
	for _, mode := range []string{"default", "standard"} {
		t.Run(mode, func(t *testing.T) {
			p := startProxy(t, "-redis", srv.Addr(), "-origin", origin.URL, "-mode", mode)
			path := "/t-" + mode
			for i := range 3 {
				res, body, _ := proxyGet(t, p, path)
				if i == 0 && res.Trailer.Get("X-Request-Id") == "" {
					t.Errorf("GET 0: no X-Request-Id trailer: %q %v", body, res.Trailer)
				}
				for _, f := range []string{"X-Request-Id", "Server-Timing"} {
					if res.Header.Get(f) != "" {
						t.Errorf("GET %d (%s): the trailer %s came as a header field: %q", i, res.Header.Get("Cache-Status"), f, res.Header.Get(f))
					}
					if i > 0 && res.Trailer.Get(f) != "" {
						t.Errorf("GET %d (%s): the first request's trailer %s replayed: %q", i, res.Header.Get("Cache-Status"), f, res.Trailer.Get(f))
					}
				}
			}
		})
	}
}

// TestProxyTruncatedOriginBodyIsNotStored: an origin that declares
// Content-Length 27 and sends 14 bytes is not stored by the proxy as a
// complete response (RFC 9111 §3.3): the next client gets the origin
// again.
func TestProxyTruncatedOriginBodyIsNotStored(t *testing.T) {
	srv := redistest.Start(t)
	var n atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60")
		if n.Add(1) == 1 {
			w.Header().Set("Content-Length", "27")
			io.WriteString(w, "the first 14 ")
			return
		}
		io.WriteString(w, "the whole body, 27 bytes ok")
	}))
	defer origin.Close()
	for _, mode := range []string{"default", "standard"} {
		t.Run(mode, func(t *testing.T) {
			n.Store(0)
			p := startProxy(t, "-redis", srv.Addr(), "-origin", origin.URL, "-mode", mode)
			req, _ := http.NewRequest(http.MethodGet, p+"/trunc-"+mode, nil)
			if res, err := http.DefaultClient.Do(req); err == nil {
				b, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err == nil {
					t.Errorf("first GET: %q read as complete, want an error (a cut body)", b)
				}
			}
			_, body, _ := proxyGet(t, p, "/trunc-"+mode)
			req2, _ := http.NewRequest(http.MethodGet, p+"/trunc-"+mode, nil)
			res, err := http.DefaultClient.Do(req2)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if string(b) != "the whole body, 27 bytes ok" {
				t.Errorf("second GET: %q (%s), want the whole body; proxyGet (another Host) got %q", b, res.Header.Get("Cache-Status"), body)
			}
		})
	}
}

// TestProxyDropsOriginHopByHopFields: an origin's Connection-listed
// fields are hop-by-hop: neither the first client nor a hit gets them.
func TestProxyDropsOriginHopByHopFields(t *testing.T) {
	srv := redistest.Start(t)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60")
		w.Header().Set("Connection", "X-Backend-Secret")
		w.Header().Set("X-Backend-Secret", "s3cr3t")
		w.Header().Set("Keep-Alive", "timeout=5")
		io.WriteString(w, "page")
	}))
	defer origin.Close()
	for _, mode := range []string{"default", "standard"} {
		p := startProxy(t, "-redis", srv.Addr(), "-origin", origin.URL, "-mode", mode)
		for i := range 2 {
			res, _, _ := proxyGet(t, p, "/hop-"+mode)
			if res.Header.Get("X-Backend-Secret") != "" || res.Header.Get("Keep-Alive") != "" {
				t.Errorf("-mode %s GET %d (%s): hop-by-hop fields forwarded: %v", mode, i, res.Header.Get("Cache-Status"), res.Header)
			}
		}
	}
}
