package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// progress is the one-line status on stderr. On a terminal it is redrawn
// in place; elsewhere (CI logs) only phase changes are printed, one line
// each, plus a line every 5 s.
type progress struct {
	w     io.Writer
	tty   bool
	start time.Time
	mu    sync.Mutex
	last  time.Time
	shown bool
}

func newProgress(w io.Writer) *progress {
	tty := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progress{w: w, tty: tty, start: time.Now()}
}

// set shows a status; major marks a phase change.
func (p *progress) set(major bool, format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	line := fmt.Sprintf("bench %5.1fs %s", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.shown = true
		return
	}
	if major || time.Since(p.last) >= 5*time.Second {
		fmt.Fprintln(p.w, line)
		p.last = time.Now()
	}
}

// done clears the status line.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
}

// tableHeader and tableRow are the columns of the results table.
var tableHeader = []string{
	"scenario", "strategy", "requests", "origin calls", "calls/rebuild", "max/rebuild", "peak origin conc",
	"p50 ms", "p99 ms", "p99.9 ms", "max ms", "follower +p50 ms", "follower +p99 ms",
	"redis cmd/req", "server cmd/req", "server cmd/wave", "new conn/wave", "errors", "notes",
}

func tableRow(pr *phaseResult) []string {
	f := func(x float64) string {
		switch {
		case x >= 100:
			return fmt.Sprintf("%.0f", x)
		case x >= 10:
			return fmt.Sprintf("%.1f", x)
		case x > 0 && x < 0.01:
			return fmt.Sprintf("%.4f", x) // a near hit is under a microsecond
		}
		return fmt.Sprintf("%.2f", x)
	}
	added := func(x float64) string {
		if pr.Added.N == 0 {
			return "-"
		}
		return f(x)
	}
	srv := "-"
	if pr.SrvCmdsPerReq >= 0 {
		srv = f(pr.SrvCmdsPerReq)
	}
	// Per wave: the cold and stall scenarios' unit of work.
	perWave := func(n int64) string {
		if n < 0 || len(pr.PerWave) == 0 || (pr.Scenario != scCold && pr.Scenario != scStall) {
			return "-"
		}
		return f(float64(n) / float64(len(pr.PerWave)))
	}
	return []string{
		pr.Scenario, pr.Strategy, fmt.Sprint(pr.Requests), fmt.Sprint(pr.OriginCalls),
		f(pr.CallsPerRebuild), fmt.Sprint(pr.MaxPerRebuild), fmt.Sprint(pr.PeakConcurrency),
		f(pr.Latency.P50), f(pr.Latency.P99), f(pr.Latency.P999), f(pr.Latency.Max),
		added(pr.Added.P50), added(pr.Added.P99),
		f(pr.CmdsPerReq), srv, perWave(pr.ServerCmds), perWave(pr.ServerConns), fmt.Sprint(pr.Errors), pr.Notes,
	}
}

// hotHeader and hotRow are the columns of the hotkey scenario's table.
var hotHeader = []string{
	"scenario", "strategy", "reads", "reads/s", "hit p50 µs", "hit p99 µs", "from memory",
	"redis cmd/read", "server cmd/read", "writes", "stale reads", "stale p99 ms", "stale max ms", "errors", "notes",
}

func hotRow(pr *phaseResult) []string {
	h := pr.Hot
	if h == nil {
		h = &hotResult{SrvCmdsPerRead: -1}
	}
	f := func(x float64) string {
		switch {
		case x >= 100:
			return fmt.Sprintf("%.0f", x)
		case x >= 10:
			return fmt.Sprintf("%.1f", x)
		}
		return fmt.Sprintf("%.2f", x)
	}
	// Commands per read go down to a few per ten thousand reads.
	perRead := func(x float64) string {
		if x < 0 {
			return "-"
		}
		if x < 0.01 && x > 0 {
			return fmt.Sprintf("%.5f", x)
		}
		return fmt.Sprintf("%.3f", x)
	}
	stale := fmt.Sprint(h.StaleReads)
	if h.Judged > 0 && h.StaleReads > 0 {
		stale = fmt.Sprintf("%d (%.3f%%)", h.StaleReads, 100*float64(h.StaleReads)/float64(h.Judged))
	}
	dash := func(x float64) string {
		if h.StaleReads == 0 {
			return "-"
		}
		return f(x)
	}
	return []string{
		pr.Scenario, pr.Strategy, fmt.Sprint(h.Reads), fmt.Sprintf("%.0f", h.ReadsPerSec),
		f(h.HitP50Us), f(h.HitP99Us), fmt.Sprintf("%.1f%%", 100*h.FromMemory),
		perRead(h.CmdsPerRead), perRead(h.SrvCmdsPerRead), fmt.Sprint(h.Writes),
		stale, dash(h.StaleP99Ms), dash(h.StaleMaxMs), fmt.Sprint(pr.Errors), pr.Notes,
	}
}

