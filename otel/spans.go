package otel

import (
	"context"
	"sync"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/observe"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// spans starts herd's spans on one Tracer.
type spans struct {
	tracer trace.Tracer
}

// leaders maps the rebuild name of each leased load in progress in this
// process, whichever Observer of this package reports it, to its span's
// context, so that a wait in this process for that rebuild links to it.
// An entry lives from StartLoad to the load's end.
// The values are pointers, which CompareAndDelete can compare (a
// SpanContext holds a slice).
var leaders sync.Map // string → *trace.SpanContext

func stepAttributes(st herd.Step) []attribute.KeyValue {
	class := st.Class
	if class == "" {
		class = "default"
	}
	attrs := []attribute.KeyValue{attribute.String("herd.class", class)}
	if st.Rebuild != "" {
		attrs = append(attrs, attribute.String("herd.rebuild", st.Rebuild))
	}
	return attrs
}

// load starts a herd.load span under the span in ctx (the Get that
// started the flight) and lends the loader a context that carries only
// that span: the caller's other values belong to that caller, not to
// the shared rebuild.
func (s *spans) load(ctx context.Context, st herd.Step) (context.Context, func(error)) {
	attrs := append(stepAttributes(st), attribute.Bool("herd.leased", st.Leased))
	_, span := s.tracer.Start(ctx, "herd.load", trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	var registered *trace.SpanContext
	if sc := span.SpanContext(); st.Leased && st.Rebuild != "" && sc.IsValid() {
		registered = &sc
		leaders.Store(st.Rebuild, registered)
	}
	return trace.ContextWithSpan(context.Background(), span), func(err error) {
		if registered != nil {
			leaders.CompareAndDelete(st.Rebuild, registered)
		}
		res := observe.LoadResult(err)
		span.SetAttributes(attribute.String("herd.load.result", res))
		if res == "error" || res == "panic" {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// wait starts a herd.wait span, linked to the leader's herd.load span
// when that load runs in this process.
func (s *spans) wait(ctx context.Context, st herd.Step) func(herd.WaitEnd) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(stepAttributes(st)...)}
	if st.Rebuild != "" {
		if sc, ok := leaders.Load(st.Rebuild); ok {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: *sc.(*trace.SpanContext)}))
		}
	}
	_, span := s.tracer.Start(ctx, "herd.wait", opts...)
	return func(end herd.WaitEnd) {
		span.SetAttributes(attribute.String("herd.wait.end", end.String()))
		if end == herd.WaitTimeout {
			span.SetStatus(codes.Error, "herd: the wait budget was spent; the fallback applied")
		}
		span.End()
	}
}

// commit starts a herd.commit span.
func (s *spans) commit(ctx context.Context, st herd.Step) func(herd.CommitResult) {
	_, span := s.tracer.Start(ctx, "herd.commit", trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(stepAttributes(st)...))
	return func(r herd.CommitResult) {
		span.SetAttributes(attribute.String("herd.commit.result", r.String()))
		if r == herd.CommitError {
			span.SetStatus(codes.Error, "herd: the commit failed; the value was returned but not stored")
		}
		span.End()
	}
}
