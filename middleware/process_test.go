package middleware

// Cross-process tests of the middleware. The test binary is re-run as
// worker processes (see xpSpawn): each serves the same chi router, with
// the middleware, on its own port, and all of them share one real
// redis-server started by the parent. The handler counts its runs in Redis
// with INCR, so the parent sees how often it ran in the whole cluster.
//
// A worker stops when the parent closes its stdin (or dies, which closes
// it too), and in any case at its deadline, so none outlives the test.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// xpWorkerEnv names the worker role when the test binary is re-run as an
// instance process; TestMain hands such a process to runWorkerIfAsked.
const xpWorkerEnv = "HERD_MW_TEST_WORKER"

// Environment of a worker process.
const (
	xpEnvRedis    = "HERD_MW_TEST_REDIS"    // redis-server address
	xpEnvRun      = "HERD_MW_TEST_RUN"      // prefix of the bookkeeping keys
	xpEnvInst     = "HERD_MW_TEST_INSTANCE" // index of this worker
	xpEnvDeadline = "HERD_MW_TEST_DEADLINE" // the longest a worker runs
)

// xpWorkerRoles holds what a re-run test binary can act as.
var xpWorkerRoles = map[string]func() error{
	"chiserver": xpChiServer,
}

// runWorkerIfAsked runs the worker role named in the environment, if
// any, and exits the process with its status. It returns at once in the
// parent test process.
func runWorkerIfAsked() {
	role := os.Getenv(xpWorkerEnv)
	if role == "" {
		return
	}
	fn, ok := xpWorkerRoles[role]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown worker role %q\n", role)
		os.Exit(2)
	}
	if err := fn(); err != nil {
		fmt.Fprintf(os.Stderr, "worker %s (pid %d): %v\n", role, os.Getpid(), err)
		os.Exit(1)
	}
	os.Exit(0)
}

// ---------------------------------------------------------------------------
// Parent side.

// xpProcs is a set of worker processes started by xpSpawn.
type xpProcs struct {
	t      *testing.T
	cmds   []*exec.Cmd
	stdins []io.WriteCloser
	outs   []*xpBuffer
	done   []chan struct{} // closed when the process has been reaped
	errs   []error         // exit status, valid once done is closed
}

// xpBuffer is a bytes.Buffer safe for the writer goroutine of exec.Cmd
// and a reader in the test.
type xpBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *xpBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *xpBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// xpSpawn re-runs the test binary n times in role with env. Each process
// is reaped in the background; at the end of the test any still running
// is killed by its pid.
func xpSpawn(t *testing.T, n int, role string, env ...string) *xpProcs {
	t.Helper()
	p := &xpProcs{t: t, done: make([]chan struct{}, n), errs: make([]error, n)}
	t.Cleanup(func() {
		for i, c := range p.cmds {
			select {
			case <-p.done[i]:
			default:
				_ = c.Process.Kill()
				<-p.done[i]
			}
		}
	})
	for i := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), env...)
		cmd.Env = append(cmd.Env, xpWorkerEnv+"="+role, xpEnvInst+"="+strconv.Itoa(i))
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
		out := &xpBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start worker %d: %v", i, err)
		}
		p.cmds, p.stdins, p.outs = append(p.cmds, cmd), append(p.stdins, stdin), append(p.outs, out)
		p.done[i] = make(chan struct{})
		go func() {
			p.errs[i] = cmd.Wait()
			close(p.done[i])
		}()
	}
	return p
}

// exited reports the first worker that exited before it was told to stop.
func (p *xpProcs) exited() error {
	for i := range p.cmds {
		select {
		case <-p.done[i]:
			return fmt.Errorf("worker %d (pid %d) exited early: %v\n%s", i, p.cmds[i].Process.Pid, p.errs[i], p.outs[i])
		default:
		}
	}
	return nil
}

