package middleware

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	herdprom "github.com/herdkit/herd/prometheus"
	prom "github.com/prometheus/client_golang/prometheus"
)

// promSum adds the values of the series of name whose labels include
// want (a histogram counts its samples).
func promSum(t *testing.T, reg *prom.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				total += m.Counter.GetValue()
			case m.Histogram != nil:
				total += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return total
}

// metricsInstance is one instance of a service: its Cache, its registry
// and its server.
type metricsInstance struct {
	cache *herd.Cache
	reg   *prom.Registry
	srv   string
	cl    *http.Client
}

// metricsRouters mount the routes of the metrics tests: /p/{id} (a
// page), /s/{id} (a page stale after 1ms, servable stale for a minute),
// /c/{id} (sets a cookie) and /f/{id} (fails with a 500), behind the
// middleware with Class RoutePattern, on each router. ServeMux registers
// the middleware per route; chi has it in the r.Use of a router mounted
// at "/", which runs before that router has matched (r.Pattern is "/*"
// then, so RoutePattern routes the request once more).
var metricsRouters = []struct {
	name    string
	pattern func(route string) string // the class of a route
	build   func(page, stale func(http.Handler) http.Handler, h http.Handler) http.Handler
}{
	{"ServeMux", func(route string) string { return "GET " + route }, func(page, stale func(http.Handler) http.Handler, h http.Handler) http.Handler {
		mux := http.NewServeMux()
		for _, route := range []string{"/p/{id}", "/c/{id}", "/f/{id}"} {
			mux.Handle("GET "+route, page(h))
			mux.Handle("POST "+route, page(h))
		}
		mux.Handle("GET /s/{id}", stale(h))
		return secOuter{mux}
	}},
	{"chi", func(route string) string { return route }, func(page, stale func(http.Handler) http.Handler, h http.Handler) http.Handler {
		pages := chi.NewRouter()
		pages.Use(page)
		pages.Get("/p/{id}", h.ServeHTTP)
		pages.Post("/p/{id}", h.ServeHTTP)
		pages.Get("/c/{id}", h.ServeHTTP)
		pages.Get("/f/{id}", h.ServeHTTP)
		r := chi.NewRouter()
		r.With(stale).Get("/s/{id}", h.ServeHTTP)
		r.Mount("/", pages)
		return secOuter{r}
	}},
}

// newMetricsInstances starts n instances of one service on one Redis,
// each with the Prometheus adapter on its own registry.
func newMetricsInstances(t *testing.T, n int, opt Options, build func(page, stale func(http.Handler) http.Handler, h http.Handler) http.Handler, h http.Handler) []*metricsInstance {
	t.Helper()
	srv := redistest.Start(t)
	var out []*metricsInstance
	for range n {
		reg := prom.NewRegistry()
		c := herd.New(srv.Client(t), &herd.Options{
			Observer:    herdprom.NewObserver(reg, nil),
			KeyClass:    KeyClass(nil),
			WaitTimeout: secWait,
		})
		t.Cleanup(func() { c.Close() })
		o := opt
		o.Class = RoutePattern // the instances share entries whatever their ports
		o.OnBypass = herdprom.NewBypassCounter(reg, nil)
		so := o
		so.TTL, so.StaleFor = time.Millisecond, time.Minute
		so.Scope = "stale" // a second middleware on the Cache: a scope of its own
		_, cl := secServe(t, build(New(c, &o), New(c, &so), h))
		// The client dials its own server whatever the URL's host: every
		// instance is "shop.test", as behind a load balancer.
		out = append(out, &metricsInstance{cache: c, reg: reg, srv: "http://shop.test", cl: cl})
	}
	return out
}

