package herd

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// calibWindowLen returns how many of the latest n samples a window holds, as
// documented on calibWindow.
func calibWindowLen(n int) int {
	if n < calibGeneration {
		return n
	}
	return calibGeneration + n%calibGeneration
}

// nearestRankP99 returns the nearest-rank p99 of xs: the ceil(0.99·len)-th
// smallest value. It sorts a copy.
func nearestRankP99(xs []time.Duration) time.Duration {
	s := slices.Clone(xs)
	slices.Sort(s)
	k := (99*len(s) + 99) / 100 // ceil(0.99·n)
	return s[k-1]
}

// wantLease computes clamp(factor × p, min, max) independently of Lease.
func wantLease(cfg calibration, p time.Duration) time.Duration {
	l := time.Duration(float64(p) * cfg.Factor)
	return min(max(l, cfg.Min), cfg.Max)
}

func TestCalibBounds(t *testing.T) {
	if got, want := calibBounds[0], 100*time.Microsecond; got != want {
		t.Errorf("calibBounds[0] = %v, want %v", got, want)
	}
	if got, want := calibBounds[calibBuckets-1], 100*time.Microsecond<<21; got != want {
		t.Errorf("top bound = %v, want %v", got, want)
	}
	for i := 1; i < calibBuckets; i++ {
		r := float64(calibBounds[i]) / float64(calibBounds[i-1])
		if math.Abs(r/calibRatio-1) > 1e-5 {
			t.Errorf("calibBounds[%d]/calibBounds[%d] = %v, want %v", i, i-1, r, calibRatio)
		}
	}
	tests := []struct {
		d    time.Duration
		want int
	}{
		{1, 0},
		{100 * time.Microsecond, 0},
		{100*time.Microsecond + 1, 1},
		{calibBounds[17], 17},
		{calibBounds[17] + 1, 18},
		{calibBounds[calibBuckets-1], calibBuckets - 1},
		{calibBounds[calibBuckets-1] + 1, calibBuckets - 1},
		{math.MaxInt64, calibBuckets - 1},
	}
	for _, tt := range tests {
		if got := calibBucket(tt.d); got != tt.want {
			t.Errorf("calibBucket(%v) = %d, want %d", tt.d, got, tt.want)
		}
	}
}

func TestCalibratorDistributions(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	tests := []struct {
		name string
		n    int
		gen  func(r *rand.Rand) time.Duration
	}{
		{"constant", 3000, func(*rand.Rand) time.Duration { return 50 * time.Millisecond }},
		{"uniform", 3000, func(r *rand.Rand) time.Duration { return ms(10 + 190*r.Float64()) }},
		{"lognormal", 3000, func(r *rand.Rand) time.Duration { return ms(30 * math.Exp(0.8*r.NormFloat64())) }},
		{"bimodal", 5000, func(r *rand.Rand) time.Duration {
			if r.Float64() < 0.02 {
				return 800 * time.Millisecond
			}
			return 20 * time.Millisecond
		}},
		{"exponential", 3000, func(r *rand.Rand) time.Duration { return ms(40 * r.ExpFloat64()) }},
		{"short", 100, func(r *rand.Rand) time.Duration { return ms(5 + 5*r.Float64()) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := calibration{Factor: 1.5, Min: 10 * time.Millisecond, Max: time.Second, Default: 500 * time.Millisecond}
			c := newCalibrator(cfg)
			r := rand.New(rand.NewPCG(1, 2))
			fed := make([]time.Duration, 0, tt.n)
			overruns := 0
			for i := 1; i <= tt.n; i++ {
				d := tt.gen(r)
				if p, ok := c.P99("k"); ok && d > p {
					overruns++
				}
				fed = append(fed, d)
				c.Observe("k", d)

				got, ok := c.P99("k")
				if i < calibMinSamples {
					if ok {
						t.Fatalf("after %d samples: P99 = %v, true; want no estimate", i, got)
					}
					if l := c.Lease("k"); l != cfg.Default {
						t.Fatalf("after %d samples: Lease = %v, want Default %v", i, l, cfg.Default)
					}
					continue
				}
				if !ok {
					t.Fatalf("after %d samples: P99 reported no estimate", i)
				}
				window := fed[i-calibWindowLen(i):]
				truth := nearestRankP99(window)
				upper := max(time.Duration(float64(truth)*calibRatio*(1+1e-9)), calibBounds[0])
				if got < truth || got > upper {
					t.Fatalf("after %d samples: P99 = %v, want within [%v, %v] (true p99 of last %d samples, ×%.3f)",
						i, got, truth, upper, len(window), calibRatio)
				}
				l := c.Lease("k")
				if l < min(cfg.Max, truth) || l < cfg.Min || l > cfg.Max {
					t.Fatalf("after %d samples: Lease = %v, want >= min(Max, %v) and within [%v, %v]",
						i, l, truth, cfg.Min, cfg.Max)
				}
				if want := wantLease(cfg, got); l != want {
					t.Fatalf("after %d samples: Lease = %v, want clamp(%.1f × %v) = %v", i, l, cfg.Factor, got, want)
				}
			}
			got, _ := c.P99("k")
			t.Logf("n=%d: P99 %v, true p99 of all samples %v, samples above the estimate in effect: %d (%.2f%%)",
				tt.n, got, nearestRankP99(fed), overruns, 100*float64(overruns)/float64(tt.n))
		})
	}
}

