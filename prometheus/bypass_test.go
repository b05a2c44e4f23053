package prometheus_test

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/herdkit/herd"
	herdprom "github.com/herdkit/herd/prometheus"
	prom "github.com/prometheus/client_golang/prometheus"
)

// TestBypassCounter counts bypasses by reason, with the label values
// bounded.
func TestBypassCounter(t *testing.T) {
	reg := prom.NewRegistry()
	onBypass := herdprom.NewBypassCounter(reg, &herdprom.Options{ConstLabels: prom.Labels{"service": "shop"}})
	r := httptest.NewRequest("POST", "/", nil)
	for range 3 {
		onBypass(r, "method")
	}
	onBypass(r, "hit_for_miss")
	for i := range 100 {
		onBypass(r, fmt.Sprintf("reason%d", i))
	}
	for reason, want := range map[string]float64{"method": 3, "hit_for_miss": 1, "reason0": 1, "reason61": 1, "reason62": 0, "other": 38} {
		if got := sum(t, reg, "herd_http_bypasses_total", map[string]string{"reason": reason, "service": "shop"}); got != want {
			t.Errorf("reason %q: %v, want %v", reason, got, want)
		}
	}
}

// TestNotSharedLoads: a load whose value was not for sharing has its own
// result, apart from errors.
func TestNotSharedLoads(t *testing.T) {
	reg := prom.NewRegistry()
	obs := herdprom.NewObserver(reg, nil)
	obs.Load("page", time.Millisecond, fmt.Errorf("%w: sets a cookie", herd.ErrNotShared), true)
	obs.Load("page", time.Millisecond, errors.New("boom"), true)
	for result, want := range map[string]float64{"not_shared": 1, "error": 1} {
		if got := sum(t, reg, "herd_loads_total", map[string]string{"result": result}); got != want {
			t.Errorf("result %q: %v, want %v", result, got, want)
		}
	}
}
