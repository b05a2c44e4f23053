package middleware

import (
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The standard mode (Options.Standard): a response's freshness, and
// whether it is stored at all, come from the response alone, as RFC 9111
// reads.

// Targeted cache-control fields (RFC 9213), in the order herd selects
// them: its own, then the one every CDN honours. The first with a valid,
// non-empty value rules the response, and Cache-Control and Expires are
// then ignored.
const (
	fieldHerdCacheControl = "Herd-Cache-Control"
	fieldCDNCacheControl  = "Cdn-Cache-Control"
)

var targetedFields = []string{fieldHerdCacheControl, fieldCDNCacheControl}

// heuristicStatuses may be given a heuristic freshness (RFC 9110 §15.1):
// "heuristically cacheable" status codes.
var heuristicStatuses = []int{200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501}

// heuristicFraction and heuristicCap bound a heuristic lifetime: a tenth
// of the time since Last-Modified (RFC 9111 §4.2.2), at most a day.
const (
	heuristicFraction = 10
	heuristicCap      = 24 * time.Hour
)

// parseDirectives parses cache directives strictly (RFC 9111 §5.2): a
// directive whose name is not a token ("max-age =60") is ignored, and a
// directive given twice keeps its first value (§4.2.1 lets a cache use
// the first).
func parseDirectives(lines []string) cacheControl {
	cc := cacheControl{}
	for _, line := range lines {
		for _, d := range splitDirectives(line) {
			d = strings.TrimSpace(d)
			if d == "" {
				continue
			}
			name, val, _ := strings.Cut(d, "=")
			if !isToken(name) {
				continue
			}
			name = strings.ToLower(name)
			if strings.HasPrefix(val, `"`) {
				val = strings.Trim(val, `"`)
			}
			if _, dup := cc[name]; !dup {
				cc[name] = val
			}
		}
	}
	return cc
}

// sfKey is a Structured Field dictionary key (RFC 8941 §3.2).
var sfKey = regexp.MustCompile(`^[a-z*][a-z0-9_.*-]*$`)

// sfBareItem is an integer, decimal, string, token or boolean item.
var sfBareItem = regexp.MustCompile(`^(-?[0-9]{1,15}(\.[0-9]{1,3})?|"([^"\\]|\\["\\])*"|[A-Za-z*][A-Za-z0-9:/!#$%&'*+.^_` + "`" + `|~-]*|\?[01])$`)

// integerDirectives must have integer values in a targeted field.
var integerDirectives = []string{"max-age", "s-maxage", "stale-while-revalidate", "stale-if-error"}

// parseTargeted parses a targeted cache-control field (RFC 9213 §2.1), a
// Structured Field dictionary: ok is false when the field is absent,
// empty or invalid (a member that is no key=item, max-age given as a
// string), and then it is ignored.
func parseTargeted(lines []string) (cc cacheControl, ok bool) {
	cc = cacheControl{}
	for _, line := range lines {
		for _, m := range splitDirectives(line) {
			m = strings.Trim(m, " \t")
			if m == "" {
				return nil, false
			}
			item, _, _ := strings.Cut(m, ";") // parameters are not used
			name, val, hasVal := strings.Cut(item, "=")
			name = strings.ToLower(name) // MaX-aGe, as caches commonly read it
			if !sfKey.MatchString(name) {
				return nil, false
			}
			if !hasVal {
				val = "?1"
			}
			if !sfBareItem.MatchString(val) {
				return nil, false
			}
			if slices.Contains(integerDirectives, name) {
				if strings.Trim(val, "0123456789") != "" {
					return nil, false
				}
			}
			if !hasVal {
				val = ""
			}
			cc[name] = strings.Trim(val, `"`) // the last value wins in a dictionary
		}
	}
	return cc, len(cc) > 0
}

// splitDirectives splits a Cache-Control line at the commas outside
// quoted strings (no-cache="Set-Cookie, X-Foo" is one directive).
func splitDirectives(line string) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(line); i++ {
		switch line[i] {
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				out = append(out, line[start:i])
				start = i + 1
			}
		}
	}
	return append(out, line[start:])
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// deltaSeconds reads a delta-seconds value: its leading digits ("3600.0"
// and "3600a" are 3600, as most caches read them), capped at
// maxLifetime; false when it does not start with a digit.
func deltaSeconds(v string) (time.Duration, bool) {
	n := 0
	for n < len(v) && v[n] >= '0' && v[n] <= '9' {
		n++
	}
	if n == 0 {
		return 0, false
	}
	secs, err := strconv.ParseInt(v[:n], 10, 64)
	if err != nil || secs > int64(maxLifetime/time.Second) {
		return maxLifetime, true
	}
	return time.Duration(secs) * time.Second, true
}