func TestCalibratorLeaseBounds(t *testing.T) {
	cfg := calibration{} // defaults: Factor 2, Min 250ms, Max 30s, Default 5s
	tests := []struct {
		name    string
		feed    []time.Duration
		wantP99 time.Duration // 0: no estimate
		want    time.Duration
	}{
		{"no data", nil, 0, 5 * time.Second},
		{"too few samples", slices.Repeat([]time.Duration{time.Second}, calibMinSamples-1), 0, 5 * time.Second},
		{"non-positive ignored", []time.Duration{0, -1, -time.Hour, 0, 0, 0}, 0, 5 * time.Second},
		{"tiny clamps to Min", slices.Repeat([]time.Duration{time.Microsecond}, 10), calibBounds[0], 250 * time.Millisecond},
		{"huge clamps to Max", slices.Repeat([]time.Duration{time.Hour}, 10), calibBounds[calibBuckets-1], 30 * time.Second},
		{"max duration", slices.Repeat([]time.Duration{math.MaxInt64}, 10), calibBounds[calibBuckets-1], 30 * time.Second},
		{"within range", slices.Repeat([]time.Duration{time.Second}, 10), calibBounds[calibBucket(time.Second)],
			2 * calibBounds[calibBucket(time.Second)]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCalibrator(cfg)
			for _, d := range tt.feed {
				c.Observe("k", d)
			}
			p, ok := c.P99("k")
			if ok != (tt.wantP99 != 0) || p != tt.wantP99 {
				t.Errorf("P99 = %v, %v; want %v, %v", p, ok, tt.wantP99, tt.wantP99 != 0)
			}
			if got := c.Lease("k"); got != tt.want {
				t.Errorf("Lease = %v, want %v", got, tt.want)
			}
			if got := c.Lease("unknown"); got != tt.want {
				t.Errorf("Lease(unknown) = %v, want %v (global fallback)", got, tt.want)
			}
		})
	}
}

func TestCalibratorGlobalFallback(t *testing.T) {
	c := newCalibrator(calibration{})
	for range 50 {
		c.Observe("fast", 40*time.Millisecond)
		c.Observe("slow", 2*time.Second)
	}
	c.Observe("new", 10*time.Millisecond)
	c.Observe("new", 10*time.Millisecond)

	global := time.Duration(c.global.est.Load())
	tests := []struct {
		class string
		want  time.Duration
	}{
		{"fast", calibBounds[calibBucket(40*time.Millisecond)]},
		{"slow", calibBounds[calibBucket(2*time.Second)]},
		{"new", global},     // 2 samples: too few of its own
		{"unknown", global}, // never observed
	}
	if want := calibBounds[calibBucket(2*time.Second)]; global != want {
		t.Fatalf("global estimate = %v, want %v", global, want)
	}
	for _, tt := range tests {
		got, ok := c.P99(tt.class)
		if !ok || got != tt.want {
			t.Errorf("P99(%q) = %v, %v; want %v, true", tt.class, got, ok, tt.want)
		}
		if got, want := c.Lease(tt.class), wantLease(c.cfg, tt.want); got != want {
			t.Errorf("Lease(%q) = %v, want %v", tt.class, got, want)
		}
	}

	// With calibMinSamples samples the class uses its own estimate.
	for range calibMinSamples - 2 {
		c.Observe("new", 10*time.Millisecond)
	}
	if got, want := c.Lease("new"), 250*time.Millisecond; got != want {
		t.Errorf("Lease(new) after %d samples = %v, want %v (own estimate, clamped to Min)", calibMinSamples, got, want)
	}
}

