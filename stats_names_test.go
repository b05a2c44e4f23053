package herd_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	herdprom "github.com/herdkit/herd/prometheus"
	prom "github.com/prometheus/client_golang/prometheus"
)

// counter returns the sum of the series of the counter name whose label
// label is value.
func counter(t *testing.T, reg *prom.Registry, name, label, value string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return uint64(total)
}

// TestStatsCountLocalJoinersAsPrometheusDoes: 3 keys × 20 concurrent
// callers in one process, with a loader held until every caller has
// joined its key's flight: 3 leaders and 57 followers, in Stats
// (Leads, Follows) as in herd_lookups_total{outcome}. Before, Stats
// counted only flights that waited for another process (Follows 0 here,
// with 57 followers in Prometheus); that count is Stats.Waits now, 0 as
// herd_wait_duration_seconds has no sample.
func TestStatsCountLocalJoinersAsPrometheusDoes(t *testing.T) {
	t.Parallel()
	const keys, callers = 3, 20
	rdb := redistest.Start(t).Client(t)
	reg := prom.NewRegistry()
	c := herd.New(rdb, &herd.Options{Observer: herdprom.NewObserver(reg, nil)})
	defer c.Close()

	gate := make(chan struct{})
	load := func(context.Context) ([]byte, error) {
		<-gate
		return []byte("v"), nil
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for k := range keys {
		for range callers {
			wg.Go(func() {
				if _, err := c.Get(ctx, fmt.Sprintf("item:%d", k), time.Minute, load); err != nil {
					t.Errorf("Get: %v", err)
				}
			})
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for k := range keys {
		for herd.FlightJoiners(c, fmt.Sprintf("item:%d", k)) < callers-1 {
			if time.Now().After(deadline) {
				close(gate)
				t.Fatalf("item:%d: %d callers joined its flight, want %d", k, herd.FlightJoiners(c, fmt.Sprintf("item:%d", k)), callers-1)
			}
			time.Sleep(time.Millisecond)
		}
	}
	close(gate)
	wg.Wait()

	st := c.Stats()
	for _, n := range []struct {
		name       string
		stats      uint64
		prometheus uint64
		want       uint64
	}{
		{"leaders (Leads, outcome=leader)", st.Leads, counter(t, reg, "herd_lookups_total", "outcome", "leader"), keys},
		{"followers (Follows, outcome=follower)", st.Follows, counter(t, reg, "herd_lookups_total", "outcome", "follower"), keys * (callers - 1)},
		{"loads (Loads, loads_total leased=true)", st.Loads, counter(t, reg, "herd_loads_total", "leased", "true"), keys},
	} {
		if n.stats != n.want || n.prometheus != n.want {
			t.Errorf("%s: Stats %d, Prometheus %d; want both %d", n.name, n.stats, n.prometheus, n.want)
		}
	}
	if st.Waits != 0 {
		t.Errorf("Stats.Waits = %d, want 0: no flight waited for another process", st.Waits)
	}
}
