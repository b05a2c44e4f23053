package prometheus_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	herdprom "github.com/herdkit/herd/prometheus"
	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sum adds the values of every series of name whose labels include want.
func sum(t *testing.T, reg *prom.Registry, name string, want map[string]string) float64 {
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
	metric:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				total += m.Counter.GetValue()
			case m.Gauge != nil:
				total += m.Gauge.GetValue()
			case m.Histogram != nil:
				total += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return total
}

// instances returns n Caches on rdb, as n processes would have, each
// reporting to reg with its own instance label.
func instances(t *testing.T, reg *prom.Registry, n int, newClient func() *redis.Client, opt herd.Options) []*herd.Cache {
	t.Helper()
	var cs []*herd.Cache
	for i := range n {
		o := opt
		o.Observer = herdprom.NewObserver(reg, &herdprom.Options{ConstLabels: prom.Labels{"instance": strconv.Itoa(i)}})
		o.KeyClass = func(string) string { return "item" }
		c := herd.New(newClient(), &o)
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs
}

func TestColdWave(t *testing.T) {
	srv := redistest.Start(t)
	reg := prom.NewRegistry()
	cs := instances(t, reg, 4, func() *redis.Client { return srv.Client(t) }, herd.Options{})
	gate := make(chan struct{})
	entered := make(chan struct{}, 4)
	load := func(context.Context) ([]byte, error) {
		entered <- struct{}{}
		<-gate
		return []byte("v"), nil
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() {
			if _, err := c.Get(ctx, "item:1", time.Minute, load); err != nil {
				t.Errorf("Get: %v", err)
			}
		})
	}
	<-entered
	waitFor(t, func() bool {
		return sum(t, reg, "herd_lease_events_total", map[string]string{"event": "contended"}) == 3
	})
	time.Sleep(50 * time.Millisecond) // let followers subscribe; the counts below hold either way
	close(gate)
	wg.Wait()

	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"herd_loads_total", map[string]string{"result": "ok", "leased": "true", "class": "item"}, 1},
		{"herd_lookups_total", map[string]string{"outcome": "leader"}, 1},
		{"herd_lookups_total", map[string]string{"outcome": "follower"}, 3},
		{"herd_lease_events_total", map[string]string{"event": "acquired"}, 1},
		{"herd_lease_events_total", map[string]string{"event": "contended"}, 3},
		{"herd_wait_duration_seconds", nil, 3},
		{"herd_commits_total", map[string]string{"result": "stored"}, 1},
		{"herd_commits_total", map[string]string{"result": "fenced"}, 0},
	} {
		if got := sum(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// A hit afterwards.
	if _, err := cs[0].Get(ctx, "item:1", time.Minute, load); err != nil {
		t.Fatal(err)
	}
	if got := sum(t, reg, "herd_lookups_total", map[string]string{"outcome": "hit", "instance": "0"}); got != 1 {
		t.Errorf("hits on instance 0 = %v, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "herd_load_duration_seconds"); err != nil || n == 0 {
		t.Errorf("load duration histogram: %d series (%v)", n, err)
	}
}

// A stalled leader: its lease vanishes, another instance takes over, and
// the stalled leader's commit is fenced and its lease reported lost.
func TestStalledLeader(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	reg := prom.NewRegistry()
	const lease = 300 * time.Millisecond
	cs := instances(t, reg, 2, func() *redis.Client { return srv.Client(t) },
		herd.Options{MinLease: lease, MaxLease: lease, DefaultLease: lease})
	ctx := context.Background()
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	stalled := func(context.Context) ([]byte, error) {
		entered <- struct{}{}
		<-gate
		return []byte("old"), nil
	}
	done := make(chan struct{})
	go func() {
		cs[0].Get(ctx, "item:stall", time.Minute, stalled)
		close(done)
	}()
	<-entered
	// The stall: the leader's lease disappears as if it had lapsed.
	keys, _ := rdb.Keys(ctx, "herd:*:l").Result()
	if len(keys) != 1 {
		t.Fatalf("lease keys %v, want 1", keys)
	}
	rdb.Del(ctx, keys[0])
	if _, err := cs[1].Get(ctx, "item:stall", time.Minute, func(context.Context) ([]byte, error) { return []byte("new"), nil }); err != nil {
		t.Fatal(err)
	}
	// The stalled leader's watchdog finds its lease gone.
	waitFor(t, func() bool {
		return sum(t, reg, "herd_lease_events_total", map[string]string{"event": "lost", "instance": "0"}) == 1
	})
	close(gate)
	<-done
	if got := sum(t, reg, "herd_commits_total", map[string]string{"result": "fenced", "instance": "0"}); got != 1 {
		t.Errorf("fenced commits on the stalled instance = %v, want 1", got)
	}
	if got := sum(t, reg, "herd_lease_events_total", map[string]string{"event": "extend_failed", "instance": "0"}); got < 1 {
		t.Errorf("extend_failed on the stalled instance = %v, want ≥ 1", got)
	}
	if got := sum(t, reg, "herd_commits_total", map[string]string{"result": "stored", "instance": "1"}); got != 1 {
		t.Errorf("stored commits on the other instance = %v, want 1", got)
	}
}

// A Redis outage opens the circuit and serves by local loads; the circuit
// closes when Redis is back.
func TestRedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	reg := prom.NewRegistry()
	short := func(o *redis.Options) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetries = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond, -1
	}
	cs := instances(t, reg, 1, func() *redis.Client { return srv.Client(t, short) },
		herd.Options{BreakerThreshold: 2, BreakerCooldown: 100 * time.Millisecond})
	c := cs[0]
	ctx := context.Background()
	load := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	srv.Stop(t)
	for i := range 4 {
		if _, err := c.Get(ctx, "item:"+strconv.Itoa(i), time.Minute, load); err != nil {
			t.Fatalf("Get with Redis down: %v", err)
		}
	}
	if got := testutil.ToFloat64(gaugeOf(t, reg, "herd_circuit_open")); got != 1 {
		t.Errorf("herd_circuit_open = %v during the outage, want 1", got)
	}
	if got := sum(t, reg, "herd_fail_open_total", nil); got < 4 {
		t.Errorf("herd_fail_open_total = %v, want ≥ 4", got)
	}
	if got := sum(t, reg, "herd_loads_total", map[string]string{"leased": "false"}); got < 4 {
		t.Errorf("unleased loads = %v, want ≥ 4", got)
	}
	srv.Restart(t)
	waitFor(t, func() bool {
		c.Get(ctx, "item:back", time.Minute, load)
		return sum(t, reg, "herd_circuit_transitions_total", map[string]string{"state": "closed"}) >= 1
	})
	if got := testutil.ToFloat64(gaugeOf(t, reg, "herd_circuit_open")); got != 0 {
		t.Errorf("herd_circuit_open = %v after recovery, want 0", got)
	}
}

