// Command herd looks at what herd keeps in Redis. herd's Redis names are
// hashes of the keys (PREFIX:{T}:ROLE, T = base64url SHA-256 of the key),
// so redis-cli tells a debugging user nothing; this command does.
//
//	go run ./cmd/herd inspect -redis 127.0.0.1:6379 user:42 user:43
//	go run ./cmd/herd stats -redis 127.0.0.1:6379
//
// inspect prints, for each key, its value's envelope (fence, written at,
// fresh and stale deadlines, Δ, size, TTL), the lease holder and its
// PTTL, the fence counter, the refresh backoff, the failure marker and
// the FencedStore record. stats counts herd's keys of the prefix by role
// on every master. -cluster takes a comma-separated list of cluster
// nodes instead of -redis; -json prints JSON.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/herdkit/herd"
	"github.com/redis/go-redis/v9"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "herd:", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

const usage = `usage:
  herd inspect [-redis ADDR | -cluster ADDR,ADDR...] [-prefix P] [-json] KEY...
  herd stats   [-redis ADDR | -cluster ADDR,ADDR...] [-prefix P] [-json]`

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return usageError{usage}
	}
	cmd := args[0]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("redis", "127.0.0.1:6379", "address of the Redis server")
	cluster := fs.String("cluster", "", "comma-separated Redis Cluster nodes (instead of -redis)")
	prefix := fs.String("prefix", herd.DefaultPrefix, "herd's key prefix (Options.Prefix)")
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on the whole command")
	if err := fs.Parse(args[1:]); err != nil {
		return usageError{fmt.Sprintf("%v\n%s", err, usage)}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var rdb redis.UniversalClient
	if *cluster != "" {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(*cluster, ",")})
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: *addr})
	}
	defer rdb.Close()
	switch cmd {
	case "inspect":
		if fs.NArg() == 0 {
			return usageError{"inspect: name at least one key\n" + usage}
		}
		return inspect(ctx, rdb, *prefix, fs.Args(), *asJSON, out)
	case "stats":
		if fs.NArg() != 0 {
			return usageError{"stats takes no arguments\n" + usage}
		}
		return stats(ctx, rdb, *prefix, *asJSON, out)
	default:
		return usageError{fmt.Sprintf("unknown command %q\n%s", cmd, usage)}
	}
}

func inspect(ctx context.Context, rdb redis.UniversalClient, prefix string, keys []string, asJSON bool, out io.Writer) error {
	c := herd.New(rdb, &herd.Options{Prefix: prefix})
	defer c.Close()
	var all []*herd.Inspection
	for _, k := range keys {
		in, err := c.Inspect(ctx, k)
		if err != nil {
			return err
		}
		all = append(all, in)
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(all)
	}
	for i, in := range all {
		if i > 0 {
			fmt.Fprintln(out)
		}
		fmt.Fprint(out, in)
	}
	return nil
}

// roles names the last part of herd's Redis names.
var roles = map[string]string{
	"v": "values", "l": "leases", "f": "fence counters", "r": "FencedStore records",
	"b": "refresh backoffs", "x": "failure markers", "tz": "tag indexes", "tp": "tag purge records",
}

func stats(ctx context.Context, rdb redis.UniversalClient, prefix string, asJSON bool, out io.Writer) error {
	var mu sync.Mutex
	counts := map[string]int64{}
	scan := func(ctx context.Context, node *redis.Client) error {
		iter := node.Scan(ctx, 0, globQuote(prefix)+":*", 1000).Iterator()
		local := map[string]int64{}
		for iter.Next(ctx) {
			local[role(prefix, iter.Val())]++
		}
		if err := iter.Err(); err != nil {
			return err
		}
		mu.Lock()
		for k, n := range local {
			counts[k] += n
		}
		mu.Unlock()
		return nil
	}
	var err error
	switch r := rdb.(type) {
	case *redis.ClusterClient:
		err = r.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, r)
	}
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(counts)
	}
	names := make([]string, 0, len(counts))
	for k := range counts {
		names = append(names, k)
	}
	sort.Strings(names)
	fmt.Fprintf(out, "herd keys with prefix %q:\n", prefix)
	if len(names) == 0 {
		fmt.Fprintln(out, "  none")
	}
	for _, k := range names {
		fmt.Fprintf(out, "  %-20s %d\n", k, counts[k])
	}
	return nil
}

// globQuote escapes SCAN's glob characters in s, so that a prefix such as
// "app[1]" or "a*" matches itself only.
func globQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\^-`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// role classifies one of herd's Redis names: PREFIX:{T}:ROLE, or
// PREFIX:{T}:w:<id> (a write's retry marker), PREFIX:tg, PREFIX:near.
func role(prefix, name string) string {
	rest := strings.TrimPrefix(name, prefix+":")
	if i := strings.LastIndexByte(rest, '}'); strings.HasPrefix(rest, "{") && i > 0 {
		r := strings.TrimPrefix(rest[i+1:], ":")
		if strings.HasPrefix(r, "w:") {
			return "write markers"
		}
		if n, ok := roles[r]; ok {
			return n
		}
		return "other"
	}
	if rest == "tg" {
		return "tag purge generation"
	}
	return "other"
}
