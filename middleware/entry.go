package middleware

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// entry is a stored response.
type entry struct {
	status int
	header http.Header
	body   []byte
	// owned: decoded for one request (decodeEntry), so nothing else holds
	// its header's slices, and write may hand them to the response as
	// they are.
	owned bool
	// facts of header, found once per header block the memo keeps (see
	// entryMemo); nil: not found yet (use headerFacts).
	facts *headerFacts
}

// headerFacts returns e's facts: the memo's, or found now.
func (e *entry) headerFacts() *headerFacts {
	if e.facts != nil {
		return e.facts
	}
	return factsOf(e.header)
}

// headerFacts is what a hit needs of a stored header beyond its fields,
// computed once per header block instead of on every hit.
type headerFacts struct {
	age     time.Duration // storedAge(header)
	trailer bool          // header has a Trailer field, in any case
	coding  string        // contentCoding(header)
}

func factsOf(h http.Header) *headerFacts {
	f := &headerFacts{age: storedAge(h), coding: contentCoding(h)}
	for name := range h {
		if len(name) == len("Trailer") && strings.EqualFold(name, "Trailer") {
			f.trailer = true
		}
	}
	return f
}

// The stored form: 'H', version 1, status (uint16), the number of header
// fields (uvarint), each field as name and value (uvarint length and
// bytes), then the body.
const (
	entryMagic   = 'H'
	entryVersion = 1
)

var errBadEntry = errors.New("herd/middleware: stored entry is not a response")

func (e *entry) encode() []byte {
	var b bytes.Buffer
	b.Grow(len(e.body) + 256)
	b.WriteByte(entryMagic)
	b.WriteByte(entryVersion)
	_ = binary.Write(&b, binary.BigEndian, uint16(e.status))
	names := make([]string, 0, len(e.header))
	fields := 0
	for name, vs := range e.header {
		names = append(names, name)
		fields += len(vs)
	}
	slices.Sort(names)
	b.Write(binary.AppendUvarint(nil, uint64(fields)))
	for _, name := range names {
		for _, v := range e.header[name] {
			b.Write(binary.AppendUvarint(nil, uint64(len(name))))
			b.WriteString(name)
			b.Write(binary.AppendUvarint(nil, uint64(len(v))))
			b.WriteString(v)
		}
	}
	b.Write(e.body)
	return b.Bytes()
}

func decodeEntry(p []byte) (*entry, error) {
	if len(p) < 4 || p[0] != entryMagic || p[1] != entryVersion {
		return nil, errBadEntry
	}
	e := &entry{status: int(binary.BigEndian.Uint16(p[2:])), header: http.Header{}, owned: true}
	p = p[4:]
	fields, n := binary.Uvarint(p)
	if n <= 0 || fields > uint64(len(p)) {
		return nil, errBadEntry
	}
	p = p[n:]
	str := func() (string, bool) {
		l, n := binary.Uvarint(p)
		if n <= 0 || l > uint64(len(p)-n) {
			return "", false
		}
		s := string(p[n : n+int(l)])
		p = p[n+int(l):]
		return s, true
	}
	for range fields {
		name, ok1 := str()
		value, ok2 := str()
		if !ok1 || !ok2 {
			return nil, errBadEntry
		}
		e.header[name] = append(e.header[name], value)
	}
	if e.status < 100 || e.status > 999 {
		return nil, errBadEntry
	}
	e.body = p
	return e, nil
}

// hopByHop are the header fields that describe one connection, never a
// stored response (RFC 9110 §7.6.1), plus those herd recomputes on every
// response it serves.
var hopByHop = []string{
	"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
	"Date", "Age", "Content-Length", "Cache-Status",
}

// perUser are the response fields that make a response one user's: a
// response carrying any of them, under any case and with any value (even
// empty), is not stored, and they are never stored nor replayed.
var perUser = []string{
	"Set-Cookie", "Set-Cookie2", "Clear-Site-Data", "Authentication-Info",
	"Www-Authenticate", "Proxy-Authenticate",
}

// isPerUser reports whether the field name, in any case, is in perUser,
// as a header field or as a trailer set through net/http's TrailerPrefix
// ("Trailer:Set-Cookie"), which net/http sends as that field in the
// trailer section.
func isPerUser(name string) bool {
	name, _ = cutTrailerPrefix(name)
	for _, p := range perUser {
		if strings.EqualFold(name, p) {
			return true
		}
	}
	return false
}

