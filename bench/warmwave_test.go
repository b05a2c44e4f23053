package main

import "testing"

// The warm-up wave (-warm-wave, on by default) is not measured: with one
// measured wave of one process, the cold phase's origin calls, requests
// and herd's counters (herd_stats in the JSON, which the Cache counts
// from its start, the warm-up included) are one wave's: one miss, one
// lead, one load.
func TestTheWarmUpWaveIsNotMeasured(t *testing.T) {
	res, _ := runBench(t, "-scenarios", "cold", "-strategies", "herd-notify,herd-near", "-p", "1", "-c", "4", "-waves", "1", "-origin-latency", "20ms")
	if !res.Settings.WarmWave {
		t.Fatal("the run had no warm wave")
	}
	for _, st := range []string{stHerdNotify, stHerdNear} {
		pr := phaseOf(t, res, scCold, st)
		if pr.OriginCalls != 1 || pr.Rebuilds != 1 || pr.Requests != 4 {
			t.Errorf("cold/%s: %d origin calls, %d rebuilds, %d requests; want 1, 1, 4", st, pr.OriginCalls, pr.Rebuilds, pr.Requests)
		}
		h := pr.Herd
		if h == nil {
			t.Fatalf("cold/%s: no herd stats", st)
		}
		if h.Leads != uint64(pr.Rebuilds) || h.Loads != uint64(pr.Rebuilds) || h.Misses != uint64(pr.Rebuilds) {
			t.Errorf("cold/%s: herd stats count %d leads, %d loads, %d misses for %d measured rebuild(s): the warm wave is counted (near hits/misses %d/%d)",
				st, h.Leads, h.Loads, h.Misses, pr.Rebuilds, h.NearHits, h.NearMisses)
		}
	}
}
