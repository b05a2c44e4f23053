package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
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
	"redis cmd/req", "server cmd/req", "errors", "notes",
}

func tableRow(pr *phaseResult) []string {
	f := func(x float64) string {
		switch {
		case x >= 100:
			return fmt.Sprintf("%.0f", x)
		case x >= 10:
			return fmt.Sprintf("%.1f", x)
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
	return []string{
		pr.Scenario, pr.Strategy, fmt.Sprint(pr.Requests), fmt.Sprint(pr.OriginCalls),
		f(pr.CallsPerRebuild), fmt.Sprint(pr.MaxPerRebuild), fmt.Sprint(pr.PeakConcurrency),
		f(pr.Latency.P50), f(pr.Latency.P99), f(pr.Latency.P999), f(pr.Latency.Max),
		added(pr.Added.P50), added(pr.Added.P99),
		f(pr.CmdsPerReq), srv, fmt.Sprint(pr.Errors), pr.Notes,
	}
}

// writeTable prints the aligned table, one row per strategy per scenario.
func writeTable(w io.Writer, res *results) error {
	fmt.Fprintf(w, "herd stampede benchmark: %d processes × %d callers, origin latency %s, %s\n",
		res.Settings.Procs, res.Settings.Callers, res.Settings.OriginLatency, res.Redis)
	rows := [][]string{tableHeader}
	for _, pr := range res.Phases {
		rows = append(rows, tableRow(pr))
	}
	width := make([]int, len(tableHeader))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
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
	b.WriteString(legend(res) + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func legend(res *results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "calls/rebuild: origin calls per cold wave (cold, stall) or per rebuild episode of a key (steady, failure);")
	fmt.Fprintf(&b, " latencies are per request; follower +: latency beyond the origin call the request waited for;")
	fmt.Fprintf(&b, " redis cmd/req: commands sent (go-redis hook, pub/sub frames excluded); server cmd/req: commands the server processed.")
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
	fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(tableHeader, " | "), strings.Repeat("---|", len(tableHeader)))
	for _, pr := range res.Phases {
		row := tableRow(pr)
		for i := range row {
			row[i] = strings.ReplaceAll(row[i], "|", "\\|")
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintf(&b, "\n%s\n", legend(res))
	return os.WriteFile(path, b.Bytes(), 0o644)
}
