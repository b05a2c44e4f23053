package otel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	"go.opentelemetry.io/otel/attribute"
)

// TestMetricsAgreeWithStats: for one run of mixed traffic (a
// load, hits, a loader error, a not-found, a not-shared load, Fills
// committed, passed and aborted, a Set racing a rebuild, a fail-open
// load), the OTel counters equal the Cache's Stats.
func TestMetricsAgreeWithStats(t *testing.T) {
	srv := redistest.Start(t)
	r := newRig(t)
	c := caches(t, srv, 1, r.obs)[0]
	ctx := context.Background()
	val := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	for range 3 {
		if _, err := c.Get(ctx, "user:1", time.Minute, val); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = c.Get(ctx, "user:2", time.Minute, func(context.Context) ([]byte, error) { return nil, errors.New("boom") })
	_, _ = c.Get(ctx, "user:3", time.Minute, func(context.Context) ([]byte, error) { return nil, herd.ErrNotFound })
	_, _ = c.Get(ctx, "user:4", time.Minute, func(context.Context) ([]byte, error) { return []byte("x"), herd.ErrNotShared })
	_, _ = c.Get(ctx, "user:5", time.Minute, func(context.Context) ([]byte, error) { panic("boom") })
	// A Set while the rebuild runs: the commit is fenced.
	_, _ = c.Get(ctx, "user:6", time.Minute, func(context.Context) ([]byte, error) {
		if err := c.Set(ctx, "user:6", []byte("set"), time.Minute); err != nil {
			t.Error(err)
		}
		return []byte("old"), nil
	})
	for i, end := range []string{"commit", "pass", "abort"} {
		_, fill, err := c.Begin(ctx, "user:fill"+string(rune('a'+i)), time.Minute, nil)
		if err != nil || fill == nil {
			t.Fatalf("Begin: %v %v", fill, err)
		}
		switch end {
		case "commit":
			err = fill.Commit([]byte("f"), time.Minute, 0)
		case "pass":
			err = fill.Pass(errors.New("private"), time.Minute)
		case "abort":
			fill.Abort(errors.New("no"))
		}
		if err != nil {
			t.Fatalf("%s: %v", end, err)
		}
	}
	srv.Kill(t)
	_, _ = c.Get(ctx, "user:7", time.Minute, val)

	st := c.Stats()
	user := attribute.String("class", "user")
	for _, k := range []struct {
		name string
		with []attribute.KeyValue
		want uint64
	}{
		{"herd.loads", []attribute.KeyValue{user, attribute.Bool("leased", true)}, st.Loads},
		{"herd.loads", []attribute.KeyValue{user, attribute.Bool("leased", false)}, st.LocalLoads},
		{"herd.loads", []attribute.KeyValue{user, attribute.String("result", "not_shared")}, st.NotShared},
		{"herd.commits", []attribute.KeyValue{user, attribute.String("result", "fenced")}, st.Fenced},
		{"herd.commits", []attribute.KeyValue{user, attribute.String("result", "error")}, st.CommitErrors},
		{"herd.fail_open", []attribute.KeyValue{user}, st.FailOpen},
		{"herd.lookups", []attribute.KeyValue{user, attribute.String("outcome", "hit")}, st.Hits},
	} {
		if got := r.sum(t, k.name, k.with...); got != float64(k.want) {
			t.Errorf("%s%v = %v, Stats say %d", k.name, k.with, got, k.want)
		}
	}
	errs := r.sum(t, "herd.loads", user, attribute.String("result", "error")) + r.sum(t, "herd.loads", user, attribute.String("result", "panic"))
	if errs != float64(st.LoadErrors) {
		t.Errorf("herd.loads{result=error|panic} = %v, Stats.LoadErrors %d", errs, st.LoadErrors)
	}
	t.Logf("stats %+v", st)
}
