package middleware

// The cross-process test of KeyCookies, on process_test.go's worker
// machinery (xpSpawn): the handler's runs are counted by an HTTP origin
// that the parent test runs, not in the Redis under test.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// xpEnvOrigin is the parent's origin URL, which a cookieserver worker's
// handler fetches its page from.
const xpEnvOrigin = "HERD_MW_TEST_ORIGIN"

func init() { xpWorkerRoles["cookieserver"] = xpCookieServer }

// ckOrigin is the parent's origin: it counts the calls per lang, holds
// each until the test releases it, and keeps the Cookie header each
// handler run saw.
type ckOrigin struct {
	release chan struct{} // closed to let held calls answer
	mu      sync.Mutex
	calls   map[string]int
	cookies []string
}

func (o *ckOrigin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	lang := r.URL.Query().Get("lang")
	o.mu.Lock()
	o.calls[lang]++
	n := o.calls[lang]
	o.cookies = append(o.cookies, r.Header.Get("X-Seen-Cookie"))
	release := o.release
	o.mu.Unlock()
	limit := time.NewTimer(secWait)
	defer limit.Stop()
	select {
	case <-release:
	case <-r.Context().Done():
		return
	case <-limit.C:
	}
	fmt.Fprintf(w, "catalog %s in %s (origin call %d)\n", r.URL.Path, lang, n)
}

// TestCrossProcessKeyCookies: 4 processes serve a chi router with the
// middleware (KeyCookies lang) and share one redis-server. 200 concurrent
// clients, spread over the processes, ask for one cold URL with the same
// lang cookie but each with analytics and consent cookies of its own, in
// varied orders. The origin holds its answer until all 200 requests have
// reached the workers. The handler must run exactly once in the whole
// cluster (counted by the origin), every client must get that run's page,
// and the run must have seen the whole Cookie header. A second wave with
// another lang on the same URL is another entry: one more run.
func TestCrossProcessKeyCookies(t *testing.T) {
	const (
		procs   = 4
		clients = 200
	)
	srv := redistest.Start(t)
	origin := &ckOrigin{calls: map[string]int{}}
	osrv := httptest.NewServer(origin)
	defer osrv.Close()

	p := xpSpawn(t, procs, "cookieserver",
		xpEnvRedis+"="+srv.Addr(), xpEnvOrigin+"="+osrv.URL, xpEnvDeadline+"=60s")
	defer p.stop(10 * time.Second)
	addrs := ckListening(t, p, procs)
	t.Logf("workers at %v", addrs)

	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 2 * secWait}
	xpWarm(t, client, addrs, clients)
	probe := &http.Client{Timeout: secWait} // for /arrived, beside the clients' connections
	defer probe.CloseIdleConnections()

	consents := []string{"yes", "no", "analytics%2Cads"}
	for wave, lang := range []string{"de", "fr"} {
		t.Run(lang, func(t *testing.T) {
			release := make(chan struct{})
			origin.mu.Lock()
			origin.release = release
			origin.mu.Unlock()
			defer func() {
				select {
				case <-release:
				default:
					close(release)
				}
			}()

			results := make([]xpResult, clients)
			start := make(chan struct{})
			var ready, done sync.WaitGroup
			ready.Add(clients)
			for i := range clients {
				done.Go(func() {
					res := &results[i]
					res.proc = i % procs
					req, err := http.NewRequest(http.MethodGet, "http://"+addrs[res.proc]+"/items/teapot", nil)
					ready.Done()
					if err != nil {
						res.err = err
						return
					}
					req.Host = "catalog.example" // as behind a load balancer
					ga := fmt.Sprintf("_ga=GA1.2.%d.%d", 1000+i, 7*i)
					consent := "consent=" + consents[i%len(consents)]
					pairs := [][]string{
						{ga, "lang=" + lang, consent},
						{"lang=" + lang, consent, ga, "_gid=GA1.2." + strconv.Itoa(i)},
						{consent, ga, "lang=" + lang},
					}[i%3]
					req.Header.Set("Cookie", strings.Join(pairs, "; "))
					<-start
					resp, err := client.Do(req)
					if err != nil {
						res.err = err
						return
					}
					defer resp.Body.Close()
					b, err := io.ReadAll(resp.Body)
					res.status, res.cacheStatus, res.body, res.err = resp.StatusCode, resp.Header.Get("Cache-Status"), string(b), err
				})
			}
			ready.Wait()
			close(start)

			// Every request of the wave is in a worker before the one
			// handler run may answer.
			want := clients * (wave + 1)
			secWaitForState(t, "every request in a worker", func() (bool, string) {
				n := 0
				for _, a := range addrs {
					resp, err := probe.Get("http://" + a + "/arrived")
					if err != nil {
						return false, err.Error()
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					k, _ := strconv.Atoi(strings.TrimSpace(string(b)))
					n += k
				}
				return n == want, fmt.Sprintf("%d of %d arrived", n, want)
			})
			close(release)
			done.Wait()

			origin.mu.Lock()
			calls, seen := origin.calls[lang], slices.Clone(origin.cookies)
			origin.mu.Unlock()
			if calls != 1 {
				t.Errorf("the handler ran %d times in the cluster for %d clients with lang=%s, want 1", calls, clients, lang)
			}
			if last := seen[len(seen)-1]; !strings.Contains(last, "_ga=GA1.2.") || !strings.Contains(last, "lang="+lang) {
				t.Errorf("the handler run saw Cookie %q, want the request's whole header (with its _ga and lang)", last)
			}

			counts := map[string]int{}
			bodies := map[string]int{}
			var failures []string
			for i, r := range results {
				if r.err != nil || r.status != http.StatusOK {
					failures = append(failures, fmt.Sprintf("client %d (worker %d): status %d, err %v, body %q", i, r.proc, r.status, r.err, r.body))
					continue
				}
				bodies[r.body]++
				cs := r.cacheStatus
				if strings.HasPrefix(cs, statusHit) {
					cs = statusHit
				}
				counts[cs]++
			}
			if len(failures) > 0 {
				t.Errorf("%d of %d clients did not get a 200:\n%s", len(failures), clients, strings.Join(failures[:min(len(failures), 10)], "\n"))
			}
			wantBody := fmt.Sprintf("catalog /items/teapot in %s (origin call 1)\n", lang)
			if len(bodies) != 1 || bodies[wantBody] != clients-len(failures) {
				t.Errorf("clients got bodies %v, want only %q", bodies, wantBody)
			}
			if counts[statusStored] != 1 || counts[statusStored]+counts[statusCollapsed]+counts[statusHit] != clients-len(failures) {
				t.Errorf("Cache-Status counts %v, want one %q and the others %q or %q", counts, statusStored, statusCollapsed, statusHit)
			}
			t.Logf("%d clients: Cache-Status %v", clients, counts)
		})
	}
}

