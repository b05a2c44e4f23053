// Command bench is herd's stampede load benchmark: several instance
// processes, each with many concurrent callers, read keys from one shared
// Redis and rebuild them from a slow origin when they are missing, with
// seven strategies run one after another in the same run:
//
//	none          GET; on a miss call the origin and SET
//	singleflight  the same inside golang.org/x/sync/singleflight (per process)
//	gocache-once  github.com/go-redis/cache/v9 Cache.Once
//	redislock     github.com/bsm/redislock lock, others poll every 10 ms
//	herd-poll     herd with pub/sub unavailable (followers poll every 10 ms)
//	herd-notify   herd with its defaults (followers woken by pub/sub)
//	herd-swr      herd with StaleFor (stale-while-revalidate)
//
// Scenarios:
//
//	cold     W waves; in each, every caller of every process asks for the
//	         same fresh key at the same instant
//	steady   closed-loop load over a Zipf-distributed key set with TTL expiry
//	failure  the same load while the origin fails for a window
//	stall    one cold wave whose leader process is SIGSTOPped for three
//	         times the lease, then SIGCONTed
//
// The parent process serves the embedded Redis (miniredis on loopback,
// unless -redis or -cluster names a server) and the origin (a loopback
// HTTP server with a configurable latency that records every call), and
// starts P worker processes by re-running its own executable with
// HERD_BENCH_ROLE=worker in the environment. It drives them over their
// stdin and stdout: a barrier is a start instant sent 50 ms ahead, which
// every worker sleeps until before releasing its callers at once.
//
// Usage:
//
//	go run ./bench                                  # everything, embedded Redis
//	go run ./bench -quick                           # a smoke run of a few seconds
//	go run ./bench -redis 127.0.0.1:6379 -p 4 -c 64 -origin-latency 50ms -svg docs/bench.svg
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
	_, err = run(ctx, cfg, os.Stdout, os.Stderr)
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
