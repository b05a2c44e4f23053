package main

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// reportFixture is a run's results with figures as wide as real runs
// give (a large request count, a failure scenario's long note, a hotkey
// row with a stale share), for every scenario.
func reportFixture() *results {
	res := &results{Redis: "redis-server 7.0.15 (started for this run on 127.0.0.1:40723)", Elapsed: 412}
	res.Settings.Procs, res.Settings.Callers, res.Settings.OriginLatency = 4, 64, "50ms"
	res.Settings.WriteRate, res.Settings.HotDurationS = 10, 10
	res.Settings.Scenarios = allScenarios
	for _, sc := range []string{scCold, scSteady, scFailure, scStall} {
		for i, st := range allStrategies {
			res.Phases = append(res.Phases, &phaseResult{
				Scenario: sc, Strategy: st, Requests: 1234567 + i, OriginCalls: 98765 + i,
				CallsPerRebuild: 256, MaxPerRebuild: 256, PeakConcurrency: 256 + i,
				Latency:    pct{N: 10, P50: 0.0021, P99: 1234.5, P999: 23456, Max: 34567},
				Added:      pct{N: 5, P50: 12.3 + float64(i), P99: 456.7},
				CmdsPerReq: 20.7, SrvCmdsPerReq: 0.0042, Errors: 123456,
				Notes: "while failing: 147 origin calls (294/s), 17.2% of calls failed; after: 0.6% failed; " +
					"near hits 69.7%; near cache: 592 invalidations, 0 flushes, 0 lookups bypassed; takeovers 0, fenced 0, wait timeouts 0",
			})
		}
	}
	for i, st := range allStrategies {
		res.Phases = append(res.Phases, &phaseResult{Scenario: scHot, Strategy: st, Errors: 7, Notes: "writes: p50 0.51ms, p99 0.88ms",
			Hot: &hotResult{Reads: 12345678, ReadsPerSec: 1234567, HitP50Us: 0.82 + float64(i), HitP99Us: 1720, FromMemory: 0.898,
				CmdsPerRead: 0.00665, SrvCmdsPerRead: 1.042, Writes: 100, Judged: 12345678, StaleReads: 1234 + i,
				StaleP99Ms: 123.4, StaleMaxMs: 345.6}})
	}
	return res
}

// TestTableFits100Columns: the default terminal report (tables, notes
// and legend) has no line wider than 100 columns, and still shows every
// figure of the wide report: each cell of each row is in the line of
// that scenario and strategy in one of the tables, or, for the notes,
// in the notes list.
func TestTableFits100Columns(t *testing.T) {
	res := reportFixture()
	var narrow, wide strings.Builder
	if err := writeTable(&narrow, res, false); err != nil {
		t.Fatal(err)
	}
	if err := writeTable(&wide, res, true); err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(narrow.String(), "\n") {
		if n := utf8.RuneCountInString(line); n > tableWidth {
			t.Errorf("line %d is %d columns wide (at most %d):\n%s", i+1, n, tableWidth, line)
		}
	}
	widest := 0
	for _, line := range strings.Split(wide.String(), "\n") {
		widest = max(widest, utf8.RuneCountInString(line))
	}
	if widest <= tableWidth {
		t.Errorf("the -wide report is at most %d columns: the fixture does not exercise the split", widest)
	}

	lines := strings.Split(narrow.String(), "\n")
	main, hot := tables(res)
	for _, set := range []struct {
		header []string
		rows   [][]string
	}{{tableHeader, main}, {hotHeader, hot}} {
		for _, col := range set.header {
			if !strings.Contains(narrow.String(), col) {
				t.Errorf("no column %q in the report", col)
			}
		}
		for _, row := range set.rows {
			var mine []string // the lines of this row's scenario and strategy
			for _, l := range lines {
				if f := strings.Fields(l); len(f) >= 2 && f[0] == row[0] && f[1] == row[1] {
					mine = append(mine, l)
				}
			}
			joined := strings.Join(mine, "\n")
			for i, cell := range row[2 : len(row)-1] {
				if !strings.Contains(joined, " "+cell) {
					t.Errorf("%s/%s: %s %q is in no table", row[0], row[1], set.header[i+2], cell)
				}
			}
			note := strings.Join(strings.Fields(row[len(row)-1]), " ")
			if !strings.Contains(strings.Join(strings.Fields(narrow.String()), " "), row[0]+"/"+row[1]+": "+note) {
				t.Errorf("%s/%s: the notes %q are not in the notes list", row[0], row[1], note)
			}
		}
	}
	// -wide keeps the one-line layout: each header on one line.
	for _, h := range [][]string{tableHeader, hotHeader} {
		found := false
		for _, l := range strings.Split(wide.String(), "\n") {
			found = found || (strings.HasPrefix(l, "scenario") && strings.Contains(l, h[2]) && strings.HasSuffix(l, h[len(h)-1]))
		}
		if !found {
			t.Errorf("-wide has no one-line header from %q to %q:\n%s", h[2], h[len(h)-1], wide.String())
		}
	}
}

// TestWrap: words stay whole, lines end at the width, and the lines after
// the first start with the indent.
func TestWrap(t *testing.T) {
	got := wrap("aaa bbb ccc dddddddddddd e", 8, "  ")
	if want := "aaa bbb\n  ccc\n  dddddddddddd\n  e"; got != want {
		t.Errorf("wrap = %q, want %q", got, want)
	}
}
