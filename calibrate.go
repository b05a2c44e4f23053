package herd

import (
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Lease calibration.
//
// A rebuild holds a lease in Redis while it runs. If the lease is shorter
// than the rebuild, another process takes over and the stampede the lease
// was meant to stop happens anyway; if it is much longer, a crashed
// rebuilder blocks the key for longer than necessary. The calibrator sizes
// the lease from measured rebuild durations:
//
//	lease = clamp(Factor × p99(rebuild time), Min, Max)
//
// and falls back to Default while there is not enough data.
//
// Statistics are kept in small log-scale histograms over a sliding window of
// recent samples (see calibWindow for the exact window and the adaptation
// speeds that follow from it).

// Histogram layout. Bucket i holds durations d with
// calibBounds[i-1] < d <= calibBounds[i], where
// calibBounds[i] = 100µs × 2^(i/3). Bucket 0 also holds everything at or below
// 100µs, and the top bucket (upper bound 2^21 × 100µs ≈ 209.7s) also holds
// everything above it. Adjacent bounds differ by a factor of
// calibRatio = 2^(1/3) ≈ 1.26, which is the resolution of every estimate.
const (
	calibBuckets = 64
	calibBase    = 100 * time.Microsecond
)

// calibRatio is the ratio between the upper bounds of adjacent buckets.
var calibRatio = math.Cbrt(2)

// calibBounds holds the inclusive upper bound of every bucket.
var calibBounds = func() (b [calibBuckets]time.Duration) {
	for i := range b {
		b[i] = time.Duration(math.Round(float64(calibBase) * math.Exp2(float64(i)/3)))
	}
	return b
}()

const (
	// calibGeneration is the number of samples in one generation of a
	// window; see calibWindow.
	calibGeneration = 128

	// calibMinSamples is the number of samples a window must hold before its
	// estimate is used. A class with fewer samples falls back to the global
	// window; a global window with fewer samples falls back to Default.
	calibMinSamples = 5

	// calibEvictSample is the number of tracked classes inspected when one
	// has to be evicted; the least recently observed of them is dropped.
	calibEvictSample = 5
)

// Calibration defaults, applied to zero fields of a calibration.
const (
	defaultCalibFactor     = 2.0
	defaultCalibMin        = 250 * time.Millisecond
	defaultCalibMax        = 30 * time.Second
	defaultCalibDefault    = 5 * time.Second
	defaultCalibMaxClasses = 10000
)

// calibration holds the knobs of a calibrator. A zero field is replaced by
// its default in newCalibrator: Factor 2, Min 250ms, Max 30s, Default 5s and
// MaxClasses 10000. There is no way to ask for "no limit" or "no per-class
// statistics": MaxClasses 0 means the default of 10000.
type calibration struct {
	// Factor multiplies the p99 rebuild time. It must be at least 1 and
	// finite, so the lease is never shorter than the estimate it is based on
	// (unless Max says otherwise). Default 2.
	Factor float64

	// Min is the shortest lease handed out. It must be positive. Default
	// 250ms.
	Min time.Duration

	// Max is the longest lease handed out. It must be at least Min. Default
	// 30s. Estimates saturate at about 209.7s (the top bucket), so with the
	// default Factor a Max above about 419s is never reached from data.
	Max time.Duration

	// Default is the lease handed out while fewer than calibMinSamples
	// rebuilds have been observed in total. It must lie within [Min, Max]
	// after defaults are applied; note that the default Default of 5s does
	// not fit a Min above 5s, so such a Min needs an explicit Default too.
	// Default 5s.
	Default time.Duration

	// MaxClasses bounds the number of classes with their own statistics. It
	// must not be negative; 0 means the default of 10000. Memory use is
	// O(MaxClasses × buckets), about 300 bytes per class plus the class name.
	MaxClasses int
}

// calibrator turns observed rebuild durations into lease lengths.
//
// It keeps one histogram window per class (at most MaxClasses of them) and
// one global window that every observation also feeds. Lease uses the class
// window once it holds at least calibMinSamples (5) samples, else the global
// window once that holds at least 5 samples, else Default; the result is
// clamped to [Min, Max].
//
// The estimate behind a lease is conservative: it is the upper bound of the
// histogram bucket that contains the nearest-rank p99 of the samples in the
// window, so it is at least that p99 and less than calibRatio (≈1.26) times
// it, for durations between 100µs and about 209.7s. See calibWindow for how
// quickly the estimate follows shifts. The window is short (128 to 255
// samples) so that the estimate follows shifts quickly; the price is that
// for a steady distribution the window's p99 scatters around the long-run
// p99, so about 1% of rebuilds still outlast the estimate in effect when they
// start. Factor (default 2) is the margin that covers them.
//
// When MaxClasses classes are tracked and a new one is observed, one class is
// evicted: calibEvictSample (5) tracked classes are picked by map iteration,
// which starts at a random position, and the least recently observed of them
// is dropped. This approximates least-recently-observed eviction at O(1)
// cost. An evicted or never-observed class uses the global estimate.
//
// A calibrator is safe for concurrent use by multiple goroutines. Observe
// costs O(buckets) and does not allocate for a class that is already tracked;
// Lease and P99 cost O(1) (a map lookup and an atomic load) and never
// allocate. Nothing is sorted.
type calibrator struct {
	cfg calibration

	global calibWindow
	tick   atomic.Uint64 // logical clock for least-recently-observed eviction

	mu      sync.RWMutex
	classes map[string]*calibWindow
}

// calibWindow is a histogram over a sliding window of recent samples.
//
// Samples are counted in two generations of calibGeneration (128) samples.
// New samples go into the current generation; when it is full it becomes the
// previous generation and the old previous one is discarded. The estimate is
// computed over both, so once 128 samples have been seen the window holds
// exactly the most recent W samples, 128 <= W <= 255 (before that, all of
// them). This is the decay: a sample counts fully while it is in the window
// and not at all afterwards.
//
// Adaptation speed, for a window that has seen at least 128 samples:
//
//   - Slower: the estimate covers a new, slower level as soon as the slower
//     samples exceed 1% of the window, which takes at most 3 of them
//     (3 > 1% of 255), and 2 while the window holds fewer than 200 samples.
//   - Faster: old, slower samples leave the window after at most 255 new
//     samples (typically 128 to 255), and the estimate drops to the new level
//     once they are at most 1% of the window, which takes at most 253 new
//     samples (255 is the bound to rely on).
//
// The zero value is an empty window. Methods are safe for concurrent use.
type calibWindow struct {
	mu  sync.Mutex
	gen [2][calibBuckets]uint16 // bucket counts per generation
	n   [2]uint16               // samples per generation
	cur uint8                   // index of the current generation

	// est is the cached estimate in nanoseconds, or 0 while the window holds
	// fewer than calibMinSamples samples. It is written under mu and read
	// without it.
	est atomic.Int64
	// last is the calibrator tick of the latest observation, for eviction.
	last atomic.Uint64
}

// newCalibrator returns a calibrator for cfg, with zero fields replaced by
// their defaults (see calibration). It panics with a message starting with
// "herd: " if the resulting configuration is invalid: Factor below 1 or not
// finite, Min not positive, Max below Min, Default outside [Min, Max], or
// MaxClasses negative.
func newCalibrator(cfg calibration) *calibrator {
	if cfg.Factor == 0 {
		cfg.Factor = defaultCalibFactor
	}
	if cfg.Min == 0 {
		cfg.Min = defaultCalibMin
	}
	if cfg.Max == 0 {
		cfg.Max = defaultCalibMax
	}
	if cfg.Default == 0 {
		cfg.Default = defaultCalibDefault
	}
	if cfg.MaxClasses == 0 {
		cfg.MaxClasses = defaultCalibMaxClasses
	}
	switch {
	case math.IsNaN(cfg.Factor) || math.IsInf(cfg.Factor, 0) || cfg.Factor < 1:
		panic("herd: calibration Factor must be a finite number >= 1, got " + strconv.FormatFloat(cfg.Factor, 'g', -1, 64))
	case cfg.Min <= 0:
		panic("herd: calibration Min must be positive, got " + cfg.Min.String())
	case cfg.Max < cfg.Min:
		panic("herd: calibration Max " + cfg.Max.String() + " is below Min " + cfg.Min.String())
	case cfg.Default < cfg.Min || cfg.Default > cfg.Max:
		panic("herd: calibration Default " + cfg.Default.String() + " is outside [Min, Max] = [" +
			cfg.Min.String() + ", " + cfg.Max.String() + "]")
	case cfg.MaxClasses < 0:
		panic("herd: calibration MaxClasses must not be negative, got " + strconv.Itoa(cfg.MaxClasses))
	}
	return &calibrator{
		cfg:     cfg,
		classes: make(map[string]*calibWindow),
	}
}

// Observe records that a rebuild of class took d. Durations d <= 0 are
// ignored; durations above the top bucket (about 209.7s) are counted in the
// top bucket. The sample feeds both the class window and the global window.
// If class is not tracked yet it starts being tracked, evicting another class
// if MaxClasses are already tracked. Observe is safe for concurrent use.
func (c *calibrator) Observe(class string, d time.Duration) {
	if d <= 0 {
		return
	}
	b := calibBucket(d)
	tick := c.tick.Add(1)
	c.global.add(b)
	w := c.window(class, tick)
	w.last.Store(tick)
	w.add(b)
}

// Lease returns the lease length for a rebuild of class: Factor times the
// p99 estimate of P99, clamped to [Min, Max], or Default when there is no
// estimate. Lease is safe for concurrent use and does not allocate.
func (c *calibrator) Lease(class string) time.Duration {
	p, ok := c.P99(class)
	if !ok {
		return c.cfg.Default
	}
	l := float64(p) * c.cfg.Factor
	if l >= float64(c.cfg.Max) {
		return c.cfg.Max
	}
	if d := time.Duration(l); d > c.cfg.Min {
		return d
	}
	return c.cfg.Min
}

// P99 returns the p99 estimate behind Lease: the estimate of class if it has
// at least calibMinSamples samples in its window, else the global estimate if
// the global window has at least that many, else false. The estimate is the
// upper bound of the bucket holding the window's nearest-rank p99. P99 is
// meant for tests and metrics; it is safe for concurrent use and does not
// allocate.
func (c *calibrator) P99(class string) (time.Duration, bool) {
	c.mu.RLock()
	w := c.classes[class]
	c.mu.RUnlock()
	if w != nil {
		if est := w.est.Load(); est > 0 {
			return time.Duration(est), true
		}
	}
	if est := c.global.est.Load(); est > 0 {
		return time.Duration(est), true
	}
	return 0, false
}

// len returns the number of tracked classes.
func (c *calibrator) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.classes)
}

