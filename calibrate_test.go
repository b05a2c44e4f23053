package herd

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
	"weak"

	"github.com/alicebob/miniredis/v2"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

// newTestCalibrator returns a calibrator on a fake clock (refresh_test.go).
func newTestCalibrator(cfg calibration) (*calibrator, *fakeClock) {
	c := newCalibrator(cfg)
	clk := newFakeClock()
	c.now, c.base = clk.Now, clk.Now()
	return c, clk
}

// wantLease computes clamp(factor × p, min, max) independently of Lease.
func wantLease(cfg calibration, p time.Duration) time.Duration {
	l := time.Duration(float64(p) * cfg.Factor)
	return min(max(l, cfg.Min), cfg.Max)
}

// bucketWeights returns the weights of class's buckets now (nil if the
// class is not tracked).
func bucketWeights(c *calibrator, class string) []float64 {
	c.mu.RLock()
	w := c.classes[maphash.String(c.seed, class)]
	c.mu.RUnlock()
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	f := timeDecay(c.clock() - w.at)
	out := make([]float64, calibBuckets)
	for i, v := range w.w {
		out[i] = float64(v) * f
	}
	return out
}

// tracked reports whether class has a window.
func tracked(c *calibrator, class string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.classes[maphash.String(c.seed, class)]
	return ok
}

func TestCalibBounds(t *testing.T) {
	t.Parallel()
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

// TestCalibForgetConstants checks the documented bounds against the model
// they are derived from.
func TestCalibForgetConstants(t *testing.T) {
	t.Parallel()
	w := 1 / (1 - math.Exp2(-1.0/calibHalfLifeLoads))
	if math.Abs(calibMaxWeight-w) > 1e-9 {
		t.Errorf("calibMaxWeight = %v, want %v", calibMaxWeight, w)
	}
	halvings := math.Log2(calibMaxWeight / calibTrimWeight)
	if got, want := calibForgetLoads, int(math.Ceil(calibHalfLifeLoads*halvings)); got != want {
		t.Errorf("calibForgetLoads = %d, want ceil(%d × log2(%.3f/%d)) = %d", got, calibHalfLifeLoads, calibMaxWeight, calibTrimWeight, want)
	}
	if got, want := calibForgetTime, time.Duration(math.Ceil(calibHalfLife.Seconds()*halvings))*time.Second; got != want {
		t.Errorf("calibForgetTime = %v, want %v", got, want)
	}
}

// refSample is a sample of the reference model: its duration, its index
// among the class's samples, and when it was observed.
type refSample struct {
	d  time.Duration
	n  int
	at time.Duration
}

// refModel holds the weights of the reference model at one moment,
// slowest sample first.
type refModel struct {
	d     []time.Duration
	w     []float64
	total float64
}

// newRefModel computes the documented model's weights with float64 and no
// histogram: 2^(-later samples/32) × 2^(-elapsed/2min).
func newRefModel(samples []refSample, n int, now time.Duration) refModel {
	s := slices.Clone(samples)
	slices.SortFunc(s, func(a, b refSample) int { return -int(a.d - b.d) })
	m := refModel{d: make([]time.Duration, len(s)), w: make([]float64, len(s))}
	for i, x := range s {
		m.d[i] = x.d
		m.w[i] = math.Exp2(-float64(n-1-x.n)/calibHalfLifeLoads) * math.Exp2(-float64(now-x.at)/float64(calibHalfLife))
		m.total += m.w[i]
	}
	return m
}

// tail returns the duration of the sample at which the weight counted from
// the slowest exceeds trim; ok is false when the total weight is below
// minWeight.
func (m refModel) tail(trim, minWeight float64) (time.Duration, bool) {
	if m.total < minWeight {
		return 0, false
	}
	var cum float64
	for i, w := range m.w {
		if cum += w; cum > trim {
			return m.d[i], true
		}
	}
	return m.d[len(m.d)-1], true
}

// TestCalibratorTailMatchesModel feeds distributions with random gaps in
// time and checks every estimate against the documented model, computed
// independently: the bucket of the sample at which the weight counted from
// the slowest exceeds 2, or none below weight 5.
func TestCalibratorTailMatchesModel(t *testing.T) {
	t.Parallel()
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	tests := []struct {
		name string
		gen  func(r *rand.Rand) time.Duration
	}{
		{"constant", func(*rand.Rand) time.Duration { return 50 * time.Millisecond }},
		{"uniform", func(r *rand.Rand) time.Duration { return ms(10 + 190*r.Float64()) }},
		{"lognormal", func(r *rand.Rand) time.Duration { return ms(30 * math.Exp(0.8*r.NormFloat64())) }},
		{"bimodal", func(r *rand.Rand) time.Duration {
			if r.Float64() < 0.05 {
				return 800 * time.Millisecond
			}
			return 20 * time.Millisecond
		}},
		{"exponential", func(r *rand.Rand) time.Duration { return ms(40 * r.ExpFloat64()) }},
	}
	const n, keep, eps = 2000, 700, 1e-4
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := calibration{Factor: 1.5, Min: 10 * time.Millisecond, Max: time.Second, Default: 500 * time.Millisecond}
			c, clk := newTestCalibrator(cfg)
			r := rand.New(rand.NewPCG(1, 2))
			var (
				fed    []refSample
				prev   time.Duration
				prevOK bool
			)
			defaults := 0
			for i := range n {
				switch x := r.Float64(); {
				case x < 0.01:
					clk.Advance(3 * calibHalfLife) // a long pause: back to Default
				case x < 0.5:
					clk.Advance(time.Duration(r.Int64N(int64(5 * time.Second))))
				}
				now := clk.Now().Sub(c.base)
				d := tt.gen(r)
				fed = append(fed, refSample{d, i, now})
				if len(fed) > keep { // older samples weigh less than 2^-21
					fed = fed[1:]
				}
				c.Observe("k", d)

				got, ok := c.Tail("k")
				if i%4 != 0 && got == prev && ok == prevOK {
					continue // check every 4th sample and every change
				}
				prev, prevOK = got, ok
				m := newRefModel(fed, i+1, now)
				lo, okLo := m.tail(calibTrimWeight*(1-eps), calibMinWeight*(1+eps))
				hi, okHi := m.tail(calibTrimWeight*(1+eps), calibMinWeight*(1-eps))
				switch {
				case !ok && okHi && okLo:
					t.Fatalf("sample %d: Tail = none, want about %v", i, lo)
				case ok && !okHi:
					t.Fatalf("sample %d: Tail = %v, want none (weight below %d)", i, got, calibMinWeight)
				case !ok:
					defaults++
					if l := c.Lease("k"); l != cfg.Default {
						t.Fatalf("sample %d: Lease = %v without an estimate, want Default %v", i, l, cfg.Default)
					}
					continue
				}
				if okLo {
					if want := calibBounds[calibBucket(lo)]; got > want {
						t.Fatalf("sample %d: Tail = %v, want <= %v (model: %v)", i, got, want, lo)
					}
				}
				if want := calibBounds[calibBucket(hi)]; got < want {
					t.Fatalf("sample %d: Tail = %v, want >= %v (model: %v)", i, got, want, hi)
				}
				if l, want := c.Lease("k"), wantLease(cfg, got); l != want {
					t.Fatalf("sample %d: Lease = %v, want clamp(%.1f × %v) = %v", i, l, cfg.Factor, got, want)
				}
			}
			if defaults == 0 || defaults == n {
				t.Errorf("%d checks of %d samples found no estimate: the test does not reach both paths", defaults, n)
			}
			got, _ := c.Tail("k")
			t.Logf("final Tail %v; %d checks found no estimate", got, defaults)
		})
	}
}

