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

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
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
	for _, st := range []string{stHerdPoll, stHerdNotify, stHerdSWR, stHerdNear} {
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
	// Every origin call but the stalled leader's is a takeover of an
	// expired lease: one at least (the leader's), and more only if a
	// busy machine paused a taker past its own lease too.
	if h := pr.Herd; h == nil || h.Takeovers < 1 || h.Fenced < 1 || pr.OriginCalls != 1+int(h.Takeovers) {
		t.Errorf("stall/herd-notify: %d origin calls, herd stats %+v: want the stalled leader's call, at least one takeover, one more call per takeover, and the leader's commit fenced", pr.OriginCalls, pr.Herd)
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
	c, err = parseFlags([]string{"-write-rate", "2.5/s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.WriteRate != 2.5 || c.Duration != 10*time.Second || c.HotDuration != defaultHotDuration {
		t.Errorf("-write-rate 2.5/s: rate %v, durations %v, %v", c.WriteRate, c.Duration, c.HotDuration)
	}
	c, err = parseFlags([]string{"-duration", "2s", "-write-rate", "0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.WriteRate != 0 || c.Duration != 2*time.Second || c.HotDuration != 2*time.Second {
		t.Errorf("-duration 2s: rate %v, durations %v, %v (want -duration for both)", c.WriteRate, c.Duration, c.HotDuration)
	}
	if c, err = parseFlags([]string{"-cluster", "start"}, io.Discard); err != nil || !c.StartCluster || len(c.ClusterAddrs) != 0 {
		t.Errorf("-cluster start: %+v, %v; want a cluster started for the run", c, err)
	}
	for _, bad := range [][]string{
		{"-write-rate", "fast"}, {"-write-rate", "-1/s"}, {"-write-rate", "1/m"}, {"-write-rate", "1e9/s"},
		{"-scenarios", "warm"}, {"-strategies", "memcache"}, {"-ttl", "500ms"}, {"-redis", "a:1", "-cluster", "b:1"},
		{"-p", "0"}, {"-zipf", "1"}, {"extra"}, {"-embedded", "-redis", "a:1"}, {"-embedded", "-cluster", "a:1,b:1"},
		{"-cluster", "start", "-redis", "a:1"}, {"-cluster", "start", "-embedded"},
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
	for _, bad := range []string{"hello", "hb|1|2|3|", "hb|1|2|3|x|", "hb||2|3|4|", "hb|1|99999999999999999999|3|4|", "hb|1|2|3|18446744073709551616|"} {
		if _, err := parseValue([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = parseValue(b) }); n != 0 {
		t.Errorf("parseValue: %v allocations", n)
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

// TestHotkey runs the hotkey scenario with 2 processes for a short window:
// every strategy reports its read rate, hit latency, commands per read,
// writes and staleness; the counts add up, and a plain GET per read, which
// Redis answers in order, is never judged stale.
func TestHotkey(t *testing.T) {
	strategies := []string{stNone, stSingle, stHerdNotify, stHerdNear}
	res, out := runBench(t, "-p", "2", "-c", "8", "-scenarios", "hotkey", "-strategies", strings.Join(strategies, ","),
		"-duration", "1s", "-write-rate", "20/s")
	for _, col := range hotHeader {
		if !strings.Contains(out, col) {
			t.Errorf("the table has no column %q", col)
		}
	}
	for _, st := range strategies {
		pr := phaseOf(t, res, scHot, st)
		h := pr.Hot
		if h == nil {
			t.Fatalf("hotkey/%s: no hotkey result", st)
		}
		if h.Reads == 0 || h.ReadsPerSec <= 0 || h.Hits == 0 || h.HitP50Us <= 0 || h.HitP99Us < h.HitP50Us {
			t.Errorf("hotkey/%s: %d reads (%.0f/s), %d hits, hit p50 %.1fµs p99 %.1fµs: the load did not run",
				st, h.Reads, h.ReadsPerSec, h.Hits, h.HitP50Us, h.HitP99Us)
		}
		if pr.Errors != 0 {
			t.Errorf("hotkey/%s: %d errors (%s)", st, pr.Errors, pr.ErrorMsg)
		}
		if h.Writes == 0 || h.WriteErrors != 0 || h.Newest < 2 {
			t.Errorf("hotkey/%s: %d writes, %d failed, newest version read %d: the writer did not write, or no read saw it",
				st, h.Writes, h.WriteErrors, h.Newest)
		}
		// Every worker heard of every acknowledged write, and judged
		// every successful read.
		if h.Heard != res.Settings.Procs*h.AckedAll {
			t.Errorf("hotkey/%s: the workers heard %d acknowledgements, want %d × %d", st, h.Heard, res.Settings.Procs, h.AckedAll)
		}
		if h.Judged != h.Reads-pr.Errors || h.Unjudged != 0 {
			t.Errorf("hotkey/%s: %d reads, %d errors, %d judged, %d not judged", st, h.Reads, pr.Errors, h.Judged, h.Unjudged)
		}
		if h.ReaderCmds == 0 || h.CmdsPerRead <= 0 || h.SrvCmdsPerRead <= 0 {
			t.Errorf("hotkey/%s: %d commands, %.3f per read, %.3f server commands per read", st, h.ReaderCmds, h.CmdsPerRead, h.SrvCmdsPerRead)
		}
		if st != stHerdNear && h.FromMemory != 0 {
			t.Errorf("hotkey/%s: %.1f%% from memory, without a near cache", st, 100*h.FromMemory)
		}
	}
	// herd-near answers reads from its near cache, and never serves a
	// value a write replaced more than its Staleness (default 250ms)
	// before the read.
	near := phaseOf(t, res, scHot, stHerdNear)
	if h := near.Hot; h.FromMemory <= 0 || near.Herd == nil || near.Herd.NearHits == 0 {
		t.Errorf("hotkey/herd-near: %.1f%% from memory, herd stats %+v: the near cache answered nothing", 100*h.FromMemory, near.Herd)
	}
	if h := near.Hot; h.StaleMaxMs >= 250 {
		t.Errorf("hotkey/herd-near: a read %.1fms stale, beyond the near cache's 250ms bound", h.StaleMaxMs)
	}
	// none sends one GET per read (and GET, SET per miss): the hook's
	// count over the whole phase says so exactly.
	none := phaseOf(t, res, scHot, stNone)
	if misses := none.Hot.OriginCallsAll; none.RedisCmds != int64(none.TotalCalls+misses) {
		t.Errorf("hotkey/none: %d commands counted for %d reads and %d origin calls, want one per read and one per origin call",
			none.RedisCmds, none.TotalCalls, misses)
	}
	// With no miss (no SET of an older version loaded from the origin),
	// a GET sent after the writer's SET returned gets that version or a
	// newer one: none is never stale.
	if none.Hot.OriginCallsAll == 0 && none.Hot.StaleReads != 0 {
		t.Errorf("hotkey/none: %d stale reads (max %.2fms) with every read a GET and no miss", none.Hot.StaleReads, none.Hot.StaleMaxMs)
	}
}

// TestStaleness judges a hand-made log of writes and reads: versions 1, 2
// and 3 acknowledged at 100, 200 and 300, version 4's write failed,
// version 5 acknowledged at 500, the watermark at 600.
func TestStaleness(t *testing.T) {
	var s ackStore
	s.reset()
	s.ack(1, 100)
	s.ack(2, 200)
	s.ack(3, 300)
	s.watermark(350) // version 4's write failed
	s.ack(5, 500)
	s.watermark(600)
	l := s.load()
	for _, tc := range []struct {
		name   string
		start  int64
		got    uint64
		stale  int64
		missed uint64
		known  bool
	}{
		{"stale: began 50 after version 2 was acknowledged, got 1", 250, 1, 50, 2, true},
		{"overlapped the write of 2: began before its acknowledgement, got 1", 190, 1, 0, 0, true},
		{"fresh: got 2, version 3 acknowledged after it began", 250, 2, 0, 0, true},
		{"fresh: began at the very acknowledgement", 300, 2, 0, 0, true},
		{"got a version newer than any acknowledged (the origin's)", 150, 2, 0, 0, true},
		{"missed 5 (4 failed): stale by 100", 600, 3, 100, 5, true},
		{"newest, before the watermark", 599, 5, 0, 0, true},
		{"newest, after the watermark: not known yet", 601, 5, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stale, missed, known := l.judge(tc.start, tc.got)
			if stale != tc.stale || missed != tc.missed || known != tc.known {
				t.Errorf("judge(%d, %d) = %d, %d, %v; want %d, %d, %v", tc.start, tc.got, stale, missed, known, tc.stale, tc.missed, tc.known)
			}
		})
	}

	// A caller's reads wait until they can be judged, in order.
	s.reset()
	s.ack(1, 100)
	var tr staleTracker
	var hs hotSamples
	tr.add(hotRead{Start: 150, Ver: 1}, s.load(), &hs) // not known until a watermark or version 2
	tr.add(hotRead{Start: 190, Ver: 1}, s.load(), &hs)
	tr.add(hotRead{Start: 260, Ver: 1}, s.load(), &hs)
	tr.add(hotRead{Start: 270, Ver: 2}, s.load(), &hs)
	if hs.Judged != 0 || len(tr.pend) != 4 {
		t.Fatalf("judged %d, %d pending; want 0 judged before any newer acknowledgement or watermark", hs.Judged, len(tr.pend))
	}
	s.ack(2, 200) // the read at 260 missed it by 60; the ones at 150 and 190 overlapped it
	tr.resolve(s.load(), &hs)
	if hs.Judged != 3 || len(tr.pend) != 1 || hs.Stale.N != 1 || hs.Stale.Max != 60 || hs.MissedBy[2] != 60 {
		t.Fatalf("after version 2's acknowledgement: judged %d, %d pending, %d stale (max %d, by version %v); want 3, 1, 1 (60 by version 2)",
			hs.Judged, len(tr.pend), hs.Stale.N, hs.Stale.Max, hs.MissedBy)
	}
	s.watermark(1000)
	tr.finish(&s, &hs, time.Now())
	if hs.Judged != 4 || hs.Unjudged != 0 || hs.Stale.N != 1 {
		t.Errorf("after the watermark: judged %d, %d not judged, %d stale; want 4, 0, 1", hs.Judged, hs.Unjudged, hs.Stale.N)
	}
	// Without a watermark past it, a read is left undecided, not fresh.
	tr.add(hotRead{Start: 2000, Ver: 2}, s.load(), &hs)
	tr.finish(&s, &hs, time.Now())
	if hs.Judged != 4 || hs.Unjudged != 1 {
		t.Errorf("with no watermark after the read: judged %d, %d not judged; want 4, 1", hs.Judged, hs.Unjudged)
	}
}

// TestCounter checks the go-redis hook that the commands per request come
// from: one per command, each command of a pipeline once, the connection
// handshake not at all, and failures apart from misses.
func TestCounter(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	cnt := &counter{}
	rdb.AddHook(cnt)
	ctx := context.Background()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_ = rdb.Get(ctx, "k").Err()
	_ = rdb.Get(ctx, "missing").Err() // redis.Nil: a miss, not a failure
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Get(ctx, "k")
		p.Incr(ctx, "k") // fails: not an integer
		return nil
	})
	if got, want := cnt.cmds.Load(), int64(5); got != want {
		t.Errorf("%d commands counted, want %d (SET, GET, GET, and a pipeline of 2)", got, want)
	}
	if got := cnt.errs.Load(); got != 1 {
		t.Errorf("%d failures counted, want 1 (the INCR); kinds %v", got, cnt.errorKinds())
	}
}

func TestHist(t *testing.T) {
	var h hist
	for i := int64(1); i <= 1000; i++ {
		h.add(i * 1000) // 1..1000 µs
	}
	for _, tc := range []struct {
		q    float64
		want int64
	}{{0.5, 500_000}, {0.99, 990_000}, {1, 1_000_000}} {
		if got := h.quantile(tc.q); got < tc.want*97/100 || got > tc.want*103/100 {
			t.Errorf("quantile(%v) = %d, want %d within 3%%", tc.q, got, tc.want)
		}
	}
	if h.Max != 1_000_000 || h.N != 1000 {
		t.Errorf("max %d, n %d", h.Max, h.N)
	}
	for v := int64(0); v < 1<<20; v = v*5/4 + 1 {
		lo, hi := histBounds(histIndex(v))
		if v < lo || v > hi {
			t.Fatalf("%d in bucket %d = [%d, %d]", v, histIndex(v), lo, hi)
		}
	}
	var m hist
	m.merge(&h)
	m.merge(&hist{})
	if m.N != h.N || m.quantile(0.5) != h.quantile(0.5) {
		t.Errorf("merged: n %d, p50 %d", m.N, m.quantile(0.5))
	}
	if (&hist{}).quantile(0.5) != 0 {
		t.Error("empty")
	}
}
