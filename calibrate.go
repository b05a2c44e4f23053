package herd

import (
	"errors"
	"hash/maphash"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Lease calibration.
//
// A rebuild holds a lease in Redis while it runs, and the watchdog renews
// it, so the lease only has to cover the time a crashed rebuilder keeps
// the key blocked and the renewal margin. The calibrator sizes it from the
// measured durations of successful rebuilds:
//
//	lease = clamp(Factor × tail(rebuild times), Min, Max)
//
// and hands out Default while a class has too little recent data.
//
// Samples. Only rebuilds that produced a value (or ErrNotFound) are
// samples: a failed, timed-out or panicked load says nothing about how long
// a rebuild takes. A process counts its own rebuilds and the rebuilds of
// other processes it learns of through the rebuild time Δ in the envelopes
// it reads: hits, wake-ups with the value, the value found after a wake-up
// without it, and the expired value under a takeover. Each rebuild (a key
// and the fence its writer held) counts once per process.
//
// Weights. A sample starts with weight 1. Its weight halves with every
// calibHalfLifeLoads (32) later samples of its class and with every
// calibHalfLife (2 minutes) that passes, so a class's total weight never
// reaches calibMaxWeight (about 46.7): the estimate follows the last few
// dozen rebuilds, the recent ones most.
//
// Tail. The estimate of a class is the upper bound of the smallest
// histogram bucket above which the class's samples weigh at most
// calibTrimWeight (2) in total: the slowest weight-2 of the data is trimmed,
// which at full weight is about the p96 of the last 47 rebuilds. A class
// whose total weight is below calibMinWeight (5) has no estimate and gets
// Default. Consequences, documented on Options:
//
//   - One or two slow rebuilds never move the lease; three in a row (less
//     than about 80 s apart) do.
//   - Samples stop counting on their own (their weight falls to 2 or less)
//     after at most calibForgetLoads (146) later rebuilds of their class
//     or calibForgetTime (546 s, about 9 minutes), whichever comes first,
//     however many they were: m samples after 32·log2(m/2) rebuilds or
//     2 minutes × log2(m/2).
//   - A class rebuilt less often than about every 35 s never gathers
//     weight 5 and stays at Default.
//   - A class without data gets Default, never an estimate pooled from
//     other classes: no number of slow keys moves the lease of an unrelated
//     class.
//
// Memory. Classes are kept by a 64-bit maphash of their name, never the
// name, so a class costs about 600 bytes whatever its length, and at most
// MaxClasses are tracked (the least recently observed of a random sample
// is evicted).

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
	// calibHalfLifeLoads is the number of later samples of its class that
	// halve a sample's weight.
	calibHalfLifeLoads = 32

	// calibHalfLife is the time that halves a sample's weight.
	calibHalfLife = 2 * time.Minute

	// calibTrimWeight is the weight of the slowest samples the estimate
	// ignores.
	calibTrimWeight = 2

	// calibMinWeight is the total weight a class needs for an estimate.
	calibMinWeight = 5

	// calibForgetLoads and calibForgetTime bound how long any set of
	// samples can raise the estimate on its own: their weight is below
	// calibMaxWeight, and after this many later samples, or this much time,
	// it is at most calibTrimWeight.
	// 32·log2(46.668/2) = 145.4; 120 s·log2(46.668/2) = 545.3 s.
	calibForgetLoads = 146
	calibForgetTime  = 546 * time.Second

	// calibNegligible is the weight below which a bucket is set to 0.
	calibNegligible = 1e-6

	// calibEvictSample is the number of tracked classes inspected when one
	// has to be evicted; the least recently observed of them is dropped.
	calibEvictSample = 5

	// calibSeenBits sizes the table of rebuilds recently counted (key and
	// fence), which keeps the hit path at one atomic load when a hit's
	// rebuild was counted already: 1<<12 = 4096 slots, 32 KiB.
	calibSeenBits  = 12
	calibSeenSlots = 1 << calibSeenBits

	// calibRecentTags is the number of rebuilds each class remembers, to
	// count a rebuild once even when its entry in the table was
	// overwritten: a class whose keys are read in turn counts each
	// rebuild once while it has at most this many (256 bytes a class).
	calibRecentTags = 32
)

// calibLoadDecay is the factor every sample of a class is multiplied by
// when a new one arrives.
var calibLoadDecay = math.Exp2(-1.0 / calibHalfLifeLoads)

