package prometheus

import (
	"net/http"
	"strings"
	"sync"
	"unicode/utf8"

	prom "github.com/prometheus/client_golang/prometheus"
)

// NewBypassCounter registers herd_http_bypasses_total{reason} on reg and
// returns the function that feeds it, for the HTTP middleware's OnBypass:
//
//	mw := middleware.New(cache, &middleware.Options{OnBypass: herdprom.NewBypassCounter(reg, nil)})
//
// It counts the requests the middleware served without a lookup (method,
// body, credentials, upgrade, range, no_store, ...) and those it served
// directly because a lookup found the URL's hit-for-miss mark
// (hit_for_miss), by reason. Reasons beyond the first 64 distinct ones
// are counted as "other". Only opt's Namespace and ConstLabels apply. It
// panics if the counter cannot be registered, as NewObserver does. The
// function is safe for concurrent use.
func NewBypassCounter(reg prom.Registerer, opt *Options) func(r *http.Request, reason string) {
	var o Options
	if opt != nil {
		o = *opt
	}
	if o.Namespace == "" {
		o.Namespace = "herd"
	}
	vec := prom.NewCounterVec(prom.CounterOpts{
		Namespace: o.Namespace, Name: "http_bypasses_total", ConstLabels: o.ConstLabels,
		Help: "HTTP requests the middleware served without a lookup, or after finding the URL's hit-for-miss mark, by reason.",
	}, []string{"reason"})
	reg.MustRegister(vec)
	var (
		mu      sync.Mutex
		reasons = map[string]prom.Counter{}
	)
	return func(_ *http.Request, reason string) {
		if !utf8.ValidString(reason) {
			reason = strings.ToValidUTF8(reason, "\uFFFD") // a label value must be UTF-8
		}
		mu.Lock()
		c, ok := reasons[reason]
		if !ok {
			if len(reasons) >= 64 {
				reason = "other"
			}
			c = vec.WithLabelValues(reason)
			if reason != "other" {
				reasons[reason] = c
			}
		}
		mu.Unlock()
		c.Inc()
	}
}