// TestMetricsAgree drives a known mix of requests through two instances
// and checks that each instance's Cache.Stats and Prometheus counters
// agree with each other, and their sums with the mix: hits, a collapsed
// wave across both instances, a stale hit and its refresh, bypasses, a
// response that sets a cookie (then hit-for-miss), and a failing handler.
func TestMetricsAgree(t *testing.T) {
	for _, rt := range metricsRouters {
		t.Run(rt.name, func(t *testing.T) {
			var runs atomic.Int64
			gate := newSecGate(t)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				switch {
				case strings.HasPrefix(r.URL.Path, "/p/wave"):
					gate.wait(r)
				case strings.HasPrefix(r.URL.Path, "/c/"):
					http.SetCookie(w, &http.Cookie{Name: "session", Value: "x"})
				case strings.HasPrefix(r.URL.Path, "/f/"):
					w.WriteHeader(http.StatusInternalServerError)
				}
				io.WriteString(w, "page "+r.URL.Path)
			})
			in := newMetricsInstances(t, 2, Options{}, rt.build, h)
			a, b := in[0], in[1]
			expect := func(i *metricsInstance, path, want string, hdr ...string) {
				t.Helper()
				if r := secGet(t, i.cl, i.srv+path, hdr...); !strings.HasPrefix(r.cacheStatus(), want) {
					t.Errorf("GET %s: %v, want Cache-Status %q", path, r, want)
				}
			}

			expect(a, "/p/1", statusStored) // leader, load ok
			expect(b, "/p/1", statusHit)
			expect(a, "/p/1", statusHit)

			// A collapsed wave: the leader on a, the others waiting on a
			// (for a's Fill) and on b (through Redis).
			const wave = 6
			first := secParallel(a.cl, []*http.Request{secNewReq(t, http.MethodGet, a.srv+"/p/wave", nil)})
			secWaitFor(t, "the wave's leader", func() bool { return runs.Load() == 2 })
			var reqs []*http.Request
			var cls []*http.Client
			for i := range wave - 1 {
				i := []*metricsInstance{a, b}[i%2]
				reqs, cls = append(reqs, secNewReq(t, http.MethodGet, i.srv+"/p/wave", nil)), append(cls, i.cl)
			}
			var waiters sync.WaitGroup
			collapsed := make(chan string, wave-1)
			for i, req := range reqs {
				waiters.Go(func() { collapsed <- secDo(cls[i], req).cacheStatus() })
			}
			secWaitFor(t, "the wave's waiters", func() bool { return secWaiting() == wave-1 })
			gate.open()
			first.wait(t)
			waiters.Wait()
			close(collapsed)
			for cs := range collapsed {
				if !sameStatus(cs, statusCollapsed) {
					t.Errorf("a waiter of the wave: Cache-Status %q, want %q", cs, statusCollapsed)
				}
			}

			// Stale: stored for 1ms, then served stale while one refresh
			// runs (a load under the lease).
			expect(b, "/s/1", statusStored)
			time.Sleep(10 * time.Millisecond) // past the 1ms fresh period; nothing else depends on time
			expect(a, "/s/1", statusStale)
			secWaitFor(t, "the refresh's load", func() bool { return a.cache.Stats().Loads == 3 }) // /p/1, the wave, the refresh

			// Bypasses, counted by reason.
			for _, by := range []struct {
				i   *metricsInstance
				req *http.Request
			}{
				{a, secNewReq(t, http.MethodPost, a.srv+"/p/1", nil)},
				{a, secNewReq(t, http.MethodGet, a.srv+"/p/1", nil, "Range", "bytes=0-1")},
				{b, secNewReq(t, http.MethodGet, b.srv+"/p/1", nil, "Cookie", "a=b")},
				{b, secNewReq(t, http.MethodGet, b.srv+"/p/1", nil, "Cache-Control", "no-store")},
			} {
				if res := secSend(t, by.i.cl, by.req); !sameStatus(res.cacheStatus(), statusBypass) {
					t.Errorf("%s %s %v: %v, want bypassed", by.req.Method, by.req.URL, by.req.Header, res)
				}
			}

			// Not shared: the cookie marks the URL; two lookups find it.
			expect(a, "/c/1", statusMiss)
			expect(b, "/c/1", statusHitForMiss)
			expect(a, "/c/1", statusHitForMiss)

			// A failing handler: two rebuilds, two load errors.
			expect(a, "/f/1", statusMiss)
			expect(b, "/f/1", statusMiss)

			type count struct {
				name          string
				stats, metric func(i *metricsInstance) float64
			}
			lookups := func(outcome string) func(*metricsInstance) float64 {
				return func(i *metricsInstance) float64 {
					return promSum(t, i.reg, "herd_lookups_total", map[string]string{"outcome": outcome})
				}
			}
			loads := func(labels map[string]string) func(*metricsInstance) float64 {
				return func(i *metricsInstance) float64 { return promSum(t, i.reg, "herd_loads_total", labels) }
			}
			st := func(f func(herd.Stats) uint64) func(*metricsInstance) float64 {
				return func(i *metricsInstance) float64 { return float64(f(i.cache.Stats())) }
			}
			for _, c := range []count{
				{"hits", st(func(s herd.Stats) uint64 { return s.Hits }), lookups("hit")},
				{"stale", st(func(s herd.Stats) uint64 { return s.StaleServed }), lookups("stale")},
				{"passes", st(func(s herd.Stats) uint64 { return s.Passes }), lookups("pass")},
				{"leased loads", st(func(s herd.Stats) uint64 { return s.Loads }), loads(map[string]string{"leased": "true"})},
				{"local loads", st(func(s herd.Stats) uint64 { return s.LocalLoads }), loads(map[string]string{"leased": "false"})},
				{"load errors", st(func(s herd.Stats) uint64 { return s.LoadErrors }), loads(map[string]string{"result": "error"})},
				{"not shared", st(func(s herd.Stats) uint64 { return s.NotShared }), loads(map[string]string{"result": "not_shared"})},
				{"leaders (loads but refreshes)", st(func(s herd.Stats) uint64 { return s.Loads - s.Refreshes }), lookups("leader")},
			} {
				for n, i := range in {
					if s, m := c.stats(i), c.metric(i); s != m {
						t.Errorf("instance %d: %s: Stats %v, Prometheus %v", n, c.name, s, m)
					}
				}
			}

			total := func(f func(*metricsInstance) float64) float64 { return f(a) + f(b) }
			for name, c := range map[string]struct {
				got  float64
				want float64
			}{
				"leader lookups":     {total(lookups("leader")), 6}, // /p/1, /p/wave, /s/1, /c/1, /f/1 twice
				"follower lookups":   {total(lookups("follower")), wave - 1},
				"hit lookups":        {total(lookups("hit")), 2},
				"stale lookups":      {total(lookups("stale")), 1},
				"pass lookups":       {total(lookups("pass")), 2},
				"ok loads":           {total(loads(map[string]string{"result": "ok"})), 4}, // and the refresh
				"not-shared loads":   {total(loads(map[string]string{"result": "not_shared"})), 1},
				"failed loads":       {total(loads(map[string]string{"result": "error"})), 2},
				"refreshes":          {total(st(func(s herd.Stats) uint64 { return s.Refreshes })), 1},
				"handler runs":       {float64(runs.Load()), 13}, // 6 leads, the refresh, 4 bypasses, 2 hit-for-miss
				"method bypasses":    {total(bypasses(t, "method")), 1},
				"range bypasses":     {total(bypasses(t, "range")), 1},
				"cookie bypasses":    {total(bypasses(t, "credentials")), 1},
				"no-store bypasses":  {total(bypasses(t, "no_store")), 1},
				"hit-for-miss count": {total(bypasses(t, "hit_for_miss")), 2},
			} {
				if c.got != c.want {
					t.Errorf("%s: %v, want %v", name, c.got, c.want)
				}
			}
			// Per route: the class is the route's pattern.
			for route, want := range map[string]float64{"/p/{id}": 3 + wave, "/s/{id}": 2, "/c/{id}": 3, "/f/{id}": 2} {
				got := promSum(t, a.reg, "herd_lookups_total", map[string]string{"class": rt.pattern(route)}) +
					promSum(t, b.reg, "herd_lookups_total", map[string]string{"class": rt.pattern(route)})
				if got != want {
					t.Errorf("lookups of class %q: %v, want %v", rt.pattern(route), got, want)
				}
			}
		})
	}
}