// window returns the window of class, creating it (and evicting another one
// if the calibrator is full) if it is not tracked. tick is the current
// logical time, stamped on a new window so it does not look stale.
func (c *calibrator) window(class string, tick uint64) *calibWindow {
	c.mu.RLock()
	w := c.classes[class]
	c.mu.RUnlock()
	if w != nil {
		return w
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if w = c.classes[class]; w != nil {
		return w
	}
	if len(c.classes) >= c.cfg.MaxClasses {
		c.evictLocked()
	}
	w = new(calibWindow)
	w.last.Store(tick)
	c.classes[class] = w
	return w
}

// evictLocked drops the least recently observed of up to calibEvictSample
// classes picked by map iteration. Callers hold c.mu for writing and ensure
// the map is not empty. A goroutine still holding the evicted window may
// record one more sample into it; that sample is lost for the class but was
// already counted in the global window.
func (c *calibrator) evictLocked() {
	var (
		victim string
		oldest uint64
		seen   int
	)
	for k, w := range c.classes {
		if t := w.last.Load(); seen == 0 || t < oldest {
			victim, oldest = k, t
		}
		seen++
		if seen == calibEvictSample {
			break
		}
	}
	delete(c.classes, victim)
}

// calibBucket returns the index of the bucket holding d: the smallest i with
// d <= calibBounds[i], or the top bucket if there is none. It is a binary
// search over the bounds.
func calibBucket(d time.Duration) int {
	lo, hi := 0, calibBuckets-1
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if d <= calibBounds[mid] {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// add counts one sample in bucket b and refreshes the cached estimate.
func (w *calibWindow) add(b int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := w.cur
	w.gen[g][b]++
	w.n[g]++
	if w.n[g] == calibGeneration {
		g ^= 1
		w.cur = g
		w.gen[g] = [calibBuckets]uint16{}
		w.n[g] = 0
	}
	total := uint32(w.n[0]) + uint32(w.n[1])
	if total < calibMinSamples {
		w.est.Store(0)
		return
	}
	// The nearest-rank p99 is the ceil(0.99·total)-th smallest sample. It
	// lies in the smallest bucket whose cumulative count reaches
	// 0.99·total, because counts are integers.
	var cum uint32
	b = calibBuckets - 1
	for i := range calibBuckets {
		cum += uint32(w.gen[0][i]) + uint32(w.gen[1][i])
		if cum*100 >= total*99 {
			b = i
			break
		}
	}
	w.est.Store(int64(calibBounds[b]))
}