// firstAge is the Age a response came with (RFC 9111 §5.1): the first
// member of its first Age field, if it is delta-seconds (digits only);
// 0 when absent or invalid ("7200.0" is ignored).
func firstAge(h http.Header) time.Duration {
	vs := headerValues(h, "Age")
	if len(vs) == 0 {
		return 0
	}
	first, _, _ := strings.Cut(vs[0], ",")
	first = strings.TrimSpace(first)
	if strings.Trim(first, "0123456789") != "" {
		return 0
	}
	d, _ := deltaSeconds(first)
	return d
}

// initialAge is the corrected initial age of a response (RFC 9111
// §4.2.3) that the handler began building at start and finished at done:
// the Age it came with plus the time it took, or its apparent age (done
// less its Date) when that is larger; apparent counts only in the
// standard mode (a handler's Date is its own clock's).
func initialAge(h http.Header, start, done time.Time, apparent bool) time.Duration {
	age := firstAge(h) + max(done.Sub(start), 0)
	if apparent {
		if d, ok := parseHTTPDate(headerGet(h, "Date")); ok {
			age = max(age, done.Sub(d))
		}
	}
	return min(age, maxLifetime)
}

// imfFixdate and the obsolete formats a recipient must accept (RFC 9110
// §5.6.7), matched exactly: one space between fields, two-digit day,
// hour, minute and second.
var (
	imfFixdate = regexp.MustCompile(`^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), [0-9]{2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} (?i:GMT)$`)
	rfc850Date = regexp.MustCompile(`^(Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), [0-9]{2}-(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT$`)
	asctime    = regexp.MustCompile(`^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2} [0-9]{4}$`)
)

// parseHTTPDate parses an HTTP-date strictly: an invalid one (wrong
// spacing, a one-digit hour, "0") is not a date.
func parseHTTPDate(v string) (time.Time, bool) {
	var layout string
	switch {
	case imfFixdate.MatchString(v):
		v = v[:len(v)-3] + "GMT"
		layout = http.TimeFormat
	case rfc850Date.MatchString(v):
		layout = time.RFC850
	case asctime.MatchString(v):
		layout = time.ANSIC
	default:
		return time.Time{}, false
	}
	t, err := time.Parse(layout, v)
	return t, err == nil
}

// policy is what a response says of its caching in the standard mode.
type policy struct {
	cc       cacheControl  // the directives that rule it: a targeted field's, else Cache-Control's
	targeted bool          // cc is a targeted field's: Expires does not count
	lifetime time.Duration // its freshness lifetime
	explicit bool          // lifetime is stated (max-age, s-maxage, Expires)
	heur     bool          // lifetime is heuristic
}

// responsePolicy reads the caching policy of a response of status with
// header h.
func responsePolicy(h http.Header, status int) policy {
	var p policy
	for _, f := range targetedFields {
		if cc, ok := parseTargeted(headerValues(h, f)); ok {
			p.cc, p.targeted = cc, true
			break
		}
	}
	if !p.targeted {
		p.cc = parseDirectives(headerValues(h, "Cache-Control"))
	}
	for _, d := range []string{"s-maxage", "max-age"} {
		if v, ok := p.cc[d]; ok {
			if p.targeted && d == "s-maxage" {
				continue // targeted fields use max-age (RFC 9213 §2.1)
			}
			if life, ok := deltaSeconds(v); ok {
				p.lifetime, p.explicit = life, true
				return p
			}
		}
	}
	if !p.targeted {
		if exp := headerValues(h, "Expires"); len(exp) > 0 {
			p.explicit = true
			t, ok := parseHTTPDate(strings.TrimSpace(exp[0]))
			if ok {
				date := time.Now()
				if d, ok := parseHTTPDate(headerGet(h, "Date")); ok {
					date = d
				}
				p.lifetime = min(max(t.Sub(date), 0), maxLifetime)
			}
			return p // an invalid Expires is in the past: stale at once
		}
	}
	if slices.Contains(heuristicStatuses, status) || p.cc.has("public") {
		if lm, ok := parseHTTPDate(headerGet(h, "Last-Modified")); ok {
			date := time.Now()
			if d, ok := parseHTTPDate(headerGet(h, "Date")); ok {
				date = d
			}
			if since := date.Sub(lm); since > 0 {
				p.lifetime, p.heur = min(since/heuristicFraction, heuristicCap), true
			}
		}
	}
	return p
}

