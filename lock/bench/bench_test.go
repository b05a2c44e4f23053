package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// requireEnv set to 1 (herd's CI) makes a backend whose server is missing
// fail the test instead of skipping it.
const requireEnv = "HERD_REQUIRE_REDIS"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestBenchRunsEveryBackend runs the benchmark briefly (-n 5, a short
// contended phase) on every backend against real servers, one subtest
// each, so that a change that breaks a backend's row fails here: every
// phase must complete with n samples, the handoffs included (a waiter
// that is never woken fails its Acquire at the lease's end), and the
// table must have the row. goleak (TestMain) checks that the bench stops
// every Lock and client it opened. A backend whose server is not there is
// skipped, unless HERD_REQUIRE_REDIS=1.
func TestBenchRunsEveryBackend(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			cfg, err := parseFlags([]string{"-n", "5", "-contend", "100ms", "-ttl", "5s", "-backends", b.name}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			dep, err := b.setup(ctx, cfg)
			if err != nil {
				if os.Getenv(requireEnv) == "1" {
					t.Fatalf("setup: %v (%s=1: a missing server fails)", err, requireEnv)
				}
				t.Skipf("setup: %v (set %s=1 to fail instead)", err, requireEnv)
			}
			r := measure(ctx, b.name, dep, cfg)
			if err := dep.teardown(); err != nil {
				t.Errorf("teardown: %v", err)
			}
			if r.err != nil {
				t.Fatalf("measure: %v", r.err)
			}
			for phase, got := range map[string]int{"TryAcquire": len(r.tryAcquire), "Release": len(r.release), "handoff": len(r.handoff)} {
				if got != cfg.n {
					t.Errorf("%s: %d samples, want %d", phase, got, cfg.n)
				}
			}
			if r.acquired == 0 {
				t.Error("the contended phase counted no acquisition")
			}
			var out bytes.Buffer
			printTable(&out, cfg, []result{r})
			if !strings.Contains(out.String(), "| "+b.name+" | ") || strings.Contains(out.String(), "not measured") {
				t.Errorf("table without the measured row:\n%s", out.String())
			}
		})
	}
}

// TestParseFlags: the names and ranges the command accepts.
func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(cfg.backends, ","), strings.Join(names(), ","); got != want {
		t.Errorf("default backends %q, want every one, %q", got, want)
	}
	for _, args := range [][]string{
		{"-backends", "locker,nosuch"},
		{"-backends", ","},
		{"-n", "-1"},
		{"-ttl", "10ms"},
		{"-workers", "0"},
		{"extra"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q): no error", args)
		}
	}
}

// TestPercentile: nearest rank.
func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i))
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 50}, {99, 99}, {100, 100}, {1, 1}} {
		if got := percentile(ds, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %v", got)
	}
}

// TestFmtDur: three significant digits, no "1000 µs".
func TestFmtDur(t *testing.T) {
	for d, want := range map[time.Duration]string{
		171 * time.Microsecond:   "171 µs",
		999600 * time.Nanosecond: "1.00 ms",
		1234 * time.Microsecond:  "1.23 ms",
		9996 * time.Microsecond:  "10.0 ms",
		99960 * time.Microsecond: "100 ms",
		1500 * time.Millisecond:  "1500 ms",
	} {
		if got := fmtDur(d); got != want {
			t.Errorf("fmtDur(%v) = %q, want %q", d, got, want)
		}
	}
}
