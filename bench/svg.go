package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// renderSVG draws the run at a glance, hand-written SVG with no
// dependencies: origin calls per rebuild (log scale) and p99 latency per
// strategy side by side, then the origin concurrency around one rebuild of
// the hottest key, one small chart per strategy on a shared scale.
func renderSVG(res *results) string {
	const (
		width   = 1000
		rowH    = 26
		labelW  = 112
		top     = 70
		gap     = 44
		tlRowH  = 40
		panelW  = width/2 - 30
		barArea = panelW - labelW - 56
	)
	strategies := res.Settings.Strategies
	byKey := map[string]*phaseResult{}
	for _, pr := range res.Phases {
		byKey[pr.Scenario+"/"+pr.Strategy] = pr
	}
	get := func(sc, st string) *phaseResult { return byKey[sc+"/"+st] }
	has := func(sc string) bool {
		for _, st := range strategies {
			if get(sc, st) != nil {
				return true
			}
		}
		return false
	}

	var b strings.Builder
	text := func(x, y float64, anchor, style, s string) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="%s" %s>%s</text>`+"\n", x, y, anchor, style, html.EscapeString(s))
	}

	panelA := len(strategies)*rowH + 40
	tlSc := ""
	for _, sc := range []string{scSteady, scCold} {
		for _, st := range strategies {
			if pr := get(sc, st); pr != nil && pr.Timeline != nil && tlSc == "" {
				tlSc = sc
			}
		}
	}
	height := top + panelA + 20
	if tlSc != "" {
		height += gap + len(strategies)*tlRowH + 50
	}
	height += 30

	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	text(20, 28, "start", `font-size="18" font-weight="bold"`, "Cache stampede: who calls the origin, and what it costs")
	text(20, 46, "start", `fill="#555"`, fmt.Sprintf("%d processes × %d callers, origin latency %s. Blue: herd; warm colours: the alternatives.",
		res.Settings.Procs, res.Settings.Callers, res.Settings.OriginLatency))
	redisStyle := `fill="#555"`
	if res.RedisSrc == redisEmbedded {
		redisStyle = `fill="#b3261e"` // not a real server: say so where it is seen
	}
	text(20, 62, "start", redisStyle, "Redis: "+res.Redis)

	// Panel A: origin calls per rebuild, log scale.
	scA := scCold
	if !has(scA) {
		scA = scSteady
	}
	if has(scA) {
		title := "Origin calls per cold wave (mean, log scale)"
		if scA == scSteady {
			title = "Origin calls per expiry, steady load (mean, log scale)"
		}
		x0, y0 := 20.0, float64(top)
		text(x0, y0+10, "start", `font-size="14" font-weight="bold"`, title)
		maxV := 1.0
		for _, st := range strategies {
			if pr := get(scA, st); pr != nil {
				maxV = max(maxV, pr.CallsPerRebuild, float64(pr.MaxPerRebuild))
			}
		}
		decades := math.Ceil(math.Log10(maxV) + 0.01)
		lo := math.Log10(0.5)
		scale := func(v float64) float64 {
			v = max(v, 0.5)
			return float64(barArea) * (math.Log10(v) - lo) / (decades - lo)
		}
		bx := x0 + labelW
		by := y0 + 24
		for d := 0.0; d <= decades; d++ {
			x := bx + scale(math.Pow(10, d))
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x, by-4, x, by+float64(len(strategies)*rowH))
			text(x, by+float64(len(strategies)*rowH)+14, "middle", `fill="#777" font-size="11"`, fmt.Sprintf("%g", math.Pow(10, d)))
		}
		for i, st := range strategies {
			pr := get(scA, st)
			y := by + float64(i*rowH)
			text(bx-8, y+15, "end", "", st)
			if pr == nil {
				continue
			}
			w := scale(pr.CallsPerRebuild)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="%s"><title>%s: %.2f origin calls per rebuild (max %d)</title></rect>`+"\n",
				bx, y+3, w, rowH-8, color(st), st, pr.CallsPerRebuild, pr.MaxPerRebuild)
			label := fmt.Sprintf("%.1f", pr.CallsPerRebuild)
			if pr.CallsPerRebuild >= 100 {
				label = fmt.Sprintf("%.0f", pr.CallsPerRebuild)
			}
			text(bx+w+5, y+15, "start", `font-weight="bold"`, label)
		}
	}

	// Panel B: p99 latency, linear, one bar per scenario with a value.
	var scB []string
	for _, sc := range []string{scCold, scSteady} {
		if has(sc) {
			scB = append(scB, sc)
		}
	}
	if len(scB) > 0 {
		x0, y0 := float64(width/2+10), float64(top)
		text(x0, y0+10, "start", `font-size="14" font-weight="bold"`, "Caller latency p99 (ms)")
		maxV := 1.0
		for _, sc := range scB {
			for _, st := range strategies {
				if pr := get(sc, st); pr != nil {
					maxV = max(maxV, pr.Latency.P99)
				}
			}
		}
		step := niceStep(maxV / 4)
		top := step * math.Ceil(maxV/step)
		bx, by := x0+labelW, y0+24
		scale := func(v float64) float64 { return float64(barArea) * v / top }
		for k := 0.0; k*step <= top+step/2; k++ {
			v := k * step
			x := bx + scale(v)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x, by-4, x, by+float64(len(strategies)*rowH))
			text(x, by+float64(len(strategies)*rowH)+14, "middle", `fill="#777" font-size="11"`, fmt.Sprintf("%g", v))
		}
		if o := res.Settings.originMeanMs; o > 0 && o <= top {
			x := bx + scale(o)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333" stroke-dasharray="4,3"/>`+"\n", x, by-9, x, by+float64(len(strategies)*rowH))
			text(x-3, by-1, "end", `fill="#333" font-size="10"`, "origin latency")
		}
		sub := float64(rowH-6) / float64(len(scB))
		for i, st := range strategies {
			y := by + float64(i*rowH)
			text(bx-8, y+15, "end", "", st)
			for j, sc := range scB {
				pr := get(sc, st)
				if pr == nil {
					continue
				}
				op := 1.0
				if j > 0 {
					op = 0.45
				}
				yy := y + 3 + float64(j)*sub
				w := scale(pr.Latency.P99)
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="%.2f"><title>%s, %s: p99 %.1f ms</title></rect>`+"\n",
					bx, yy, max(w, 1), sub-1, color(st), op, st, sc, pr.Latency.P99)
				text(bx+w+5, yy+sub-3, "start", `font-size="11"`, fmt.Sprintf("%.0f", pr.Latency.P99))
			}
		}
		if len(scB) > 1 {
			text(x0, by+float64(len(strategies)*rowH)+32, "start", `fill="#555" font-size="11"`,
				"upper bar: cold waves; lower, paler bar: steady load")
		} else {
			text(x0, by+float64(len(strategies)*rowH)+32, "start", `fill="#555" font-size="11"`, scB[0])
		}
	}

	// Panel C: origin concurrency timeline around one rebuild.
	if tlSc != "" {
		y0 := float64(top + panelA + 20 + gap)
		title := "Origin calls in flight around one expiry of the hottest key (steady load)"
		if tlSc == scCold {
			title = "Origin calls in flight around one cold wave"
		}
		text(20, y0-14, "start", `font-size="14" font-weight="bold"`, title)
		tMin, tMax, nMax := 0.0, 0.0, 1
		for _, st := range strategies {
			if pr := get(tlSc, st); pr != nil && pr.Timeline != nil {
				for _, p := range pr.Timeline.Points {
					tMin, tMax = min(tMin, p.T), max(tMax, p.T)
					nMax = max(nMax, p.N)
				}
			}
		}
		bx := 20.0 + labelW
		areaW := float64(width) - bx - 150
		sx := func(t float64) float64 { return bx + areaW*(t-tMin)/max(tMax-tMin, 1) }
		h := float64(tlRowH - 8)
		for i, st := range strategies {
			y := y0 + float64(i*tlRowH)
			base := y + h
			text(bx-8, y+h/2+4, "end", "", st)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#bbb"/>`+"\n", bx, base, bx+areaW, base)
			pr := get(tlSc, st)
			if pr == nil || pr.Timeline == nil {
				text(bx+4, y+h/2+4, "start", `fill="#999"`, "no rebuild of that key in the window")
				continue
			}
			var path strings.Builder
			fmt.Fprintf(&path, "M%.1f,%.1f", sx(pr.Timeline.Points[0].T), base)
			peak := 0
			prevY := base
			for _, p := range pr.Timeline.Points {
				yy := base - h*float64(p.N)/float64(nMax)
				fmt.Fprintf(&path, " L%.1f,%.1f L%.1f,%.1f", sx(p.T), prevY, sx(p.T), yy)
				prevY = yy
				peak = max(peak, p.N)
			}
			fmt.Fprintf(&path, " L%.1f,%.1f Z", sx(tMax), base)
			fmt.Fprintf(&b, `<path d="%s" fill="%s" fill-opacity="0.8" stroke="%s" stroke-width="2" stroke-linejoin="round"/>`+"\n", path.String(), color(st), color(st))
			text(bx+areaW+10, y+h/2+4, "start", "", fmt.Sprintf("peak %d, %d call%s", peak, pr.Timeline.Calls, plural(pr.Timeline.Calls)))
		}
		axisY := y0 + float64(len(strategies)*tlRowH) + 4
		step := niceStep((tMax - tMin) / 6)
		for k := math.Ceil(tMin / step); k*step <= tMax; k++ {
			t := k * step
			if k == 0 {
				t = 0 // not -0
			}
			x := sx(t)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ccc"/>`+"\n", x, axisY-4, x, axisY)
			text(x, axisY+12, "middle", `fill="#777" font-size="11"`, fmt.Sprintf("%g", t))
		}
		x0 := sx(0)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#888" stroke-dasharray="3,3"/>`+"\n", x0, y0-4, x0, axisY-4)
		text(bx, axisY+28, "start", `fill="#555" font-size="11"`,
			fmt.Sprintf("ms from the rebuild's first origin call; height: calls in flight for that key, full row = %d", nMax))
	}
	text(20, float64(height-10), "start", `fill="#999" font-size="10"`, res.Command)
	b.WriteString("</svg>\n")
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// niceStep rounds x up to 1, 2 or 5 × a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func color(st string) string {
	switch st {
	case stNone:
		return "#d62728"
	case stSingle:
		return "#ff7f0e"
	case stGoCache:
		return "#e6ab02"
	case stRedisLock:
		return "#8c564b"
	case stHerdPoll:
		return "#9ecae1"
	case stHerdNotify:
		return "#3182bd"
	case stHerdSWR:
		return "#08306b"
	}
	return "#777"
}