// cutTrailerPrefix returns name without net/http's TrailerPrefix (in any
// case), and whether it had it.
func cutTrailerPrefix(name string) (string, bool) {
	if n := len(http.TrailerPrefix); len(name) > n && strings.EqualFold(name[:n], http.TrailerPrefix) {
		return name[n:], true
	}
	return name, false
}

// perUserField returns a per-user field the response header h carries or
// announces as a trailer (the Trailer field, RFC 9110 §6.6.2, whose
// values a handler sets in the header map after writing the body), or "".
func perUserField(h http.Header) string {
	for name := range h {
		if isPerUser(name) {
			return name
		}
	}
	for _, v := range headerValues(h, "Trailer") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); isPerUser(name) {
				return "Trailer: " + name
			}
		}
	}
	return ""
}

// headerValues returns the values of the field name under any case of its
// key: a handler that writes h["cache-control"] directly bypasses the
// canonicalisation of Header.Set, and net/http still sends the field.
func headerValues(h http.Header, name string) []string {
	var out []string
	for k, vs := range h {
		if strings.EqualFold(k, name) {
			out = append(out, vs...)
		}
	}
	return out
}

// headerGet is the first value of name under any case, or "".
func headerGet(h http.Header, name string) string {
	if vs := h[name]; len(vs) > 0 {
		return vs[0]
	}
	if vs := headerValues(h, name); len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// headerSnapshot records the response header map as it was before the
// handler ran (what outer middleware had set), by identity: each field's
// slice, its length and its values. A value the handler wrote is the
// handler's even when it equals what was there: Header.Set makes a new
// slice, Header.Add appends to the one recorded (snapshotHeader leaves it
// room to, so the append stays in place), and an in-place write changes a
// recorded value. A nil snapshot records no field: all are the handler's.
type headerSnapshot map[string]fieldSnap

type fieldSnap struct {
	first *string  // the slice's first element (of its capacity)
	n     int      // its length
	vals  []string // its values
}

// snapSpare is the room snapshotHeader leaves after each field's values:
// a handler that appends more to one field (than 8 values) moves its
// slice, and the whole field is then taken as the handler's (judged, and
// stored).
const snapSpare = 8

// snapshotHeader gives each field of h a slice of its own with room to
// append, and records it.
func snapshotHeader(h http.Header) headerSnapshot {
	s := make(headerSnapshot, len(h))
	for k, vs := range h {
		ns := make([]string, len(vs), len(vs)+snapSpare)
		copy(ns, vs)
		h[k] = ns
		s[k] = fieldSnap{first: &ns[:1][0], n: len(vs), vals: slices.Clone(vs)}
	}
	return s
}

// handlerSet returns the values of field k (vs now) that the handler
// wrote: none when it left the field as recorded, the ones it appended,
// or all of them when it replaced the field or changed a value; touched
// says whether it wrote any.
func (s headerSnapshot) handlerSet(k string, vs []string) (set []string, touched bool) {
	f, ok := s[k]
	if !ok {
		return vs, len(vs) > 0
	}
	if cap(vs) > 0 && &vs[:1][0] == f.first && len(vs) >= f.n && slices.Equal(vs[:f.n], f.vals) {
		return vs[f.n:], len(vs) > f.n
	}
	return vs, true
}

// handlerValues returns the values of the field name (under any case)
// that the handler wrote (see headerSnapshot): all of them when it
// replaced the field, even with the same values, the ones it appended
// when it added to them, none when they are what an outer middleware set.
func handlerValues(h http.Header, before headerSnapshot, name string) []string {
	var out []string
	for k, vs := range h {
		if !strings.EqualFold(k, name) {
			continue
		}
		set, _ := before.handlerSet(k, vs)
		out = append(out, set...)
	}
	return out
}

// storedHeader returns the header fields of a response that may be
// stored: those the handler wrote (see headerSnapshot; fields an outer
// middleware set for this one request are not replayed to others), less
// hop-by-hop fields, those recomputed on every response, the per-user
// ones, under any case, and trailers set through net/http's
// TrailerPrefix (a stored response is replayed without trailers).
func storedHeader(h http.Header, before headerSnapshot) http.Header {
	out := http.Header{}
	for name, vs := range h {
		if _, trailer := cutTrailerPrefix(name); trailer {
			continue
		}
		if _, touched := before.handlerSet(name, vs); touched {
			out[name] = slices.Clone(vs)
		}
	}
	drop := slices.Clone(hopByHop)
	drop = append(drop, perUser...)
	drop = append(drop, declaredTrailers(h)...) // trailer fields are never header fields (RFC 9111 §3.1)
	for _, f := range headerValues(h, "Connection") {
		for name := range strings.SplitSeq(f, ",") {
			drop = append(drop, strings.TrimSpace(name))
		}
	}
	for name := range out {
		for _, d := range drop {
			if strings.EqualFold(name, d) {
				delete(out, name)
				break
			}
		}
	}
	return out
}

// declaredTrailers returns the field names the response header h
// announces in its Trailer field (RFC 9110 §6.6.2), canonical: a handler
// sets their values in the header map after writing the body, and
// net/http sends them in the trailer section.
func declaredTrailers(h http.Header) []string {
	var out []string
	for _, v := range headerValues(h, "Trailer") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				out = append(out, http.CanonicalHeaderKey(name))
			}
		}
	}
	return out
}