func TestCalibratorLeaseBounds(t *testing.T) {
	t.Parallel()
	cfg := calibration{} // defaults: Factor 2, Min 250ms, Max 30s, Default 5s
	tests := []struct {
		name     string
		feed     []time.Duration
		wantTail time.Duration // 0: no estimate
		want     time.Duration
	}{
		{"no data", nil, 0, 5 * time.Second},
		{"too little weight", slices.Repeat([]time.Duration{time.Second}, calibMinWeight), 0, 5 * time.Second},
		{"non-positive ignored", []time.Duration{0, -1, -time.Hour, 0, 0, 0, 0, 0}, 0, 5 * time.Second},
		{"tiny clamps to Min", slices.Repeat([]time.Duration{time.Microsecond}, 10), calibBounds[0], 250 * time.Millisecond},
		{"huge clamps to Max", slices.Repeat([]time.Duration{time.Hour}, 10), calibBounds[calibBuckets-1], 30 * time.Second},
		{"max duration", slices.Repeat([]time.Duration{math.MaxInt64}, 10), calibBounds[calibBuckets-1], 30 * time.Second},
		{"within range", slices.Repeat([]time.Duration{time.Second}, 10), calibBounds[calibBucket(time.Second)],
			2 * calibBounds[calibBucket(time.Second)]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := newTestCalibrator(cfg)
			for _, d := range tt.feed {
				c.Observe("k", d)
			}
			p, ok := c.Tail("k")
			if ok != (tt.wantTail != 0) || p != tt.wantTail {
				t.Errorf("Tail = %v, %v; want %v, %v", p, ok, tt.wantTail, tt.wantTail != 0)
			}
			if got := c.Lease("k"); got != tt.want {
				t.Errorf("Lease = %v, want %v", got, tt.want)
			}
			if got := c.Lease("unknown"); got != 5*time.Second {
				t.Errorf("Lease(unknown) = %v, want Default 5s", got)
			}
		})
	}
}

