package middleware

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd"
)

// TestHitForMiss: once a cookie-setting URL is marked, 100 concurrent
// requests for it all run the handler at the same time (none waits for
// another's response), and when the mark expires the next request leads
// again.
func TestHitForMiss(t *testing.T) {
	c, rdb := newCache(t, &herd.Options{WaitTimeout: secWait})
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var running, peak, runs atomic.Int64
			var gate *secGate
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				now := running.Add(1)
				defer running.Add(-1)
				for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); {
					p = peak.Load()
				}
				if n > 1 {
					gate.wait(r)
				}
				http.SetCookie(w, &http.Cookie{Name: "session", Value: fmt.Sprint(n)})
				fmt.Fprintf(w, "run%d", n)
			})
			srv, cl := secServe(t, rt.build(New(c, &Options{HitForMiss: time.Minute}), h))
			gate = newSecGate(t)
			url := srv.URL + "/account"
			if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusMiss) {
				t.Fatalf("first request: %v, want %q (it marks the URL)", r, statusMiss)
			}
			key := secKeyOfURL(t, nil, url)
			if pttl := rdb.PTTL(context.Background(), secRedisKey(key, "v")).Val(); pttl <= 0 || pttl > time.Minute {
				t.Errorf("the mark's PTTL is %v, want at most HitForMiss (1m)", pttl)
			}
			if secStored(t, rdb, key) {
				t.Errorf("a response with Set-Cookie is stored")
			}

			const n = 100
			reqs := make([]*http.Request, n)
			for i := range reqs {
				reqs[i] = secNewReq(t, http.MethodGet, url, nil)
			}
			batch := secParallel(cl, reqs)
			secWaitForState(t, "100 handler runs at once", func() (bool, string) {
				return running.Load() == n, fmt.Sprintf("%d running, %d waiting in the middleware", running.Load(), secWaiting())
			})
			gate.open()
			rs := batch.wait(t)
			seen := map[string]bool{}
			for i, r := range rs {
				if r.err != nil || !sameStatus(r.cacheStatus(), statusHitForMiss) || seen[r.body] {
					t.Errorf("request %d: %v, want its own run with Cache-Status %q", i, r, statusHitForMiss)
				}
				seen[r.body] = true
				if want := "session=" + strings.TrimPrefix(r.body, "run"); !strings.HasPrefix(r.header.Get("Set-Cookie"), want) {
					t.Errorf("request %d: Set-Cookie %q for body %q", i, r.header.Get("Set-Cookie"), r.body)
				}
			}
			if p := peak.Load(); p != n {
				t.Errorf("at most %d handler runs at once, want %d", p, n)
			}
			if s := c.Stats(); s.LoadErrors != 0 {
				t.Errorf("%d load errors, want 0 (not shared is no failure)", s.LoadErrors)
			}
		})
	}
}

// TestHitForMissExpires: the mark lives HitForMiss in Redis; the first
// request after it leads (and marks the URL again).
func TestHitForMissExpires(t *testing.T) {
	c, rdb := newCache(t, nil)
	const hfm = 300 * time.Millisecond
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header().Set("Cache-Control", "private")
				io.WriteString(w, "mine")
			})
			srv, cl := secServe(t, rt.build(New(c, &Options{HitForMiss: hfm}), h))
			url := srv.URL + "/me"
			if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusMiss) {
				t.Fatalf("first request: %v, want %q", r, statusMiss)
			}
			marked := time.Now()
			if pttl := rdb.PTTL(context.Background(), secRedisKey(secKeyOfURL(t, nil, url), "v")).Val(); pttl <= 0 || pttl > hfm {
				t.Errorf("the mark's PTTL is %v, want in (0, %v]", pttl, hfm)
			}
			for {
				r := secGet(t, cl, url)
				if sameStatus(r.cacheStatus(), statusMiss) {
					break // led: the mark expired
				}
				if !sameStatus(r.cacheStatus(), statusHitForMiss) {
					t.Fatalf("while marked: %v, want %q", r, statusHitForMiss)
				}
				if time.Since(marked) > 10*hfm {
					t.Fatalf("still marked %v after a mark of %v", time.Since(marked), hfm)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusHitForMiss) {
				t.Errorf("after leading again: %v, want the URL marked again", r)
			}
		})
	}
}