// calibMaxWeight is the limit of a class's total weight: W = decay·W + 1.
var calibMaxWeight = 1 / (1 - calibLoadDecay)

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
// MaxClasses 10000 (a Cache passes its own Options, where DefaultLease
// defaults to 1s). There is no way to ask for "no limit" or "no per-class
// statistics": MaxClasses 0 means the default of 10000.
type calibration struct {
	// Factor multiplies the tail estimate. It must be at least 1 and
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

	// Default is the lease of a class without an estimate. It must lie
	// within [Min, Max] after defaults are applied; note that the default
	// Default of 5s does not fit a Min above 5s, so such a Min needs an
	// explicit Default too. Default 5s.
	Default time.Duration

	// MaxClasses bounds the number of classes with their own statistics. It
	// must not be negative; 0 means the default of 10000. A class costs
	// about 600 bytes whatever the length of its name.
	MaxClasses int
}

// calibrator turns observed rebuild durations into lease lengths; see the
// comment at the top of this file for the model.
//
// A calibrator is safe for concurrent use by multiple goroutines. Observe,
// Lease and Tail hash the class name and cost O(buckets) under the class's
// mutex; they do not allocate, except Observe once for a class that is not
// tracked yet. observeRebuild of a rebuild already counted costs one hash
// of the key's name and one atomic load.
type calibrator struct {
	cfg  calibration
	seed maphash.Seed

	// now is the clock of the time decay; tests replace it before first
	// use. base is the clock reading weights are timed from.
	now  func() time.Time
	base time.Time

	tick atomic.Uint64 // logical clock for least-recently-observed eviction

	// seen holds tags (key and fence, see rebuildTag) of rebuilds counted
	// recently, direct-mapped; 0 is an empty slot.
	seen [calibSeenSlots]atomic.Uint64

	mu      sync.RWMutex
	classes map[uint64]*calibWindow // by maphash of the class name
}

// calibWindow is one class's histogram of decayed sample weights.
//
// The weights are stored as of time at: a reader multiplies them by the
// time decay since then, a writer applies that decay and the load decay
// before adding its sample. The zero value is an empty class.
type calibWindow struct {
	mu   sync.Mutex
	w    [calibBuckets]float32   // bucket weights as of at
	at   int64                   // calibrator clock (ns since base) of the weights
	tags [calibRecentTags]uint64 // rebuilds counted last, 0: none
	next uint8                   // next slot of tags to overwrite
	last atomic.Uint64           // calibrator tick of the latest observation, for eviction
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
	now := time.Now
	return &calibrator{
		cfg:     cfg,
		seed:    maphash.MakeSeed(),
		now:     now,
		base:    now(),
		classes: make(map[uint64]*calibWindow),
	}
}

// observeLoad records a rebuild of f's key that this process ran under the
// lease with the given fence and that took d. Only a load that produced a
// value or ErrNotFound is a sample: a failed, timed-out or panicked load
// (err of any other kind) is not. The rebuild is marked as counted, so the
// envelope it writes is not counted again when this process reads it.
func (c *Cache) observeLoad(f *flight, fence uint64, d time.Duration, err error) {
	if err != nil && !errors.Is(err, ErrNotFound) {
		return
	}
	c.calib.observeRebuild(f.keys.Value, f.key, c.cfg.classLabel, fence, d)
}

// observeDelta records the rebuild time Δ of an envelope of f's key that
// this process read (a hit, a wake-up, a value found while waiting or under
// a takeover). Each rebuild, told apart by its writer's fence, counts once;
// an envelope without Δ (written by Set) counts not at all. When the
// rebuild was counted already this costs a hash of the key's short Redis
// name (whatever the key's length) and one atomic load, and never
// allocates.
func (c *Cache) observeDelta(f *flight, fence uint64, delta time.Duration) {
	c.calib.observeRebuild(f.keys.Value, f.key, c.cfg.classLabel, fence, delta)
}

// observeRebuild records a rebuild of key, by the writer that held fence,
// that took d, unless it was counted already. name identifies the key for
// that check (its Redis value name: short whatever the key's length).
// classOf maps the key to its class; nil means the key is its own class.
// Durations d <= 0 are ignored.
func (c *calibrator) observeRebuild(name, key string, classOf func(string) string, fence uint64, d time.Duration) {
	if d <= 0 {
		return
	}
	tag := rebuildTag(maphash.String(c.seed, name), fence)
	slot := &c.seen[tag>>(64-calibSeenBits)]
	if slot.Load() == tag {
		return
	}
	slot.Store(tag)
	class := key
	if classOf != nil {
		class = classOf(key)
	}
	c.observe(maphash.String(c.seed, class), d, tag)
}

// rebuildTag identifies a rebuild (a key's hash and its writer's fence) in
// 64 bits, never 0.
func rebuildTag(keyHash, fence uint64) uint64 {
	// The splitmix64 finalizer spreads the bits over the whole word, so
	// the top bits index the seen table.
	x := keyHash ^ (fence * 0x9e3779b97f4a7c15)
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x | 1
}