// gaugeOf finds a registered gauge by name for testutil.ToFloat64.
func gaugeOf(t *testing.T, reg *prom.Registry, name string) prom.Collector {
	t.Helper()
	return gatheredGauge{reg: reg, name: name, t: t}
}

type gatheredGauge struct {
	reg  *prom.Registry
	name string
	t    *testing.T
}

func (g gatheredGauge) Describe(ch chan<- *prom.Desc) {}
func (g gatheredGauge) Collect(ch chan<- prom.Metric) {
	v := sum(g.t, g.reg, g.name, nil)
	ch <- prom.MustNewConstMetric(prom.NewDesc(g.name, "", nil, nil), prom.GaugeValue, v)
}

func TestMaxClasses(t *testing.T) {
	reg := prom.NewRegistry()
	obs := herdprom.NewObserver(reg, &herdprom.Options{MaxClasses: 2})
	for _, c := range []string{"a", "b", "c", "d", ""} {
		obs.Lookup(c, herd.OutcomeHit)
	}
	for class, want := range map[string]float64{"a": 1, "b": 1, "other": 2, "default": 1} {
		if got := sum(t, reg, "herd_lookups_total", map[string]string{"class": class}); got != want {
			t.Errorf("class %q: %v lookups, want %v", class, got, want)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for a metric")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A leader's load fails and its follower in another instance, with
// RetryFailedLoad, retries with a new leader: herd_load_retries_total
// counts that one retry, on the follower's instance only, and the loads
// are one error and one ok.
func TestLoadRetry(t *testing.T) {
	srv := redistest.Start(t)
	reg := prom.NewRegistry()
	cs := instances(t, reg, 2, func() *redis.Client { return srv.Client(t) }, herd.Options{RetryFailedLoad: true})
	entered, gate := make(chan struct{}), make(chan struct{})
	ctx := context.Background()
	errs := make(chan error, 2)
	go func() {
		_, err := cs[0].Get(ctx, "item:1", time.Minute, func(context.Context) ([]byte, error) {
			close(entered)
			<-gate
			return nil, errors.New("origin reset the connection")
		})
		errs <- err
	}()
	<-entered
	go func() {
		v, err := cs[1].Get(ctx, "item:1", time.Minute, func(context.Context) ([]byte, error) { return []byte("v"), nil })
		if err == nil && string(v) != "v" {
			err = fmt.Errorf("value %q", v)
		}
		errs <- err
	}()
	waitFor(t, func() bool {
		return sum(t, reg, "herd_lease_events_total", map[string]string{"event": "contended", "instance": "1"}) == 1
	})
	close(gate)
	if err := <-errs; !errors.Is(err, herd.ErrLoadFailed) {
		t.Errorf("leader: %v, want ErrLoadFailed", err)
	}
	if err := <-errs; err != nil {
		t.Errorf("follower: %v, want the retry's value", err)
	}
	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"instance": "1", "class": "item"}, 1},
		{map[string]string{"instance": "0"}, 0},
	} {
		if got := sum(t, reg, "herd_load_retries_total", c.labels); got != c.want {
			t.Errorf("herd_load_retries_total%v = %v, want %v", c.labels, got, c.want)
		}
	}
	if got := sum(t, reg, "herd_loads_total", map[string]string{"result": "error"}); got != 1 {
		t.Errorf("herd_loads_total{result=error} = %v, want 1", got)
	}
	if got := sum(t, reg, "herd_loads_total", map[string]string{"result": "ok", "instance": "1"}); got != 1 {
		t.Errorf("herd_loads_total{result=ok,instance=1} = %v, want 1", got)
	}
}
