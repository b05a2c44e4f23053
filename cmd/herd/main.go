// Command herd looks at what herd keeps in Redis. herd's Redis names are
// hashes of the keys (PREFIX:{T}:ROLE, T = base64url SHA-256 of the key),
// so redis-cli tells a debugging user nothing; this command does.
//
//	go run ./cmd/herd inspect -redis 127.0.0.1:6379 user:42 user:43
//	go run ./cmd/herd stats -redis 127.0.0.1:6379
//	go run ./cmd/herd help
//
// inspect prints, for each key, its value's envelope (fence, written at,
// fresh and stale deadlines, Δ, size, TTL), the lease holder and its
// PTTL, the fence counter, the refresh backoff, the failure marker and
// the FencedStore record. stats counts herd's keys of the prefix by role
// on every master. -cluster takes a comma-separated list of cluster
// nodes instead of -redis; -json prints JSON.
//
// # Which Redis
//
// No command has a default Redis: a look at the wrong one would be one
// typo away. Name it with -redis ADDR or -cluster ADDR,ADDR..., or set
// HERD_REDIS (an address) or HERD_REDIS_CLUSTER (a comma-separated node
// list) in the environment; a flag wins over the environment. A Redis
// taken from the environment is named on stderr before it is used.
// Without one, a command exits with status 2 and says so.
//
// # Help and exit status
//
// herd -h, herd --help and herd help print every command with its flags
// and their defaults; herd help CMD and herd CMD -h print one command's.
// Asked-for help goes to stdout with status 0. A usage mistake (an
// unknown command or flag, a missing argument, no Redis named) prints
// the error and the usage to stderr with status 2; a failure after
// that (Redis unreachable, a bad key) prints the error with status 1.
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
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}))
}

// env is what a command reads and writes besides its arguments.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// command is one entry of the table of commands. Adding a command is
// adding one entry to commands (its code may live in a file of its own).
type command struct {
	name    string
	args    string // what follows the flags in its synopsis, such as "KEY..."
	summary string // one line, for the list of commands
	// flags defines the command's flags on fs and returns the function
	// that runs it, called once fs has parsed the arguments.
	flags func(fs *flag.FlagSet, e *env) func(ctx context.Context) error
}

// commands is the table of commands, in the order help lists them.
var commands = []*command{
	inspectCmd,
	statsCmd,
	proxyCmd,
}

var inspectCmd = &command{
	name:    "inspect",
	args:    "KEY...",
	summary: "show what herd keeps in Redis for each key",
	flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
		r := redisFlags(fs, e)
		asJSON := fs.Bool("json", false, "print JSON")
		return func(ctx context.Context) error {
			if fs.NArg() == 0 {
				return usageError{msg: "inspect: name at least one key"}
			}
			return r.with(ctx, e, func(ctx context.Context, rdb redis.UniversalClient) error {
				return inspect(ctx, rdb, *r.prefix, fs.Args(), *asJSON, e.stdout)
			})
		}
	},
}

var statsCmd = &command{
	name:    "stats",
	summary: "count herd's keys of a prefix by role, on every master",
	flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
		r := redisFlags(fs, e)
		asJSON := fs.Bool("json", false, "print JSON")
		return func(ctx context.Context) error {
			if fs.NArg() != 0 {
				return usageError{msg: "stats takes no arguments"}
			}
			return r.with(ctx, e, func(ctx context.Context, rdb redis.UniversalClient) error {
				return stats(ctx, rdb, *r.prefix, *asJSON, e.stdout)
			})
		}
	},
}

// The environment variables that name a Redis when no flag does.
const (
	envRedis   = "HERD_REDIS"
	envCluster = "HERD_REDIS_CLUSTER"
)

// redisOpts are the flags every command that reads Redis takes.
type redisOpts struct {
	fs                    *flag.FlagSet
	addr, cluster, prefix *string
	timeout               *time.Duration
}