// Observe records a sample of class that took d. Durations d <= 0 are
// ignored; durations above the top bucket (about 209.7s) are counted in the
// top bucket. If class is not tracked yet it starts being tracked, evicting
// another class if MaxClasses are already tracked.
func (c *calibrator) Observe(class string, d time.Duration) {
	if d <= 0 {
		return
	}
	c.observe(maphash.String(c.seed, class), d, 0)
}

// observe adds a sample to the class with hash class; a non-zero tag that
// the class counted recently is not counted again.
func (c *calibrator) observe(class uint64, d time.Duration, tag uint64) {
	tick := c.tick.Add(1)
	w := c.window(class, tick)
	w.last.Store(tick)
	w.add(calibBucket(d), c.clock(), tag)
}

// Lease returns the lease length for a rebuild of class: Factor times the
// estimate of Tail, clamped to [Min, Max], or Default when class has no
// estimate.
func (c *calibrator) Lease(class string) time.Duration {
	p, ok := c.Tail(class)
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

// Tail returns the estimate behind Lease: the upper bound of the smallest
// bucket above which the samples of class weigh at most calibTrimWeight,
// or false when the class is not tracked or weighs less than
// calibMinWeight.
func (c *calibrator) Tail(class string) (time.Duration, bool) {
	c.mu.RLock()
	w := c.classes[maphash.String(c.seed, class)]
	c.mu.RUnlock()
	if w == nil {
		return 0, false
	}
	return w.estimate(c.clock())
}

// weight returns the total weight of class now, 0 if it is not tracked.
// For tests.
func (c *calibrator) weight(class string) float64 {
	c.mu.RLock()
	w := c.classes[maphash.String(c.seed, class)]
	c.mu.RUnlock()
	if w == nil {
		return 0
	}
	total, _ := w.snapshot(c.clock())
	return total
}

// len returns the number of tracked classes.
func (c *calibrator) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.classes)
}

// clock returns the calibrator's time in nanoseconds since base.
func (c *calibrator) clock() int64 {
	return int64(c.now().Sub(c.base))
}

// window returns the window of class, creating it (and evicting another one
// if the calibrator is full) if it is not tracked. tick is the current
// logical time, stamped on a new window so it does not look stale.
func (c *calibrator) window(class uint64, tick uint64) *calibWindow {
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
	w = &calibWindow{at: c.clock()}
	w.last.Store(tick)
	c.classes[class] = w
	return w
}

// evictLocked drops the least recently observed of up to calibEvictSample
// classes picked by map iteration, which starts at a random position.
// Callers hold c.mu for writing and ensure the map is not empty. A
// goroutine still holding the evicted window may record one more sample
// into it; that sample is lost.
func (c *calibrator) evictLocked() {
	var (
		victim uint64
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

// timeDecay is the factor a weight is multiplied by over elapsed
// nanoseconds; 1 for elapsed <= 0 (a clock read before another goroutine
// moved the window on).
func timeDecay(elapsed int64) float64 {
	if elapsed <= 0 {
		return 1
	}
	return math.Exp2(-float64(elapsed) / float64(calibHalfLife))
}

// add decays the window to now and by one sample, then counts a sample of
// weight 1 in bucket b, unless tag (non-zero) is one of the rebuilds the
// window counted last.
func (w *calibWindow) add(b int, now int64, tag uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if tag != 0 {
		for _, t := range w.tags {
			if t == tag {
				return
			}
		}
		w.tags[w.next] = tag
		w.next = (w.next + 1) % calibRecentTags
	}
	g := float32(calibLoadDecay * timeDecay(now-w.at))
	for i := range w.w {
		if v := w.w[i] * g; v >= calibNegligible {
			w.w[i] = v
		} else {
			w.w[i] = 0
		}
	}
	if now > w.at {
		w.at = now
	}
	w.w[b]++
}

// snapshot returns the window's total weight at time now and the factor
// its stored weights are to be multiplied by.
func (w *calibWindow) snapshot(now int64) (total, f float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.totalLocked(now)
}

func (w *calibWindow) totalLocked(now int64) (total, f float64) {
	f = timeDecay(now - w.at)
	for _, v := range w.w {
		total += float64(v)
	}
	return total * f, f
}

// estimate returns the window's tail estimate at time now (see Tail).
func (w *calibWindow) estimate(now int64) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	total, f := w.totalLocked(now)
	if total < calibMinWeight {
		return 0, false
	}
	// Compare the stored weights with the trim scaled back by the decay.
	trim := calibTrimWeight / f
	var tail float64
	for i := calibBuckets - 1; i > 0; i-- {
		if tail += float64(w.w[i]); tail > trim {
			return calibBounds[i], true
		}
	}
	return calibBounds[0], true
}