// takeTrailers removes from the response header h the values of the
// fields h announces as trailers, and returns them: a response herd sends
// after the handler returned would otherwise carry them as header fields.
// restoreTrailers puts them back once the body is written, and net/http
// sends them as trailers.
func takeTrailers(h http.Header) http.Header {
	var out http.Header
	for _, name := range declaredTrailers(h) {
		for k, vs := range h {
			if strings.EqualFold(k, name) {
				if out == nil {
					out = http.Header{}
				}
				out[k] = vs
				delete(h, k)
			}
		}
	}
	return out
}

// cacheControl is a parsed Cache-Control header.
type cacheControl map[string]string

// conflicting is the value of a directive given twice with different
// arguments: it parses as no number, so a max-age or s-maxage given as 0
// and 60 (on one line or two: the handler's and another layer's) makes
// the response stale at once, never the later or the larger value. RFC
// 9111 §4.2.1 lets a cache use the first or treat the response as stale;
// herd does the safe one.
const conflicting = "\x00conflicting"

func parseCacheControl(h http.Header) cacheControl {
	cc := cacheControl{}
	for _, line := range headerValues(h, "Cache-Control") {
		for _, d := range strings.Split(line, ",") {
			d = strings.TrimSpace(d)
			if d == "" {
				continue
			}
			name, val, _ := strings.Cut(d, "=")
			name = strings.ToLower(strings.TrimSpace(name))
			val = strings.Trim(strings.TrimSpace(val), `"`)
			if old, dup := cc[name]; dup && old != val {
				val = conflicting
			}
			cc[name] = val
		}
	}
	return cc
}

func (cc cacheControl) has(d string) bool { _, ok := cc[d]; return ok }

// maxAge returns the shared-cache lifetime the response allows:
// s-maxage, else max-age.
func (cc cacheControl) maxAge() (time.Duration, bool) {
	for _, d := range []string{"s-maxage", "max-age"} {
		if v, ok := cc[d]; ok {
			secs, err := strconv.ParseInt(v, 10, 64)
			if err != nil || secs < 0 {
				return 0, true // unparsable: treat as 0, do not store
			}
			return time.Duration(min(secs, int64(maxLifetime/time.Second))) * time.Second, true
		}
	}
	return 0, false
}

// maxLifetime caps any lifetime or age herd reads from a response.
const maxLifetime = 365 * 24 * time.Hour

// freshness is what a response says of its own freshness (RFC 9111
// §4.2): its freshness lifetime, whether it states one, and the Age it
// already had when the handler passed it on (a proxying handler's
// upstream cache).
type freshness struct {
	lifetime time.Duration // s-maxage, else max-age, else Expires - Date
	stated   bool          // one of them is present
	age      time.Duration // the Age field, 0 when absent or invalid
}

// remaining is how long the response is still fresh (<= 0: stale).
func (f freshness) remaining() time.Duration { return f.lifetime - f.age }