// TestCalibratorShiftSlower checks the documented rise: after a shift to
// slower rebuilds the lease covers the new level within 3 slow samples, for
// every phase of the generation window.
func TestCalibratorShiftSlower(t *testing.T) {
	const fast, slow, maxSlow = 20 * time.Millisecond, 800 * time.Millisecond, 3
	cfg := calibration{Factor: 2, Min: 100 * time.Millisecond, Max: 30 * time.Second, Default: time.Second}
	worst := 0
	for before := 1000; before < 1000+calibGeneration; before++ {
		c := newCalibrator(cfg)
		for range before {
			c.Observe("k", fast)
		}
		if p, _ := c.P99("k"); p >= slow {
			t.Fatalf("before=%d: P99 = %v before the shift, want < %v", before, p, slow)
		}
		k := 0
		for k < 1000 && c.Lease("k") < min(cfg.Max, time.Duration(cfg.Factor*float64(slow))) {
			c.Observe("k", slow)
			k++
		}
		if p, _ := c.P99("k"); p < slow {
			t.Fatalf("before=%d: P99 = %v after %d slow samples, want >= %v", before, p, k, slow)
		}
		if k > maxSlow {
			t.Errorf("before=%d: lease reflected %v after %d slow samples, want <= %d", before, slow, k, maxSlow)
		}
		worst = max(worst, k)
	}
	t.Logf("worst case: %d slow samples", worst)
}

// TestCalibratorShiftFaster checks the documented fall: after a shift to
// faster rebuilds the estimate drops within 253 samples (and so within the
// 255 it takes to replace the window), for every phase of the generation
// window.
func TestCalibratorShiftFaster(t *testing.T) {
	const fast, slow, maxFast = 20 * time.Millisecond, 800 * time.Millisecond, 253
	worst := 0
	for before := 1000; before < 1000+calibGeneration; before++ {
		c := newCalibrator(calibration{})
		for range before {
			c.Observe("k", slow)
		}
		k := 0
		for p, _ := c.P99("k"); p >= 100*time.Millisecond && k < 1000; p, _ = c.P99("k") {
			c.Observe("k", fast)
			k++
		}
		if k > maxFast {
			t.Errorf("before=%d: P99 dropped below 100ms after %d fast samples, want <= %d", before, k, maxFast)
		}
		worst = max(worst, k)
		if got, want := c.Lease("k"), 250*time.Millisecond; got != want {
			t.Errorf("before=%d: Lease after the drop = %v, want %v", before, got, want)
		}
	}
	t.Logf("worst case: %d fast samples", worst)
}

func TestCalibratorMemoryBound(t *testing.T) {
	const maxClasses = 1000
	keys := 1_000_000
	if testing.Short() {
		keys = 100_000
	}
	c := newCalibrator(calibration{MaxClasses: maxClasses})
	for range 10 {
		c.Observe("stale", 20*time.Second)
	}
	var buf []byte
	for i := range keys {
		buf = strconv.AppendInt(append(buf[:0], "key-"...), int64(i), 10)
		c.Observe(string(buf), 10*time.Millisecond)
		// "hot" is observed often, so approximate least-recently-observed
		// eviction keeps it.
		if i%2 == 0 {
			c.Observe("hot", time.Second)
		}
		if i%100_000 == 0 {
			if n := c.len(); n > maxClasses {
				t.Fatalf("after %d keys: %d classes tracked, want <= %d", i, n, maxClasses)
			}
		}
	}
	if n := c.len(); n > maxClasses {
		t.Fatalf("%d classes tracked, want <= %d", n, maxClasses)
	}
	global, ok := c.P99("never-seen")
	if !ok || global != time.Duration(c.global.est.Load()) {
		t.Fatalf("P99(never-seen) = %v, %v; want global estimate %v", global, ok, time.Duration(c.global.est.Load()))
	}
	c.mu.RLock()
	_, staleTracked := c.classes["stale"]
	_, hotTracked := c.classes["hot"]
	c.mu.RUnlock()
	if staleTracked {
		t.Errorf("class %q still tracked after %d newer classes, want evicted", "stale", keys)
	}
	if !hotTracked {
		t.Errorf("class %q evicted although observed every other step, want tracked", "hot")
	}
	if got, ok := c.P99("stale"); !ok || got != global {
		t.Errorf("P99(stale) = %v, %v; want global %v, true", got, ok, global)
	}
	if got, want := c.Lease("stale"), c.Lease("never-seen"); got != want {
		t.Errorf("Lease(stale) = %v, want global lease %v", got, want)
	}
	if got, want := c.Lease("hot"), wantLease(c.cfg, calibBounds[calibBucket(time.Second)]); got != want {
		t.Errorf("Lease(hot) = %v, want %v", got, want)
	}
}

