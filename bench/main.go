// Command bench is herd's stampede load benchmark: several instance
// processes, each with many concurrent callers, read keys from one shared
// Redis and rebuild them from a slow origin when they are missing, with
// eight strategies run one after another in the same run:
//
//	none          GET; on a miss call the origin and SET
//	singleflight  the same inside golang.org/x/sync/singleflight (per process)
//	gocache-once  github.com/go-redis/cache/v9 Cache.Once
//	redislock     github.com/bsm/redislock lock, others poll every 10 ms
//	herd-poll     herd with pub/sub unavailable (followers poll every 10 ms)
//	herd-notify   herd with its defaults (followers woken by pub/sub)
//	herd-swr      herd with StaleFor (stale-while-revalidate)
//	herd-near     herd with its near cache (Options.Near: values in process
//	              memory, invalidated cluster-wide on every write)
//
// Scenarios:
//
//	cold     W waves; in each, every caller of every process asks for the
//	         same fresh key at the same instant
//	steady   closed-loop load over a Zipf-distributed key set with TTL expiry
//	failure  the same load while the origin fails for a window
//	stall    one cold wave whose leader process is SIGSTOPped for three
//	         times the lease, then SIGCONTed
//	hotkey   one key read by every caller in a closed loop, while a writer
//	         in the parent writes a new version of it at -write-rate
//	         through the strategy's write path; reports the read rate,
//	         the hit latency, reads served from process memory, Redis
//	         commands per read, and every read's staleness against the
//	         writer's acknowledgements (see hotkey.go)
//
// # Which Redis
//
// Without -redis or -cluster, the parent starts a redis-server of its own
// when one is on $PATH: on a free port on 127.0.0.1, with no persistence
// (--save "" --appendonly no) and a temporary directory. It waits until
// that process answers PING, and stops it (SIGTERM to its pid, SIGKILL
// after 5 s) and removes the directory when the run ends, also when it
// fails or is interrupted by SIGINT (Ctrl-C) or SIGTERM; on Linux the
// server also gets a parent-death SIGKILL, so even a killed bench leaves
// none behind. With no redis-server on $PATH, with -embedded, or outside
// Unix, the parent serves miniredis on loopback instead. miniredis is an emulation
// that runs every Lua script under one global lock, so script-heavy
// strategies (herd, redislock) are much slower on it than on a real server
// (herd's steady p50 was 14 ms there against 0.5 ms on redis-server): use
// it to count origin calls, not to compare latencies. The stderr, the
// table, the Markdown and the chart all name the Redis used, with the
// server's redis_version. -embedded excludes -redis and -cluster.
// -cluster start starts a Redis Cluster of three masters instead (free
// loopback ports, nothing on disk; redis-server and redis-cli on $PATH)
// and stops it the same way.
//
// # How it runs
//
// The parent serves the Redis, as above, and the origin (a loopback HTTP
// server with a configurable latency that records every call), and
// starts P worker processes by re-running its own executable with
// HERD_BENCH_ROLE=worker in the environment. It drives them over their
// stdin and stdout: a barrier is a start instant sent 50 ms ahead, which
// every worker sleeps until before releasing its callers at once.
//
// # Usage
//
//	go run ./bench                                  # everything, on a redis-server it starts (miniredis if none on $PATH)
//	go run ./bench -quick                           # a smoke run of a few seconds
//	go run ./bench -embedded -quick                 # on miniredis even when redis-server is installed
//	go run ./bench -scenarios hotkey -write-rate 10/s -duration 10s
//	go run ./bench -redis 127.0.0.1:6379 -p 4 -c 64 -origin-latency 50ms -svg docs/bench.svg
//	go run ./bench -cluster start -p 4 -c 64 -scenarios cold  # on a 3-master Cluster it starts
//	go run ./bench -cluster 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002
//	go run ./bench -http -c 64 -value-size 2048       # the HTTP benchmark (http.go)
//
// Results: a table on stdout, -json, -svg (a chart) and -md (the table as
// Markdown with the command). See docs/bench.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	if os.Getenv(roleEnv) == roleWorker {
		os.Exit(workerMain(os.Stdin, os.Stdout))
	}
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	cfg.Command = commandLine(os.Args[1:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if cfg.HTTP {
		err = runHTTP(ctx, cfg, os.Stdout, os.Stderr)
	} else {
		_, err = run(ctx, cfg, os.Stdout, os.Stderr)
	}
	interrupted := ctx.Err() != nil
	stop()
	if err != nil {
		if interrupted {
			fmt.Fprintln(os.Stderr, "\nbench: interrupted; workers stopped")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "\nbench:", err)
		os.Exit(1)
	}
}

// commandLine is how to run this again.
func commandLine(args []string) string {
	parts := []string{"go run ./bench"}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'$\\;&|<>*?()[]{}") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}
