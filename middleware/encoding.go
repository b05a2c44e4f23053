package middleware

import (
	"net/http"
	"strings"
)

// Content negotiation on Accept-Encoding (RFC 9110 §12.5.3).
//
// herd reduces a request's Accept-Encoding to the content codings it
// negotiates, gzip and br, that the client accepts. The handler that
// builds an entry is shown an Accept-Encoding derived from that reduction
// alone, never the client's own field, so its choice of coding depends on
// nothing a request's key does not hold:
//
//   - By default every client shares one entry. The handler is shown
//     "gzip" when its client accepts gzip, else "identity"; it may answer
//     with a gzip body or an identity one, and herd serves either to every
//     client, decoding a gzip body for a client that does not accept gzip
//     (compress.go). A response in any other coding is not stored. With
//     Options.Compress herd also compresses the identity bodies worth it.
//   - With Accept-Encoding in Options.KeyHeaders the key holds the
//     client's bucket, one of four: br and gzip, br, gzip, identity. The
//     handler is shown exactly the bucket's codings ("br, gzip", "br",
//     "gzip" or "identity"), and each bucket's entry is served as stored:
//     every client of a bucket accepts every coding the handler may pick
//     for it. This is for handlers that code with br themselves.
//
// zstd, deflate and compress are never offered to the handler: a client
// that accepts only them is an identity client.

// accepted is the set of negotiated codings a client accepts.
type accepted uint8

const (
	acceptsGzip accepted = 1 << iota
	acceptsBr
)

// acceptance is what Accept-Encoding says of one coding.
type acceptance uint8

const (
	unmentioned acceptance = iota
	acceptable
	refused
)

// mention merges one more mention of a coding with its q-value verdict:
// a refusal (q=0, or a q-value that does not parse) is never undone by
// another mention.
func (a acceptance) mention(ok bool) acceptance {
	if a == refused || !ok {
		return refused
	}
	return acceptable
}

// parseAcceptEncoding returns the negotiated codings that the
// Accept-Encoding field values accept. A coding is accepted when it is
// listed (x-gzip is gzip, names in any case) with a q-value above 0 or
// none, or, unlisted, when "*" is (§12.5.3). Whatever is in doubt is not
// accepted: a q-value that is not an RFC 9110 qvalue, a coding listed
// twice once with q=0. No field, or an empty one, accepts nothing but
// identity: RFC 9110 lets a server send any coding to a client that sent
// no Accept-Encoding, but not every such client decodes one. It does not
// allocate.
func parseAcceptEncoding(values []string) accepted {
	var gzip, br, star acceptance
	for _, v := range values {
		for v != "" {
			var elem string
			elem, v, _ = strings.Cut(v, ",")
			name, params, _ := strings.Cut(elem, ";")
			switch name = strings.TrimSpace(name); {
			case strings.EqualFold(name, "gzip"), strings.EqualFold(name, "x-gzip"):
				gzip = gzip.mention(qPositive(params))
			case strings.EqualFold(name, "br"):
				br = br.mention(qPositive(params))
			case name == "*":
				star = star.mention(qPositive(params))
			}
		}
	}
	var a accepted
	if gzip == acceptable || (gzip == unmentioned && star == acceptable) {
		a |= acceptsGzip
	}
	if br == acceptable || (br == unmentioned && star == acceptable) {
		a |= acceptsBr
	}
	return a
}

// qPositive reports whether the parameters after a coding (";q=0.8",
// ";Q=1;x=y", "") give it a weight above 0: no q parameter is q=1, and a
// q that is not a qvalue ("0" to "1" with at most three decimals) counts
// as 0.
func qPositive(params string) bool {
	ok := true
	for params != "" {
		var p string
		p, params, _ = strings.Cut(params, ";")
		name, val, _ := strings.Cut(p, "=")
		if strings.EqualFold(strings.TrimSpace(name), "q") {
			ok = ok && qvaluePositive(strings.TrimSpace(val))
		}
	}
	return ok
}

// qvaluePositive parses an RFC 9110 §12.4.2 qvalue and reports whether it
// is above 0; an invalid one is not.
func qvaluePositive(q string) bool {
	if q == "" || (q[0] != '0' && q[0] != '1') {
		return false
	}
	frac := q[1:]
	if frac != "" {
		if frac[0] != '.' || len(frac) > 4 {
			return false
		}
		frac = frac[1:]
	}
	positive := q[0] == '1'
	for i := range len(frac) {
		c := frac[i]
		if c < '0' || c > '9' || (q[0] == '1' && c != '0') {
			return false
		}
		positive = positive || c != '0'
	}
	return positive
}

// The encoding part of a key: "|ae=" and one byte, z when all clients
// share the entry, else the client's bucket. Its length is fixed, so
// appending it to a key keeps keys injective.
const (
	keyShared   = "|ae=z"
	keyBrGzip   = "|ae=b"
	keyBr       = "|ae=r"
	keyGzip     = "|ae=g"
	keyIdentity = "|ae=i"
)

// bucket is what r's Accept-Encoding adds to its key, and the
// Accept-Encoding the handler is shown when it builds the entry.
func (h *handler) bucket(r *http.Request) (key, shown string) {
	a := parseAcceptEncoding(r.Header["Accept-Encoding"])
	if !h.cfg.encodingKeyed {
		// One entry for all: the handler is shown what its own client
		// accepts of gzip, so that what streams past the cache to that
		// client is acceptable to it, and herd decodes the stored entry
		// for the clients without gzip.
		if a&acceptsGzip != 0 {
			return keyShared, "gzip"
		}
		return keyShared, "identity"
	}
	switch a {
	case acceptsBr | acceptsGzip:
		return keyBrGzip, "br, gzip"
	case acceptsBr:
		return keyBr, "br"
	case acceptsGzip:
		return keyGzip, "gzip"
	}
	return keyIdentity, "identity"
}

// encodingKey is what r's Accept-Encoding adds to its key.
func (h *handler) encodingKey(r *http.Request) string {
	key, _ := h.bucket(r)
	return key
}

// handlerRequest returns the request the handler builds an entry from: r
// as a GET, without its conditional header fields (see
// withoutConditionals), and with the Accept-Encoding of its bucket. It is
// r itself when that changes nothing.
func (h *handler) handlerRequest(r *http.Request) *http.Request {
	req := withoutConditionals(r)
	if len(req.Header["Range"]) > 0 {
		// The standard mode's one Range of a GET: the entry is the whole
		// response (ranges.go).
		if req == r {
			req = r.Clone(r.Context())
		}
		req.Header.Del("Range")
	}
	_, shown := h.bucket(r)
	if vs := req.Header["Accept-Encoding"]; len(vs) == 1 && vs[0] == shown {
		return req
	}
	if req == r {
		req = r.Clone(r.Context())
	}
	req.Header.Set("Accept-Encoding", shown)
	return req
}
