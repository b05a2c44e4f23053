package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// testMainEnv makes the test binary run main, the bench command (see
// TestMain).
const testMainEnv = "HERD_BENCH_TEST_MAIN"

// The test binary doubles as the worker: run() re-runs its own executable
// with the worker role in the environment. With testMainEnv set it is the
// bench command itself (main), for tests that signal a whole run.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == roleWorker {
		os.Exit(workerMain(os.Stdin, os.Stdout))
	}
	if os.Getenv(testMainEnv) == "1" {
		main() // exits
	}
	os.Exit(m.Run())
}

// lockedBuffer collects the progress line and the workers' stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func runBench(t *testing.T, args ...string) (*results, string) {
	t.Helper()
	cfg, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Command = commandLine(args)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	var out bytes.Buffer
	var errOut lockedBuffer
	res, err := run(ctx, cfg, &out, &errOut)
	if err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, errOut.String())
	}
	t.Logf("stdout:\n%s", out.String())
	return res, out.String()
}

func phaseOf(t *testing.T, res *results, sc, st string) *phaseResult {
	t.Helper()
	for _, pr := range res.Phases {
		if pr.Scenario == sc && pr.Strategy == st {
			return pr
		}
	}
	t.Fatalf("no result for %s/%s", sc, st)
	return nil
}

// TestQuick runs the quick mode end to end, as CI's smoke test: separate
// processes, one shared Redis (the redis-server the run starts, when one
// is on $PATH), the origin over HTTP. In every
// cold wave the herd strategies call the origin exactly once across all
// processes, and the unprotected strategy more than once.
func TestQuick(t *testing.T) {
	dir := t.TempDir()
	jsonPath, svgPath, mdPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.svg"), filepath.Join(dir, "r.md")
	res, out := runBench(t, "-quick", "-p", "2", "-c", "8", "-json", jsonPath, "-svg", svgPath, "-md", mdPath)
	checkDefaultRedis(t, res)

	if got, want := len(res.Phases), 2*len(allStrategies); got != want {
		t.Fatalf("%d phases, want %d (cold and steady × every strategy)", got, want)
	}
	for _, st := range []string{stHerdPoll, stHerdNotify, stHerdSWR} {
		pr := phaseOf(t, res, scCold, st)
		for w, n := range pr.PerWave {
			if n != 1 {
				t.Errorf("cold/%s: wave %d made %d origin calls, want 1 (per wave: %v)", st, w, n, pr.PerWave)
			}
		}
		if pr.Errors != 0 {
			t.Errorf("cold/%s: %d errors (%s)", st, pr.Errors, pr.ErrorMsg)
		}
		if pr.Requests != res.Settings.Procs*res.Settings.Callers*res.Settings.Waves {
			t.Errorf("cold/%s: %d requests, want %d", st, pr.Requests, res.Settings.Procs*res.Settings.Callers*res.Settings.Waves)
		}
	}
	// Poll mode is real: herd-poll's followers were never woken by a
	// message, they polled; herd-notify's were woken.
	if h := phaseOf(t, res, scCold, stHerdPoll).Herd; h == nil || h.Notified != 0 || h.Polled == 0 {
		t.Errorf("cold/herd-poll: herd stats %+v: want polls and no notifications", h)
	}
	if h := phaseOf(t, res, scCold, stHerdNotify).Herd; h == nil || h.Notified == 0 {
		t.Errorf("cold/herd-notify: herd stats %+v: want notifications", h)
	}
	none := phaseOf(t, res, scCold, stNone)
	for w, n := range none.PerWave {
		if n <= 1 {
			t.Errorf("cold/none: wave %d made %d origin calls; an unprotected cold wave should stampede (per wave: %v)", w, n, none.PerWave)
		}
	}
	if none.CallsPerRebuild <= 1 {
		t.Errorf("cold/none: %.2f origin calls per wave, want > 1", none.CallsPerRebuild)
	}
	// Singleflight alone coalesces within a process only.
	if sf := phaseOf(t, res, scCold, stSingle); sf.MaxPerRebuild > res.Settings.Procs {
		t.Errorf("cold/singleflight: %d origin calls in a wave, more than one per process (%d)", sf.MaxPerRebuild, res.Settings.Procs)
	}
	for _, st := range allStrategies {
		if pr := phaseOf(t, res, scSteady, st); pr.Requests == 0 || pr.OriginCalls == 0 {
			t.Errorf("steady/%s: %d requests, %d origin calls: the load did not run", st, pr.Requests, pr.OriginCalls)
		}
	}

	for _, st := range allStrategies {
		if !strings.Contains(out, st) {
			t.Errorf("the table has no row for %s", st)
		}
	}
	var decoded results
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &decoded); err != nil || len(decoded.Phases) != len(res.Phases) {
		t.Errorf("JSON: %v, %d phases", err, len(decoded.Phases))
	}
	svg, err := os.ReadFile(svgPath)
	if err != nil {
		t.Fatal(err)
	}
	checkXML(t, svg)
	md, err := os.ReadFile(mdPath)
	if err != nil || !strings.Contains(string(md), "go run ./bench -quick") {
		t.Errorf("markdown: %v, missing the command:\n%s", err, md)
	}
}

