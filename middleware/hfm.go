package middleware

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/herdkit/herd"
)

// Hit-for-miss (Varnish's name): a URL whose response turned out not
// shareable is marked so in Redis for Options.HitForMiss, with
// herd.Fill.Pass. The mark is the key's entry itself, so a lookup finds
// it with the one GET a hit costs; until it expires, each request for the
// URL runs the handler at once instead of queueing behind a rebuild that
// nobody else may take. It is never a page: herd answers Begin with
// herd.ErrPass, not with a value.

// statusHitForMiss is the Cache-Status of a request served directly
// because its URL is marked (RFC 9211 allows a detail parameter).
const statusHitForMiss = statusBypass + "; detail=" + detailHitForMiss

// defaultHitForMiss is Options.HitForMiss's default: long enough to spare
// a busy URL the queueing, short enough that a URL whose responses become
// shareable again is cached soon after.
const defaultHitForMiss = 5 * time.Second

// resolveHitForMiss validates Options.HitForMiss and applies its default;
// 0 in the result means off.
func resolveHitForMiss(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return defaultHitForMiss
	case d < 0:
		return 0
	case d < time.Millisecond:
		panic(fmt.Sprintf("herd/middleware: Options.HitForMiss %v is below 1ms (negative turns it off)", d))
	case d > time.Hour:
		panic(fmt.Sprintf("herd/middleware: Options.HitForMiss %v is above 1h", d))
	}
	return d
}

// notShared ends fill for a response that is not shared, why being the
// reason. urlWide says the reason is the response's (a header it set, a
// stream), not a failure nor a property of this request: then, unless
// hit-for-miss is off or the request carries credentials outside the key
// (its response says nothing of anyone else's), the URL is marked. The
// waiters, in every instance, run the handler themselves either way.
func (h *handler) notShared(r *http.Request, fill *herd.Fill, why string, urlWide bool) {
	cause := fmt.Errorf("%w: %s", herd.ErrNotShared, why)
	if urlWide && h.cfg.HitForMiss > 0 && !h.unkeyedCredentials(r, h.scanHeaders(r)) {
		_ = fill.Pass(cause, h.cfg.HitForMiss) // the ttl is valid: resolveHitForMiss checked it
		return
	}
	fill.Abort(cause)
}

// bypass serves r without the cache, reporting reason to OnBypass.
func (h *handler) bypass(w http.ResponseWriter, r *http.Request, reason, status string) {
	if h.cfg.OnBypass != nil {
		h.cfg.OnBypass(r, reason)
	}
	w.Header().Set("Cache-Status", status)
	h.next.ServeHTTP(w, r)
}

// requestNoStore reports whether r says Cache-Control: no-store, which
// forbids storing the response (RFC 9111 §5.2.1.5): r bypasses the cache.
// A request's no-cache (and Pragma: no-cache, and max-age=0: a browser's
// reload) is ignored, as shared caches commonly do: it only says the
// client prefers a validated response (§5.2.1.4), and honouring it would
// let any client send every request to the handler, past the
// coalescing.
func requestNoStore(r *http.Request) bool {
	vs := r.Header["Cache-Control"]
	if len(vs) == 0 {
		return false
	}
	for _, v := range vs {
		if strings.Contains(strings.ToLower(v), "no-store") {
			return parseCacheControl(r.Header).has("no-store")
		}
	}
	return false
}