// TestCalibratorOutliersTrimmed: one or two slow rebuilds never move the
// lease; three in a row do, but not three spread over minutes.
func TestCalibratorOutliersTrimmed(t *testing.T) {
	t.Parallel()
	const fast, slow = 20 * time.Millisecond, 4 * time.Second
	cfg := calibration{Factor: 2, Min: 10 * time.Millisecond, Max: 30 * time.Second, Default: time.Second}
	fastLease := wantLease(cfg, calibBounds[calibBucket(fast)])
	slowLease := wantLease(cfg, calibBounds[calibBucket(slow)])
	tests := []struct {
		name string
		gaps []time.Duration // before each slow sample after the first
		want time.Duration
	}{
		{"one", nil, fastLease},
		{"two", []time.Duration{0}, fastLease},
		{"three in a row", []time.Duration{0, 0}, slowLease},
		{"three 70s apart", []time.Duration{70 * time.Second, 70 * time.Second}, slowLease},
		{"three 90s apart", []time.Duration{90 * time.Second, 90 * time.Second}, fastLease},
		{"two, then one 3min later", []time.Duration{0, 3 * time.Minute}, fastLease},
	}
	for _, tt := range tests {
		for _, before := range []int{5, 40, 500} {
			spread := slices.ContainsFunc(tt.gaps, func(d time.Duration) bool { return d > 0 })
			if spread && before < 40 {
				continue // the fast history would decay below weight 5
			}
			t.Run(fmt.Sprintf("%s/after %d fast", tt.name, before), func(t *testing.T) {
				c, clk := newTestCalibrator(cfg)
				for range before {
					c.Observe("k", fast)
				}
				c.Observe("k", slow)
				for _, gap := range tt.gaps {
					clk.Advance(gap)
					c.Observe("k", slow)
				}
				if got := c.Lease("k"); got != tt.want {
					t.Errorf("Lease = %v (weight %.2f), want %v (fast %v, slow %v)", got, c.weight("k"), tt.want, fastLease, slowLease)
				}
			})
		}
	}
}

// TestCalibratorForgetsByLoads checks the documented bound: m slow samples
// stop counting after at most ceil(32·log2(m/2)) later samples, and any
// number after calibForgetLoads, for every length of the fast history
// before them.
func TestCalibratorForgetsByLoads(t *testing.T) {
	t.Parallel()
	const fast, slow = 20 * time.Millisecond, 800 * time.Millisecond
	cfg := calibration{Factor: 2, Min: 10 * time.Millisecond, Max: 30 * time.Second, Default: time.Second}
	fastTail := calibBounds[calibBucket(fast)]
	worst := 0
	for _, m := range []int{3, 4, 10, 46, 1000} {
		bound := int(math.Ceil(calibHalfLifeLoads * math.Log2(min(float64(m), calibMaxWeight)/calibTrimWeight)))
		if bound > calibForgetLoads {
			t.Fatalf("m=%d: bound %d above calibForgetLoads %d", m, bound, calibForgetLoads)
		}
		for before := calibMinWeight; before < calibMinWeight+64; before++ {
			c, _ := newTestCalibrator(cfg)
			for range before {
				c.Observe("k", fast)
			}
			for range m {
				c.Observe("k", slow)
			}
			if p, ok := c.Tail("k"); !ok || p < slow {
				t.Fatalf("m=%d before=%d: Tail = %v, %v after the slow burst, want >= %v", m, before, p, ok, slow)
			}
			k := 0
			for ; k < 1000; k++ {
				if p, ok := c.Tail("k"); ok && p == fastTail {
					break
				}
				c.Observe("k", fast)
			}
			if k > bound {
				t.Errorf("m=%d before=%d: Tail back to %v after %d fast samples, want <= %d", m, before, fastTail, k, bound)
			}
			worst = max(worst, k)
		}
	}
	t.Logf("worst case: %d fast samples (bound %d)", worst, calibForgetLoads)
}

