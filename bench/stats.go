package main

import (
	"slices"
	"sort"
	"time"
)

// pct are latency percentiles in milliseconds.
type pct struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
}

// percentiles of µs samples (nearest rank). xs is sorted in place.
func percentiles(xs []int64) pct {
	if len(xs) == 0 {
		return pct{}
	}
	slices.Sort(xs)
	at := func(q float64) float64 {
		i := int(q*float64(len(xs))+0.999999) - 1 // ceil(q·n) − 1
		i = min(max(i, 0), len(xs)-1)
		return float64(xs[i]) / 1000
	}
	return pct{N: len(xs), P50: at(0.50), P99: at(0.99), P999: at(0.999), Max: float64(xs[len(xs)-1]) / 1000}
}

// rebuild is one rebuild episode of a key: its first origin call and every
// call for the same key that started before that one ended (plus a
// slack): the duplicates a stampede makes.
type rebuild struct {
	Key   string `json:"key"`
	Start int64  `json:"start"` // unix ns of the first call
	End   int64  `json:"end"`   // unix ns the last call of the episode ended
	Calls int    `json:"calls"`
}

// rebuildSlack lets a call that started just after the first call of its
// episode ended (its GET missed before the value was written) count as a
// duplicate of that episode.
const rebuildSlack = 10 * time.Millisecond

// rebuilds groups origin calls into episodes per key.
func rebuilds(events []originEvent) []rebuild {
	byKey := map[string][]originEvent{}
	for _, e := range events {
		byKey[e.Key] = append(byKey[e.Key], e)
	}
	var out []rebuild
	for key, es := range byKey {
		sort.Slice(es, func(i, j int) bool { return es[i].Start < es[j].Start })
		var cur *rebuild
		var firstEnd int64
		for _, e := range es {
			if cur != nil && e.Start <= firstEnd+int64(rebuildSlack) {
				cur.Calls++
				cur.End = max(cur.End, e.End)
				continue
			}
			out = append(out, rebuild{Key: key, Start: e.Start, End: e.End, Calls: 1})
			cur = &out[len(out)-1]
			firstEnd = e.End
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}

// peakConcurrency is the most origin calls in flight at once.
func peakConcurrency(events []originEvent) int {
	type edge struct {
		t int64
		d int
	}
	edges := make([]edge, 0, 2*len(events))
	for _, e := range events {
		edges = append(edges, edge{e.Start, +1}, edge{e.End, -1})
	}
	// Ends before starts at the same instant.
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].t != edges[j].t {
			return edges[i].t < edges[j].t
		}
		return edges[i].d < edges[j].d
	})
	n, peak := 0, 0
	for _, e := range edges {
		n += e.d
		peak = max(peak, n)
	}
	return peak
}

// point is one step of a concurrency timeline: from T (ms relative to the
// episode's first call) there are N calls in flight.
type point struct {
	T float64 `json:"t_ms"`
	N int     `json:"n"`
}

// timeline is the origin concurrency for one key around one rebuild.
type timeline struct {
	Key    string  `json:"key"`
	Origin int64   `json:"origin"` // unix ns of the first call (t = 0)
	Calls  int     `json:"calls"`
	Points []point `json:"points"`
}

// concurrencyTimeline steps the in-flight count of key's calls that
// overlap [from, to], relative to origin.
func concurrencyTimeline(events []originEvent, key string, origin, from, to int64) timeline {
	tl := timeline{Key: key, Origin: origin}
	var es []originEvent
	for _, e := range events {
		if e.Key == key && e.End >= from && e.Start <= to {
			es = append(es, e)
		}
	}
	tl.Calls = len(es)
	type edge struct {
		t int64
		d int
	}
	var edges []edge
	for _, e := range es {
		edges = append(edges, edge{e.Start, +1}, edge{e.End, -1})
	}
	sort.Slice(edges, func(i, j int) bool { return edges[i].t < edges[j].t })
	ms := func(t int64) float64 { return float64(t-origin) / 1e6 }
	n := 0
	tl.Points = append(tl.Points, point{T: ms(from), N: 0})
	for i, e := range edges {
		n += e.d
		if i+1 < len(edges) && edges[i+1].t == e.t {
			continue
		}
		t := min(max(e.t, from), to)
		tl.Points = append(tl.Points, point{T: ms(t), N: max(n, 0)})
	}
	tl.Points = append(tl.Points, point{T: ms(to), N: max(n, 0)})
	return tl
}
