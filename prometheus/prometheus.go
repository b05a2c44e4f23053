// Package prometheus exports herd's signals as Prometheus metrics.
//
//	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
//	obs := herdprom.NewObserver(reg, nil)
//	cache := herd.New(rdb, &herd.Options{Observer: obs, KeyClass: classOf})
//
// Every metric is prefixed herd_. Labels are bounded: the key class
// ([herd.Options.KeyClass], "" shown as "default"), the outcome or event
// name, never a raw key; classes beyond [Options.MaxClasses] are reported
// as "other". Duration histograms have buckets from 100µs (a hit-path
// wait) to 60s (a long rebuild).
//
// The metrics:
//
//	herd_lookups_total{class,outcome}           how calls were served: hit, stale, early-refresh, negative, leader, follower, fallback, pass
//	herd_loads_total{class,result,leased}       loader runs: result ok, not_found, not_shared, error, panic; leased false = fail-open or fallback
//	herd_load_duration_seconds{class}           loader run time (histogram)
//	herd_load_retries_total{class}              followers that retried a failed leader's load (RetryFailedLoad, NoShare)
//	herd_lease_events_total{class,event}        acquired, contended, taken_over, lost, extended, extend_failed
//	herd_wait_duration_seconds{class,end}       waits for another process's rebuild, by how they ended: notified, polled, takeover, timeout, cancelled (histogram)
//	herd_commits_total{class,result}            stored, fenced (the duplicate-rebuild signal), error, unreplicated (on the master, not confirmed on its replicas)
//	herd_circuit_open                           1 while the Redis circuit breaker is open
//	herd_circuit_transitions_total{state}       open, closed
//	herd_fail_open_total{class}                 calls served by a local load because Redis was unreachable
//	herd_corrupt_values_total{class}            unreadable bytes at a value key (read as a miss)
//	herd_refreshes_total{class,event}           background refreshes: started, dropped, failed, skipped
//
// Reading them (each mirrors a field of [herd.Stats]; docs/design.md,
// "Metrics: one name per count", has the table):
//
//   - outcome="leader" counts rebuilds, not callers: of the callers of one
//     rebuild in a process one is the leader and the others followers. A
//     leader's rebuild is one herd_loads_total with leased="true", whatever
//     its result, except one handed over ([herd.Fill.Handover]: an HTTP
//     client that went away; or a Begin caller that left before it got
//     its Fill), which has none. A background refresh is a load without
//     a lookup.
//   - result="not_shared" is a rebuild whose value was not for sharing
//     (the HTTP middleware's responses that set a cookie, are private,
//     streamed or too large): no failure, and not in result="error".
//   - outcome="pass" is a lookup that found a pass mark ([herd.Fill.Pass],
//     the HTTP middleware's hit-for-miss): the caller built its own value
//     at once, without waiting.
//   - outcome="follower" is a call that waited for another caller's
//     rebuild, in this process or in another; its reading of the rebuilt
//     value is not a hit. [herd.Stats].Follows counts the same calls;
//     herd_wait_duration_seconds counts [herd.Stats].Waits, the flights
//     that waited for another process.
//
// [NewBypassCounter] adds herd_http_bypasses_total{reason} for the HTTP
// middleware: the requests it served without a lookup, or, for
// reason="hit_for_miss", after a lookup found the URL marked.
//
// dashboard.json, next to this package's source, is a Grafana dashboard
// of these metrics (lookup mix, load latency, lock wait time, lease
// contention and renewal failures, fenced commits and takeovers, circuit
// state and fail-open loads); a test checks that its queries name only
// metrics this package registers.
package prometheus

import (
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/observe"
	prom "github.com/prometheus/client_golang/prometheus"
)

// Options configures [NewObserver]. A nil *Options means the defaults.
type Options struct {
	// Namespace replaces the "herd" prefix of every metric name.
	Namespace string
	// ConstLabels are added to every metric (for example the service).
	ConstLabels prom.Labels
	// MaxClasses bounds the distinct class label values; later classes
	// are reported as "other". Default: 100.
	MaxClasses int
}

// durationBuckets span sub-millisecond waits to multi-second rebuilds.
var durationBuckets = []float64{
	.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60,
}