// TestCalibratorForgetsByTime checks the time bound: without any new
// rebuild, slow samples of weight m stop counting after 2min·log2(m/2), and
// a class's whole history weighs at most 2 after calibForgetTime.
func TestCalibratorForgetsByTime(t *testing.T) {
	t.Parallel()
	const fast, slow = 20 * time.Millisecond, 4 * time.Second
	cfg := calibration{Factor: 2, Min: 10 * time.Millisecond, Max: 30 * time.Second, Default: time.Second}
	fastLease := wantLease(cfg, calibBounds[calibBucket(fast)])
	slowLease := wantLease(cfg, calibBounds[calibBucket(slow)])

	t.Run("burst over fast history", func(t *testing.T) {
		c, clk := newTestCalibrator(cfg)
		for range 200 {
			c.Observe("k", fast)
		}
		for range 3 {
			c.Observe("k", slow)
		}
		if got := c.Lease("k"); got != slowLease {
			t.Fatalf("Lease after 3 slow = %v, want %v", got, slowLease)
		}
		m := 1 + calibLoadDecay + calibLoadDecay*calibLoadDecay // the burst's weight
		bound := time.Duration(float64(calibHalfLife) * math.Log2(m/calibTrimWeight))
		clk.Advance(bound - time.Second)
		if got := c.Lease("k"); got != slowLease {
			t.Errorf("Lease %v later = %v, want %v still", bound-time.Second, got, slowLease)
		}
		clk.Advance(2 * time.Second)
		if got := c.Lease("k"); got != fastLease {
			t.Errorf("Lease %v later = %v, want %v (the burst forgotten, no new rebuild)", bound+time.Second, got, fastLease)
		}
	})
	t.Run("whole history", func(t *testing.T) {
		c, clk := newTestCalibrator(cfg)
		for range 1000 {
			c.Observe("k", slow)
		}
		clk.Advance(5 * time.Minute)
		if got := c.Lease("k"); got != slowLease {
			t.Errorf("Lease 5min later = %v, want %v", got, slowLease)
		}
		clk.Advance(calibForgetTime - 5*time.Minute - 10*time.Second)
		if w := c.weight("k"); w <= calibTrimWeight {
			t.Errorf("weight 10s before calibForgetTime = %v, want > %d (the bound is tight)", w, calibTrimWeight)
		}
		clk.Advance(10 * time.Second)
		if w := c.weight("k"); w > calibTrimWeight {
			t.Errorf("weight after calibForgetTime = %v, want <= %d", w, calibTrimWeight)
		}
		if got := c.Lease("k"); got != cfg.Default {
			t.Errorf("Lease after calibForgetTime = %v, want Default %v", got, cfg.Default)
		}
		// New data takes over at once: the old samples weigh too little.
		for range calibMinWeight + 1 {
			c.Observe("k", fast)
		}
		if got := c.Lease("k"); got != fastLease {
			t.Errorf("Lease after %d fast = %v, want %v", calibMinWeight+1, got, fastLease)
		}
	})
	t.Run("rare rebuilds stay at Default", func(t *testing.T) {
		for _, tt := range []struct {
			every time.Duration
			want  time.Duration
		}{{36 * time.Second, cfg.Default}, {30 * time.Second, slowLease}} {
			c, clk := newTestCalibrator(cfg)
			for range 1000 {
				clk.Advance(tt.every)
				c.Observe("k", slow)
			}
			if got := c.Lease("k"); got != tt.want {
				t.Errorf("Lease of a class rebuilt every %v = %v (weight %.2f), want %v", tt.every, got, c.weight("k"), tt.want)
			}
		}
	})
}

// TestCalibratorNoPooledFallback: a class without data gets Default, however
// many slow classes there are.
func TestCalibratorNoPooledFallback(t *testing.T) {
	t.Parallel()
	c, _ := newTestCalibrator(calibration{Default: time.Second})
	for i := range 20000 {
		for range 6 {
			c.Observe("slow-"+strconv.Itoa(i), 20*time.Second)
		}
	}
	if got := c.Lease("slow-19999"); got != 30*time.Second {
		t.Errorf("Lease(slow-19999) = %v, want 30s (its own data)", got)
	}
	if p, ok := c.Tail("unrelated"); ok {
		t.Errorf("Tail(unrelated) = %v, true; want no estimate", p)
	}
	if got := c.Lease("unrelated"); got != time.Second {
		t.Errorf("Lease(unrelated) = %v, want Default 1s", got)
	}
}

