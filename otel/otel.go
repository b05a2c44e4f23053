// Package otel exports herd's signals through OpenTelemetry: metrics on
// a [metric.MeterProvider] and spans on a [trace.TracerProvider].
//
//	obs, err := herdotel.NewObserver(nil) // the global providers
//	if err != nil { ... }
//	cache := herd.New(rdb, &herd.Options{Observer: obs, KeyClass: classOf})
//
// It is its own module (github.com/herdkit/herd/otel), so programs that
// use herd without it do not depend on OpenTelemetry.
//
// # Metrics
//
// The metrics are those of the Prometheus adapter
// (github.com/herdkit/herd/prometheus), named in OpenTelemetry's style;
// an OpenTelemetry Prometheus exporter turns them back into the same
// names (herd.lookups becomes herd_lookups_total). Attributes are
// bounded: class ([herd.Options.KeyClass], "" reported as "default";
// classes beyond [Options.MaxClasses] as "other") and the outcome or
// event name, never a raw key.
//
//	herd.lookups{class,outcome}          how calls were served: hit, stale, early-refresh, negative, leader, follower, fallback, pass
//	herd.loads{class,result,leased}      loader runs: result ok, not_found, not_shared, error, panic; leased false = fail-open or fallback
//	herd.load.duration{class}            loader run time, seconds (histogram)
//	herd.load.retries{class}             followers that retried a failed leader's load (RetryFailedLoad, NoShare)
//	herd.lease.events{class,event}       acquired, contended, taken_over, lost, extended, extend_failed
//	herd.wait.duration{class,end}        waits for another process's rebuild, by how they ended: notified, polled, takeover, timeout, cancelled (seconds, histogram)
//	herd.commits{class,result}           stored, fenced (the duplicate-rebuild signal), error, unreplicated
//	herd.circuit.open                    1 while the Redis circuit breaker is open (gauge)
//	herd.circuit.transitions{state}      open, closed
//	herd.fail_open{class}                calls served by a local load because Redis was unreachable
//	herd.corrupt_values{class}           unreadable bytes at a value key (read as a miss)
//	herd.refreshes{class,event}          background refreshes: started, dropped, failed, skipped
//
// The package documentation of the Prometheus adapter says how to read
// them. [NewBypassCounter] adds herd.http.bypasses{reason} for the HTTP
// middleware.
//
// # Spans
//
// Three kinds of span, from [herd.Observer.StartLoad],
// [herd.Observer.StartWait] and [herd.Observer.StartCommit]:
//
//   - herd.load: a loader run, by the leader of a rebuild or by a caller
//     that loads without the lease (herd.leased=false: fail-open, or a
//     fallback after the wait budget). Its parent is the span in the
//     context of the Get that started the flight; the loader's context
//     carries it (and only it), so spans the loader starts are its
//     children. A failed load has status Error; ErrNotFound and a value
//     not for sharing are no failure.
//   - herd.wait: a follower's wait for a rebuild by another process (or
//     another Cache), with herd.wait.end. When the leader runs in the
//     same process and reports to this package, the span links to the
//     leader's herd.load span.
//   - herd.commit: a leader's write, with herd.commit.result (stored,
//     fenced, error, unreplicated; error has status Error).
//
// Every span has herd.class and herd.rebuild, the rebuild's name
// ([herd.Step.Rebuild]: the key's hash tag, as in its Redis key names,
// and the leader's fencing token). A wait in another process carries the
// same herd.rebuild as the load it waits for: a trace search on it finds
// that load, where a link cannot reach (the leader's span context is not
// sent through Redis).
//
// The loads of Begin's Fills (the HTTP middleware builds those values
// itself) and of GetMany's batch loaders have no herd.load span; their
// commits have herd.commit spans. Callers served from the cache (hits,
// stale hits) and the followers in
// the leader's own process have no span of herd's: they are counted in
// herd.lookups.
package otel

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/observe"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// scope is the instrumentation scope name of the Meter and the Tracer.
const scope = "github.com/herdkit/herd/otel"

// Options configures [NewObserver]. A nil *Options means the defaults.
type Options struct {
	// MeterProvider receives the metrics. Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider

	// TracerProvider receives the spans. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider

	// NoSpans turns the spans off: the Observer reports metrics only,
	// and herd calls no Start hook.
	NoSpans bool

	// MaxClasses bounds the distinct values of the class attribute of
	// the metrics; later classes are reported as "other". Default: 100.
	MaxClasses int
}

// NewObserver returns the Observer that reports herd's signals as
// metrics and spans. Its error is the Meter's, when an instrument cannot
// be created. The Observer is safe for concurrent use, and may serve
// several Caches and Lockers.
func NewObserver(opt *Options) (*herd.Observer, error) {
	var o Options
	if opt != nil {
		o = *opt
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.MaxClasses <= 0 {
		o.MaxClasses = 100
	}
	cls := observe.NewClasses(o.MaxClasses)
	in, err := newInstruments(o.MeterProvider.Meter(scope), cls)
	if err != nil {
		return nil, err
	}
	obs := &herd.Observer{
		Lookup:    in.lookup,
		Load:      in.load,
		LoadRetry: in.loadRetry,
		Lease:     in.lease,
		Wait:      in.wait,
		Commit:    in.commit,
		Circuit:   in.circuit,
		FailOpen:  in.failedOpen,
		Corrupt:   in.corrupted,
		Refresh:   in.refresh,
	}
	if !o.NoSpans {
		sp := &spans{tracer: o.TracerProvider.Tracer(scope)}
		obs.StartLoad, obs.StartWait, obs.StartCommit = sp.load, sp.wait, sp.commit
	}
	return obs, nil
}

// NewBypassCounter returns the function that counts the HTTP
// middleware's bypasses as herd.http.bypasses{reason}, for its OnBypass,
// as the Prometheus adapter's NewBypassCounter does: reasons beyond the
// first 64 distinct ones are counted as "other". A nil mp means
// otel.GetMeterProvider(). Its error is the Meter's. The function is
// safe for concurrent use.
func NewBypassCounter(mp metric.MeterProvider) (func(r *http.Request, reason string), error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	c, err := mp.Meter(scope).Int64Counter("herd.http.bypasses", metric.WithUnit("{request}"),
		metric.WithDescription("HTTP requests the middleware served without a lookup, or after finding the URL's hit-for-miss mark, by reason."))
	if err != nil {
		return nil, err
	}
	var (
		mu      sync.Mutex
		reasons = map[string]metric.MeasurementOption{}
	)
	return func(r *http.Request, reason string) {
		if !utf8.ValidString(reason) {
			reason = strings.ToValidUTF8(reason, "\uFFFD")
		}
		mu.Lock()
		attrs, ok := reasons[reason]
		if !ok {
			if len(reasons) >= 64 {
				reason = "other"
			}
			attrs = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", reason)))
			if reason != "other" {
				reasons[reason] = attrs
			}
		}
		mu.Unlock()
		ctx := context.Background()
		if r != nil {
			ctx = r.Context()
		}
		c.Add(ctx, 1, attrs)
	}, nil
}