// redisFlags defines -redis, -cluster, -prefix and -timeout on fs. The
// help of -redis and -cluster says what the environment holds, so that
// it shows which Redis a command would use.
func redisFlags(fs *flag.FlagSet, e *env) *redisOpts {
	fromEnv := func(name string) string {
		if v := e.getenv(name); v != "" {
			return fmt.Sprintf(" (default: $%s, %q)", name, v)
		}
		return " (default: $" + name + ", which is not set)"
	}
	return &redisOpts{
		fs:      fs,
		addr:    fs.String("redis", "", "address of the Redis server"+fromEnv(envRedis)),
		cluster: fs.String("cluster", "", "comma-separated Redis Cluster nodes, instead of -redis"+fromEnv(envCluster)),
		prefix:  fs.String("prefix", herd.DefaultPrefix, "herd's key prefix (Options.Prefix)"),
		timeout: fs.Duration("timeout", 10*time.Second, "bound on the whole command"),
	}
}

// with runs f with a client of the Redis the flags name (see client),
// bounded by -timeout, and closes the client after.
func (r *redisOpts) with(ctx context.Context, e *env, f func(context.Context, redis.UniversalClient) error) error {
	rdb, err := r.client(e)
	if err != nil {
		return err
	}
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, *r.timeout)
	defer cancel()
	return f(ctx, rdb)
}

// client returns a client of the Redis the flags name or, when no flag
// does, the environment; a usage error when none is named, or two are.
// A Redis from the environment is named on stderr first.
func (r *redisOpts) client(e *env) (redis.UniversalClient, error) {
	set := map[string]bool{}
	r.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	addr, cluster, source := *r.addr, *r.cluster, ""
	if !set["redis"] && !set["cluster"] {
		addr, cluster = e.getenv(envRedis), e.getenv(envCluster)
		source = envRedis
		if cluster != "" {
			source = envCluster
		}
	}
	addr, cluster = strings.TrimSpace(addr), strings.TrimSpace(cluster)
	switch {
	case addr != "" && cluster != "" && source != "":
		return nil, usageError{msg: "both " + envRedis + " and " + envCluster + " are set: unset one, or give -redis or -cluster"}
	case addr != "" && cluster != "":
		return nil, usageError{msg: "give -redis or -cluster, not both"}
	case addr == "" && cluster == "":
		return nil, usageError{msg: "no Redis named: give -redis ADDR or -cluster ADDR,ADDR... (or set " + envRedis + " or " + envCluster + "); there is no default"}
	case cluster != "":
		if source != "" {
			fmt.Fprintf(e.stderr, "herd: Redis Cluster %s (from %s)\n", cluster, source)
		}
		// The README's client options: a Redis that is down costs a call
		// milliseconds, not go-redis's default dial retries (herd proxy
		// fails open through them).
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(cluster, ","),
			DialTimeout: 250 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
			MaxRetries: -1, DialerRetries: 1}), nil
	default:
		if source != "" {
			fmt.Fprintf(e.stderr, "herd: Redis %s (from %s)\n", addr, source)
		}
		return redis.NewClient(&redis.Options{Addr: addr,
			DialTimeout: 250 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
			MaxRetries: -1, DialerRetries: 1}), nil
	}
}

// usageError is a mistake in the command line: exit status 2, with the
// usage of the command it names (nil: the list of commands).
type usageError struct {
	msg string
	cmd *command
}

func (e usageError) Error() string { return e.msg }

// run runs the command line args and returns the exit status.
func run(ctx context.Context, args []string, e *env) int {
	err := dispatch(ctx, args, e)
	var u usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &u):
		fmt.Fprintln(e.stderr, "herd:", err)
		fmt.Fprintln(e.stderr)
		if u.cmd != nil {
			printCommand(e.stderr, u.cmd, e)
		} else {
			printUsage(e.stderr, e)
		}
		return 2
	default:
		fmt.Fprintln(e.stderr, "herd:", err)
		return 1
	}
}