// stop closes every worker's stdin, which tells it to shut down, waits up
// to d for all of them, kills those still running, and reports every
// worker that did not exit with status 0.
func (p *xpProcs) stop(d time.Duration) {
	p.t.Helper()
	for _, in := range p.stdins {
		_ = in.Close()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for i, c := range p.cmds {
		select {
		case <-p.done[i]:
		case <-timer.C:
			p.t.Errorf("worker %d (pid %d) still running %v after it was told to stop: killing it", i, c.Process.Pid, d)
			for j := i; j < len(p.cmds); j++ {
				select {
				case <-p.done[j]:
				default:
					_ = p.cmds[j].Process.Kill()
				}
			}
			<-p.done[i]
		}
		if p.errs[i] != nil {
			p.t.Errorf("worker %d (pid %d): %v\n%s", i, c.Process.Pid, p.errs[i], p.outs[i])
		}
	}
}

// xpResult is what one client got.
type xpResult struct {
	proc        int // the worker it asked
	status      int
	cacheStatus string
	body        string
	err         error
}

// TestCrossProcessCoalescing: 4 processes serve the same chi router with
// the middleware and share one redis-server. 200 concurrent clients,
// spread round-robin over the processes and released together, ask for
// one cold URL whose handler takes 100 ms. The handler must run exactly
// once in the whole cluster, every client must get a 200 with the same
// bytes (those of the process that ran it), and exactly one response must
// say it was stored, the others collapsed onto it (or hits, for clients
// that arrived after the commit). Three cold URLs in turn.
func TestCrossProcessCoalescing(t *testing.T) {
	const (
		procs   = 4
		clients = 200
		urls    = 3
	)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	run := "mwxp-" + strconv.FormatInt(time.Now().UnixNano(), 36)

	p := xpSpawn(t, procs, "chiserver",
		xpEnvRedis+"="+srv.Addr(), xpEnvRun+"="+run, xpEnvDeadline+"=60s")
	defer p.stop(10 * time.Second)

	// Each worker announces "instance pid address" once it listens.
	addrs, pids := make([]string, procs), make([]int, procs)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := p.exited(); err != nil {
			t.Fatal(err)
		}
		lines, err := rdb.LRange(ctx, run+":addrs", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(lines) == procs {
			for _, ln := range lines {
				var inst, pid int
				var addr string
				if _, err := fmt.Sscan(ln, &inst, &pid, &addr); err != nil || inst < 0 || inst >= procs {
					t.Fatalf("bad announcement %q: %v", ln, err)
				}
				addrs[inst], pids[inst] = addr, pid
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d workers listening after 20s", len(lines), procs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("workers: pids %v at %v", pids, addrs)

	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	xpWarm(t, client, addrs, clients)

	for u := range urls {
		path := fmt.Sprintf("/items/%s-%d", run, u)
		t.Run(strconv.Itoa(u), func(t *testing.T) {
			results := make([]xpResult, clients)
			start := make(chan struct{})
			var ready, done sync.WaitGroup
			ready.Add(clients)
			for i := range clients {
				done.Go(func() {
					res := &results[i]
					res.proc = i % procs
					req, err := http.NewRequest(http.MethodGet, "http://"+addrs[res.proc]+path, nil)
					ready.Done()
					if err != nil {
						res.err = err
						return
					}
					// The key includes the Host: as behind a load balancer,
					// every instance is asked for the same host name.
					req.Host = "catalog.example"
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
			began := time.Now()
			close(start)
			done.Wait()
			elapsed := time.Since(began)

			runs, err := rdb.Get(ctx, run+":runs:"+path).Int()
			if err != nil {
				t.Fatalf("handler run count: %v", err)
			}
			if runs != 1 {
				t.Errorf("the handler ran %d times in the cluster for %d concurrent requests, want 1", runs, clients)
			}

			counts := map[string]int{}
			perProc := make([]map[string]int, procs)
			for i := range perProc {
				perProc[i] = map[string]int{}
			}
			var stored []int
			bodies := map[string]int{}
			var failures []string
			for i, r := range results {
				if r.err != nil || r.status != http.StatusOK {
					failures = append(failures, fmt.Sprintf("client %d (worker %d): status %d, err %v, body %q", i, r.proc, r.status, r.err, r.body))
					continue
				}
				bodies[r.body]++
				cs := r.cacheStatus
				if strings.HasPrefix(cs, statusHit+";") || sameStatus(cs, statusHit) {
					cs = statusHit // "herd; hit; ttl=59": count the hits together
				}
				counts[cs]++
				perProc[r.proc][cs]++
				if r.cacheStatus == statusStored {
					stored = append(stored, i)
				}
			}
			if len(failures) > 0 {
				t.Errorf("%d of %d clients did not get a 200:\n%s", len(failures), clients, strings.Join(failures[:min(len(failures), 10)], "\n"))
			}
			if len(bodies) != 1 {
				t.Errorf("clients got %d different bodies, want 1: %v", len(bodies), bodies)
			}
			if len(stored) != 1 {
				t.Errorf("%d responses say %q, want exactly 1", len(stored), statusStored)
			}
			for cs, n := range counts {
				if !sameStatus(cs, statusStored) && !sameStatus(cs, statusCollapsed) && !sameStatus(cs, statusHit) {
					t.Errorf("%d responses say Cache-Status %q, want %q or %q after the one %q", n, cs, statusCollapsed, statusHit, statusStored)
				}
			}
			if len(stored) == 1 && len(bodies) == 1 {
				// The stored response came from the process that built it,
				// and that is the body every other process served.
				builder := results[stored[0]].proc
				want := fmt.Sprintf("built by pid %d for %s-%d\n", pids[builder], run, u)
				if results[stored[0]].body != want {
					t.Errorf("body %q, want %q (the worker whose response says stored)", results[stored[0]].body, want)
				}
				t.Logf("built by worker %d (pid %d)", builder, pids[builder])
			}
			t.Logf("%d clients in %v: Cache-Status %v; per worker %v", clients, elapsed.Round(time.Millisecond), counts, perProc)
		})
	}
}

// xpWarm opens the clients' connections ahead of the waves (n concurrent
// requests to an uncached route), so that the requests of a wave reach
// the workers together rather than behind TCP handshakes.
func xpWarm(t *testing.T, client *http.Client, addrs []string, n int) {
	t.Helper()
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, err := client.Get("http://" + addrs[i%len(addrs)] + "/ping")
			if err != nil {
				errs <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatalf("warming up the connections: %v", err)
	}
}

// ---------------------------------------------------------------------------
// Worker side.

// xpChiServer is one instance of the service: a chi router with the
// middleware on a route whose handler is slow and counts its runs in
// Redis.
func xpChiServer() error {
	ctx := context.Background()
	run, addr := os.Getenv(xpEnvRun), os.Getenv(xpEnvRedis)
	if run == "" || addr == "" {
		return errors.New("missing " + xpEnvRun + " or " + xpEnvRedis)
	}
	inst, err := strconv.Atoi(os.Getenv(xpEnvInst))
	if err != nil {
		return fmt.Errorf("%s: %w", xpEnvInst, err)
	}
	limit, err := time.ParseDuration(os.Getenv(xpEnvDeadline))
	if err != nil {
		return fmt.Errorf("%s: %w", xpEnvDeadline, err)
	}
	pid := os.Getpid()

	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 100})
	defer rdb.Close()
	cache := herd.New(rdb, nil)
	defer cache.Close()

	r := chi.NewRouter()
	r.Use(chimw.Recoverer)
	r.Get("/ping", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond) // keep the connections of a warm-up busy at once
	})
	// The workers listen on different ports of one host: one Scope makes
	// them one service (the default scope is the listener's port).
	r.With(New(cache, &Options{Scope: "catalog"})).Get("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := rdb.Incr(r.Context(), run+":runs:"+r.URL.Path).Err(); err != nil {
			http.Error(w, "count: "+err.Error(), http.StatusInternalServerError)
			return
		}
		time.Sleep(100 * time.Millisecond) // a slow database
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "built by pid %d for %s\n", pid, chi.URLParam(r, "id"))
	})

	return serveUntilStopped(r, limit, func(addr net.Addr) error {
		if err := rdb.RPush(ctx, run+":addrs", fmt.Sprintf("%d %d %s", inst, pid, addr)).Err(); err != nil {
			return fmt.Errorf("announce: %w", err)
		}
		return nil
	})
}

// serveUntilStopped serves h on a loopback port, tells the parent where
// (announce; an error closes the server), and serves until the parent
// closes stdin (or dies), or limit passes.
func serveUntilStopped(h http.Handler, limit time.Duration, announce func(net.Addr) error) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	if err := announce(ln.Addr()); err != nil {
		_ = hs.Close()
		return err
	}
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var result error
	select {
	case <-stop:
	case <-timer.C:
		result = fmt.Errorf("not told to stop within %v", limit)
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		result = errors.Join(result, fmt.Errorf("shutdown: %w", err))
	}
	return result
}