// TestCalibratorKeepsNoClassName: memory per class does not grow with the
// name: the calibrator keeps no reference to it (issue 14 item 8).
func TestCalibratorKeepsNoClassName(t *testing.T) {
	t.Parallel()
	c, _ := newTestCalibrator(calibration{})
	var ptrs []weak.Pointer[byte]
	for i := range 24 {
		name := strings.Repeat("q", 512<<10) + strconv.Itoa(i) // a 512 KiB key
		ptrs = append(ptrs, weak.Make(unsafe.StringData(name)))
		c.Observe(name, time.Second)
		c.observeRebuild(name, name, nil, uint64(i+1), time.Second)
	}
	runtime.GC()
	runtime.GC()
	for i, p := range ptrs {
		if p.Value() != nil {
			t.Fatalf("class name %d still reachable after GC: the calibrator keeps it", i)
		}
	}
	if n := c.len(); n != 24 {
		t.Errorf("%d classes tracked, want 24", n)
	}
	if size := unsafe.Sizeof(calibWindow{}); size > 600 {
		t.Errorf("a class window is %d bytes, want <= 600", size)
	}
}

func TestCalibratorMemoryBound(t *testing.T) {
	t.Parallel()
	const maxClasses = 1000
	keys := 30_000 // P(a class survives) = (1 - 5/1000)^29000 ≈ e^-145
	if testing.Short() {
		keys = 10_000
	}
	c, _ := newTestCalibrator(calibration{MaxClasses: maxClasses})
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
		if i%5_000 == 0 {
			if n := c.len(); n > maxClasses {
				t.Fatalf("after %d keys: %d classes tracked, want <= %d", i, n, maxClasses)
			}
		}
	}
	if n := c.len(); n > maxClasses {
		t.Fatalf("%d classes tracked, want <= %d", n, maxClasses)
	}
	if tracked(c, "stale") {
		t.Errorf("class %q still tracked after %d newer classes, want evicted", "stale", keys)
	}
	if !tracked(c, "hot") {
		t.Errorf("class %q evicted although observed every other step, want tracked", "hot")
	}
	if got, want := c.Lease("stale"), c.cfg.Default; got != want {
		t.Errorf("Lease(stale) = %v, want Default %v", got, want)
	}
	if got, want := c.Lease("hot"), wantLease(c.cfg, calibBounds[calibBucket(time.Second)]); got != want {
		t.Errorf("Lease(hot) = %v, want %v", got, want)
	}
}

// TestCalibratorRebuildCountedOnce: a rebuild (key, fence) read many times
// counts once, also when its entry in the shared table was overwritten, and
// for classes grouping several keys.
func TestCalibratorRebuildCountedOnce(t *testing.T) {
	t.Parallel()
	c, _ := newTestCalibrator(calibration{})
	approx := func(got, want float64) bool { return math.Abs(got-want) < 1e-3 }
	for range 10 {
		c.observeRebuild("a", "a", nil, 7, time.Second)
	}
	if w := c.weight("a"); !approx(w, 1) {
		t.Errorf("weight after 10 reads of one rebuild = %v, want 1", w)
	}
	c.observeRebuild("a", "a", nil, 8, time.Second)
	if w := c.weight("a"); !approx(w, 1+calibLoadDecay) {
		t.Errorf("weight after a second rebuild = %v, want %v", w, 1+calibLoadDecay)
	}
	c.observeRebuild("a", "a", nil, 9, 0) // a Set: no Δ
	if w := c.weight("a"); !approx(w, 1+calibLoadDecay) {
		t.Errorf("weight after an envelope without Δ = %v, want unchanged", w)
	}

	// Keys of one class, read in turn, with the table forgotten between
	// reads: each rebuild counts once.
	group := func(string) string { return "group" }
	for round := range 5 {
		for _, k := range []string{"x", "y", "z"} {
			c.observeRebuild(k, k, group, 1, time.Second)
		}
		for i := range c.seen {
			c.seen[i].Store(0)
		}
		if w, want := c.weight("group"), 1+calibLoadDecay+calibLoadDecay*calibLoadDecay; !approx(w, want) {
			t.Fatalf("round %d: weight of the group = %v, want %v (3 rebuilds)", round, w, want)
		}
	}
	if tracked(c, "x") {
		t.Errorf("key %q tracked as a class of its own, want only its class", "x")
	}
}

// TestObserveLoadOnlySuccess: only loads that produced a value (or
// ErrNotFound) are samples; failed, timed-out and panicked ones are not.
func TestObserveLoadOnlySuccess(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	c := newTestCache(t, rdb, nil)
	tests := []struct {
		name   string
		err    error
		sample bool
	}{
		{"value", nil, true},
		{"not found", ErrNotFound, true},
		{"error", errors.New("db down"), false},
		{"timeout", fmt.Errorf("herd: the loader did not return within 2s: %w", context.DeadlineExceeded), false},
		{"panic", &PanicError{Value: "boom"}, false},
		{"closed", ErrClosed, false},
	}
	for i, tt := range tests {
		key := "k" + strconv.Itoa(i)
		c.observeLoad(&flight{key: key, keys: mustKeys(t, key)}, 1, 3*time.Second, tt.err)
		if got := c.calib.weight(key) > 0; got != tt.sample {
			t.Errorf("%s: sampled = %v, want %v", tt.name, got, tt.sample)
		}
	}
}