// NewObserver registers herd's metrics on reg and returns the Observer
// that feeds them. It panics if the metrics cannot be registered (for
// example registered twice on one registry with the same Namespace and
// ConstLabels), as prometheus.MustRegister does.
func NewObserver(reg prom.Registerer, opt *Options) *herd.Observer {
	var o Options
	if opt != nil {
		o = *opt
	}
	if o.Namespace == "" {
		o.Namespace = "herd"
	}
	if o.MaxClasses <= 0 {
		o.MaxClasses = 100
	}
	m := &metrics{classes: observe.NewClasses(o.MaxClasses)}
	counter := func(name, help string, labels ...string) *prom.CounterVec {
		return prom.NewCounterVec(prom.CounterOpts{Namespace: o.Namespace, Name: name, Help: help, ConstLabels: o.ConstLabels}, labels)
	}
	histogram := func(name, help string, labels ...string) *prom.HistogramVec {
		return prom.NewHistogramVec(prom.HistogramOpts{Namespace: o.Namespace, Name: name, Help: help, ConstLabels: o.ConstLabels, Buckets: durationBuckets}, labels)
	}
	m.lookups = counter("lookups_total", "Calls by how they were served.", "class", "outcome")
	m.loads = counter("loads_total", "Loader runs (origin calls) by result; leased=false means fail-open or fallback.", "class", "result", "leased")
	m.retries = counter("load_retries_total", "Follower flights that retried a failed leader's load with a new leader.", "class")
	m.loadDur = histogram("load_duration_seconds", "Loader run time.", "class")
	m.leases = counter("lease_events_total", "Lease events.", "class", "event")
	m.waits = histogram("wait_duration_seconds", "Waits of a flight for another process's rebuild, by how they ended.", "class", "end")
	m.commits = counter("commits_total", "Leader writes by result; fenced counts duplicate or stale rebuilds.", "class", "result")
	m.circuitOpen = prom.NewGauge(prom.GaugeOpts{Namespace: o.Namespace, Name: "circuit_open", Help: "1 while the Redis circuit breaker is open.", ConstLabels: o.ConstLabels})
	m.circuitTrans = counter("circuit_transitions_total", "Circuit breaker transitions.", "state")
	m.failOpen = counter("fail_open_total", "Calls served by a local load because Redis was unreachable.", "class")
	m.corrupt = counter("corrupt_values_total", "Unreadable bytes at a value key, read as a miss.", "class")
	m.refreshes = counter("refreshes_total", "Background refresh events.", "class", "event")
	reg.MustRegister(m.lookups, m.loads, m.retries, m.loadDur, m.leases, m.waits, m.commits,
		m.circuitOpen, m.circuitTrans, m.failOpen, m.corrupt, m.refreshes)

	return &herd.Observer{
		Lookup: func(class string, out herd.Outcome) {
			m.lookups.WithLabelValues(m.classes.Name(class), out.String()).Inc()
		},
		Load: func(class string, d time.Duration, err error, leased bool) {
			c := m.classes.Name(class)
			m.loads.WithLabelValues(c, observe.LoadResult(err), boolLabel(leased)).Inc()
			m.loadDur.WithLabelValues(c).Observe(d.Seconds())
		},
		LoadRetry: func(class string) { m.retries.WithLabelValues(m.classes.Name(class)).Inc() },
		Lease: func(class string, ev herd.LeaseEvent) {
			m.leases.WithLabelValues(m.classes.Name(class), ev.String()).Inc()
		},
		Wait: func(class string, d time.Duration, end herd.WaitEnd) {
			m.waits.WithLabelValues(m.classes.Name(class), end.String()).Observe(d.Seconds())
		},
		Commit: func(class string, r herd.CommitResult) {
			m.commits.WithLabelValues(m.classes.Name(class), r.String()).Inc()
		},
		Circuit: func(open bool) {
			if open {
				m.circuitOpen.Set(1)
				m.circuitTrans.WithLabelValues("open").Inc()
			} else {
				m.circuitOpen.Set(0)
				m.circuitTrans.WithLabelValues("closed").Inc()
			}
		},
		FailOpen: func(class string) { m.failOpen.WithLabelValues(m.classes.Name(class)).Inc() },
		Corrupt:  func(class string) { m.corrupt.WithLabelValues(m.classes.Name(class)).Inc() },
		Refresh: func(class string, ev herd.RefreshEvent) {
			m.refreshes.WithLabelValues(m.classes.Name(class), ev.String()).Inc()
		},
	}
}

type metrics struct {
	lookups, loads, retries, leases, commits, circuitTrans, failOpen, corrupt, refreshes *prom.CounterVec
	loadDur, waits                                                                       *prom.HistogramVec
	circuitOpen                                                                          prom.Gauge

	classes *observe.Classes // the class label's bound
}

func boolLabel(b bool) string {
	if b {
		return "true"
	}
	return "false"
}
