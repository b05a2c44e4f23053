package main

import (
	"cmp"
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/herdkit/herd"
)

// results is everything one run measured.
type results struct {
	Command  string         `json:"command"`
	Started  time.Time      `json:"started"`
	Elapsed  float64        `json:"elapsed_s"`
	Redis    string         `json:"redis"`      // which Redis, for the reports
	RedisSrc string         `json:"redis_kind"` // started, embedded, redis or cluster
	RedisVer string         `json:"redis_version,omitempty"`
	Host     string         `json:"host"`
	Settings settings       `json:"settings"`
	Phases   []*phaseResult `json:"phases"`

	redisPid int // the redis-server this run started (and stopped); 0 for none
}

type settings struct {
	Procs         int      `json:"procs"`
	Callers       int      `json:"callers_per_proc"`
	Waves         int      `json:"waves"`
	WarmWave      bool     `json:"warm_wave"`
	DurationS     float64  `json:"duration_s"`
	HotDurationS  float64  `json:"hotkey_duration_s"`
	WriteRate     float64  `json:"hotkey_write_rate_per_s"`
	OriginLatency string   `json:"origin_latency"`
	Keys          int      `json:"keys"`
	Zipf          float64  `json:"zipf_s"`
	TTLS          float64  `json:"ttl_s"`
	StaleForS     float64  `json:"stale_for_s"`
	ThinkMs       float64  `json:"think_ms"`
	ValueSize     int      `json:"value_size"`
	FailWindowS   float64  `json:"fail_window_s"`
	WarmupS       float64  `json:"warmup_s"`
	StallLeaseS   float64  `json:"stall_lease_s"`
	LockPollMs    float64  `json:"redislock_poll_ms"`
	HerdPollMs    float64  `json:"herd_poll_ms"`
	originMeanMs  float64  // for the chart
	Scenarios     []string `json:"scenarios"`
	Strategies    []string `json:"strategies"`
}

// phaseResult is one strategy in one scenario.
type phaseResult struct {
	Scenario string `json:"scenario"`
	Strategy string `json:"strategy"`

	Requests   int `json:"requests"`    // recorded calls
	TotalCalls int `json:"total_calls"` // including warm-up

	OriginCalls     int     `json:"origin_calls"`
	Rebuilds        int     `json:"rebuilds"`          // waves, or rebuild episodes in the window
	CallsPerRebuild float64 `json:"calls_per_rebuild"` // the stampede factor
	MaxPerRebuild   int     `json:"max_per_rebuild"`
	PerWave         []int   `json:"per_wave,omitempty"`
	PeakConcurrency int     `json:"peak_origin_concurrency"`
	StrayOrigin     int     `json:"stray_origin_calls"` // late calls of an earlier phase, not counted

	Latency  pct            `json:"latency"`
	Added    pct            `json:"follower_added"`
	Origin   int            `json:"origin_callers"`
	Follower int            `json:"followers"`
	Hit      int            `json:"hits"`
	Stale    int            `json:"stale"`
	Errors   int            `json:"errors"`
	ErrorMsg string         `json:"error_sample,omitempty"`
	Outcomes map[string]int `json:"herd_outcomes,omitempty"`

	RedisCmds     int64            `json:"redis_cmds"`
	RedisErrors   int64            `json:"redis_errors"`
	RedisCanceled int64            `json:"redis_canceled"` // commands the process itself cancelled
	RedisErrorMsg map[string]int64 `json:"redis_error_kinds,omitempty"`
	CmdsPerReq    float64          `json:"redis_cmds_per_request"`
	ServerCmds    int64            `json:"server_cmds"`  // -1: unknown
	ServerConns   int64            `json:"server_conns"` // connections the server accepted in the phase; -1: unknown
	SrvCmdsPerReq float64          `json:"server_cmds_per_request"`
	Herd          *herd.Stats      `json:"herd_stats,omitempty"`

	BarrierLateMs float64 `json:"barrier_late_max_ms"`
	// The longest pause of the parent or of a (not stalled) worker process
	// during the phase: a busy machine, not a strategy.
	HiccupMs float64 `json:"hiccup_max_ms"`

	Failure  []segmentResult `json:"failure_segments,omitempty"`
	Stall    *stallResult    `json:"stall,omitempty"`
	Hot      *hotResult      `json:"hotkey,omitempty"`
	Timeline *timeline       `json:"timeline,omitempty"`
	Notes    string          `json:"notes"`
}