func TestCalibratorConcurrent(t *testing.T) {
	t.Parallel()
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
				case 3:
					churn := "churn-" + strconv.Itoa(r.IntN(64))
					c.observeRebuild(churn, churn, nil, uint64(r.IntN(4)), d)
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
	c.observeRebuild("k", "k", nil, 1, time.Second)
	fence := uint64(1)
	tests := []struct {
		name string
		f    func()
	}{
		{"Observe", func() { c.Observe("k", 30*time.Millisecond) }},
		{"Lease", func() { _ = c.Lease("k") }},
		{"Lease unknown", func() { _ = c.Lease("unknown") }},
		{"Tail", func() { _, _ = c.Tail("k") }},
		{"observeRebuild counted", func() { c.observeRebuild("k", "k", nil, 1, time.Second) }},
		{"observeRebuild new", func() { fence++; c.observeRebuild("k", "k", nil, fence, time.Second) }},
	}
	for _, tt := range tests {
		if got := testing.AllocsPerRun(1000, tt.f); got != 0 {
			t.Errorf("%s: %v allocations per call, want 0", tt.name, got)
		}
	}
}

// TestObserveDeltaNoAllocs: the hit path's calibration step allocates
// nothing, for a rebuild counted already and for a new one, whatever the
// key's length.
func TestObserveDeltaNoAllocs(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	c := newTestCache(t, rdb, nil)
	for _, key := range []string{"user:42", strings.Repeat("q", 1<<20)} {
		f := &flight{key: key, keys: mustKeys(t, key)}
		c.observeDelta(f, 1, time.Second)
		fence := uint64(1)
		if got := testing.AllocsPerRun(100, func() { c.observeDelta(f, 1, time.Second) }); got != 0 {
			t.Errorf("%d-byte key, counted rebuild: %v allocations, want 0", len(key), got)
		}
		if got := testing.AllocsPerRun(100, func() { fence++; c.observeDelta(f, fence, time.Second) }); got != 0 {
			t.Errorf("%d-byte key, new rebuild: %v allocations, want 0", len(key), got)
		}
	}
}

func TestNewCalibratorDefaults(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

// TestCalibrationFailedLoadIsNotASample is the filed scenario of issue 12
// defect 3 on a real redis-server: with LoadTimeout 2s, one load that timed
// out took the lease from 250ms to 4.1s, and it stayed there after 50 fast
// loads; a source failing fast drove a slow class's lease down to MinLease.
// Failed, timed-out and panicked loads must not move the lease.
func TestCalibrationFailedLoadIsNotASample(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), &Options{
		LoadTimeout: 2 * time.Second,
		KeyClass:    func(key string) string { key, _, _ = strings.Cut(key, "/"); return key },
	})
	ctx := context.Background()
	n := 0
	get := func(class string, load LoadFunc) error {
		n++
		_, err := c.Get(ctx, class+"/"+strconv.Itoa(n), time.Minute, load)
		return err
	}
	fast := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	for range 10 {
		if err := get("report", fast); err != nil {
			t.Fatal(err)
		}
	}
	before := c.leaseFor("report/x")
	if before != 250*time.Millisecond {
		t.Fatalf("lease after 10 fast loads = %v, want MinLease 250ms", before)
	}

	failures := []struct {
		name string
		load LoadFunc
	}{
		{"timed out", func(ctx context.Context) ([]byte, error) { <-ctx.Done(); return nil, ctx.Err() }},
		{"failed", func(context.Context) ([]byte, error) { return nil, errors.New("db down") }},
		{"panicked", func(context.Context) ([]byte, error) { panic("boom") }},
	}
	for _, f := range failures {
		if err := get("report", f.load); !errors.Is(err, ErrLoadFailed) {
			t.Fatalf("%s load: err = %v, want ErrLoadFailed", f.name, err)
		}
		if got := c.leaseFor("report/x"); got != before {
			t.Errorf("lease after one %s load = %v, want %v (unchanged)", f.name, got, before)
		}
	}
	afterFailure := c.leaseFor("report/x")
	for range 50 {
		if err := get("report", fast); err != nil {
			t.Fatal(err)
		}
	}
	afterFast := c.leaseFor("report/x")
	if afterFast != before {
		t.Errorf("lease after 50 fast loads = %v, want %v", afterFast, before)
	}
	t.Logf("lease before: %v, after one timed-out load: %v, after 50 fast loads: %v", before, afterFailure, afterFast)

	// A slow class whose source starts failing fast keeps its lease, so
	// followers do not give up just as the source recovers.
	for range 10 {
		c.calib.Observe("slow", 2*time.Second) // successful 2s rebuilds
	}
	slow := c.leaseFor("slow/x")
	if want := wantLease(c.calib.cfg, calibBounds[calibBucket(2*time.Second)]); slow != want {
		t.Fatalf("lease of the slow class = %v, want %v", slow, want)
	}
	for range 300 {
		if err := get("slow", failures[1].load); !errors.Is(err, ErrLoadFailed) {
			t.Fatalf("err = %v, want ErrLoadFailed", err)
		}
	}
	if got := c.leaseFor("slow/x"); got != slow {
		t.Errorf("lease of the slow class after 300 fast failures = %v, want %v (unchanged)", got, slow)
	}
}

