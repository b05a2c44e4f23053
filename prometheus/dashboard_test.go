package prometheus_test

import (
	_ "embed"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd"
	herdprom "github.com/herdkit/herd/prometheus"
	prom "github.com/prometheus/client_golang/prometheus"
)

//go:embed dashboard.json
var dashboardJSON []byte

// registered returns the names of every series the adapter can export:
// each Observer signal and the bypass counter are fed once, so that every
// vector has a child; a histogram's series are its _bucket, _sum and
// _count (its bare name is none).
func registered(t *testing.T) map[string]bool {
	t.Helper()
	reg := prom.NewRegistry()
	obs := herdprom.NewObserver(reg, nil)
	obs.Lookup("c", herd.OutcomeHit)
	obs.Load("c", time.Millisecond, errors.New("x"), true)
	obs.LoadRetry("c")
	obs.Lease("c", herd.LeaseContended)
	obs.Wait("c", time.Millisecond, herd.WaitNotified)
	obs.Commit("c", herd.CommitFenced)
	obs.Circuit(true)
	obs.FailOpen("c")
	obs.Corrupt("c")
	obs.Refresh("c", herd.RefreshStarted)
	herdprom.NewBypassCounter(reg, nil)(httptest.NewRequest("POST", "/", nil), "method")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetType().String() != "HISTOGRAM" {
			names[mf.GetName()] = true
			continue
		}
		// A histogram has no series of its bare name.
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			names[mf.GetName()+s] = true
		}
	}
	if len(names) < 12 {
		t.Fatalf("gathered only %v: a signal was not fed", names)
	}
	return names
}

var (
	promqlStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promqlRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlVars     = regexp.MustCompile(`\$\{?\w+\}?`)
	promqlIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	promqlKeywords = map[string]bool{"by": true, "without": true, "and": true, "or": true, "unless": true,
		"offset": true, "bool": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// metricNames returns the metric names a PromQL expression selects: the
// identifiers left once strings, label matchers, ranges, grouping
// clauses and dashboard variables are removed, other than functions
// (followed by a parenthesis), keywords and numbers.
func metricNames(expr string) []string {
	e := promqlStrings.ReplaceAllString(expr, `""`)
	e = promqlMatchers.ReplaceAllString(e, " ")
	e = promqlRanges.ReplaceAllString(e, " ")
	e = promqlGrouping.ReplaceAllString(e, " ")
	e = promqlVars.ReplaceAllString(e, " ")
	var names []string
	for _, m := range promqlIdent.FindAllStringSubmatch(e, -1) {
		id := strings.TrimSpace(strings.TrimSuffix(m[0], "("))
		if m[1] != "" || promqlKeywords[strings.ToLower(id)] {
			continue
		}
		names = append(names, id)
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`sum by (outcome) (rate(herd_lookups_total{class=~"$class"}[$__rate_interval]))`, []string{"herd_lookups_total"}},
		{`histogram_quantile(0.99, sum by (le, class) (rate(herd_wait_duration_seconds_bucket[5m])))`, []string{"herd_wait_duration_seconds_bucket"}},
		{`sum(rate(a_total{x="by (y)"}[1m])) / sum(rate(b_total[1m])) > 0.5`, []string{"a_total", "b_total"}},
		{`max by (instance) (herd_circuit_open) or on(instance) vector(0)`, []string{"herd_circuit_open"}},
	} {
		if got := metricNames(c.expr); !slices.Equal(got, c.want) {
			t.Errorf("metricNames(%s) = %v, want %v", c.expr, got, c.want)
		}
	}
}

type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

var labelValues = regexp.MustCompile(`^label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*\w+\s*\)$`)

// Every PromQL expression of the dashboard names only metrics the
// adapter registers, and names at least one: a panel on a metric that
// was renamed or never existed fails here, not on an operator's screen.
func TestDashboardNamesOnlyRegisteredMetrics(t *testing.T) {
	names := registered(t)
	var d dashboard
	if err := json.Unmarshal(dashboardJSON, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	used := map[string]bool{}
	exprs := 0
	for _, p := range d.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs++
			ms := metricNames(tg.Expr)
			if len(ms) == 0 {
				t.Errorf("panel %q: %s names no metric", p.Title, tg.Expr)
			}
			for _, m := range ms {
				used[m] = true
				if !names[m] {
					t.Errorf("panel %q: %s names %s, which the adapter does not register", p.Title, tg.Expr, m)
				}
			}
		}
	}
	for _, v := range d.Templating.List {
		var q struct {
			Query string `json:"query"`
		}
		if len(v.Query) == 0 || v.Query[0] != '{' || json.Unmarshal(v.Query, &q) != nil || q.Query == "" {
			continue // the data source variable
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil || !names[m[1]] {
			t.Errorf("variable %s: query %s does not read a registered metric", v.Name, q.Query)
		}
	}
	if exprs < 20 {
		t.Errorf("the dashboard has %d expressions; its panels were lost", exprs)
	}
	// The panels the dashboard promises read these series.
	for _, m := range []string{"herd_wait_duration_seconds_bucket", "herd_lease_events_total", "herd_commits_total",
		"herd_circuit_open", "herd_fail_open_total", "herd_lookups_total", "herd_load_duration_seconds_bucket"} {
		if !used[m] {
			t.Errorf("no panel reads %s", m)
		}
	}
}

// TestDashboardHistogramBaseName: the dashboard test must fail on
// a query of a series Prometheus never has. A histogram exports only its
// _bucket, _sum and _count series, so a panel on the bare name (say
// rate(herd_load_duration_seconds[5m])) shows nothing; the set the test
// checks names against must not hold it.
func TestDashboardHistogramBaseName(t *testing.T) {
	names := registered(t)
	for _, m := range []string{"herd_load_duration_seconds", "herd_wait_duration_seconds"} {
		if !names[m+"_bucket"] {
			t.Fatalf("%s_bucket not registered: the histogram was renamed", m)
		}
		if names[m] {
			t.Errorf("a query of %s (a histogram's bare name, no such series) would pass the dashboard test", m)
		}
	}
}