// tables splits the phases into the results table's rows and the hotkey
// table's.
func tables(res *results) (main, hot [][]string) {
	for _, pr := range res.Phases {
		if pr.Scenario == scHot {
			hot = append(hot, hotRow(pr))
		} else {
			main = append(main, tableRow(pr))
		}
	}
	return main, hot
}

// tableWidth is the width the terminal tables fit, legend included, unless
// -wide asks for one line per row.
const tableWidth = 100

// columnGroup is a table of the narrow report: after the scenario and
// strategy columns, the wide table's columns cols, under title. Together
// the groups hold every column of the wide table but the notes, which
// follow them as a list.
type columnGroup struct {
	title string
	cols  []int // indexes into the wide table's columns
}

var tableGroups = []columnGroup{
	{"origin calls", []int{2, 3, 4, 5, 6}},
	{"latency", []int{7, 8, 9, 10, 11, 12}},
	{"Redis commands and errors", []int{13, 14, 15, 16, 17}},
}

var hotGroups = []columnGroup{
	{"reads", []int{2, 3, 4, 5, 6}},
	{"Redis commands, writes and errors", []int{7, 8, 9, 13}},
	{"staleness", []int{10, 11, 12}},
}

// writeTable prints the results: one row per strategy per scenario, the
// hotkey scenario in tables of its own. By default each measure is a
// table of its own, so that every line fits tableWidth columns; wide
// prints each row on one line, every column side by side, as the
// Markdown report has it.
func writeTable(w io.Writer, res *results, wide bool) error {
	var b strings.Builder
	title := fmt.Sprintf("herd stampede benchmark: %d processes × %d callers, origin latency %s",
		res.Settings.Procs, res.Settings.Callers, res.Settings.OriginLatency)
	if wide {
		b.WriteString(title + ", " + res.Redis + "\n")
	} else {
		b.WriteString(title + "\n" + wrap("Redis: "+res.Redis, tableWidth, "  ") + "\n")
	}
	main, hot := tables(res)
	if len(main) > 0 {
		writeTables(&b, tableHeader, main, tableGroups, wide)
	}
	if len(hot) > 0 {
		if len(main) > 0 {
			b.WriteString("\n")
		}
		b.WriteString(wrap(fmt.Sprintf("hotkey: one key read by every caller, %s written by the parent (%.0fs measured):",
			rateString(res.Settings.WriteRate), res.Settings.HotDurationS), tableWidth, "") + "\n")
		writeTables(&b, hotHeader, hot, hotGroups, wide)
	}
	if wide {
		b.WriteString(legend(res) + "\n")
	} else {
		b.WriteString("\n")
		for _, para := range strings.Split(legend(res), "\n") {
			b.WriteString(wrap(para, tableWidth, "  ") + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeTables writes the rows, with header, as one wide table, or as one
// table per group followed by the rows' notes (the last column).
func writeTables(b *strings.Builder, header []string, rows [][]string, groups []columnGroup, wide bool) {
	if wide {
		alignTable(b, header, rows)
		return
	}
	pick := func(r []string, cols []int) []string {
		out := []string{r[0], r[1]}
		for _, c := range cols {
			out = append(out, r[c])
		}
		return out
	}
	for i, g := range groups {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(g.title + ":\n")
		body := make([][]string, len(rows))
		for j, r := range rows {
			body[j] = pick(r, g.cols)
		}
		alignTable(b, pick(header, g.cols), body)
	}
	notes := len(header) - 1
	first := true
	for _, r := range rows {
		if r[notes] == "" {
			continue
		}
		if first {
			b.WriteString("\nnotes:\n")
			first = false
		}
		b.WriteString(wrap("  "+r[0]+"/"+r[1]+": "+r[notes], tableWidth, "      ") + "\n")
	}
}

// wrap breaks s at spaces into lines of at most width runes (a word
// longer than that stays whole), each line after the first starting with
// indent.
func wrap(s string, width int, indent string) string {
	var b strings.Builder
	line := 0
	for i, word := range strings.Split(s, " ") {
		n := utf8.RuneCountInString(word)
		switch {
		case i == 0:
		case line+1+n > width:
			b.WriteString("\n" + indent)
			line = utf8.RuneCountInString(indent)
		default:
			b.WriteString(" ")
			line++
		}
		b.WriteString(word)
		line += n
	}
	return b.String()
}

// rateString is how the reports name the write rate.
func rateString(r float64) string {
	if r == 0 {
		return "never"
	}
	return strconv.FormatFloat(r, 'f', -1, 64) + " versions/s"
}

// alignTable writes header and rows with aligned columns, a blank line
// between scenarios.
func alignTable(b *strings.Builder, header []string, body [][]string) {
	rows := append([][]string{header}, body...)
	width := make([]int, len(header))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for n, r := range rows {
		if n > 1 && r[0] != rows[n-1][0] {
			b.WriteString("\n")
		}
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			switch {
			case i == len(r)-1:
				b.WriteString(c)
			case i < 2:
				b.WriteString(c + pad + "  ")
			default:
				b.WriteString(pad + c + "  ")
			}
		}
		b.WriteString("\n")
	}
}

func legend(res *results) string {
	var lines []string
	if slices.ContainsFunc(res.Settings.Scenarios, func(sc string) bool { return sc != scHot }) {
		lines = append(lines, "calls/rebuild: origin calls per cold wave (cold, stall) or per rebuild episode of a key (steady, failure);"+
			" latencies are per request; follower +: latency beyond the origin call the request waited for;"+
			" redis cmd/req: commands sent (go-redis hook, pub/sub frames excluded); server cmd/req: commands the server processed; server cmd/wave, new conn/wave: commands the server processed and connections it accepted per cold wave.")
	}
	var b strings.Builder
	b.WriteString(strings.Join(lines, ""))
	if slices.Contains(res.Settings.Scenarios, scHot) {
		if len(lines) > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "hotkey (over the measured window): hit: a read that waited for no origin call;"+
			" from memory: reads answered from process memory (a near cache's hits; a strategy without one shows 0%%);"+
			" redis cmd/read: commands the workers' clients sent per read (go-redis hook); server cmd/read: commands the server processed per read, the writer's and pub/sub's included;"+
			" writes: acknowledged writes of a new version (herd: Cache.Set; the others: their SET);"+
			" stale: a read that began after the write of a newer version than the one it got had returned, by the time between the two"+
			" (judged against the writer's acknowledgements; processes share the host clock); stale p99 and max: among the stale reads.")
	}
	fmt.Fprintf(&b, "\nherd-poll: herd with pub/sub unavailable to it (SUBSCRIBE fails), PollMin = PollMax = %v. Total %.0fs.", herdPollEvery, res.Elapsed)
	if res.RedisSrc == redisEmbedded {
		fmt.Fprintf(&b, "\nEmbedded Redis: miniredis runs each Lua script (herd's and redislock's) in an interpreter under its one global lock,"+
			" so script-heavy strategies slow every command of the run; compare latencies on a real redis-server"+
			" (put redis-server on $PATH and drop -embedded, or pass -redis).")
	}
	return b.String()
}

func writeJSON(path string, res *results) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// writeMarkdown writes the command, the settings and the table.
func writeMarkdown(path string, res *results) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "```sh\n%s\n```\n\n", res.Command)
	fmt.Fprintf(&b, "%s; %d processes × %d callers; origin latency %s; %s; run %s, %.0f s.\n\n",
		res.Redis, res.Settings.Procs, res.Settings.Callers, res.Settings.OriginLatency, res.Host,
		res.Started.UTC().Format("2006-01-02 15:04 UTC"), res.Elapsed)
	main, hot := tables(res)
	mdTable := func(header []string, rows [][]string) {
		fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat("---|", len(header)))
		for _, row := range rows {
			for i := range row {
				row[i] = strings.ReplaceAll(row[i], "|", "\\|")
			}
			fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
		}
	}
	if len(main) > 0 {
		mdTable(tableHeader, main)
	}
	if len(hot) > 0 {
		if len(main) > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "hotkey: one key read by every caller, %s written by the parent (%.0f s measured):\n\n",
			rateString(res.Settings.WriteRate), res.Settings.HotDurationS)
		mdTable(hotHeader, hot)
	}
	fmt.Fprintf(&b, "\n%s\n", legend(res))
	return os.WriteFile(path, b.Bytes(), 0o644)
}