type segmentResult struct {
	Name        string `json:"name"`
	Calls       int    `json:"calls"`
	Errors      int    `json:"errors"`
	Stale       int    `json:"stale"`
	OriginCalls int    `json:"origin_calls"`
}

type stallResult struct {
	Worker        int     `json:"worker"`
	Pid           int     `json:"pid"`
	StoppedMs     float64 `json:"stopped_ms"`
	ExcludedCalls int     `json:"stalled_process_calls"`
	StalledMaxMs  float64 `json:"stalled_process_max_ms"`
	StalledErrors int     `json:"stalled_process_errors"`
	// The origin calls of the stalled wave (ms from the first one).
	Calls []stallCall `json:"origin_calls"`
}

type stallCall struct {
	Pid     int     `json:"pid"`
	StartMs float64 `json:"start_ms"`
	EndMs   float64 `json:"end_ms"`
	OK      bool    `json:"ok"`
}

type bench struct {
	cfg    *config
	redis  *redisEnv
	origin *origin
	fleet  *fleet
	prog   *progress
	hic    *hiccups
	runID  string
	step   int
	steps  int
}

// run runs the benchmark as the parent: Redis, origin, workers, every
// selected scenario × strategy, then the reports.
func run(ctx context.Context, cfg *config, stdout, stderr io.Writer) (*results, error) {
	if slices.Contains(cfg.Scenarios, scStall) && !canStall {
		return nil, errors.New("the stall scenario needs SIGSTOP, which this platform lacks")
	}
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	started := time.Now()
	prog := newProgress(stderr)
	defer prog.done()

	rs, err := startRedis(ctx, cfg, stderr)
	if err != nil {
		return nil, err
	}
	defer rs.close()
	if !isLoopback(rs.spec.Addrs) {
		fmt.Fprintf(stderr, "bench: note: Redis at %v is not on loopback\n", rs.spec.Addrs)
	}
	org, err := startOrigin(cfg.lat, cfg.ValueSize)
	if err != nil {
		return nil, err
	}
	defer org.close()

	deadline := started.Add(3*estimate(cfg) + 2*time.Minute)
	fl, err := startFleet(exe, cfg.Procs, deadline, stderr)
	if err != nil {
		return nil, err
	}
	defer func() {
		if ctx.Err() != nil {
			fl.kill() // interrupted: no grace
		} else {
			fl.stop(3 * time.Second)
		}
	}()

	var id [3]byte
	_, _ = cryptorand.Read(id[:])
	hic := startHiccups()
	defer hic.close()
	b := &bench{cfg: cfg, redis: rs, origin: org, fleet: fl, prog: prog, hic: hic, runID: hex.EncodeToString(id[:]),
		steps: len(cfg.Scenarios) * len(cfg.Strategies)}
	res := &results{
		Command: cfg.Command, Started: started, Redis: rs.describe(), RedisSrc: rs.kind, RedisVer: rs.version,
		Host: fmt.Sprintf("%s/%s, %d CPUs, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version()),
		Settings: settings{
			Procs: cfg.Procs, Callers: cfg.Callers, Waves: cfg.Waves, WarmWave: cfg.WarmWave, DurationS: cfg.Duration.Seconds(),
			HotDurationS: cfg.HotDuration.Seconds(), WriteRate: cfg.WriteRate,
			OriginLatency: cfg.lat.String(), Keys: cfg.Keys, Zipf: cfg.Zipf, TTLS: cfg.TTL.Seconds(),
			StaleForS: cfg.StaleFor.Seconds(), ThinkMs: ms(cfg.Think), ValueSize: cfg.ValueSize,
			FailWindowS: cfg.FailWindow.Seconds(), WarmupS: cfg.Warmup.Seconds(), StallLeaseS: stallLease.Seconds(),
			LockPollMs: ms(lockPoll), HerdPollMs: ms(herdPollEvery), originMeanMs: ms(cfg.lat.mean()),
			Scenarios: cfg.Scenarios, Strategies: cfg.Strategies,
		},
	}
	if rs.srv != nil {
		res.redisPid = rs.srv.pid
	}
	for _, sc := range cfg.Scenarios {
		for _, st := range cfg.Strategies {
			b.step++
			pr, err := b.phase(ctx, sc, st)
			if err != nil {
				return res, fmt.Errorf("%s/%s: %w", sc, st, err)
			}
			res.Phases = append(res.Phases, pr)
		}
	}
	res.Elapsed = time.Since(started).Seconds()
	prog.done()
	if err := writeTable(stdout, res, cfg.Wide); err != nil {
		return res, err
	}
	if cfg.JSONPath != "" {
		if err := writeJSON(cfg.JSONPath, res); err != nil {
			return res, err
		}
	}
	if cfg.SVGPath != "" {
		if err := os.WriteFile(cfg.SVGPath, []byte(renderSVG(res)), 0o644); err != nil {
			return res, err
		}
	}
	if cfg.MDPath != "" {
		if err := writeMarkdown(cfg.MDPath, res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// estimate is a generous bound on the run's length, for the workers'
// deadline.
func estimate(cfg *config) time.Duration {
	var per time.Duration
	for _, sc := range cfg.Scenarios {
		per += 2 * time.Second
		switch sc {
		case scCold:
			per += time.Duration(cfg.Waves) * (300*time.Millisecond + 2*cfg.lat.typical())
		case scSteady:
			per += cfg.Warmup + cfg.Duration
		case scFailure:
			per += cfg.Warmup + 3*cfg.FailWindow
		case scStall:
			per += 3*stallLease + 3*time.Second
		case scHot:
			per += cfg.Warmup + cfg.HotDuration + time.Second
		}
	}
	return time.Duration(len(cfg.Strategies)) * per
}

const barrierLead = 50 * time.Millisecond // how far ahead the start instant is sent

func (b *bench) phase(ctx context.Context, sc, st string) (*phaseResult, error) {
	cfg := b.cfg
	phase := sc + "/" + st
	prefix := "hb" + b.runID + "-" + sc + "-" + st
	b.prog.set(true, "[%d/%d] %s × %s: setting up", b.step, b.steps, sc, st)
	b.origin.begin(phase, st)
	params := strategyParams{Name: st, Prefix: prefix, TTL: cfg.TTL, StaleFor: cfg.StaleFor}
	if err := b.fleet.broadcast(command{
		Op: "setup", Phase: phase, Strategy: st, Prefix: prefix, Redis: b.redis.spec, Origin: b.origin.url,
		Callers: cfg.Callers, TTL: int64(params.TTL), StaleFor: int64(params.StaleFor),
		Timeout: int64(cfg.CallTimeout), Think: int64(cfg.Think),
	}); err != nil {
		return nil, err
	}
	if _, err := b.fleet.await(ctx, 30*time.Second, nil); err != nil {
		return nil, err
	}
	if sc == scCold && cfg.WarmWave {
		if err := b.warmWave(ctx, sc); err != nil {
			return nil, err
		}
		b.origin.begin(phase, st) // its origin call is not counted
	}
	srv0, conn0 := b.redis.serverCommands(ctx), b.redis.serverConnections(ctx)
	b.hic.take()

	pr := &phaseResult{Scenario: sc, Strategy: st}
	per := make([]*sampleSet, len(b.fleet.procs))
	for i := range per {
		per[i] = &sampleSet{}
	}
	var err error
	var window [2]int64 // load scenarios: the measured window
	var bounds []int64
	var stall *stallResult
	var hot *hotResult
	switch sc {
	case scCold:
		err = b.waves(ctx, pr, per)
	case scSteady, scFailure:
		window, bounds, err = b.loadRun(ctx, pr, per)
	case scStall:
		stall, err = b.stall(ctx, pr, per)
	case scHot:
		hot, err = b.hotRun(ctx, pr, per, params)
	}
	if err != nil {
		return nil, err
	}
	parentHiccup := b.hic.take()
	srv1, conn1 := b.redis.serverCommands(ctx), b.redis.serverConnections(ctx)

	if err := b.fleet.broadcast(command{Op: "teardown"}); err != nil {
		return nil, err
	}
	stats, err := b.fleet.await(ctx, 30*time.Second, nil)
	if err != nil {
		return nil, err
	}
	events, stray := b.origin.end()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if err := b.redis.cleanup(cctx, prefix); err != nil {
		fmt.Fprintf(os.Stderr, "bench: cleanup of %s: %v\n", prefix, err)
	}
	cancel()

	// Samples: for the stall scenario, the stalled process's callers are
	// reported apart (they wait out the stop whatever the strategy).
	all := &sampleSet{}
	for i, s := range per {
		if stall != nil && i == stall.Worker {
			stall.ExcludedCalls = len(s.Lat) + s.Errors
			if len(s.Lat) > 0 {
				stall.StalledMaxMs = float64(slices.Max(s.Lat)) / 1000
			}
			stall.StalledErrors = s.Errors
			continue
		}
		all.merge(s)
	}
	pr.Stall = stall
	pr.StrayOrigin = stray
	pr.Requests = len(all.Lat) + all.Errors
	pr.Latency = percentiles(all.Lat)
	pr.Added = percentiles(all.Added)
	pr.Origin, pr.Follower, pr.Hit, pr.Stale = all.Origin, all.Follower, all.Hit, all.Stale
	pr.Errors, pr.ErrorMsg, pr.Outcomes = all.Errors, all.ErrSample, all.Outcomes
	pr.BarrierLateMs = float64(all.LateMax) / 1e6
	pr.HiccupMs = ms(max(parentHiccup, time.Duration(all.Hiccup)))

	var hs *herd.Stats
	for _, r := range stats {
		pr.RedisCmds += r.Stats.RedisCmds
		pr.RedisErrors += r.Stats.RedisErrors
		pr.RedisCanceled += r.Stats.Canceled
		for k, v := range r.Stats.RedisErrs {
			if pr.RedisErrorMsg == nil {
				pr.RedisErrorMsg = map[string]int64{}
			}
			pr.RedisErrorMsg[k] += v
		}
		if r.Stats.Herd != nil {
			if hs == nil {
				hs = &herd.Stats{}
			}
			addStats(hs, r.Stats.Herd)
		}
	}
	pr.Herd = hs
	// Every call the workers made, stalled process included, for the
	// per-request command counts.
	calls := 0
	for _, s := range per {
		calls += s.Calls
	}
	pr.TotalCalls = calls
	if calls > 0 {
		pr.CmdsPerReq = float64(pr.RedisCmds) / float64(calls)
	}
	pr.ServerCmds, pr.SrvCmdsPerReq = -1, -1
	pr.ServerConns = -1
	if conn0 >= 0 && conn1 >= conn0 {
		pr.ServerConns = conn1 - conn0
	}
	if srv0 >= 0 && srv1 >= srv0 {
		pr.ServerCmds = srv1 - srv0
		if calls > 0 {
			pr.SrvCmdsPerReq = float64(pr.ServerCmds) / float64(calls)
		}
	}

	switch sc {
	case scCold, scStall:
		keys := waveKeys(sc, len(pr.PerWave))
		for i, k := range keys {
			for _, e := range events {
				if e.Key == k {
					pr.PerWave[i]++
				}
			}
		}
		pr.OriginCalls = len(events)
		pr.Rebuilds = len(keys)
		pr.MaxPerRebuild = slices.Max(pr.PerWave)
		pr.CallsPerRebuild = float64(pr.OriginCalls) / float64(max(pr.Rebuilds, 1))
		pr.PeakConcurrency = peakConcurrency(events)
		if stall != nil && len(events) <= 32 {
			first := int64(math.MaxInt64)
			for _, e := range events {
				first = min(first, e.Start)
			}
			for _, e := range events {
				stall.Calls = append(stall.Calls, stallCall{Pid: e.Pid, StartMs: float64(e.Start-first) / 1e6, EndMs: float64(e.End-first) / 1e6, OK: e.OK})
			}
			slices.SortFunc(stall.Calls, func(a, b stallCall) int { return cmp.Compare(a.StartMs, b.StartMs) })
		}
		if sc == scCold {
			mid := keys[len(keys)/2]
			first := int64(math.MaxInt64)
			for _, e := range events {
				if e.Key == mid {
					first = min(first, e.Start)
				}
			}
			if first != math.MaxInt64 {
				span := int64(cfg.lat.typical())
				tl := concurrencyTimeline(events, mid, first, first-span/2, first+4*span)
				pr.Timeline = &tl
			}
		}
	case scSteady, scFailure:
		var inWin []originEvent
		for _, e := range events {
			if e.Start >= window[0] && e.Start < window[1] {
				inWin = append(inWin, e)
			}
		}
		var eps []rebuild
		for _, r := range rebuilds(events) {
			if r.Start >= window[0] && r.Start < window[1] {
				eps = append(eps, r)
			}
		}
		pr.OriginCalls = len(inWin)
		pr.Rebuilds = len(eps)
		for _, r := range eps {
			pr.MaxPerRebuild = max(pr.MaxPerRebuild, r.Calls)
		}
		if len(eps) > 0 {
			n := 0
			for _, r := range eps {
				n += r.Calls
			}
			pr.CallsPerRebuild = float64(n) / float64(len(eps))
		}
		pr.PeakConcurrency = peakConcurrency(inWin)
		if sc == scSteady {
			pr.Timeline = hotTimeline(cfg, eps, events, window)
		}
		if sc == scFailure {
			names := []string{"before", "failing", "after"}
			for i := range len(bounds) - 1 {
				sr := segmentResult{Name: names[i]}
				if i < len(all.Seg) {
					sr.Calls, sr.Errors, sr.Stale = all.Seg[i].Calls, all.Seg[i].Errors, all.Seg[i].Stale
				}
				for _, e := range events {
					if e.Start >= bounds[i] && e.Start < bounds[i+1] {
						sr.OriginCalls++
					}
				}
				pr.Failure = append(pr.Failure, sr)
			}
		}
	case scHot:
		hs := all.Hot
		if hs == nil {
			hs = &hotSamples{}
		}
		hot.summarize(hs, cfg.HotDuration)
		pr.Hot = hot
		hot.OriginCallsAll = len(events)
		pr.Requests, pr.Errors, pr.ErrorMsg, pr.Hit = hs.Reads, hs.Errors, hs.ErrSample, hs.Hits
		pr.Latency = hs.Lat.pct()
		pr.CmdsPerReq, pr.ServerCmds, pr.SrvCmdsPerReq = hot.CmdsPerRead, hot.ServerCmds, hot.SrvCmdsPerRead
		from, stop := hot.window[0], hot.window[1]
		for _, e := range events {
			if e.Start >= from && e.Start < stop {
				pr.OriginCalls++
			}
		}
	}
	pr.Notes = notes(cfg, pr)
	return pr, nil
}

func waveKeys(sc string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = sc + ":" + strconv.Itoa(i)
	}
	return keys
}

// hotTimeline is the origin concurrency of the hottest key around its
// rebuild nearest the middle of the window.
func hotTimeline(cfg *config, eps []rebuild, events []originEvent, window [2]int64) *timeline {
	hot := scSteady + ":0"
	mid := (window[0] + window[1]) / 2
	var best *rebuild
	for i := range eps {
		if eps[i].Key != hot {
			continue
		}
		if best == nil || absInt(eps[i].Start-mid) < absInt(best.Start-mid) {
			best = &eps[i]
		}
	}
	if best == nil {
		return nil
	}
	span := int64(cfg.lat.typical())
	tl := concurrencyTimeline(events, hot, best.Start, best.Start-span/2, best.Start+4*span)
	return &tl
}

func absInt(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// warmWave runs one cold wave on a key of its own, before the measured
// waves, and measures nothing of it. A fleet that has been serving for a
// while has paid its one-off costs long ago: the Redis pool's connections
// (which the setup opens for every strategy), a script's first run
// (NOSCRIPT, then the whole script), a pub/sub connection, what a library
// learned of its keys. The measured waves are then what a key that
// expires in a running fleet costs; -warm-wave=false measures the first
// wave of a fresh process too.
func (b *bench) warmWave(ctx context.Context, sc string) error {
	start := time.Now().Add(barrierLead)
	if err := b.fleet.broadcast(command{Op: "warm-wave", Key: sc + ":warm", Start: start.UnixNano()}); err != nil {
		return err
	}
	if _, err := b.fleet.await(ctx, b.cfg.CallTimeout+10*time.Second, nil); err != nil {
		return err
	}
	time.Sleep(20 * time.Millisecond) // as between waves
	return nil
}

// waves runs the cold waves: every caller of every process gets a fresh
// key at the same instant.
func (b *bench) waves(ctx context.Context, pr *phaseResult, per []*sampleSet) error {
	cfg := b.cfg
	pr.PerWave = make([]int, cfg.Waves)
	for w, key := range waveKeys(scCold, cfg.Waves) {
		b.prog.set(false, "[%d/%d] %s × %s: wave %d/%d, origin calls so far %d",
			b.step, b.steps, pr.Scenario, pr.Strategy, w+1, cfg.Waves, b.origin.calls())
		start := time.Now().Add(barrierLead)
		if err := b.fleet.broadcast(command{Op: "wave", Key: key, Start: start.UnixNano()}); err != nil {
			return err
		}
		rs, err := b.fleet.await(ctx, cfg.CallTimeout+10*time.Second, nil)
		if err != nil {
			return err
		}
		for i, r := range rs {
			per[i].merge(r.Samples)
		}
		time.Sleep(20 * time.Millisecond) // let stragglers (unsubscribes, releases) finish
	}
	return nil
}

// loadRun runs the steady or failure scenario's closed-loop load.
func (b *bench) loadRun(ctx context.Context, pr *phaseResult, per []*sampleSet) (window [2]int64, bounds []int64, err error) {
	cfg := b.cfg
	start := time.Now().Add(barrierLead)
	from := start.Add(cfg.Warmup)
	stop := from.Add(cfg.Duration)
	if pr.Scenario == scFailure {
		failFrom := from.Add(cfg.FailWindow)
		failTo := failFrom.Add(cfg.FailWindow)
		stop = failTo.Add(cfg.FailWindow)
		b.origin.setFailure(failFrom, failTo)
		bounds = []int64{from.UnixNano(), failFrom.UnixNano(), failTo.UnixNano(), stop.UnixNano()}
	} else {
		bounds = []int64{from.UnixNano(), stop.UnixNano()}
	}
	cmd := command{Op: "load", Start: start.UnixNano(), MeasureFrom: from.UnixNano(), Stop: stop.UnixNano(),
		Bounds: bounds, KeyBase: pr.Scenario, Keys: cfg.Keys, Zipf: cfg.Zipf, Seed: 42}
	if err := b.fleet.broadcast(cmd); err != nil {
		return window, nil, err
	}
	total := stop.Sub(start)
	tick := func() {
		el := min(time.Since(start), total)
		state := ""
		if pr.Scenario == scFailure {
			switch now := time.Now().UnixNano(); {
			case now >= bounds[1] && now < bounds[2]:
				state = " (origin failing)"
			case now < bounds[0]:
				state = " (warm-up)"
			}
		} else if time.Now().Before(from) {
			state = " (warm-up)"
		}
		b.prog.set(false, "[%d/%d] %s × %s: %.1f/%.1fs%s, origin calls so far %d",
			b.step, b.steps, pr.Scenario, pr.Strategy, el.Seconds(), total.Seconds(), state, b.origin.calls())
	}
	tick()
	rs, err := b.fleet.await(ctx, total+cfg.CallTimeout+10*time.Second, tick)
	if err != nil {
		return window, nil, err
	}
	for i, r := range rs {
		per[i].merge(r.Samples)
	}
	return [2]int64{from.UnixNano(), stop.UnixNano()}, bounds, nil
}

// stall runs one cold wave in which the process whose caller reaches the
// origin first is SIGSTOPped, before its origin call answers, for three
// times the lease, then SIGCONTed.
func (b *bench) stall(ctx context.Context, pr *phaseResult, per []*sampleSet) (*stallResult, error) {
	cfg := b.cfg
	pr.PerWave = make([]int, 1)
	key := waveKeys(scStall, 1)[0]
	stopFor := 3 * stallLease
	res := &stallResult{Worker: -1}
	var mu sync.Mutex
	resumed := make(chan struct{})
	b.origin.armStall(key, func(pid int) {
		if !b.fleet.has(pid) {
			close(resumed)
			return // not one of ours: never signal it
		}
		if err := stopProcess(pid); err != nil {
			close(resumed)
			return
		}
		t0 := time.Now()
		mu.Lock()
		res.Pid = pid
		for _, p := range b.fleet.procs {
			if p.pid == pid {
				res.Worker = p.idx
			}
		}
		mu.Unlock()
		time.AfterFunc(stopFor, func() {
			_ = contProcess(pid)
			mu.Lock()
			res.StoppedMs = ms(time.Since(t0))
			mu.Unlock()
			close(resumed)
		})
	})
	b.prog.set(false, "[%d/%d] %s × %s: leader stopped for %v once it calls the origin",
		b.step, b.steps, pr.Scenario, pr.Strategy, stopFor)
	start := time.Now().Add(barrierLead)
	if err := b.fleet.broadcast(command{Op: "wave", Key: key, Start: start.UnixNano()}); err != nil {
		return nil, err
	}
	rs, err := b.fleet.await(ctx, stopFor+cfg.CallTimeout+10*time.Second, nil)
	if err != nil {
		return nil, err
	}
	select {
	case <-resumed:
	case <-time.After(stopFor + 5*time.Second):
	}
	for i, r := range rs {
		per[i].merge(r.Samples)
	}
	mu.Lock()
	defer mu.Unlock()
	if res.Worker < 0 {
		return nil, errors.New("no worker called the origin: nothing was stalled")
	}
	return res, nil
}

// addStats adds every counter of b to a.
func addStats(a, b *herd.Stats) {
	va, vb := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	for i := range va.NumField() {
		if f := va.Field(i); f.Kind() == reflect.Uint64 {
			f.SetUint(f.Uint() + vb.Field(i).Uint())
		}
	}
}

// notes is the scenario-specific remark of a table row.
func notes(cfg *config, pr *phaseResult) string {
	var parts []string
	pctOf := func(n, of int) string {
		if of == 0 {
			return "0%"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
	}
	switch pr.Scenario {
	case scSteady:
		ok := pr.Requests - pr.Errors
		parts = append(parts, "hits "+pctOf(pr.Hit, ok))
		if pr.Stale > 0 {
			parts = append(parts, "stale "+pctOf(pr.Stale, ok))
		}
	case scFailure:
		if len(pr.Failure) == 3 {
			f := pr.Failure[1]
			parts = append(parts, fmt.Sprintf("while failing: %d origin calls (%.0f/s), %s of calls failed",
				f.OriginCalls, float64(f.OriginCalls)/cfg.FailWindow.Seconds(), pctOf(f.Errors, f.Calls)))
			if f.Stale > 0 {
				parts = append(parts, "stale "+pctOf(f.Stale, f.Calls))
			}
			a := pr.Failure[2]
			parts = append(parts, "after: "+pctOf(a.Errors, a.Calls)+" failed")
		}
	case scHot:
		if h := pr.Hot; h != nil {
			parts = append(parts, fmt.Sprintf("writes: p50 %.2fms, p99 %.2fms", h.WriteP50Ms, h.WriteP99Ms))
			if h.WriteErrors > 0 {
				parts = append(parts, fmt.Sprintf("%d writes failed", h.WriteErrors))
			}
			if miss := pr.Requests - pr.Errors - h.Hits; miss > 0 {
				parts = append(parts, fmt.Sprintf("%d misses, %d origin calls", miss, pr.OriginCalls))
			}
			if h.StaleReads > 0 {
				parts = append(parts, fmt.Sprintf("%d of %d writes missed by some read (longest %.2fms)", h.WritesMissed, h.Writes, h.WindowMaxMs))
			}
			if h.Unjudged > 0 {
				parts = append(parts, fmt.Sprintf("%d reads not judged (no watermark after them)", h.Unjudged))
			}
		}
	case scStall:
		if s := pr.Stall; s != nil {
			parts = append(parts, fmt.Sprintf("stopped pid %d for %.1fs; its %d calls apart (max %.0fms, %d errors)",
				s.Pid, s.StoppedMs/1000, s.ExcludedCalls, s.StalledMaxMs, s.StalledErrors))
		}
	}
	h := pr.Herd
	if pr.Hot != nil {
		h = pr.Hot.Herd // the window's (the table's from memory column is its NearHits share)
	}
	if h != nil && h.NearHits+h.NearMisses+h.NearBypassed > 0 {
		if pr.Hot == nil {
			parts = append(parts, fmt.Sprintf("near hits %.1f%%", 100*fromMemory(h)))
		}
		parts = append(parts, fmt.Sprintf("near cache: %d invalidations, %d flushes, %d lookups bypassed",
			h.NearInvalidations, h.NearFlushes, h.NearBypassed))
	}
	if h := pr.Herd; h != nil && (pr.Scenario == scStall || pr.Scenario == scFailure) {
		parts = append(parts, fmt.Sprintf("takeovers %d, fenced %d, wait timeouts %d", h.Takeovers, h.Fenced, h.WaitTimeouts))
	}
	if pr.RedisErrors > 0 {
		top, n := "", int64(0)
		for k, v := range pr.RedisErrorMsg {
			if v > n || (v == n && k < top) {
				top, n = k, v
			}
		}
		parts = append(parts, fmt.Sprintf("%d Redis errors (most: %q ×%d)", pr.RedisErrors, top, n))
	}
	if pr.HiccupMs > 50 {
		parts = append(parts, fmt.Sprintf("a process here was paused up to %.0fms (busy machine)", pr.HiccupMs))
	}
	if pr.BarrierLateMs > 5 {
		parts = append(parts, fmt.Sprintf("barrier up to %.0fms late", pr.BarrierLateMs))
	}
	if pr.StrayOrigin > 0 {
		parts = append(parts, fmt.Sprintf("%d stray origin calls", pr.StrayOrigin))
	}
	return strings.Join(parts, "; ")
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