// ckListening waits for each worker to print "listening <instance>
// <address>" and returns the addresses by instance.
func ckListening(t *testing.T, p *xpProcs, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	secWaitForState(t, "every worker listening", func() (bool, string) {
		if err := p.exited(); err != nil {
			t.Fatal(err)
		}
		got := 0
		for i := range n {
			for ln := range strings.Lines(p.outs[i].String()) {
				var inst int
				var addr string
				if _, err := fmt.Sscanf(ln, "listening %d %s", &inst, &addr); err == nil && inst == i {
					addrs[i] = addr
					got++
					break
				}
			}
		}
		return got == n, fmt.Sprintf("%d of %d", got, n)
	})
	return addrs
}

// xpCookieServer is one instance: a chi router with the middleware
// (KeyCookies lang) on a route whose handler fetches its page from the
// parent's origin, telling it the Cookie header it saw. It counts the
// requests for /items/ that reach it (GET /arrived), and prints
// "listening <instance> <address>" once it listens.
func xpCookieServer() error {
	redisAddr, originURL := os.Getenv(xpEnvRedis), os.Getenv(xpEnvOrigin)
	if redisAddr == "" || originURL == "" {
		return errors.New("missing " + xpEnvRedis + " or " + xpEnvOrigin)
	}
	inst, err := strconv.Atoi(os.Getenv(xpEnvInst))
	if err != nil {
		return fmt.Errorf("%s: %w", xpEnvInst, err)
	}
	limit, err := time.ParseDuration(os.Getenv(xpEnvDeadline))
	if err != nil {
		return fmt.Errorf("%s: %w", xpEnvDeadline, err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 100})
	defer rdb.Close()
	cache := herd.New(rdb, nil)
	defer cache.Close()
	originClient := &http.Client{Timeout: 2 * secWait}

	var arrived atomic.Int64
	r := chi.NewRouter()
	r.Use(chimw.Recoverer)
	r.Get("/ping", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond) // keep the connections of a warm-up busy at once
	})
	r.Get("/arrived", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, arrived.Load())
	})
	r.With(New(cache, &Options{Scope: "catalog", KeyCookies: []string{"lang"}})).
		Get("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
			lang := "en"
			if c, err := r.Cookie("lang"); err == nil {
				lang = c.Value
			}
			req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, originURL+"/items/"+chi.URLParam(r, "id")+"?lang="+lang, nil)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			req.Header.Set("X-Seen-Cookie", r.Header.Get("Cookie"))
			resp, err := originClient.Do(req)
			if err != nil {
				http.Error(w, "origin: "+err.Error(), http.StatusBadGateway)
				return
			}
			defer resp.Body.Close()
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(resp.StatusCode)
			_, _ = io.Copy(w, resp.Body)
		})
	counted := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.HasPrefix(req.URL.Path, "/items/") {
			arrived.Add(1)
		}
		r.ServeHTTP(w, req)
	})

	return serveUntilStopped(counted, limit, func(addr net.Addr) error {
		_, err := fmt.Printf("listening %d %s\n", inst, addr)
		return err
	})
}
