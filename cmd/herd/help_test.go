package main

import (
	"context"
	"flag"
	"strings"
	"testing"

	"github.com/herdkit/herd/internal/redistest"
)

// herdCmd runs the command line args with the environment environ (nil:
// empty) and returns what it printed and its exit status.
func herdCmd(t *testing.T, environ map[string]string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut strings.Builder
	code = run(context.Background(), args, &env{stdout: &out, stderr: &errOut, getenv: func(k string) string { return environ[k] }})
	return out.String(), errOut.String(), code
}

// wantFlags checks that text lists every flag of c with its default.
func wantFlags(t *testing.T, text string, c *command) {
	t.Helper()
	fs := newFlagSet(c, &env{getenv: func(string) string { return "" }})
	c.flags(fs, &env{getenv: func(string) string { return "" }})
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		i := strings.Index(text, "  -"+f.Name+" ")
		if i < 0 {
			i = strings.Index(text, "  -"+f.Name+"\n")
		}
		if i < 0 {
			t.Errorf("help of %s lacks -%s:\n%s", c.name, f.Name, text)
			return
		}
		line := text[i:]
		if j := strings.Index(line[1:], "\n  -"); j >= 0 {
			line = line[:j+1]
		}
		if !strings.Contains(line, "(default: ") {
			t.Errorf("help of %s gives no default for -%s: %q", c.name, f.Name, line)
		}
	})
	if n == 0 {
		t.Errorf("command %s has no flags", c.name)
	}
}

// TestHelpListsEveryCommandAndFlag: herd -h, --help, -help and help
// exit 0 and print, on stdout, every command with its summary and every
// flag of each with its default.
func TestHelpListsEveryCommandAndFlag(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}, {"help"}, {"help", "help"}} {
		out, errOut, code := herdCmd(t, nil, args...)
		if code != 0 || errOut != "" {
			t.Errorf("herd %q: exit %d, stderr %q; want 0 and nothing on stderr", args, code, errOut)
		}
		for _, c := range commands {
			if !strings.Contains(out, c.name+"  ") || !strings.Contains(out, c.summary) {
				t.Errorf("herd %q does not list %s with its summary:\n%s", args, c.name, out)
			}
			if !strings.Contains(out, "usage: herd "+c.name) {
				t.Errorf("herd %q lacks the synopsis of %s", args, c.name)
			}
			wantFlags(t, out[strings.Index(out, "usage: herd "+c.name):], c)
		}
	}
}

// TestCommandHelp: herd CMD -h (and --help) and herd help CMD exit 0 and
// print CMD's synopsis and every flag with its default on stdout, for
// every command in the table.
func TestCommandHelp(t *testing.T) {
	for _, c := range commands {
		t.Run(c.name, func(t *testing.T) {
			for _, args := range [][]string{{c.name, "-h"}, {c.name, "--help"}, {"help", c.name}} {
				out, errOut, code := herdCmd(t, nil, args...)
				if code != 0 || errOut != "" {
					t.Errorf("herd %q: exit %d, stderr %q; want 0 and nothing on stderr", args, code, errOut)
				}
				if !strings.HasPrefix(out, "usage: herd "+c.name+" [flags]") {
					t.Errorf("herd %q does not start with the synopsis:\n%s", args, out)
				}
				wantFlags(t, out, c)
			}
		})
	}
}

// TestHelpShowsTheEnvironmentsRedis: the help of -redis says which
// Redis HERD_REDIS names, so the default is visible before it is used.
func TestHelpShowsTheEnvironmentsRedis(t *testing.T) {
	out, _, _ := herdCmd(t, map[string]string{envRedis: "10.0.0.7:6380"}, "stats", "-h")
	if !strings.Contains(out, `(default: $HERD_REDIS, "10.0.0.7:6380")`) {
		t.Errorf("stats -h with HERD_REDIS set does not show it:\n%s", out)
	}
	out, _, _ = herdCmd(t, nil, "stats", "-h")
	if !strings.Contains(out, "(default: $HERD_REDIS, which is not set)") {
		t.Errorf("stats -h without HERD_REDIS does not say so:\n%s", out)
	}
}

// TestNoRedisNamedIsAUsageError: a command that reads Redis, with no
// -redis, no -cluster and neither variable set, exits 2 with a message
// that says how to name one, and contacts no server (it would have
// dialled 127.0.0.1:6379 before).
func TestNoRedisNamedIsAUsageError(t *testing.T) {
	for _, args := range [][]string{{"inspect", "user:42"}, {"stats"}} {
		out, errOut, code := herdCmd(t, nil, args...)
		if code != 2 {
			t.Errorf("herd %q: exit %d, want 2", args, code)
		}
		if !strings.Contains(errOut, "herd: no Redis named: give -redis ADDR") || !strings.Contains(errOut, "usage: herd "+args[0]) {
			t.Errorf("herd %q: stderr lacks the message and the usage:\n%s", args, errOut)
		}
		if out != "" {
			t.Errorf("herd %q printed on stdout: %q", args, out)
		}
	}
	both := map[string]string{envRedis: "a:1", envCluster: "b:1,c:1"}
	if _, errOut, code := herdCmd(t, both, "stats"); code != 2 || !strings.Contains(errOut, "both HERD_REDIS and HERD_REDIS_CLUSTER") {
		t.Errorf("stats with both variables: exit %d: %s", code, errOut)
	}
	if _, errOut, code := herdCmd(t, nil, "stats", "-redis", "a:1", "-cluster", "b:1"); code != 2 || !strings.Contains(errOut, "not both") {
		t.Errorf("stats with -redis and -cluster: exit %d: %s", code, errOut)
	}
}

// TestRedisFromEnvironment: with HERD_REDIS set and no flag, a command
// uses that Redis and names it on stderr first; a -redis flag wins over
// the variable.
func TestRedisFromEnvironment(t *testing.T) {
	srv := redistest.Start(t)
	out, errOut, code := herdCmd(t, map[string]string{envRedis: srv.Addr()}, "stats")
	if code != 0 || !strings.Contains(out, "herd keys with prefix") {
		t.Fatalf("stats with HERD_REDIS: exit %d: %s\n%s", code, errOut, out)
	}
	if want := "herd: Redis " + srv.Addr() + " (from HERD_REDIS)\n"; errOut != want {
		t.Errorf("stderr = %q, want %q", errOut, want)
	}
	out, errOut, code = herdCmd(t, map[string]string{envRedis: "127.0.0.1:1"}, "stats", "-redis", srv.Addr())
	if code != 0 || errOut != "" || !strings.Contains(out, "herd keys with prefix") {
		t.Errorf("stats -redis with another HERD_REDIS: exit %d, stderr %q", code, errOut)
	}
}
