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
	e := &entry{status: int(binary.BigEndian.Uint16(p[2:])), header: http.Header{}}
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

// isPerUser reports whether the field name, in any case, is in perUser.
func isPerUser(name string) bool {
	for _, p := range perUser {
		if strings.EqualFold(name, p) {
			return true
		}
	}
	return false
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

// handlerValues returns the values of the field name (under any case)
// that the handler set: all of them when it replaced what before held,
// the ones it appended when it added to them, none when they are what
// before held (an outer middleware's).
func handlerValues(h, before http.Header, name string) []string {
	var out []string
	for k, vs := range h {
		if !strings.EqualFold(k, name) {
			continue
		}
		if b := before[k]; len(b) <= len(vs) && slices.Equal(vs[:len(b)], b) {
			vs = vs[len(b):]
		}
		out = append(out, vs...)
	}
	return out
}

// storedHeader returns the header fields of a response that may be
// stored: those the handler set (fields whose values differ from before,
// the snapshot taken before it ran, so that headers an outer middleware
// set for this one request are not replayed to others), less hop-by-hop
// fields, those recomputed on every response and the per-user ones,
// under any case.
func storedHeader(h, before http.Header) http.Header {
	out := http.Header{}
	for name, vs := range h {
		if !slices.Equal(vs, before[name]) {
			out[name] = slices.Clone(vs)
		}
	}
	drop := slices.Clone(hopByHop)
	drop = append(drop, perUser...)
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

// cacheControl is a parsed Cache-Control header.
type cacheControl map[string]string

func parseCacheControl(h http.Header) cacheControl {
	cc := cacheControl{}
	for _, line := range headerValues(h, "Cache-Control") {
		for _, d := range strings.Split(line, ",") {
			d = strings.TrimSpace(d)
			if d == "" {
				continue
			}
			name, val, _ := strings.Cut(d, "=")
			cc[strings.ToLower(strings.TrimSpace(name))] = strings.Trim(strings.TrimSpace(val), `"`)
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
			return time.Duration(min(secs, int64(365*24*time.Hour/time.Second))) * time.Second, true
		}
	}
	return 0, false
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
	// modifiedAfter reports whether e was last modified after the date in
	// the request field (false when either date is missing or invalid).
	modifiedAfter := func(field string) (after, ok bool) {
		v := r.Header.Get(field)
		if v == "" {
			return false, false
		}
		t, err := http.ParseTime(v)
		if err != nil {
			return false, false
		}
		lm, err := http.ParseTime(headerGet(e.header, "Last-Modified"))
		if err != nil {
			return false, false
		}
		return lm.After(t), true
	}
	if im := r.Header.Values("If-Match"); len(im) > 0 {
		if !etagMatchStrong(strings.Join(im, ","), headerGet(e.header, "Etag")) {
			return http.StatusPreconditionFailed
		}
	} else if after, ok := modifiedAfter("If-Unmodified-Since"); ok && after {
		return http.StatusPreconditionFailed
	}
	if e.status != http.StatusOK {
		return 0
	}
	if inm := r.Header.Values("If-None-Match"); len(inm) > 0 {
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
