package middleware

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Revalidation in the standard mode (RFC 9111 §4.3). A stored response
// that has a validator (its handler's ETag, or Last-Modified) is also
// kept, under a key of its own, for revalidateKeep past its freshness
// (and when it could not be stored fresh: no-cache, stale on arrival).
// The request that leads the rebuild of its URL, under the key's lease
// (one across the fleet, the others wait for it), sends the handler the
// request with If-None-Match and If-Modified-Since from it; a 304 updates
// the kept response's header fields, and that is the response stored and
// served. The handler can answer 200 instead: it is then the new
// response.

// revalidateKeep is how long past its freshness a response is kept for
// revalidation.
const revalidateKeep = time.Hour

// validatorField holds, in a kept response, its handler's own ETag (the
// stored one may be herd's): ':' is in no field name.
const validatorField = ":herd-etag"

// revalidationKey is the key under which the response of key is kept
// for revalidation.
func revalidationKey(key string) string { return "herd-http/revalidate|" + key }

// keepForRevalidation keeps stored, the entry of key, for ttl (its
// freshness) plus revalidateKeep, if it has a validator (etag, its
// handler's own ETag, or Last-Modified) or a stale-if-error to serve it
// by. The copy carries the response's tags, so that a purge of one of
// them removes it too (a purged response is never served stale, nor
// revalidated); a tagged response of a minted key (see minted) is not
// kept, so that its copy takes no room in a tag's index.
//
// variant names the request's variant of a response that varies (see
// variantOf): the copy then serves only requests of that variant.
func (h *handler) keepForRevalidation(ctx context.Context, key string, stored *entry, etag string, ttl time.Duration, tags []string, minted bool, variant string) {
	if len(tags) > 0 && minted {
		return
	}
	if etag == "" && headerGet(stored.header, "Last-Modified") == "" && !responsePolicy(stored.header, stored.status).cc.has("stale-if-error") {
		return
	}
	cp := &entry{status: stored.status, header: stored.header.Clone(), body: stored.body}
	cp.header[validatorField] = []string{etag}
	if variant != "" {
		cp.header[variantField] = []string{variant}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := h.c.Set(ctx, revalidationKey(key), cp.encode(), max(ttl, 0)+revalidateKeep, tags...); err != nil {
		h.log(slog.LevelWarn, "herd/middleware: response not kept for revalidation", "err", err)
	}
}

// variantField holds, in a kept copy of a response that varies, the
// variant it is (variantOf).
const variantField = ":herd-variant"

// keptResponse returns the response kept for revalidation under key, if
// it is of r's variant, and its handler's ETag, or nil.
func (h *handler) keptResponse(ctx context.Context, key string, r *http.Request) (*entry, string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	val, found, err := h.c.Peek(ctx, revalidationKey(key))
	if err != nil || !found {
		return nil, ""
	}
	e, err := decodeEntry(val)
	if err != nil {
		return nil, ""
	}
	etag := headerGet(e.header, validatorField)
	variant := headerGet(e.header, variantField)
	delete(e.header, validatorField)
	delete(e.header, variantField)
	if !sameVariant(r, variant) {
		return nil, ""
	}
	return e, etag
}

// conditional returns req (not modified) as a conditional request for
// the kept response old: If-None-Match with its handler's ETag, and
// If-Modified-Since with its Last-Modified.
func conditional(req *http.Request, old *entry, etag string) *http.Request {
	c := req.Clone(req.Context())
	if etag != "" {
		c.Header.Set("If-None-Match", etag)
	}
	if lm := headerGet(old.header, "Last-Modified"); lm != "" {
		c.Header.Set("If-Modified-Since", lm)
	}
	return c
}

// notUpdated are the fields a 304 does not change in the kept response:
// they describe its stored bytes (RFC 9111 §3.2 for Content-Length).
var notUpdated = append([]string{"Content-Length", "Content-Encoding", "Content-Range"}, digestFields...)

// updated returns the response a 304, with header h304 (as the handler
// wrote it), makes of the kept response old: old's status and body, and
// old's header fields updated with the 304's (RFC 9111 §4.3.4). full is
// that header with the 304's hop-by-hop and per-user fields, to decide
// on; stored is what may be stored of it.
func updated(old *entry, h304 http.Header) (e *entry, full http.Header) {
	full = old.header.Clone()
	for name, vs := range h304 {
		skip := false
		for _, f := range notUpdated {
			skip = skip || strings.EqualFold(name, f)
		}
		if skip {
			continue
		}
		deleteAnyCase(full, name)
		full[name] = vs
	}
	if headerGet(h304, "Date") == "" {
		// net/http adds the 304's Date on the wire only: the response is
		// as of now, and its Age and staleness count from here (§4.3.4).
		deleteAnyCase(full, "Date")
		full["Date"] = []string{time.Now().UTC().Format(http.TimeFormat)}
	}
	return &entry{status: old.status, header: storedHeader(full, nil), body: old.body}, full
}

// staleness is how long past its freshness the kept response old is at
// now (negative: still fresh): its Age when stored plus the time since
// its Date, less its freshness lifetime. Counting the time since Date on
// top of the stored Age may count the delay before it was stored twice:
// it errs on the side of older.
func staleness(old *entry, now time.Time) time.Duration {
	p := responsePolicy(old.header, old.status)
	return sinceStored(old, now) + storedAge(old.header) - p.lifetime
}

// sinceStored is the time since the kept response old was generated
// (its Date, which the standard mode keeps), 0 without one.
func sinceStored(old *entry, now time.Time) time.Duration {
	if d, ok := parseHTTPDate(headerGet(old.header, "Date")); ok {
		return max(now.Sub(d), 0)
	}
	return 0
}

// mayServeStale reports whether the response's directives let it be
// served stale at all (§4.2.4): not must-revalidate, proxy-revalidate or
// no-cache.
func mayServeStale(old *entry) bool {
	cc := responsePolicy(old.header, old.status).cc
	return !cc.has("must-revalidate") && !cc.has("proxy-revalidate") && !cc.has("no-cache") && !cc.has("s-maxage")
}

// staleIfError reports whether the kept response old may be served in
// place of an error (a 5xx, or no answer) at now: its stale-if-error
// (RFC 5861 §4) covers its staleness.
func staleIfError(old *entry, now time.Time) bool {
	d, ok := deltaSeconds(responsePolicy(old.header, old.status).cc["stale-if-error"])
	return ok && mayServeStale(old) && staleness(old, now) <= d
}

// maxStale reports whether r's Cache-Control: max-stale (§5.2.1.2) lets
// the kept response old be served at now, stale.
func maxStale(r *http.Request, old *entry, now time.Time) bool {
	v, ok := parseDirectives(r.Header.Values("Cache-Control"))["max-stale"]
	if !ok || !mayServeStale(old) {
		return false
	}
	if v == "" {
		return true // any staleness
	}
	d, ok := deltaSeconds(v)
	return ok && staleness(old, now) <= d
}

// onlyIfCached answers a request with Cache-Control: only-if-cached
// (§5.2.1.7) in the standard mode: the stored response if there is one,
// else 504, never the handler.
func (h *handler) onlyIfCached(w http.ResponseWriter, r *http.Request, key string) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if val, found, err := h.c.Peek(ctx, key); err == nil && found {
		if e, err := decodeEntry(val); err == nil {
			if e, err := h.variant(r, e, nil); err == nil {
				h.write(w, r, e, statusHit, sinceStored(e, time.Now()), nil)
				return
			}
		}
	}
	w.Header().Set("Cache-Status", statusMiss+"; detail=only-if-cached")
	w.WriteHeader(http.StatusGatewayTimeout)
}
