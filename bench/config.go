package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Scenario names, in the order they run.
const (
	scCold    = "cold"
	scSteady  = "steady"
	scFailure = "failure"
	scStall   = "stall"
	scHot     = "hotkey"
)

var allScenarios = []string{scCold, scSteady, scFailure, scStall, scHot}

// Strategy names, in the order they run within a scenario.
const (
	stNone        = "none"
	stSingle      = "singleflight"
	stGoCache     = "gocache-once"
	stRedisLock   = "redislock"
	stHerdPoll    = "herd-poll"
	stHerdNotify  = "herd-notify"
	stHerdSWR     = "herd-swr"
	stHerdNear    = "herd-near"
	lockPoll      = 10 * time.Millisecond // redislock strategy's polling interval
	herdPollEvery = 10 * time.Millisecond // herd-poll's PollMin and PollMax
)

var allStrategies = []string{stNone, stSingle, stGoCache, stRedisLock, stHerdPoll, stHerdNotify, stHerdSWR, stHerdNear}

// nearEntries is herd-near's Options.Near.MaxEntries: room for every key
// of the steady scenario's default key set and more.
const nearEntries = 10_000

// isHerd reports whether a strategy is one of herd's.
func isHerd(st string) bool { return strings.HasPrefix(st, "herd-") }

// stallLease is the lease the leader-stall scenario stalls past: herd's
// default lease for a key with no rebuild history (Options.DefaultLease)
// and the redislock strategy's lock TTL. The leader is stopped for three
// times that.
const stallLease = time.Second

// config is the parsed command line.
type config struct {
	Procs, Callers, Waves int
	WarmWave              bool          // cold: one unmeasured wave first
	Duration              time.Duration // steady
	HotDuration           time.Duration // hotkey: -duration when given, else defaultHotDuration
	WriteRate             float64       // hotkey: writes per second (0: none)
	WriteRateFlag         string
	OriginLatency         string
	lat                   latencyDist
	Scenarios, Strategies []string
	Quick                 bool
	JSONPath, SVGPath     string
	MDPath                string
	Wide                  bool // one table line per row, every column side by side
	RedisAddr             string
	ClusterAddrs          []string
	StartCluster          bool // -cluster start: a 3-master cluster started for the run
	Embedded              bool // miniredis even when redis-server is on $PATH

	Keys       int           // steady/failure key-space size
	Zipf       float64       // Zipf exponent s (> 1)
	TTL        time.Duration // value TTL in steady/failure (and cold waves)
	StaleFor   time.Duration // herd-swr's Options.StaleFor
	Think      time.Duration // pause between a steady caller's requests
	ValueSize  int           // bytes per value
	FailWindow time.Duration // failure scenario: before, failing and after segments each last this long
	Warmup     time.Duration // load scenarios: not measured at the start

	HTTP       bool // the HTTP benchmark instead of the scenarios (http.go)
	HTTPRounds int  // the HTTP benchmark's rounds of every case

	CallTimeout time.Duration // per-request context
	Command     string        // the command line, for the reports
}

