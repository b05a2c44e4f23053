package middleware

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/herdkit/herd"
)

// The detail parameters of Cache-Status (RFC 9211 §2.8): why a request
// bypassed the cache, or why its response was not stored. Each is an
// sf-token. The package documentation lists them under "Cache-Status".
const (
	// Bypasses (fwd=bypass) before any lookup; the OnBypass reason, with
	// '_' as '-', except credentials, which say which credential.
	detailMethod         = "method"
	detailAuthorization  = "authorization"
	detailCookie         = "cookie"
	detailIdentityHeader = "identity-header"
	detailClientCert     = "client-cert"
	detailHitForMiss     = "hit-for-miss"

	// Bypasses after a lookup: the cache could not help.
	detailRedisUnavailable = "redis-unavailable"
	detailWaitTimeout      = "wait-timeout"
	detailNotShared        = "not-shared" // the response this request waited for could not be shared
	detailUnservable       = "unservable-value"
	detailClosed           = "closed"
	detailError            = "error"
	detailStreamed         = "streamed"  // the handler flushed or hijacked: not stored
	detailTooLarge         = "too-large" // the body outgrew MaxBodyBytes: not stored

	// Misses whose response was not stored (fwd=miss without stored).
	detailStatus          = "status" // no TTL in StatusTTL (a 5xx never has one)
	detailVary            = "vary"
	detailCredentials     = "credentials"
	detailStale           = "stale-on-arrival"
	detailEncoding        = "encoding"
	detailTagsInvalid     = "tags-invalid"      // Fill.SetTags refused them (ErrInvalidTag)
	detailTagsNotRecorded = "tags-not-recorded" // a full tag index (ErrTagFull), or Redis failing to record them
	detailStoreFailed     = "store-failed"
	detailTruncated       = "truncated"
	detailPerUserField    = "per-user-field"
	detailSetCookie       = "set-cookie"
	detailNotStored       = "not-stored"
)

// withDetail appends a detail parameter to a Cache-Status value.
func withDetail(status, detail string) string {
	if detail == "" {
		return status
	}
	return status + "; detail=" + detail
}

// bypassDetail is the detail of a request that bypasses the cache for
// why (a Bypass constant).
func (h *handler) bypassDetail(r *http.Request, why string) string {
	if why == BypassCredentials {
		return h.credentialDetail(r)
	}
	return strings.ReplaceAll(why, "_", "-")
}

// credentialDetail names the credential outside the key that r carries
// (see unkeyedCredentials), the first of Authorization, Cookie, an
// identity header and a TLS client certificate.
func (h *handler) credentialDetail(r *http.Request) string {
	switch {
	case !h.cfg.authKeyed && len(r.Header.Values("Authorization")) > 0:
		return detailAuthorization
	case !h.cfg.cookieKeyed && !h.cfg.cookiesDeclared && len(r.Header.Values("Cookie")) > 0:
		return detailCookie
	case h.scanHeaders(r).identity:
		return detailIdentityHeader
	}
	return detailClientCert
}

// missDetail says why a leader's response was not stored: the verdict's
// reason, else the Fill's (not leased: Redis is unreachable, fail-open,
// or the wait for another process's rebuild was spent).
func (h *handler) missDetail(fill *herd.Fill, v verdict) string {
	switch {
	case v.detail != "":
		return v.detail
	case !fill.Leased() && fill.Unavailable():
		return detailRedisUnavailable
	case !fill.Leased():
		return detailWaitTimeout
	}
	return detailNotStored
}

// errDetail is the detail of a request that Begin answered with err and
// that is served by the handler, uncached.
func errDetail(err error) string {
	switch {
	case errors.Is(err, herd.ErrNotShared):
		return detailNotShared
	case errors.Is(err, herd.ErrWaitTimeout), errors.Is(err, context.DeadlineExceeded):
		return detailWaitTimeout
	case errors.Is(err, herd.ErrUnavailable), errors.Is(err, herd.ErrNoQuorum):
		return detailRedisUnavailable
	case errors.Is(err, herd.ErrClosed):
		return detailClosed
	}
	return detailError
}

// perUserDetail is the detail of a response not stored because it sets
// the per-user field name (see perUserField).
func perUserDetail(name string) string {
	if strings.EqualFold(name, "Set-Cookie") {
		return detailSetCookie
	}
	return detailPerUserField
}
