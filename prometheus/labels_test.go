package prometheus_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/herdkit/herd"
	herdprom "github.com/herdkit/herd/prometheus"
	prom "github.com/prometheus/client_golang/prometheus"
)

// TestLabelsNotUTF8: a class or a bypass reason that is not UTF-8 (a
// KeyClass that cut a name inside a character, a raw path byte) is
// counted with U+FFFD for its bad bytes. Prometheus panics on such a label
// value, and the Observer is called from the Cache's own goroutines, where
// a panic ends the process.
func TestLabelsNotUTF8(t *testing.T) {
	reg := prom.NewRegistry()
	obs := herdprom.NewObserver(reg, nil)
	bad := "/caf\xe9"
	obs.Lookup(bad, herd.OutcomeHit)
	obs.Load(bad, time.Millisecond, nil, true)
	obs.Lease(bad, herd.LeaseAcquired)
	if got := sum(t, reg, "herd_lookups_total", map[string]string{"class": "/caf\uFFFD"}); got != 1 {
		t.Errorf("lookups of the class: %v, want 1", got)
	}
	onBypass := herdprom.NewBypassCounter(reg, nil)
	onBypass(httptest.NewRequest("GET", "/", nil), "x\xff")
	if got := sum(t, reg, "herd_http_bypasses_total", map[string]string{"reason": "x\uFFFD"}); got != 1 {
		t.Errorf("bypasses: %v, want 1", got)
	}
}
