// Command metrics serves a small chi app cached by herd, with herd's
// Prometheus metrics on /metrics next to it.
//
//	go run ./examples/metrics                   # embedded Redis
//	go run ./examples/metrics -redis 127.0.0.1:6379
//
// Then load a cold URL from many clients at once and read the signals:
//
//	seq 50 | xargs -P 50 -I{} curl -s -o /dev/null http://127.0.0.1:8081/reports/42
//	curl -s http://127.0.0.1:8081/metrics | grep '^herd_'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/middleware"
	herdprom "github.com/herdkit/herd/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address (examples/nethttp uses 8080, examples/chi 8082)")
	redisAddr := flag.String("redis", "", "Redis address (default: an embedded Redis)")
	flag.Parse()

	if *redisAddr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			log.Fatal(err)
		}
		mr.ClockTTL(true) // keys expire in real time, as in Redis
		defer mr.Close()
		*redisAddr = mr.Addr()
	}
	rdb := redis.NewClient(&redis.Options{
		Addr: *redisAddr,
		// Fail fast when Redis is gone (the README's settings): herd then
		// loads locally, and its breaker stops asking Redis.
		DialTimeout: 250 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
		MaxRetries: -1, DialerRetries: 1,
	})
	defer rdb.Close()

	// One registry for the app; herd's metrics go on it too.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	cache := herd.New(rdb, &herd.Options{
		Observer: herdprom.NewObserver(reg, nil),
		// Bounded labels: the route of each page (middleware.Options.Class
		// below); herd never labels raw keys.
		KeyClass: middleware.KeyClass(nil),
		Logger:   slog.Default(),
	})
	defer cache.Close()

	r := chi.NewRouter()
	r.Use(chimw.Recoverer, chimw.GetHead) // GetHead: HEAD requests reach Get routes (and herd's entries)
	r.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	r.With(middleware.New(cache, &middleware.Options{
		TTL: 10 * time.Second, StaleFor: 30 * time.Second,
		Class:    middleware.RoutePattern,             // class="/reports/{id}"
		OnBypass: herdprom.NewBypassCounter(reg, nil), // herd_http_bypasses_total{reason}
	})).
		Get("/reports/{id}", func(w http.ResponseWriter, r *http.Request) {
			// chi.URLParam holds in a stale refresh too (the middleware
			// copies chi's route context for it).
			time.Sleep(300 * time.Millisecond) // a slow report query
			log.Printf("handler ran for report %s", chi.URLParam(r, "id"))
			fmt.Fprintf(w, "report %s built at %s\n", chi.URLParam(r, "id"), time.Now().Format(time.RFC3339Nano))
		})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Fatal(err)
		}
	}()
	base := "http://" + ln.Addr().String()
	fmt.Println(strings.Join([]string{
		"herd metrics example on " + base,
		"  seq 50 | xargs -P 50 -I{} curl -s -o /dev/null " + base + "/reports/42   # 50 concurrent requests, one handler run",
		"  curl -s " + base + "/metrics | grep '^herd_'",
	}, "\n"))

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}
