package otel_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	herdotel "github.com/herdkit/herd/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rig is one test's OpenTelemetry pipeline: a manual metric reader and a
// span recorder behind one herd Observer, and a tracer for the test's
// own "request" spans.
type rig struct {
	reader   *sdkmetric.ManualReader
	recorder *tracetest.SpanRecorder
	tracer   trace.Tracer
	obs      *herd.Observer
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{reader: sdkmetric.NewManualReader(), recorder: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.recorder))
	t.Cleanup(func() {
		mp.Shutdown(context.Background())
		tp.Shutdown(context.Background())
	})
	r.tracer = tp.Tracer("test")
	obs, err := herdotel.NewObserver(&herdotel.Options{MeterProvider: mp, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	r.obs = obs
	return r
}

// sum adds the data points of the metric name whose attributes include
// want: a counter's values, a histogram's counts, a gauge's values.
func (r *rig) sum(t *testing.T, name string, want ...attribute.KeyValue) float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	has := func(set attribute.Set) bool {
		for _, kv := range want {
			if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
				return false
			}
		}
		return true
	}
	var total float64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if has(p.Attributes) {
						total += float64(p.Value)
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if has(p.Attributes) {
						total += float64(p.Value)
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if has(p.Attributes) {
						total += float64(p.Count)
					}
				}
			default:
				t.Fatalf("metric %s has data of type %T", name, m.Data)
			}
		}
	}
	return total
}