// dispatch finds the command and runs it. It prints the help asked for;
// run prints the usage after a usage error.
func dispatch(ctx context.Context, args []string, e *env) error {
	if len(args) == 0 {
		return usageError{msg: "name a command"}
	}
	switch args[0] {
	case "-h", "-help", "--help":
		printUsage(e.stdout, e)
		return nil
	case "help":
		if len(args) == 1 || (len(args) == 2 && args[1] == "help") {
			printUsage(e.stdout, e) // help's own help is the list of commands
			return nil
		}
		c := lookup(args[1])
		if c == nil || len(args) > 2 {
			return usageError{msg: fmt.Sprintf("help: unknown command %q", strings.Join(args[1:], " "))}
		}
		printCommand(e.stdout, c, e)
		return nil
	}
	c := lookup(args[0])
	if c == nil {
		return usageError{msg: fmt.Sprintf("unknown command %q", args[0])}
	}
	fs := newFlagSet(c, e)
	runCmd := c.flags(fs, e)
	switch err := fs.Parse(args[1:]); {
	case errors.Is(err, flag.ErrHelp):
		printCommand(e.stdout, c, e)
		return nil
	case err != nil:
		return usageError{msg: fmt.Sprintf("%s: %v", c.name, err), cmd: c}
	}
	err := runCmd(ctx)
	var u usageError
	if errors.As(err, &u) && u.cmd == nil {
		u.cmd = c
		return u
	}
	return err
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// newFlagSet returns c's flag set. It prints nothing itself: dispatch
// decides where help and errors go.
func newFlagSet(c *command, e *env) *flag.FlagSet {
	fs := flag.NewFlagSet("herd "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// printUsage prints the list of commands, then each command's synopsis
// and flags with their defaults.
func printUsage(w io.Writer, e *env) {
	fmt.Fprintln(w, "herd looks at what herd (github.com/herdkit/herd) keeps in Redis.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "usage: herd COMMAND [flags] [args]")
	fmt.Fprintln(w, "       herd help [COMMAND]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	width := 0
	for _, c := range commands {
		width = max(width, len(c.name))
	}
	for _, c := range commands {
		fmt.Fprintf(w, "  %-*s  %s\n", width, c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "A command that reads Redis needs one named: -redis, -cluster, or\n%s / %s in the environment. There is no default.\n", envRedis, envCluster)
	for _, c := range commands {
		fmt.Fprintln(w)
		printCommand(w, c, e)
	}
}

// printCommand prints c's synopsis, summary and flags with their defaults.
func printCommand(w io.Writer, c *command, e *env) {
	fs := newFlagSet(c, e)
	c.flags(fs, e)
	synopsis := "herd " + c.name + " [flags]"
	if c.args != "" {
		synopsis += " " + c.args
	}
	fmt.Fprintf(w, "usage: %s\n  %s\n", synopsis, c.summary)
	fmt.Fprintln(w, "flags:")
	fs.VisitAll(func(f *flag.Flag) {
		kind, usage := flag.UnquoteUsage(f)
		if kind != "" {
			kind = " " + kind
		}
		if !strings.Contains(usage, "(default: ") {
			def := f.DefValue
			switch {
			case def == "":
				def = "none"
			case kind == " string":
				def = fmt.Sprintf("%q", def)
			}
			usage += " (default: " + def + ")"
		}
		fmt.Fprintf(w, "  -%s%s\n    \t%s\n", f.Name, kind, usage)
	})
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

// roles names each role of herd's Redis names (internal/wire).
var roles = map[string]string{
	wire.RoleValue: "values", wire.RoleLease: "leases", wire.RoleFence: "fence counters",
	wire.RoleRecord: "FencedStore records", wire.RoleBackoff: "refresh backoffs",
	wire.RoleFailed: "failure markers", wire.RoleWrites: "write markers",
	wire.RoleTagIndex: "tag indexes", wire.RoleTagPurged: "tag purge records",
	wire.RoleTagGen: "tag purge generation",
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
	if n, ok := roles[wire.Role(prefix, name)]; ok {
		return n
	}
	return "other"
}