// TestCalibrationSlowBurstDecays: on a real redis-server, three successful
// slow rebuilds in a row raise the lease (a real shift), and fast loads
// bring it back within calibForgetLoads.
func TestCalibrationSlowBurstDecays(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), &Options{KeyClass: func(string) string { return "report" }})
	ctx := context.Background()
	fast := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	n := 0
	get := func() {
		t.Helper()
		n++
		if _, err := c.Get(ctx, "report/"+strconv.Itoa(n), time.Minute, fast); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		get()
	}
	before := c.leaseFor("report/x")
	for range 3 {
		c.calib.Observe("report", 2*time.Second) // three successful 2s rebuilds
	}
	raised := c.leaseFor("report/x")
	if want := wantLease(c.calib.cfg, calibBounds[calibBucket(2*time.Second)]); raised != want {
		t.Fatalf("lease after 3 slow rebuilds = %v, want %v", raised, want)
	}
	k := 0
	for ; k < 2*calibForgetLoads && c.leaseFor("report/x") != before; k++ {
		get()
	}
	if k > calibForgetLoads {
		t.Errorf("lease back to %v after %d fast loads, want <= %d", before, k, calibForgetLoads)
	}
	t.Logf("lease before: %v, after 3 slow rebuilds: %v, back to %v after %d fast loads", before, raised, c.leaseFor("report/x"), k)
}