// parseFlags parses args (without the program name).
func parseFlags(args []string, errOut io.Writer) (*config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(errOut)
	c := &config{}
	var scen, strat, cluster string
	fs.IntVar(&c.Procs, "p", 4, "instance `processes` (each one a separate OS process)")
	fs.IntVar(&c.Callers, "c", 64, "concurrent `callers` per process")
	fs.IntVar(&c.Waves, "waves", 10, "cold waves (one fresh key per wave; also the stall scenario runs one wave)")
	fs.BoolVar(&c.WarmWave, "warm-wave", true, "cold scenario: run one unmeasured wave first, so that the measured ones see a warm process (scripts loaded, pub/sub connected), as in a running fleet")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "measured length of the steady scenario, and of the hotkey scenario when given (else "+defaultHotDuration.String()+")")
	fs.StringVar(&c.WriteRateFlag, "write-rate", "10/s", "hotkey scenario: how often the writer writes a new version of the key (`N/s`; 0 for never)")
	fs.StringVar(&c.OriginLatency, "origin-latency", "50ms", "origin latency: a duration, uniform:MIN-MAX or exp:MEAN")
	fs.StringVar(&scen, "scenarios", strings.Join(allScenarios, ","), "comma list of scenarios: "+strings.Join(allScenarios, ","))
	fs.StringVar(&strat, "strategies", strings.Join(allStrategies, ","), "comma list of strategies: "+strings.Join(allStrategies, ","))
	fs.BoolVar(&c.Quick, "quick", false, "a smoke run of a few seconds (defaults: -p 2 -c 16 -waves 3 -duration 1s -scenarios cold,steady)")
	fs.StringVar(&c.JSONPath, "json", "", "write the results as JSON to `file`")
	fs.StringVar(&c.SVGPath, "svg", "", "write a chart to `file` (SVG)")
	fs.StringVar(&c.MDPath, "md", "", "write the table and the command as Markdown to `file`")
	fs.BoolVar(&c.Wide, "wide", false, "print each result on one line, every column side by side (over 200 columns), instead of one table per measure that fits 100 columns")
	fs.StringVar(&c.RedisAddr, "redis", "", "use the Redis server at `addr` (by default the bench starts a redis-server from $PATH on a free loopback port, or falls back to the embedded miniredis)")
	fs.StringVar(&cluster, "cluster", "", "use the Redis Cluster at `addr,addr,...`, or \"start\": start a 3-master cluster of redis-servers from $PATH for the run")
	fs.BoolVar(&c.Embedded, "embedded", false, "use the embedded miniredis even when redis-server is on $PATH (Lua scripts run one at a time there: latencies are not representative)")
	fs.IntVar(&c.Keys, "keys", 1000, "keys in the steady and failure scenarios (Zipf-distributed)")
	fs.Float64Var(&c.Zipf, "zipf", 1.1, "Zipf exponent s (> 1) of the key popularity")
	fs.DurationVar(&c.TTL, "ttl", time.Second, "value TTL (at least 1s: go-redis/cache turns a shorter one into an hour)")
	fs.DurationVar(&c.StaleFor, "stale-for", 10*time.Second, "herd-swr's StaleFor")
	fs.DurationVar(&c.Think, "think", 10*time.Millisecond, "pause between one steady caller's requests")
	fs.IntVar(&c.ValueSize, "value-size", 512, "value size in bytes")
	fs.DurationVar(&c.FailWindow, "fail-window", 2*time.Second, "failure scenario: the origin fails for this long, between two healthy segments as long")
	fs.BoolVar(&c.HTTP, "http", false, "run the HTTP benchmark instead of the scenarios: one hot URL behind a plain handler, a handler doing one Redis GET, herd's middleware, and herd's middleware with the near cache, with -c clients for -duration per case (default 3s here)")
	fs.IntVar(&c.HTTPRounds, "http-rounds", 3, "the HTTP benchmark's rounds: each case runs once per round, interleaved; a case's rate is the median of its rounds")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.Warmup = c.TTL
	c.HotDuration = defaultHotDuration
	if set["duration"] {
		c.HotDuration = c.Duration
	}
	if c.Quick {
		def := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		def("p", func() { c.Procs = 2 })
		def("c", func() { c.Callers = 16 })
		def("waves", func() { c.Waves = 3 })
		def("duration", func() { c.Duration, c.HotDuration = time.Second, time.Second })
		def("scenarios", func() { scen = scCold + "," + scSteady })
		def("keys", func() { c.Keys = 200 })
		def("fail-window", func() { c.FailWindow = 500 * time.Millisecond })
		c.Warmup = 300 * time.Millisecond
	}
	c.CallTimeout = 15 * time.Second
	if c.HTTP && !set["duration"] {
		c.Duration = 3 * time.Second
	}
	if c.HTTPRounds < 1 {
		return nil, fmt.Errorf("-http-rounds %d: want at least 1", c.HTTPRounds)
	}

	var err error
	if c.lat, err = parseLatency(c.OriginLatency); err != nil {
		return nil, err
	}
	if c.WriteRate, err = parseRate(c.WriteRateFlag); err != nil {
		return nil, err
	}
	if c.Scenarios, err = parseList(scen, allScenarios, "scenario"); err != nil {
		return nil, err
	}
	if c.Strategies, err = parseList(strat, allStrategies, "strategy"); err != nil {
		return nil, err
	}
	if cluster == "start" {
		c.StartCluster = true
	} else if cluster != "" {
		for _, a := range strings.Split(cluster, ",") {
			if a = strings.TrimSpace(a); a != "" {
				c.ClusterAddrs = append(c.ClusterAddrs, a)
			}
		}
	}
	switch {
	case c.StartCluster && !canStartServer:
		return nil, errors.New("-cluster start: the bench starts redis-servers only on Unix systems")
	case c.RedisAddr != "" && (len(c.ClusterAddrs) > 0 || c.StartCluster):
		return nil, errors.New("-redis and -cluster are exclusive")
	case c.Embedded && (c.RedisAddr != "" || len(c.ClusterAddrs) > 0 || c.StartCluster):
		return nil, errors.New("-embedded excludes -redis and -cluster")
	case c.Procs < 1 || c.Procs > 64:
		return nil, fmt.Errorf("-p %d: want 1..64", c.Procs)
	case c.Callers < 1 || c.Callers > 4096:
		return nil, fmt.Errorf("-c %d: want 1..4096", c.Callers)
	case c.Waves < 1:
		return nil, fmt.Errorf("-waves %d: want at least 1", c.Waves)
	case c.Duration < 100*time.Millisecond:
		return nil, fmt.Errorf("-duration %v: want at least 100ms", c.Duration)
	case c.Keys < 1:
		return nil, fmt.Errorf("-keys %d: want at least 1", c.Keys)
	case !(c.Zipf > 1) || math.IsInf(c.Zipf, 0):
		return nil, fmt.Errorf("-zipf %v: want s > 1", c.Zipf)
	case c.TTL < time.Second:
		return nil, fmt.Errorf("-ttl %v: want at least 1s (go-redis/cache replaces a TTL under 1s by one hour)", c.TTL)
	case c.StaleFor <= 0:
		return nil, fmt.Errorf("-stale-for %v: want > 0", c.StaleFor)
	case c.Think < 0:
		return nil, fmt.Errorf("-think %v: want >= 0", c.Think)
	case c.ValueSize < 64 || c.ValueSize > 1<<20:
		return nil, fmt.Errorf("-value-size %d: want 64..1MiB", c.ValueSize)
	case c.FailWindow < 100*time.Millisecond:
		return nil, fmt.Errorf("-fail-window %v: want at least 100ms", c.FailWindow)
	}
	return c, nil
}

