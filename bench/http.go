package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/middleware"
)

// The HTTP benchmark (-http): one hot URL served on loopback by a plain
// net/http handler and by the same handler behind herd's middleware, with
// -c keep-alive clients in a closed loop, each case for -duration, the
// cases interleaved over -http-rounds rounds. It reports each case's
// requests per second (the median of its rounds) and its ratio to the
// plain handler (the median of the rounds' ratios, each to the plain
// handler's rate in the same round), its latency percentiles, and the Redis
// commands it sent per request. The clients run in this process, as wrk
// would on the same machine: they take CPU from the servers alike in
// every case.
type httpCase struct {
	name string
	what string
	h    http.Handler
}

type httpResult struct {
	name, what string
	rates      []float64 // requests per second, one per round
	lat        hist
	cmds       int64 // Redis commands the server processed during the case's rounds
	reqs       int64
}

// runHTTP runs the HTTP benchmark and prints its table on stdout.
func runHTTP(ctx context.Context, cfg *config, stdout, stderr io.Writer) error {
	rs, err := startRedis(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	defer rs.close()
	body := []byte(strings.Repeat("x", cfg.ValueSize))
	plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})

	rdb := newClient(rs.spec)
	defer rdb.Close()
	const rawKey = "bench:http:raw"
	if err := rdb.Set(ctx, rawKey, body, 0).Err(); err != nil {
		return fmt.Errorf("redis SET: %w", err)
	}
	defer rdb.Del(context.Background(), rawKey)
	rawGET := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := rdb.Get(r.Context(), rawKey).Bytes()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	})
	prefix := "bench-http-" + fmt.Sprint(time.Now().UnixNano())
	fromRedis := herd.New(rdb, &herd.Options{Prefix: prefix})
	defer fromRedis.Close()
	near := herd.New(rdb, &herd.Options{Prefix: prefix + "-near", Near: herd.NearOptions{MaxEntries: 1000}})
	defer near.Close()
	mwOpts := &middleware.Options{TTL: time.Hour}
	cases := []httpCase{
		{"plain", "the handler alone", plain},
		{"raw-get", "a handler that does one go-redis GET per request", rawGET},
		{"herd", "the handler behind herd's middleware: hits from Redis", middleware.New(fromRedis, mwOpts)(plain)},
		{"herd-near", "the same with the near cache: hits from process memory", middleware.New(near, mwOpts)(plain)},
	}
	fmt.Fprintf(stderr, "bench: HTTP: %d clients, %v per case, %d rounds, %d-byte body, on %s\n",
		cfg.Callers, cfg.Duration, cfg.HTTPRounds, cfg.ValueSize, rs.describe())

	results := make([]*httpResult, len(cases))
	urls := make([]string, len(cases))
	for i, c := range cases {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: c.h, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		urls[i] = "http://" + ln.Addr().String() + "/products/42"
		results[i] = &httpResult{name: c.name, what: c.what}
	}
	tr := &http.Transport{MaxIdleConns: cfg.Callers * 2, MaxIdleConnsPerHost: cfg.Callers, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for i, u := range urls { // warm: the entry stored, connections open
		for range 3 {
			if err := fetch(ctx, client, u, len(body)); err != nil {
				return fmt.Errorf("%s: %w", cases[i].name, err)
			}
		}
	}
	for round := range cfg.HTTPRounds {
		for i, u := range urls {
			if err := ctx.Err(); err != nil {
				return err
			}
			before := rs.serverCommands(ctx)
			rate, n, lat, err := drive(ctx, client, u, len(body), cfg.Callers, cfg.Duration)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", cases[i].name, round+1, err)
			}
			r := results[i]
			r.rates = append(r.rates, rate)
			r.lat.merge(&lat)
			r.reqs += n
			if before >= 0 {
				r.cmds += rs.serverCommands(ctx) - before
			}
		}
	}
	printHTTP(stdout, cfg, rs, results)
	return nil
}

// fetch sends one GET and checks the reply.
func fetch(ctx context.Context, client *http.Client, url string, size int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return err
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("status %d", resp.StatusCode)
	case n != int64(size):
		return fmt.Errorf("%d bytes, want %d", n, size)
	}
	return nil
}

// drive has clients GET url in a closed loop for d; it returns the
// requests per second, the requests, and their latencies.
func drive(ctx context.Context, client *http.Client, url string, size, clients int, d time.Duration) (float64, int64, hist, error) {
	var (
		mu    sync.Mutex
		all   hist
		total int64
		first error
	)
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			var h hist
			var n int64
			for time.Now().Before(end) && ctx.Err() == nil {
				t := time.Now()
				if err := fetch(ctx, client, url, size); err != nil {
					mu.Lock()
					first = cmpOr(first, err)
					mu.Unlock()
					break
				}
				h.add(int64(time.Since(t)))
				n++
			}
			mu.Lock()
			all.merge(&h)
			total += n
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil && !errors.Is(first, context.Canceled) {
		return 0, 0, hist{}, first
	}
	return float64(total) / elapsed.Seconds(), total, all, nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func printHTTP(w io.Writer, cfg *config, rs *redisEnv, results []*httpResult) {
	// A case's ratio is the median over the rounds of its rate ÷ the plain
	// handler's in the same round: the machine's drift between rounds
	// (other load, CPU steal) cancels out.
	ratio := func(r *httpResult) float64 {
		var rs []float64
		for i, v := range r.rates {
			if b := results[0].rates[i]; b > 0 {
				rs = append(rs, v/b)
			}
		}
		return median(rs)
	}
	fmt.Fprintf(w, "HTTP, one hot URL: %d keep-alive clients, %v per case × %d rounds, %d-byte body, %s\n",
		cfg.Callers, cfg.Duration, cfg.HTTPRounds, cfg.ValueSize, rs.describe())
	fmt.Fprintf(w, "%-10s %10s %8s %8s %8s %9s  %s\n", "case", "req/s", "÷ plain", "p50 ms", "p99 ms", "cmd/req", "")
	for _, r := range results {
		rate := median(r.rates)
		perReq := "-"
		if r.reqs > 0 && r.cmds > 0 {
			perReq = fmt.Sprintf("%.3f", float64(r.cmds)/float64(r.reqs))
		}
		p := r.lat.pct()
		fmt.Fprintf(w, "%-10s %10.0f %7.2f× %8.2f %8.2f %9s  %s\n", r.name, rate, ratio(r), p.P50, p.P99, perReq, r.what)
	}
	fmt.Fprintf(w, "command: %s\n", cfg.Command)
}