// noCacheFields returns the field names a qualified no-cache lists
// (no-cache="Set-Cookie, X-Foo"): a shared cache may store the response
// without them (RFC 9111 §5.2.2.4).
func noCacheFields(cc cacheControl) []string {
	v, ok := cc["no-cache"]
	if !ok || v == "" {
		return nil
	}
	var out []string
	for name := range strings.SplitSeq(v, ",") {
		if name = strings.TrimSpace(name); name != "" {
			out = append(out, http.CanonicalHeaderKey(name))
		}
	}
	return out
}

// decideStandard is decide in the standard mode: the response is stored
// only if it says for how long, explicitly or through a heuristic RFC
// 9111 §4.2.2 allows, whatever its status (but a 206 or a 304); never
// when a request with credentials outside the key gets it without
// public, s-maxage or must-revalidate (§3.5).
func (h *handler) decideStandard(r *http.Request, e *entry, full http.Header, before headerSnapshot, age time.Duration) verdict {
	if name := perUserField(full); name != "" {
		return verdict{why: "sets " + name + ", which is per user", mark: true}
	}
	p := responsePolicy(full, e.status)
	cc := p.cc
	// A status herd knows (net/http has a text for it), final, and not
	// one that needs a stored response to complete it.
	understood := http.StatusText(e.status) != "" && e.status >= 200 && e.status != http.StatusPartialContent && e.status != http.StatusNotModified
	if cc.has("private") || (cc.has("no-store") && !(cc.has("must-understand") && understood)) {
		return verdict{why: "its cache directives forbid a shared cache", mark: true}
	}
	// The variant is known before a response is kept for revalidation,
	// so that its copy serves only requests of that variant.
	vary, ok := h.varyNames(handlerValues(full, before, "Vary"))
	if !ok {
		return verdict{why: "varies on * or on a credential", mark: true}
	}
	// The credentials check comes before a copy is kept for revalidation
	// too: a kept copy is served after a 304, to anyone (§3.5).
	if h.unkeyedCredentials(r, h.scanHeaders(r)) && !(cc.has("public") || cc.has("s-maxage") || cc.has("must-revalidate")) {
		return verdict{why: "a response to a request with credentials outside the key, without public, s-maxage or must-revalidate"}
	}
	if cc.has("no-cache") && len(noCacheFields(cc)) == 0 {
		// Kept for revalidation: the next request leads one.
		return verdict{why: "no-cache: it must be revalidated before each use", shared: true, revalidate: true, vary: vary}
	}
	if e.status < 200 || e.status == http.StatusPartialContent || e.status == http.StatusNotModified {
		return verdict{why: "status " + strconv.Itoa(e.status) + " is not stored"}
	}
	if !p.explicit && !p.heur {
		return verdict{shared: e.status >= 500, why: "it states no freshness"}
	}
	left := p.lifetime - age
	if left <= 0 {
		return verdict{shared: true, why: "stale on arrival", revalidate: e.status < 500, vary: vary}
	}
	staleFor := time.Duration(0)
	if !cc.has("must-revalidate") && !cc.has("proxy-revalidate") {
		if d, ok := deltaSeconds(cc["stale-while-revalidate"]); ok {
			staleFor = d
		}
	}
	return verdict{ttl: left, staleFor: staleFor, shared: true, vary: vary}
}

// standardStoredHeader adjusts the stored header of a response in the
// standard mode: the fields a qualified no-cache lists are not stored,
// and its Date is kept (set to when it was generated if it had none), so
// that every hit says when the response was generated (RFC 9110 §6.6.1).
func standardStoredHeader(stored, full http.Header, done time.Time) {
	for _, f := range noCacheFields(responsePolicy(full, 200).cc) {
		deleteAnyCase(stored, f)
	}
	date := headerGet(full, "Date")
	if date == "" {
		date = done.UTC().Format(http.TimeFormat)
	}
	stored["Date"] = []string{date}
}

// standardCached says whether a status that streamed would have been
// stored, for the hit-for-miss mark (see lead): the heuristically
// cacheable statuses below 500.
func standardCached(status int) bool {
	return status < 500 && slices.Contains(heuristicStatuses, status)
}