// defaultHotDuration is the hotkey scenario's measured length without
// -duration: shorter than steady's, so that the default run (every
// strategy) stays within a few minutes.
const defaultHotDuration = 3 * time.Second

// maxWriteRate bounds -write-rate: the writer is one loop of
// acknowledged writes, each announced to every worker.
const maxWriteRate = 1000

// parseRate parses a rate "N/s" (or a bare N) in events per second.
func parseRate(s string) (float64, error) {
	num, _ := strings.CutSuffix(strings.TrimSpace(s), "/s")
	r, err := strconv.ParseFloat(num, 64)
	if err != nil || r < 0 || r > maxWriteRate || math.IsNaN(r) {
		return 0, fmt.Errorf("-write-rate %q: want N/s with 0 <= N <= %d (10/s, 0.5/s, 0)", s, maxWriteRate)
	}
	return r, nil
}

func parseList(s string, known []string, what string) ([]string, error) {
	var out []string
	for _, x := range strings.Split(s, ",") {
		x = strings.TrimSpace(x)
		if x == "" {
			continue
		}
		if x == "all" {
			return slices.Clone(known), nil
		}
		if !slices.Contains(known, x) {
			return nil, fmt.Errorf("unknown %s %q (known: %s)", what, x, strings.Join(known, ","))
		}
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s selected", what)
	}
	// Keep the canonical order, whatever order they were given in.
	slices.SortFunc(out, func(a, b string) int { return slices.Index(known, a) - slices.Index(known, b) })
	return out, nil
}

// latencyDist is the origin's latency distribution.
type latencyDist struct {
	Kind string        `json:"kind"` // "fixed", "uniform" or "exp"
	A, B time.Duration `json:"-"`    // fixed: A; uniform: [A, B]; exp: mean A
}

func parseLatency(s string) (latencyDist, error) {
	bad := fmt.Errorf("-origin-latency %q: want a duration (50ms), uniform:20ms-80ms or exp:50ms", s)
	kind, rest, found := strings.Cut(s, ":")
	if !found {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return latencyDist{}, bad
		}
		return latencyDist{Kind: "fixed", A: d}, nil
	}
	switch kind {
	case "uniform":
		lo, hi, ok := strings.Cut(rest, "-")
		if !ok {
			return latencyDist{}, bad
		}
		a, err1 := time.ParseDuration(lo)
		b, err2 := time.ParseDuration(hi)
		if err1 != nil || err2 != nil || a < 0 || b < a {
			return latencyDist{}, bad
		}
		return latencyDist{Kind: "uniform", A: a, B: b}, nil
	case "exp":
		a, err := time.ParseDuration(rest)
		if err != nil || a <= 0 {
			return latencyDist{}, bad
		}
		return latencyDist{Kind: "exp", A: a}, nil
	}
	return latencyDist{}, bad
}

// sample draws one latency.
func (d latencyDist) sample() time.Duration {
	switch d.Kind {
	case "uniform":
		return d.A + rand.N(d.B-d.A+1)
	case "exp":
		return min(time.Duration(rand.ExpFloat64()*float64(d.A)), 20*d.A)
	}
	return d.A
}

// mean is the distribution's mean.
func (d latencyDist) mean() time.Duration {
	if d.Kind == "uniform" {
		return (d.A + d.B) / 2
	}
	return d.A
}

// typical is a latency that bounds most draws, for chart windows.
func (d latencyDist) typical() time.Duration {
	switch d.Kind {
	case "uniform":
		return d.B
	case "exp":
		return 3 * d.A
	}
	return d.A
}

func (d latencyDist) String() string {
	switch d.Kind {
	case "uniform":
		return fmt.Sprintf("uniform:%v-%v", d.A, d.B)
	case "exp":
		return fmt.Sprintf("exp:%v", d.A)
	}
	return d.A.String()
}