// TestStallAndFailure runs the leader-stall and origin-failure scenarios
// for herd and the unprotected strategy. A leader stopped past its lease
// is taken over once, and its late commit is fenced.
func TestStallAndFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("stops a process for 3s")
	}
	if !canStall {
		t.Skip("no SIGSTOP here")
	}
	res, _ := runBench(t, "-p", "2", "-c", "8", "-scenarios", "failure,stall", "-strategies", "none,herd-notify",
		"-fail-window", "300ms", "-keys", "50")
	pr := phaseOf(t, res, scStall, stHerdNotify)
	if pr.Stall == nil || pr.Stall.StoppedMs < 2900 {
		t.Fatalf("stall: %+v: the leader was not stopped for 3s", pr.Stall)
	}
	if pr.OriginCalls != 2 {
		t.Errorf("stall/herd-notify: %d origin calls, want 2 (the stalled leader's and one takeover)", pr.OriginCalls)
	}
	if h := pr.Herd; h == nil || h.Takeovers != 1 || h.Fenced != 1 {
		t.Errorf("stall/herd-notify: herd stats %+v, want 1 takeover and 1 fenced commit", pr.Herd)
	}
	// The others waited about one lease, not the whole stop.
	if pr.Latency.Max > 2500 || pr.Errors != 0 {
		t.Errorf("stall/herd-notify: other processes' max latency %.0fms, %d errors", pr.Latency.Max, pr.Errors)
	}
	if pr := phaseOf(t, res, scStall, stNone); pr.OriginCalls < res.Settings.Callers {
		t.Errorf("stall/none: %d origin calls, want at least one per caller", pr.OriginCalls)
	}
	for _, st := range []string{stNone, stHerdNotify} {
		pr := phaseOf(t, res, scFailure, st)
		if len(pr.Failure) != 3 || pr.Failure[1].OriginCalls == 0 || pr.Failure[1].Errors == 0 {
			t.Errorf("failure/%s: segments %+v: the origin should have been called and failed", st, pr.Failure)
		}
	}
}

func checkXML(t *testing.T, b []byte) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	for {
		_, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
	}
	if !bytes.HasPrefix(b, []byte("<svg")) {
		t.Error("SVG does not start with <svg")
	}
}