// ended returns the ended spans named name.
func (r *rig) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range r.recorder.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// started counts the spans named name that have started.
func (r *rig) started(name string) int {
	n := 0
	for _, s := range r.recorder.Started() {
		if s.Name() == name {
			n++
		}
	}
	return n
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// caches returns n Caches on srv, as n processes would have, reporting
// to obs with the class "user".
func caches(t *testing.T, srv *redistest.Server, n int, obs *herd.Observer) []*herd.Cache {
	t.Helper()
	out := make([]*herd.Cache, n)
	for i := range out {
		c := herd.New(srv.Client(t), &herd.Options{Observer: obs, KeyClass: func(string) string { return "user" }})
		t.Cleanup(func() { c.Close() })
		out[i] = c
	}
	return out
}

// contended reports each Cache's flight that found the lease held, on
// top of what obs does.
func contended(obs *herd.Observer) <-chan struct{} {
	ch := make(chan struct{}, 64)
	inner := obs.Lease
	obs.Lease = func(class string, ev herd.LeaseEvent) {
		inner(class, ev)
		if ev == herd.LeaseContended {
			ch <- struct{}{}
		}
	}
	return ch
}

var (
	user   = attribute.String("class", "user")
	leased = attribute.Bool("leased", true)
)

// A cold wave on one key across four Caches (four processes): one leader
// loads, the three others wait for it. The metrics count one load, one
// leader and three followers; the spans are one herd.load, a child of
// the leader's request span and the parent of the loader's own span;
// three herd.wait, each a child of its request and linked to that load;
// one stored herd.commit; all with the same herd.rebuild.
func TestColdWave(t *testing.T) {
	srv := redistest.Start(t)
	r := newRig(t)
	waiting := contended(r.obs)
	cs := caches(t, srv, 4, r.obs)
	const key = "user:42"

	entered, gate := make(chan struct{}), make(chan struct{})
	load := func(ctx context.Context) ([]byte, error) {
		close(entered)
		_, db := r.tracer.Start(ctx, "db.query")
		defer db.End()
		<-gate
		return []byte("v"), nil
	}
	type answer struct {
		val []byte
		err error
	}
	answers := make(chan answer, len(cs))
	get := func(c *herd.Cache, name string) {
		ctx, req := r.tracer.Start(context.Background(), name)
		defer req.End()
		v, err := c.Get(ctx, key, time.Minute, load)
		answers <- answer{v, err}
	}
	go get(cs[0], "request 0")
	<-entered
	for i, c := range cs[1:] {
		go get(c, "request "+strconv.Itoa(i+1))
	}
	for range cs[1:] {
		<-waiting // every other Cache waits for the leader
	}
	// and has started its herd.wait span, which links to the load only
	// while the load runs.
	deadline := time.Now().Add(10 * time.Second)
	for r.started("herd.wait") < len(cs)-1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d herd.wait spans started, want %d", r.started("herd.wait"), len(cs)-1)
		}
		time.Sleep(time.Millisecond)
	}
	close(gate)
	for range cs {
		if a := <-answers; a.err != nil || string(a.val) != "v" {
			t.Fatalf("Get = %q, %v, want v", a.val, a.err)
		}
	}

	for _, c := range []struct {
		name string
		want float64
		with []attribute.KeyValue
	}{
		{"herd.loads", 1, []attribute.KeyValue{user, leased, attribute.String("result", "ok")}},
		{"herd.load.duration", 1, []attribute.KeyValue{user}},
		{"herd.lookups", 1, []attribute.KeyValue{user, attribute.String("outcome", "leader")}},
		{"herd.lookups", 3, []attribute.KeyValue{user, attribute.String("outcome", "follower")}},
		{"herd.lookups", 4, nil},
		{"herd.lease.events", 1, []attribute.KeyValue{user, attribute.String("event", "acquired")}},
		{"herd.lease.events", 3, []attribute.KeyValue{user, attribute.String("event", "contended")}},
		{"herd.wait.duration", 3, []attribute.KeyValue{user}},
		{"herd.commits", 1, []attribute.KeyValue{user, attribute.String("result", "stored")}},
		{"herd.fail_open", 0, nil},
	} {
		if got := r.sum(t, c.name, c.with...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.with, got, c.want)
		}
	}

	loads, waits, commits := r.ended("herd.load"), r.ended("herd.wait"), r.ended("herd.commit")
	if len(loads) != 1 || len(waits) != 3 || len(commits) != 1 {
		t.Fatalf("got %d herd.load, %d herd.wait, %d herd.commit spans, want 1, 3, 1", len(loads), len(waits), len(commits))
	}
	ld := loads[0]
	requests := map[trace.SpanID]string{}
	for _, s := range r.recorder.Ended() {
		requests[s.SpanContext().SpanID()] = s.Name()
	}
	if got := requests[ld.Parent().SpanID()]; got != "request 0" {
		t.Errorf("herd.load's parent is %q, want the leader's request span", got)
	}
	if db := r.ended("db.query"); len(db) != 1 || db[0].Parent().SpanID() != ld.SpanContext().SpanID() {
		t.Errorf("the loader's span is not a child of herd.load")
	}
	rebuild := attr(ld, "herd.rebuild").AsString()
	if rebuild == "" || !attr(ld, "herd.leased").AsBool() || attr(ld, "herd.class").AsString() != "user" {
		t.Errorf("herd.load attributes %v, want herd.rebuild, herd.leased=true, herd.class=user", ld.Attributes())
	}
	for _, w := range waits {
		if p := requests[w.Parent().SpanID()]; p == "" || p == "request 0" {
			t.Errorf("herd.wait's parent is %q, want its own request span", p)
		}
		if links := w.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != ld.SpanContext().SpanID() {
			t.Errorf("herd.wait links %v, want the leader's herd.load", links)
		}
		if got := attr(w, "herd.rebuild").AsString(); got != rebuild {
			t.Errorf("herd.wait herd.rebuild = %q, want the load's %q", got, rebuild)
		}
		if end := attr(w, "herd.wait.end").AsString(); end != "notified" && end != "polled" {
			t.Errorf("herd.wait ended %q, want notified or polled", end)
		}
	}
	cm := commits[0]
	if got := attr(cm, "herd.commit.result").AsString(); got != "stored" || attr(cm, "herd.rebuild").AsString() != rebuild {
		t.Errorf("herd.commit result %q rebuild %q, want stored, %q", got, attr(cm, "herd.rebuild").AsString(), rebuild)
	}
	if requests[cm.Parent().SpanID()] != "request 0" {
		t.Errorf("herd.commit's parent is not the leader's request span")
	}
}

// A loader error: one failed load, counted as result=error, its span
// with status Error; nothing is committed; the follower in another
// Cache gets the error too.
func TestLoaderError(t *testing.T) {
	srv := redistest.Start(t)
	r := newRig(t)
	waiting := contended(r.obs)
	cs := caches(t, srv, 2, r.obs)
	boom := errors.New("origin down")
	entered, gate := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 2)
	go func() {
		_, err := cs[0].Get(context.Background(), "user:1", time.Minute, func(context.Context) ([]byte, error) {
			close(entered)
			<-gate
			return nil, boom
		})
		errs <- err
	}()
	<-entered
	go func() {
		_, err := cs[1].Get(context.Background(), "user:1", time.Minute, func(context.Context) ([]byte, error) {
			return nil, errors.New("the follower ran its loader")
		})
		errs <- err
	}()
	<-waiting
	close(gate)
	for range 2 {
		if err := <-errs; !errors.Is(err, herd.ErrLoadFailed) {
			t.Errorf("Get error %v, want ErrLoadFailed", err)
		}
	}
	if got := r.sum(t, "herd.loads", user, leased, attribute.String("result", "error")); got != 1 {
		t.Errorf("herd.loads{result=error} = %v, want 1", got)
	}
	if got := r.sum(t, "herd.commits"); got != 0 {
		t.Errorf("herd.commits = %v, want 0", got)
	}
	loads := r.ended("herd.load")
	if len(loads) != 1 {
		t.Fatalf("got %d herd.load spans, want 1", len(loads))
	}
	if st := loads[0].Status(); st.Code != codes.Error {
		t.Errorf("herd.load status %v, want Error", st)
	}
	if got := attr(loads[0], "herd.load.result").AsString(); got != "error" {
		t.Errorf("herd.load.result = %q, want error", got)
	}
	if n := len(r.ended("herd.commit")); n != 0 {
		t.Errorf("got %d herd.commit spans, want none", n)
	}
	if w := r.ended("herd.wait"); len(w) != 1 {
		t.Errorf("got %d herd.wait spans, want 1", len(w))
	}
}

