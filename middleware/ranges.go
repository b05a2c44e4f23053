package middleware

import (
	"net/http"
	"strconv"
	"strings"
)

// Range requests in the standard mode (RFC 9110 §14): a GET with one
// byte range is looked up under the key of the whole response, whose
// rebuild runs the handler without the Range field, and is served the
// range from the complete stored response: 206 with Content-Range, or
// 416 when the range starts past its end. Several ranges, another unit,
// a Range herd cannot parse, or an If-Range that does not match get the
// whole response (a server may ignore Range, §14.2).

// byteRange is the part of a body of size bytes that the Range field v
// asks for: [start, end), ok false to send the whole body, unsatisfiable
// for a 416.
func byteRange(v string, size int) (start, end int, ok, unsatisfiable bool) {
	unit, spec, found := strings.Cut(v, "=")
	if !found || !strings.EqualFold(strings.TrimSpace(unit), "bytes") || strings.Contains(spec, ",") {
		return 0, 0, false, false
	}
	first, last, found := strings.Cut(strings.TrimSpace(spec), "-")
	if !found {
		return 0, 0, false, false
	}
	digits := func(s string) (int, bool) {
		if s == "" || strings.Trim(s, "0123456789") != "" || len(s) > 15 {
			return 0, false
		}
		n, err := strconv.Atoi(s)
		return n, err == nil
	}
	if first == "" { // a suffix: the last n bytes
		n, okN := digits(last)
		if !okN {
			return 0, 0, false, false
		}
		if n == 0 || size == 0 {
			return 0, 0, false, true // no byte to send (RFC 9110 §14.1.3)
		}
		return max(size-n, 0), size, true, false
	}
	s, okS := digits(first)
	if !okS {
		return 0, 0, false, false
	}
	e := size - 1
	if last != "" {
		l, okL := digits(last)
		if !okL || l < s {
			return 0, 0, false, false
		}
		e = min(l, size-1)
	}
	if s >= size {
		return 0, 0, false, true
	}
	return s, e + 1, true, false
}

// ifRangeMatches reports whether r's If-Range, if any, names the stored
// response e (a strong ETag match, or its Last-Modified date exactly).
func ifRangeMatches(r *http.Request, e *entry) bool {
	v := strings.TrimSpace(r.Header.Get("If-Range"))
	if v == "" {
		return true
	}
	if strings.HasPrefix(v, `"`) || strings.HasPrefix(v, "W/") {
		tag := headerGet(e.header, "Etag")
		return tag != "" && !strings.HasPrefix(tag, "W/") && v == tag
	}
	return v == headerGet(e.header, "Last-Modified")
}

// servedRange returns the status and body to send for r from e in the
// standard mode, and sets Content-Range in dst: e's own status and body
// unless r asks for a range of a 200 that herd serves (see above).
func (h *handler) servedRange(r *http.Request, e *entry, dst http.Header) (int, []byte) {
	v := r.Header.Get("Range")
	if !h.cfg.Standard || v == "" || r.Method != http.MethodGet || e.status != http.StatusOK || !ifRangeMatches(r, e) {
		return e.status, e.body
	}
	start, end, ok, unsatisfiable := byteRange(v, len(e.body))
	switch {
	case unsatisfiable:
		dst.Set("Content-Range", "bytes */"+strconv.Itoa(len(e.body)))
		return http.StatusRequestedRangeNotSatisfiable, nil
	case !ok:
		return e.status, e.body
	}
	dst.Set("Content-Range", "bytes "+strconv.Itoa(start)+"-"+strconv.Itoa(end-1)+"/"+strconv.Itoa(len(e.body)))
	return http.StatusPartialContent, e.body[start:end]
}
