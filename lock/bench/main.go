// Command bench measures herd's lock backends side by side, in one run,
// on this machine's loopback:
//
//	go run -C lock/bench .                       # every backend, 2s per phase
//	go run -C lock/bench . -n 500 -backends locker,redlock3
//
// For each backend it reports, as a markdown table:
//
//   - TryAcquire p50 and p99: an uncontended TryAcquire of a free key;
//   - Release p50 and p99: the Release of that lease;
//   - handoff p50 and p99: from the start of a holder's Release to the
//     return of the Acquire that a waiter, on another Lock (its own
//     clients, as another process would have), had blocked in; the waiter
//     is given -settle to be blocked before the Release;
//   - contended: acquisitions per second of -workers goroutines, spread
//     over two Locks, each taking one key with Acquire and releasing it at
//     once, for -contend (or, with -n, until n acquisitions in all).
//
// Each phase runs -n iterations, or for -duration when -n is 0, after a
// warm-up that is not counted. Every backend uses -ttl as its lease length
// and its defaults otherwise.
//
// Backends (-backends, comma-separated; default: all of them):
//
//	locker    herd.Locker on one redis-server
//	redlock3  herd.Redlock over 3 redis-servers
//	redlock5  herd.Redlock over 5 redis-servers
//	postgres  lock/postgres on the server at -pg
//	mysql     lock/mysql on the MySQL or MariaDB server at -mysql
//	etcd      lock/etcd on one etcd server
//	zookeeper lock/zookeeper on one standalone ZooKeeper server
//
// The bench starts the redis-servers itself (-redis-server, default from
// $PATH): each on a free port of 127.0.0.1, without persistence
// (--save "" --appendonly no), in a temporary directory, stopped by its
// process handle when the backend is done (on Linux also with a
// parent-death SIGKILL). It starts etcd and ZooKeeper with the starters
// of their modules' tests (lock/etcd/etcdtest, lock/zookeeper/zktest: free
// loopback ports, a temporary data directory, stopped by pid). For
// postgres and mysql it creates a database with a random name on the
// server at -pg or -mysql and drops it at the end.
//
// A backend that cannot be set up or measured is reported on stderr and
// the command exits with status 1 after printing the others.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// config is the command's flags.
type config struct {
	n           int
	duration    time.Duration
	backends    []string
	ttl         time.Duration
	settle      time.Duration
	contend     time.Duration
	workers     int
	redisServer string
	pgURL       string
	mysqlDSN    string
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	var list string
	fs.IntVar(&cfg.n, "n", 0, "iterations per phase (0: run each phase for -duration)")
	fs.DurationVar(&cfg.duration, "duration", 2*time.Second, "time per phase and backend, when -n is 0")
	fs.StringVar(&list, "backends", strings.Join(names(), ","), "backends to measure, comma-separated: "+strings.Join(names(), ", "))
	fs.DurationVar(&cfg.ttl, "ttl", 10*time.Second, "lease length of every acquire")
	fs.DurationVar(&cfg.settle, "settle", 5*time.Millisecond, "time a handoff's waiter is given to block before the holder releases")
	fs.DurationVar(&cfg.contend, "contend", time.Second, "length of the contended phase (0: skip it)")
	fs.IntVar(&cfg.workers, "workers", 4, "goroutines of the contended phase")
	fs.StringVar(&cfg.redisServer, "redis-server", "redis-server", "the redis-server binary")
	fs.StringVar(&cfg.pgURL, "pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL URL of an existing database, to create the run's database from")
	fs.StringVar(&cfg.mysqlDSN, "mysql", "root@tcp(127.0.0.1:3306)/", "MySQL or MariaDB DSN, to create the run's database from")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if _, ok := findBackend(name); !ok {
			return config{}, unknownBackend(name)
		}
		cfg.backends = append(cfg.backends, name)
	}
	switch {
	case len(cfg.backends) == 0:
		return config{}, fmt.Errorf("-backends lists none")
	case cfg.n < 0, cfg.duration <= 0 && cfg.n == 0:
		return config{}, fmt.Errorf("-n must be positive, or -duration")
	case cfg.ttl < 300*time.Millisecond:
		return config{}, fmt.Errorf("-ttl %v: at least 300ms (a handoff's waiter must not outlive the lease)", cfg.ttl)
	case cfg.workers < 1:
		return config{}, fmt.Errorf("-workers must be at least 1")
	case cfg.settle < 0, cfg.contend < 0:
		return config{}, fmt.Errorf("-settle and -contend must not be negative")
	}
	return cfg, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err == flag.ErrHelp {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results := run(ctx, cfg, os.Stderr)
	printTable(os.Stdout, cfg, results)
	failed := false
	for _, r := range results {
		if r.err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", r.name, r.err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

// run sets up, measures and tears down each backend of cfg in turn, and
// returns their results in cfg's order.
func run(ctx context.Context, cfg config, progress io.Writer) []result {
	var out []result
	for _, name := range cfg.backends {
		b, _ := findBackend(name)
		fmt.Fprintf(progress, "bench: %s: setting up (%s)\n", name, b.desc)
		dep, err := b.setup(ctx, cfg)
		if err != nil {
			out = append(out, result{name: name, err: fmt.Errorf("setup: %w", err)})
			continue
		}
		r := measure(ctx, name, dep, cfg)
		if err := dep.teardown(); err != nil && r.err == nil {
			r.err = fmt.Errorf("teardown: %w", err)
		}
		out = append(out, r)
	}
	return out
}

// printTable prints the results that were measured as a markdown table.
func printTable(w io.Writer, cfg config, results []result) {
	fmt.Fprintln(w, "| backend | TryAcquire p50 | TryAcquire p99 | Release p50 | Release p99 | handoff p50 | handoff p99 | contended acquires/s | samples |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range results {
		if r.err != nil && len(r.handoff) == 0 {
			fmt.Fprintf(w, "| %s | not measured: %s |||||||| |\n", r.name, oneLine(r.err))
			continue
		}
		rate := "–"
		if cfg.contend > 0 && r.acquired > 0 {
			rate = fmt.Sprintf("%.0f (%d workers)", r.contended, cfg.workers)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %d / %d |\n", r.name,
			fmtDur(percentile(r.tryAcquire, 50)), fmtDur(percentile(r.tryAcquire, 99)),
			fmtDur(percentile(r.release, 50)), fmtDur(percentile(r.release, 99)),
			fmtDur(percentile(r.handoff, 50)), fmtDur(percentile(r.handoff, 99)),
			rate, len(r.tryAcquire), len(r.handoff))
	}
}

// fmtDur prints d with three significant digits, in µs below a
// millisecond and in ms above.
func fmtDur(d time.Duration) string {
	switch {
	case d < 999500*time.Nanosecond: // 999.5µs and above print as 1.00 ms
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	case d < 9995*time.Microsecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	case d < 99950*time.Microsecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

func oneLine(err error) string {
	s := strings.ReplaceAll(err.Error(), "\n", " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}