// TestCalibrationLearnsDeltaFromOtherCache: a second Cache on the same
// redis-server learns the first one's rebuild time from the Δ in every
// envelope it reads (a hit, a wake-up with and without the value, a
// takeover), and counts each rebuild once however often it reads it.
func TestCalibrationLearnsDeltaFromOtherCache(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	b := backend{name: "redis", rdb: rdb}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	storedDelta := func(t *testing.T, key string) time.Duration {
		t.Helper()
		raw, err := rdb.Get(ctx, mustKeys(t, key).Value).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		env, ok := wire.DecodeEnvelope(raw)
		if !ok || env.Delta <= 0 {
			t.Fatalf("stored envelope: ok %v, Δ %v; want an envelope with Δ", ok, env.Delta)
		}
		return env.Delta
	}
	// learned checks that class holds exactly the rebuilds with durations
	// ds (weights 1, decay, decay², ... from the latest).
	learned := func(t *testing.T, c *Cache, class string, ds ...time.Duration) {
		t.Helper()
		want := make([]float64, calibBuckets)
		w := 1.0
		for i := len(ds) - 1; i >= 0; i-- {
			want[calibBucket(ds[i])] += w
			w *= calibLoadDecay
		}
		got := bucketWeights(c.calib, class)
		if got == nil {
			t.Fatalf("class not tracked; want rebuilds %v", ds)
		}
		for i := range want {
			// Real time passes between the samples: allow a little decay.
			if got[i] > want[i]+1e-6 || got[i] < want[i]*0.99 {
				t.Fatalf("bucket %d (<= %v) weighs %.4f, want %.4f (rebuilds %v)", i, calibBounds[i], got[i], want[i], ds)
			}
		}
	}
	slowish := func(context.Context) ([]byte, error) {
		time.Sleep(30 * time.Millisecond)
		return []byte("v"), nil
	}
	fail := func(context.Context) ([]byte, error) { return nil, errors.New("a hit called the loader") }
	type result struct {
		val []byte
		err error
	}

	t.Run("hit", func(t *testing.T) {
		c1, c2 := newTestCache(t, rdb, nil), newTestCache(t, rdb, nil)
		key := testKey(t)
		if _, err := c1.Get(ctx, key, time.Minute, slowish); err != nil {
			t.Fatal(err)
		}
		delta := storedDelta(t, key)
		for range 3 {
			if _, err := c2.Get(ctx, key, time.Minute, fail); err != nil {
				t.Fatal(err)
			}
			if _, err := c1.Get(ctx, key, time.Minute, fail); err != nil {
				t.Fatal(err)
			}
		}
		learned(t, c2, key, delta)
		learned(t, c1, key, delta) // its own load, not counted again on its hits
	})

	wake := func(t *testing.T, c1opt *Options) {
		c1, c2 := newTestCache(t, rdb, c1opt), newTestCache(t, rdb, nil)
		key := testKey(t)
		g := newGatedLoader("v")
		leader, follower := make(chan result, 1), make(chan result, 1)
		go func() { v, err := c1.Get(ctx, key, time.Minute, g.load); leader <- result{v, err} }()
		g.waitEntered(t)
		go func() { v, err := c2.Get(ctx, key, time.Minute, fail); follower <- result{v, err} }()
		waitFor(t, 5*time.Second, "the second Cache to follow", func() bool { return c2.Stats().Waits == 1 })
		waitSubscribedTB(t, b, mustKeys(t, key).Channel, 1)
		close(g.gate)
		for name, ch := range map[string]chan result{"leader": leader, "follower": follower} {
			if r := <-ch; r.err != nil || string(r.val) != "v" {
				t.Fatalf("%s: (%q, %v), want the value", name, r.val, r.err)
			}
		}
		learned(t, c2, key, storedDelta(t, key))
		// Which message ended the wait depends on whether the follower's
		// look after subscribing came before the commit;
		// TestOnNoticeLearnsDelta covers the message path alone.
		st := c2.Stats()
		t.Logf("follower: notified %d, polled %d", st.Notified, st.Polled)
	}
	t.Run("wake-up with the value", func(t *testing.T) { wake(t, nil) })
	t.Run("wake-up without the value", func(t *testing.T) { wake(t, &Options{NotifyMaxBytes: -1}) })

	t.Run("takeover", func(t *testing.T) {
		c1, c2 := newTestCache(t, rdb, nil), newTestCache(t, rdb, nil)
		// c2's clock is an hour ahead: c1's value is expired for it, so it
		// rebuilds over it.
		c2.now = func() time.Time { return time.Now().Add(time.Hour) }
		key := testKey(t)
		if _, err := c1.Get(ctx, key, time.Minute, slowish); err != nil {
			t.Fatal(err)
		}
		first := storedDelta(t, key)
		locker := NewLocker(rdb, nil)
		t.Cleanup(func() { locker.Close() })
		holder, err := locker.TryAcquire(ctx, key, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan result, 1)
		go func() { v, err := c2.Get(ctx, key, time.Minute, slowish); done <- result{v, err} }()
		waitFor(t, 5*time.Second, "the second Cache to follow", func() bool { return c2.Stats().Waits == 1 })
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if r := <-done; r.err != nil || string(r.val) != "v" {
			t.Fatalf("Get = (%q, %v), want the value", r.val, r.err)
		}
		if got := c2.Stats().Takeovers; got != 1 {
			t.Fatalf("takeovers = %d, want 1", got)
		}
		learned(t, c2, key, first, storedDelta(t, key))
	})
}

// TestOnNoticeLearnsDelta: a wake-up message that carries the value counts
// its rebuild, once, however many followers of this process receive it.
func TestOnNoticeLearnsDelta(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	c := newTestCache(t, rdb, nil)
	env := c.newEnvelope(42, []byte("v"), time.Minute, 0, 700*time.Millisecond)
	msg := notice{Payload: string(msgValue) + string(env.Encode())}
	for range 3 {
		f := &flight{c: c, key: "k", keys: mustKeys(t, "k")}
		if heard := f.heard(msg); !heard || f.ans.err != nil || string(f.ans.val) != "v" {
			t.Fatalf("heard = %v with (%q, %v), want the value", heard, f.ans.val, f.ans.err)
		}
	}
	got := bucketWeights(c.calib, "k")
	b := calibBucket(700 * time.Millisecond)
	if got == nil || math.Abs(got[b]-1) > 1e-3 {
		t.Fatalf("weights %v, want 1 in bucket %d", got, b)
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

// BenchmarkObserveDeltaCounted is the hit path's calibration cost: a
// rebuild counted already, for a short and a 1 MiB key.
func BenchmarkObserveDeltaCounted(b *testing.B) {
	c := newCalibrator(calibration{})
	for _, key := range []string{"user:42", strings.Repeat("q", 1<<20)} {
		keys, err := makeKeys(DefaultPrefix, key)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(strconv.Itoa(len(key))+"B", func(b *testing.B) {
			c.observeRebuild(keys.Value, key, nil, 9, time.Second)
			b.ReportAllocs()
			for b.Loop() {
				c.observeRebuild(keys.Value, key, nil, 9, time.Second)
			}
		})
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
