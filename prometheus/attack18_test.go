package prometheus_test

import "testing"

// TestAttack18DashboardHistogramBaseName: the dashboard test must fail on
// a query of a series Prometheus never has. A histogram exports only its
// _bucket, _sum and _count series, so a panel on the bare name (say
// rate(herd_load_duration_seconds[5m])) shows nothing; the set the test
// checks names against must not hold it.
func TestAttack18DashboardHistogramBaseName(t *testing.T) {
	names := registered(t)
	for _, m := range []string{"herd_load_duration_seconds", "herd_wait_duration_seconds"} {
		if !names[m+"_bucket"] {
			t.Fatalf("%s_bucket not registered: the histogram was renamed", m)
		}
		if names[m] {
			t.Errorf("a query of %s (a histogram's bare name, no such series) would pass the dashboard test", m)
		}
	}
}
