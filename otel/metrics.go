package otel

import (
	"context"
	"errors"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/observe"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// durationBuckets are those of the Prometheus adapter: sub-millisecond
// waits to multi-second rebuilds, in seconds.
var durationBuckets = []float64{
	.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60,
}

// instruments are herd's metrics on one Meter.
type instruments struct {
	lookups, loads, retries, leases, commits, circuitTrans, failOpen, corrupt, refreshes metric.Int64Counter
	loadDur, waitDur                                                                     metric.Float64Histogram
	circuitOpen                                                                          metric.Int64Gauge
	classes                                                                              *observe.Classes
}

func newInstruments(m metric.Meter, cls *observe.Classes) (*instruments, error) {
	in := &instruments{classes: cls}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		errs = append(errs, err)
		return h
	}
	in.lookups = counter("herd.lookups", "{call}", "Calls by how they were served.")
	in.loads = counter("herd.loads", "{load}", "Loader runs (origin calls) by result; leased=false means fail-open or fallback.")
	in.retries = counter("herd.load.retries", "{flight}", "Follower flights that retried a failed leader's load with a new leader.")
	in.loadDur = histogram("herd.load.duration", "Loader run time.")
	in.leases = counter("herd.lease.events", "{event}", "Lease events.")
	in.waitDur = histogram("herd.wait.duration", "Waits of a flight for another process's rebuild, by how they ended.")
	in.commits = counter("herd.commits", "{commit}", "Leader writes by result; fenced counts duplicate or stale rebuilds.")
	var err error
	in.circuitOpen, err = m.Int64Gauge("herd.circuit.open", metric.WithUnit("1"),
		metric.WithDescription("1 while the Redis circuit breaker is open."))
	errs = append(errs, err)
	in.circuitTrans = counter("herd.circuit.transitions", "{transition}", "Circuit breaker transitions.")
	in.failOpen = counter("herd.fail_open", "{call}", "Calls served by a local load because Redis was unreachable.")
	in.corrupt = counter("herd.corrupt_values", "{value}", "Unreadable bytes at a value key, read as a miss.")
	in.refreshes = counter("herd.refreshes", "{event}", "Background refresh events.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return in, nil
}

// Measurements are made with context.Background(): the Observer's
// metric callbacks carry no context, and herd's signals are not tied to
// one caller (exemplars, which need a span in the context, are not
// recorded).

func (in *instruments) lookup(class string, o herd.Outcome) {
	in.lookups.Add(context.Background(), 1, metric.WithAttributes(
		attribute.String("class", in.classes.Name(class)), attribute.String("outcome", o.String())))
}

func (in *instruments) load(class string, d time.Duration, err error, leased bool) {
	ctx, c := context.Background(), attribute.String("class", in.classes.Name(class))
	in.loads.Add(ctx, 1, metric.WithAttributes(c, attribute.String("result", observe.LoadResult(err)), attribute.Bool("leased", leased)))
	in.loadDur.Record(ctx, d.Seconds(), metric.WithAttributes(c))
}

func (in *instruments) loadRetry(class string) {
	in.retries.Add(context.Background(), 1, metric.WithAttributes(attribute.String("class", in.classes.Name(class))))
}

func (in *instruments) lease(class string, ev herd.LeaseEvent) {
	in.leases.Add(context.Background(), 1, metric.WithAttributes(
		attribute.String("class", in.classes.Name(class)), attribute.String("event", ev.String())))
}

func (in *instruments) wait(class string, d time.Duration, end herd.WaitEnd) {
	in.waitDur.Record(context.Background(), d.Seconds(), metric.WithAttributes(
		attribute.String("class", in.classes.Name(class)), attribute.String("end", end.String())))
}

func (in *instruments) commit(class string, r herd.CommitResult) {
	in.commits.Add(context.Background(), 1, metric.WithAttributes(
		attribute.String("class", in.classes.Name(class)), attribute.String("result", r.String())))
}

func (in *instruments) circuit(open bool) {
	ctx, state, v := context.Background(), "closed", int64(0)
	if open {
		state, v = "open", 1
	}
	in.circuitOpen.Record(ctx, v)
	in.circuitTrans.Add(ctx, 1, metric.WithAttributes(attribute.String("state", state)))
}

func (in *instruments) failedOpen(class string) {
	in.failOpen.Add(context.Background(), 1, metric.WithAttributes(attribute.String("class", in.classes.Name(class))))
}

func (in *instruments) corrupted(class string) {
	in.corrupt.Add(context.Background(), 1, metric.WithAttributes(attribute.String("class", in.classes.Name(class))))
}

func (in *instruments) refresh(class string, ev herd.RefreshEvent) {
	in.refreshes.Add(context.Background(), 1, metric.WithAttributes(
		attribute.String("class", in.classes.Name(class)), attribute.String("event", ev.String())))
}