// TestHitForMissOnlyForTheURLsReasons: a failure (5xx), a status that is
// not cached, and a response to credentials outside the key do not mark
// the URL; nor does anything when HitForMiss is off. Each second request
// leads again (fwd=miss), never bypasses.
func TestHitForMissOnlyForTheURLsReasons(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, rt := range secRouters {
		for _, tc := range []struct {
			name   string
			opt    *Options
			hdr    []string // request header fields
			status int
			cc     string // the response's Cache-Control
			want   string // the second request's Cache-Status
		}{
			{"private", nil, nil, 200, "private", statusHitForMiss},
			{"private, off", &Options{HitForMiss: -1}, nil, 200, "private", statusMiss},
			{"503", nil, nil, 503, "", statusMiss},
			{"403 not cached", nil, nil, 403, "", statusMiss},
			{"credentials outside the key", &Options{AllowAuthorized: true}, []string{"Authorization", "Bearer x"}, 200, "private", statusMiss},
		} {
			t.Run(rt.name+"/"+tc.name, func(t *testing.T) {
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if tc.cc != "" {
						w.Header().Set("Cache-Control", tc.cc)
					}
					w.WriteHeader(tc.status)
				})
				srv, cl := secServe(t, rt.build(New(c, tc.opt), h))
				for i, want := range []string{statusMiss, tc.want} {
					if r := secGet(t, cl, srv.URL+"/x", tc.hdr...); r.status != tc.status || !sameStatus(r.cacheStatus(), want) {
						t.Errorf("request %d: %v, want %d with Cache-Status %q", i+1, r, tc.status, want)
					}
				}
			})
		}
	}
}

// TestHitForMissOptions: HitForMiss is validated in New.
func TestHitForMissOptions(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, d := range []time.Duration{time.Microsecond, 2 * time.Hour} {
		func() {
			defer func() {
				if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "Options.HitForMiss") {
					t.Errorf("HitForMiss %v: recovered %v, want a panic naming Options.HitForMiss", d, v)
				}
			}()
			New(c, &Options{HitForMiss: d})
		}()
	}
	for d, want := range map[time.Duration]time.Duration{0: 5 * time.Second, -1: 0, time.Second: time.Second} {
		if got := (&Options{HitForMiss: d}).resolve().HitForMiss; got != want {
			t.Errorf("HitForMiss %v resolves to %v, want %v", d, got, want)
		}
	}
}

// TestRequestCacheControl: a request's no-store bypasses the cache (the
// response must not be stored, RFC 9111 §5.2.1.5); its no-cache, Pragma:
// no-cache or max-age=0 (a browser's reload) is served from the cache.
func TestRequestCacheControl(t *testing.T) {
	c, rdb := newCache(t, nil)
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			var mu sync.Mutex
			var reasons []string
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "run%d", runs.Add(1))
			})
			opt := &Options{OnBypass: func(_ *http.Request, reason string) {
				mu.Lock()
				defer mu.Unlock()
				reasons = append(reasons, reason)
			}}
			srv, cl := secServe(t, rt.build(New(c, opt), h))
			url := srv.URL + "/page"
			if r := secGet(t, cl, url, "Cache-Control", "no-store"); !sameStatus(r.cacheStatus(), statusBypass) || secStored(t, rdb, secKeyOfURL(t, nil, url)) {
				t.Errorf("no-store on a cold URL: %v; want %q and nothing stored", r, statusBypass)
			}
			if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusStored) {
				t.Fatalf("plain request: %v, want %q", r, statusStored)
			}
			for _, hdr := range [][]string{{"Cache-Control", "no-cache"}, {"Pragma", "no-cache"}, {"Cache-Control", "max-age=0"}} {
				if r := secGet(t, cl, url, hdr...); !strings.HasPrefix(r.cacheStatus(), statusHit) || r.body != "run2" {
					t.Errorf("%s: %v, want the stored run2 as a hit", hdr, r)
				}
			}
			if r := secGet(t, cl, url, "Cache-Control", "max-age=10, No-Store"); !sameStatus(r.cacheStatus(), statusBypass) || r.body != "run3" {
				t.Errorf("No-Store on a stored URL: %v, want the handler's run3, bypassed", r)
			}
			mu.Lock()
			defer mu.Unlock()
			if strings.Join(reasons, ",") != BypassNoStore+","+BypassNoStore {
				t.Errorf("OnBypass reasons %q, want two %q", reasons, BypassNoStore)
			}
		})
	}
}