// responseFreshness reads h's freshness at now. s-maxage, then max-age,
// take precedence over Expires (§5.3); an Expires that is invalid ("0"),
// given twice with different values, or not after Date (the handler's,
// else now) gives a lifetime of 0: stale at once. Age (§5.1) is the first
// member of its first field (firstAge).
func responseFreshness(h http.Header, cc cacheControl, now time.Time) freshness {
	var f freshness
	f.lifetime, f.stated = cc.maxAge()
	if !f.stated {
		if exp := headerValues(h, "Expires"); len(exp) > 0 {
			f.stated = true
			t, err := http.ParseTime(exp[0])
			same := !slices.ContainsFunc(exp, func(v string) bool { return v != exp[0] })
			if err == nil && same {
				date := now
				if d, err := http.ParseTime(headerGet(h, "Date")); err == nil {
					date = d
				}
				f.lifetime = min(max(t.Sub(date), 0), maxLifetime)
			}
		}
	}
	f.age = firstAge(h)
	return f
}

// storedAge is the Age an entry had when it was stored (see lead), 0 for
// none.
func storedAge(h http.Header) time.Duration {
	secs, err := strconv.ParseInt(headerGet(h, "Age"), 10, 64)
	if err != nil || secs <= 0 {
		return 0
	}
	return time.Duration(min(secs, int64(maxLifetime/time.Second))) * time.Second
}

// etagOf is a strong validator for body.
func etagOf(body []byte) string {
	sum := sha256.Sum256(body)
	return `"` + base64.RawURLEncoding.EncodeToString(sum[:16]) + `"`
}

// etagMatch reports whether an If-None-Match header matches etag, with
// the weak comparison RFC 9110 §13.1.2 prescribes for it.
func etagMatch(ifNoneMatch, etag string) bool {
	if etag == "" {
		return false
	}
	strip := func(t string) string { return strings.TrimPrefix(strings.TrimSpace(t), "W/") }
	for _, t := range strings.Split(ifNoneMatch, ",") {
		t = strings.TrimSpace(t)
		if t == "*" || strip(t) == strip(etag) {
			return true
		}
	}
	return false
}

// precondition evaluates r's conditional header fields against a stored
// response, as RFC 9110 §13.2.2 orders them: 412 when If-Match (or, in
// its absence, If-Unmodified-Since) fails, 304 when If-None-Match (or, in
// its absence, If-Modified-Since) says the client's copy is current, 0 to
// send e. Only a 2xx is subject to preconditions, and only a 200 is
// answered with 304.
func precondition(r *http.Request, e *entry) int {
	if e.status/100 != 2 {
		return 0
	}
	h := r.Header
	if len(h["If-Match"])+len(h["If-None-Match"])+len(h["If-Modified-Since"])+len(h["If-Unmodified-Since"]) == 0 {
		return 0 // most requests: no conditional field
	}
	// modifiedAfter reports whether e was last modified after the date in
	// the request field (false when either date is missing or invalid).
	modifiedAfter := func(field string) (after, ok bool) {
		vs := h[field] // field is canonical
		if len(vs) == 0 || vs[0] == "" {
			return false, false
		}
		t, err := http.ParseTime(vs[0])
		if err != nil {
			return false, false
		}
		lm, err := http.ParseTime(headerGet(e.header, "Last-Modified"))
		if err != nil {
			return false, false
		}
		return lm.After(t), true
	}
	if im := r.Header["If-Match"]; len(im) > 0 {
		if !etagMatchStrong(strings.Join(im, ","), headerGet(e.header, "Etag")) {
			return http.StatusPreconditionFailed
		}
	} else if after, ok := modifiedAfter("If-Unmodified-Since"); ok && after {
		return http.StatusPreconditionFailed
	}
	if e.status != http.StatusOK {
		return 0
	}
	if inm := r.Header["If-None-Match"]; len(inm) > 0 {
		if etagMatch(strings.Join(inm, ","), headerGet(e.header, "Etag")) {
			return http.StatusNotModified
		}
	} else if after, ok := modifiedAfter("If-Modified-Since"); ok && !after {
		return http.StatusNotModified
	}
	return 0
}

// etagMatchStrong reports whether an If-Match header matches etag, with
// the strong comparison RFC 9110 §13.1.1 prescribes for it: a weak tag
// never matches.
func etagMatchStrong(ifMatch, etag string) bool {
	for t := range strings.SplitSeq(ifMatch, ",") {
		t = strings.TrimSpace(t)
		if t == "*" || (t == etag && etag != "" && !strings.HasPrefix(etag, "W/")) {
			return true
		}
	}
	return false
}