func TestParseLatency(t *testing.T) {
	for _, tc := range []struct {
		in      string
		ok      bool
		lo, hi  time.Duration
		display string
	}{
		{"50ms", true, 50 * time.Millisecond, 50 * time.Millisecond, "50ms"},
		{"uniform:20ms-80ms", true, 20 * time.Millisecond, 80 * time.Millisecond, "uniform:20ms-80ms"},
		{"exp:10ms", true, 0, 200 * time.Millisecond, "exp:10ms"},
		{"uniform:80ms-20ms", false, 0, 0, ""},
		{"fast", false, 0, 0, ""},
		{"-5ms", false, 0, 0, ""},
		{"normal:5ms", false, 0, 0, ""},
	} {
		d, err := parseLatency(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("%q: err %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if !tc.ok {
			continue
		}
		if d.String() != tc.display {
			t.Errorf("%q: String %q", tc.in, d.String())
		}
		for range 200 {
			if s := d.sample(); s < tc.lo || s > tc.hi {
				t.Fatalf("%q: sample %v outside [%v, %v]", tc.in, s, tc.lo, tc.hi)
			}
		}
	}
}

func TestFlags(t *testing.T) {
	c, err := parseFlags([]string{"-quick", "-c", "32"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Procs != 2 || c.Callers != 32 || c.Waves != 3 || strings.Join(c.Scenarios, ",") != "cold,steady" {
		t.Errorf("quick defaults with -c 32: %+v", c)
	}
	c, err = parseFlags([]string{"-scenarios", "stall,cold", "-strategies", "herd-swr,none"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Scenarios, ",") != "cold,stall" || strings.Join(c.Strategies, ",") != "none,herd-swr" {
		t.Errorf("lists not in canonical order: %v %v", c.Scenarios, c.Strategies)
	}
	for _, bad := range [][]string{
		{"-scenarios", "warm"}, {"-strategies", "memcache"}, {"-ttl", "500ms"}, {"-redis", "a:1", "-cluster", "b:1"},
		{"-p", "0"}, {"-zipf", "1"}, {"extra"}, {"-embedded", "-redis", "a:1"}, {"-embedded", "-cluster", "a:1,b:1"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestValueRoundTrip(t *testing.T) {
	start := time.Unix(100, 5)
	end := start.Add(50 * time.Millisecond)
	b := makeValue(7, start, end, 3, 128)
	if len(b) != 128 {
		t.Fatalf("len %d", len(b))
	}
	m, err := parseValue(b)
	if err != nil || m.ID != 7 || m.Start != start.UnixNano() || m.End != end.UnixNano() || m.Ver != 3 {
		t.Fatalf("%+v, %v", m, err)
	}
	if _, err := parseValue([]byte("hello")); err == nil {
		t.Error("foreign bytes parsed")
	}
}

func TestRebuildsAndPeak(t *testing.T) {
	ms := int64(time.Millisecond)
	ev := []originEvent{
		{Key: "a", Start: 0, End: 50 * ms},
		{Key: "a", Start: 1 * ms, End: 51 * ms},
		{Key: "a", Start: 55 * ms, End: 105 * ms}, // within the slack: a duplicate
		{Key: "a", Start: 1000 * ms, End: 1050 * ms},
		{Key: "b", Start: 10 * ms, End: 60 * ms},
	}
	eps := rebuilds(ev)
	if len(eps) != 3 {
		t.Fatalf("%d episodes: %+v", len(eps), eps)
	}
	if eps[0].Key != "a" || eps[0].Calls != 3 || eps[1].Key != "b" || eps[2].Calls != 1 {
		t.Errorf("episodes %+v", eps)
	}
	if p := peakConcurrency(ev); p != 3 {
		t.Errorf("peak %d, want 3", p)
	}
	tl := concurrencyTimeline(ev, "a", 0, -10*ms, 200*ms)
	peak := 0
	for _, p := range tl.Points {
		peak = max(peak, p.N)
	}
	if tl.Calls != 3 || peak != 2 || tl.Points[len(tl.Points)-1].N != 0 {
		t.Errorf("timeline %+v", tl)
	}
}

func TestPercentiles(t *testing.T) {
	var xs []int64
	for i := 1; i <= 1000; i++ {
		xs = append(xs, int64(i)*1000) // 1..1000 ms
	}
	p := percentiles(xs)
	if p.P50 != 500 || p.P99 != 990 || p.P999 != 999 || p.Max != 1000 || p.N != 1000 {
		t.Errorf("%+v", p)
	}
	if (percentiles(nil) != pct{}) {
		t.Error("empty")
	}
}