// bypasses returns the bypass count of reason of an instance.
func bypasses(t *testing.T, reason string) func(*metricsInstance) float64 {
	return func(i *metricsInstance) float64 {
		return promSum(t, i.reg, "herd_http_bypasses_total", map[string]string{"reason": reason})
	}
}

// TestLeaderCountsLoads: outcome="leader" counts loads. Ten cold pages
// and waves of concurrent requests to a cookie-setting URL on two
// instances, with hit-for-miss off and on: every leader lookup is one
// leased load, ten of them ok and the others not shared, never load
// errors. (Before, each not-shared rebuild was a leader lookup and a load
// error in Prometheus, and no load at all in Stats: 929 leaders for 10
// loads in one trial.)
func TestLeaderCountsLoads(t *testing.T) {
	for _, hfm := range []time.Duration{-1, time.Minute} {
		t.Run(fmt.Sprintf("HitForMiss=%v", hfm), func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasPrefix(r.URL.Path, "/c/") {
					http.SetCookie(w, &http.Cookie{Name: "session", Value: "x"})
				}
				io.WriteString(w, "page")
			})
			in := newMetricsInstances(t, 2, Options{HitForMiss: hfm}, metricsRouters[1].build, h)
			for n := range 10 {
				secGet(t, in[n%2].cl, fmt.Sprintf("%s/p/%d", in[n%2].srv, n))
			}
			for range 5 {
				var reqs []*http.Request
				for n := range 20 {
					reqs = append(reqs, secNewReq(t, http.MethodGet, in[n%2].srv+"/c/1", nil))
				}
				var wg sync.WaitGroup
				for n, req := range reqs {
					wg.Go(func() { secDo(in[n%2].cl, req) })
				}
				wg.Wait()
			}
			var leaders, leased, ok, notShared, failed, passes, loads float64
			for _, i := range in {
				leaders += promSum(t, i.reg, "herd_lookups_total", map[string]string{"outcome": "leader"})
				passes += promSum(t, i.reg, "herd_lookups_total", map[string]string{"outcome": "pass"})
				leased += promSum(t, i.reg, "herd_loads_total", map[string]string{"leased": "true"})
				ok += promSum(t, i.reg, "herd_loads_total", map[string]string{"result": "ok"})
				notShared += promSum(t, i.reg, "herd_loads_total", map[string]string{"result": "not_shared"})
				failed += promSum(t, i.reg, "herd_loads_total", map[string]string{"result": "error"})
				loads += float64(i.cache.Stats().Loads)
			}
			if leaders != leased || leaders != loads || ok != 10 || failed != 0 || notShared != leaders-10 {
				t.Errorf("leader lookups %v, leased loads %v (Stats %v): %v ok, %v not shared, %v failed; want leaders = loads, 10 ok, the rest not shared",
					leaders, leased, loads, ok, notShared, failed)
			}
			if hfm > 0 && (notShared < 1 || passes == 0) {
				t.Errorf("with hit-for-miss: %v not shared, %v pass lookups; want the cookie URL marked once and then passed", notShared, passes)
			}
			t.Logf("leaders %v, not shared %v, passes %v", leaders, notShared, passes)
		})
	}
}