// Redis down: the call loads locally without the lease. Counted as
// fail-open, a load with leased=false and a fallback lookup; its span
// says herd.leased=false and names no rebuild; nothing waits or commits.
func TestFailOpenRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	r := newRig(t)
	c := caches(t, srv, 1, r.obs)[0]
	srv.Kill(t)
	v, err := c.Get(context.Background(), "user:7", time.Minute, func(context.Context) ([]byte, error) {
		return []byte("local"), nil
	})
	if err != nil || string(v) != "local" {
		t.Fatalf("Get = %q, %v, want local", v, err)
	}
	for _, c := range []struct {
		name string
		want float64
		with []attribute.KeyValue
	}{
		{"herd.fail_open", 1, []attribute.KeyValue{user}},
		{"herd.loads", 1, []attribute.KeyValue{user, attribute.Bool("leased", false), attribute.String("result", "ok")}},
		{"herd.lookups", 1, []attribute.KeyValue{user, attribute.String("outcome", "fallback")}},
		{"herd.commits", 0, nil},
	} {
		if got := r.sum(t, c.name, c.with...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.with, got, c.want)
		}
	}
	loads := r.ended("herd.load")
	if len(loads) != 1 {
		t.Fatalf("got %d herd.load spans, want 1", len(loads))
	}
	if attr(loads[0], "herd.leased").AsBool() || attr(loads[0], "herd.rebuild").AsString() != "" {
		t.Errorf("herd.load attributes %v, want herd.leased=false and no herd.rebuild", loads[0].Attributes())
	}
	if n := len(r.ended("herd.wait")) + len(r.ended("herd.commit")); n != 0 {
		t.Errorf("got %d herd.wait or herd.commit spans, want none", n)
	}
}

// NoSpans leaves herd's Start hooks unset: metrics only.
func TestNoSpans(t *testing.T) {
	obs, err := herdotel.NewObserver(&herdotel.Options{NoSpans: true,
		MeterProvider: sdkmetric.NewMeterProvider(), TracerProvider: sdktrace.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	if obs.StartLoad != nil || obs.StartWait != nil || obs.StartCommit != nil || obs.Lookup == nil {
		t.Errorf("NoSpans: Start hooks set or metrics missing")
	}
}

// With RetryFailedLoad, the follower of a failed load retries with a new
// leader: herd.load.retries counts it once, and its own load is a second
// herd.loads, ok this time.
func TestLoadRetry(t *testing.T) {
	srv := redistest.Start(t)
	r := newRig(t)
	waiting := contended(r.obs)
	cs := make([]*herd.Cache, 2)
	for i := range cs {
		cs[i] = herd.New(srv.Client(t), &herd.Options{Observer: r.obs, RetryFailedLoad: true,
			KeyClass: func(string) string { return "user" }})
		t.Cleanup(func() { cs[i].Close() })
	}
	entered, gate := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 2)
	go func() {
		_, err := cs[0].Get(context.Background(), "user:1", time.Minute, func(context.Context) ([]byte, error) {
			close(entered)
			<-gate
			return nil, errors.New("origin reset the connection")
		})
		errs <- err
	}()
	<-entered
	go func() {
		_, err := cs[1].Get(context.Background(), "user:1", time.Minute, func(context.Context) ([]byte, error) {
			return []byte("v"), nil
		})
		errs <- err
	}()
	<-waiting
	close(gate)
	if err := <-errs; !errors.Is(err, herd.ErrLoadFailed) {
		t.Errorf("leader: %v, want ErrLoadFailed", err)
	}
	if err := <-errs; err != nil {
		t.Errorf("follower: %v, want the retry's value", err)
	}
	if got := r.sum(t, "herd.load.retries", user); got != 1 {
		t.Errorf("herd.load.retries = %v, want 1", got)
	}
	for _, res := range []string{"error", "ok"} {
		if got := r.sum(t, "herd.loads", user, leased, attribute.String("result", res)); got != 1 {
			t.Errorf("herd.loads{result=%s} = %v, want 1", res, got)
		}
	}
}