// TestStaleRefreshNotShared: a background refresh whose response is not
// shareable is counted as not shared, not as a load error; the stale
// response stays servable and refreshes back off.
func TestStaleRefreshNotShared(t *testing.T) {
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			c, _ := newCache(t, nil)
			var cookie atomic.Bool
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				if cookie.Load() {
					http.SetCookie(w, &http.Cookie{Name: "session", Value: "x"})
				}
				io.WriteString(w, "page")
			})
			srv, cl := secServe(t, rt.build(New(c, &Options{TTL: time.Millisecond, StaleFor: time.Minute}), h))
			url := srv.URL + "/news"
			if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusStored) {
				t.Fatalf("first request: %v, want %q", r, statusStored)
			}
			cookie.Store(true)
			time.Sleep(10 * time.Millisecond) // past the 1ms fresh period
			if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusStale) || r.header.Get("Set-Cookie") != "" {
				t.Fatalf("stale request: %v, want the stored page, stale", r)
			}
			secWaitFor(t, "the refresh", func() bool { return c.Stats().NotShared == 1 })
			if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusStale) || r.body != "page" {
				t.Errorf("after the refresh: %v, want the stale page", r)
			}
			if s := c.Stats(); s.LoadErrors != 0 || s.NotShared != 1 || runs.Load() != 2 {
				t.Errorf("load errors %d, not shared %d, handler runs %d; want 0, 1, 2 (the refresh backs off)", s.LoadErrors, s.NotShared, runs.Load())
			}
		})
	}
}

// TestStreamedRefusalMarksNothing: a response that streams (the handler
// flushes) with a status that has no TTL in StatusTTL (a 429 for one
// client) or a 5xx marks nothing, as it marks nothing when it does not
// stream: the next request for the URL leads a rebuild, and caching comes
// back as soon as the handler answers a cacheable response. From the
// HTTP issue's hole 4: a streamed 429 turned caching off for everyone.
func TestStreamedRefusalMarksNothing(t *testing.T) {
	c, _ := newCache(t, nil)
	for _, status := range []int{http.StatusTooManyRequests, http.StatusForbidden, http.StatusServiceUnavailable} {
		for _, rt := range secRouters {
			t.Run(fmt.Sprint(status, "/", rt.name), func(t *testing.T) {
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) == 1 {
						w.WriteHeader(status)
						io.WriteString(w, "slow down")
						http.NewResponseController(w).Flush()
						return
					}
					io.WriteString(w, "page")
				})
				srv, cl := secServe(t, rt.build(New(c, &Options{HitForMiss: time.Minute}), h))
				url := srv.URL + "/busy"
				if r := secGet(t, cl, url); r.status != status {
					t.Fatalf("first GET: %v, want %d", r, status)
				}
				if r := secGet(t, cl, url); !sameStatus(r.cacheStatus(), statusStored) || r.body != "page" {
					t.Errorf("second GET: %v, want the page stored (no hit-for-miss mark)", r)
				}
			})
		}
	}
}
