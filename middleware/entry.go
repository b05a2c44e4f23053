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

// storedHeader returns the header fields of a response that may be
// stored: those the handler set (fields whose values differ from before,
// the snapshot taken before it ran, so that headers an outer middleware
// set for this one request are not replayed to others), less hop-by-hop
// fields and those recomputed on every response.
func storedHeader(h, before http.Header) http.Header {
	out := http.Header{}
	for name, vs := range h {
		if !slices.Equal(vs, before[name]) {
			out[name] = slices.Clone(vs)
		}
	}
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			out.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopByHop {
		out.Del(name)
	}
	return out
}

// cacheControl is a parsed Cache-Control header.
type cacheControl map[string]string

func parseCacheControl(h http.Header) cacheControl {
	cc := cacheControl{}
	for _, line := range h.Values("Cache-Control") {
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
