package main

import "math/bits"

// hist is a histogram of non-negative durations in nanoseconds, for the
// scenarios whose sample counts are too large to keep every sample (the
// hotkey scenario reads at memory speed). It is log-linear: exact below
// 64 ns, then histSub buckets per power of two, so a bucket is at most
// 1/histSub (3.1%) of its values wide. The zero value is empty; one hist
// is used by one goroutine at a time.
type hist struct {
	Counts []uint64 `json:"counts,omitempty"` // by bucket index, up to the last non-empty one
	N      uint64   `json:"n"`
	Max    int64    `json:"max"` // the largest value, exact
}

const histSub = 32

// histIndex is the bucket of v.
func histIndex(v int64) int {
	if v < 2*histSub {
		return int(max(v, 0))
	}
	shift := bits.Len64(uint64(v)) - 6 // keep the top 6 bits: a mantissa in [32, 64)
	return shift*histSub + int(uint64(v)>>shift)
}

// histBounds is the range [lo, hi] of the values in bucket i.
func histBounds(i int) (lo, hi int64) {
	if i < 2*histSub {
		return int64(i), int64(i)
	}
	shift := i/histSub - 1
	mant := int64(i%histSub + histSub)
	return mant << shift, (mant+1)<<shift - 1
}

func (h *hist) add(v int64) {
	v = max(v, 0)
	i := histIndex(v)
	if i >= len(h.Counts) {
		h.Counts = append(h.Counts, make([]uint64, i+1-len(h.Counts))...)
	}
	h.Counts[i]++
	h.N++
	h.Max = max(h.Max, v)
}

func (h *hist) merge(o *hist) {
	if len(o.Counts) > len(h.Counts) {
		h.Counts = append(h.Counts, make([]uint64, len(o.Counts)-len(h.Counts))...)
	}
	for i, c := range o.Counts {
		h.Counts[i] += c
	}
	h.N += o.N
	h.Max = max(h.Max, o.Max)
}

// quantile is the value of rank ceil(q·N) (nearest rank, as percentiles
// does): the middle of its bucket, at most Max; 0 when empty.
func (h *hist) quantile(q float64) int64 {
	if h.N == 0 {
		return 0
	}
	rank := uint64(q*float64(h.N) + 0.999999)
	rank = min(max(rank, 1), h.N)
	var seen uint64
	for i, c := range h.Counts {
		seen += c
		if seen >= rank {
			lo, hi := histBounds(i)
			return min(lo+(hi-lo)/2, h.Max)
		}
	}
	return h.Max
}

// pct is the histogram's percentiles, in milliseconds.
func (h *hist) pct() pct {
	msOf := func(ns int64) float64 { return float64(ns) / 1e6 }
	return pct{N: int(h.N), P50: msOf(h.quantile(0.50)), P99: msOf(h.quantile(0.99)),
		P999: msOf(h.quantile(0.999)), Max: msOf(h.Max)}
}
