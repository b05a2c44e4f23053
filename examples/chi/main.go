// Command chi serves a small catalog through herd's HTTP middleware on a
// chi router, behind chi's Recoverer and GetHead (HEAD is served from the
// GET entry).
//
// GET /products/{id} is a slow handler (200 ms: a database). Concurrent
// requests for a cold product run it once: one response says
// "Cache-Status: herd; fwd=miss; stored", the others waited for it
// ("herd; fwd=miss; collapsed"). The entry is then a hit for 10 s, and
// served stale for 30 s more while one request refreshes it. GET /stats
// counts the handler's runs. Without -redis it uses an embedded
// miniredis. Instances given the same -redis share their responses
// wherever they listen: the key holds the request's host without its port
// and its target, not the listener. Two on one machine, one handler run
// between them (docs/middleware.md has the whole recipe):
//
//	go run ./examples/chi -redis 127.0.0.1:6399
//	go run ./examples/chi -redis 127.0.0.1:6399 -addr 127.0.0.1:8083
//	curl http://127.0.0.1:8082/products/3
//	curl http://127.0.0.1:8083/products/3
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/middleware"
	"github.com/redis/go-redis/v9"
)

// catalog is the "database": product id to JSON.
var catalog = map[string]string{
	"1": `{"id":1,"name":"Teapot","price":"24.00"}`,
	"2": `{"id":2,"name":"Kettle","price":"39.50"}`,
	"3": `{"id":3,"name":"Mug","price":"8.90"}`,
}

var handlerRuns atomic.Int64

// productHandler is the slow, uncached handler. It reads its path
// parameter with chi.URLParam (r.PathValue, which chi v5 sets too, works as
// well): a stale refresh runs it in the background after the request
// returned, on a snapshot of the request that carries a copy of chi's
// route context.
func productHandler(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	log.Printf("handler ran for product %q (run %d)", id, handlerRuns.Add(1))
	time.Sleep(200 * time.Millisecond) // a slow database
	p, ok := catalog[id]
	if !ok {
		http.NotFound(w, r) // cached too, for NotFoundTTL (10 s)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintln(w, p)
}

var (
	addr      = flag.String("addr", "127.0.0.1:8082", "listen address (examples/nethttp uses 8080, examples/metrics 8081)")
	redisAddr = flag.String("redis", "", "Redis address (default: an embedded miniredis)")
	scope     = flag.String("scope", "", "middleware.Options.Scope: instances share entries only with the same scope (default: none)")
)

func main() {
	flag.Parse()
	if err := run(*addr, *redisAddr); err != nil {
		log.Fatal(err)
	}
}

func run(addr, redisAddr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if redisAddr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return err
		}
		defer mr.Close()
		mr.ClockTTL(true) // let TTLs run with the wall clock, as in a real Redis
		redisAddr = mr.Addr()
	}
	rdb := redis.NewClient(&redis.Options{
		Addr: redisAddr,
		// Fail fast when Redis is gone (the README's settings): herd then
		// loads locally, and its breaker stops asking Redis.
		DialTimeout: 250 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
		MaxRetries: -1, DialerRetries: 1,
	})
	defer rdb.Close()
	cache := herd.New(rdb, nil)
	defer cache.Close()

	r := chi.NewRouter()
	r.Use(chimw.Recoverer, chimw.GetHead)
	r.With(middleware.New(cache, &middleware.Options{TTL: 10 * time.Second, StaleFor: 30 * time.Second, Scope: *scope})).
		Get("/products/{id}", productHandler)
	r.Get("/stats", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "handler runs: %d\n", handlerRuns.Load())
	})

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	printUsage("http://"+ln.Addr().String(), redisAddr)

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Print("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx) // then, deferred: cache, client and miniredis close
}

func printUsage(base, redisAddr string) {
	fmt.Printf(`herd middleware example (%[3]s) on %[1]s, Redis at %[2]s
  curl -si %[1]s/products/1 | grep -i -e cache-status -e '^{'   # fwd=miss; stored
  curl -si %[1]s/products/1 | grep -i -e cache-status -e '^age'  # hit (stale after 10 s)
  # 50 concurrent requests for a cold product; /stats shows one run more:
  seq 50 | xargs -P 50 -I{} curl -s -o /dev/null -w '%%{http_code} %%header{cache-status}\n' %[1]s/products/2 | sort | uniq -c
  curl -s %[1]s/stats
`, base, redisAddr, "chi")
}