func TestCalibratorConcurrent(t *testing.T) {
	c := newCalibrator(calibration{MaxClasses: 16})
	cfg := c.cfg
	const workers, iters = 8, 5000
	var wg sync.WaitGroup
	errs := make(chan string, workers)
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 99))
			own := "worker-" + strconv.Itoa(w)
			for i := range iters {
				d := time.Duration(r.Int64N(int64(2 * time.Second)))
				switch i % 4 {
				case 0:
					c.Observe("shared", d)
				case 1:
					c.Observe(own, d)
				case 2:
					// Churn through more classes than fit, to race eviction.
					c.Observe("churn-"+strconv.Itoa(r.IntN(64)), d)
				}
				for _, class := range []string{"shared", own, "churn-1"} {
					if l := c.Lease(class); l < cfg.Min || l > cfg.Max {
						select {
						case errs <- class + ": Lease = " + l.String():
						default:
						}
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("%s, want within [%v, %v]", e, cfg.Min, cfg.Max)
	}
	if n := c.len(); n > 16 {
		t.Errorf("%d classes tracked, want <= 16", n)
	}
}

func TestCalibratorNoAllocs(t *testing.T) {
	c := newCalibrator(calibration{})
	c.Observe("k", time.Second)
	tests := []struct {
		name string
		f    func()
	}{
		{"Observe", func() { c.Observe("k", 30*time.Millisecond) }},
		{"Lease", func() { _ = c.Lease("k") }},
		{"Lease unknown", func() { _ = c.Lease("unknown") }},
		{"P99", func() { _, _ = c.P99("k") }},
	}
	for _, tt := range tests {
		if got := testing.AllocsPerRun(1000, tt.f); got != 0 {
			t.Errorf("%s: %v allocations per call, want 0", tt.name, got)
		}
	}
}

func TestNewCalibratorDefaults(t *testing.T) {
	c := newCalibrator(calibration{})
	want := calibration{Factor: 2, Min: 250 * time.Millisecond, Max: 30 * time.Second, Default: 5 * time.Second, MaxClasses: 10000}
	if c.cfg != want {
		t.Errorf("defaults = %+v, want %+v", c.cfg, want)
	}
	custom := calibration{Factor: 1, Min: time.Second, Max: time.Second, Default: time.Second, MaxClasses: 1}
	if c := newCalibrator(custom); c.cfg != custom {
		t.Errorf("config = %+v, want %+v unchanged", c.cfg, custom)
	}
}

func TestNewCalibratorPanics(t *testing.T) {
	tests := []struct {
		name string
		cfg  calibration
		want string // substring of the panic message after "herd: "
	}{
		{"factor below 1", calibration{Factor: 0.5}, "Factor"},
		{"factor negative", calibration{Factor: -2}, "Factor"},
		{"factor NaN", calibration{Factor: math.NaN()}, "Factor"},
		{"factor Inf", calibration{Factor: math.Inf(1)}, "Factor"},
		{"min negative", calibration{Min: -time.Second}, "Min"},
		{"max below min", calibration{Min: time.Second, Max: 500 * time.Millisecond, Default: time.Second}, "Max"},
		{"min above default max", calibration{Min: time.Minute}, "Max"},
		{"max negative", calibration{Max: -1}, "Max"},
		{"default above max", calibration{Default: time.Hour}, "Default"},
		{"default below min", calibration{Default: time.Millisecond}, "Default"},
		{"min above default default", calibration{Min: 10 * time.Second}, "Default"},
		{"default negative", calibration{Default: -time.Second}, "Default"},
		{"max classes negative", calibration{MaxClasses: -1}, "MaxClasses"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				r := recover()
				msg, ok := r.(string)
				if !ok {
					t.Fatalf("recovered %#v, want a string panic", r)
				}
				if !strings.HasPrefix(msg, "herd: ") || !strings.Contains(msg, tt.want) {
					t.Errorf("panic %q, want prefix %q and mention of %q", msg, "herd: ", tt.want)
				}
			}()
			newCalibrator(tt.cfg)
		})
	}
}

func BenchmarkCalibratorObserve(b *testing.B) {
	c := newCalibrator(calibration{})
	durs := make([]time.Duration, 1024)
	r := rand.New(rand.NewPCG(7, 7))
	for i := range durs {
		durs[i] = time.Duration(r.Int64N(int64(time.Second)))
	}
	c.Observe("k", time.Second)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.Observe("k", durs[i&1023])
		i++
	}
}

func BenchmarkCalibratorLease(b *testing.B) {
	c := newCalibrator(calibration{})
	for i := range 200 {
		c.Observe("k", time.Duration(i)*time.Millisecond)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = c.Lease("k")
	}
}

func BenchmarkCalibratorLeaseParallel(b *testing.B) {
	c := newCalibrator(calibration{})
	for i := range 200 {
		c.Observe("k", time.Duration(i)*time.Millisecond)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = c.Lease("k")
		}
	})
}
