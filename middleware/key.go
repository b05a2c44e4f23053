package middleware

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// defaultKey builds the cache key of a request: scheme, host, the
// request target as the server received it (its path and canonical
// query), the URL as the handler sees it when that is not what the target
// parses to, then the configured request headers. Every component is
// length-prefixed, so no delimiter in one component can make two requests
// share a key. herd hashes the key for Redis, so its bytes do not matter
// there; its length is bounded by Options.MaxKeyBytes.
//
//   - Host is r.Host, as net/http resolved it, case preserved.
//   - The target is r.RequestURI, byte for byte, not r.URL re-encoded:
//     a raw "<" or an invalid UTF-8 byte, %2F and /, %62 and b, an
//     absolute-form target (with its scheme and user info) and the
//     origin-form one are all different keys, whatever the router or the
//     handler makes of them. Behind http.StripPrefix (or any middleware
//     that rewrites r.URL) the target still holds the path the client
//     sent, and the rewritten URL is keyed too. A request built in
//     process (no RequestURI) is keyed on r.URL's escaped path and raw
//     query.
//   - The query is the raw query with its parameters stably sorted by
//     name, decoded as url.ParseQuery decodes it: order of different
//     parameters does not matter, but values, their order for a repeated
//     name (a and %61 are one name) and their encoding do (a=%31 and a=1
//     are different keys: when in doubt, do not share).
func defaultKey(r *http.Request, headers []string) string {
	path, query, hasQuery := requestTarget(r)
	var b strings.Builder
	b.Grow(len(path) + len(query) + len(r.Host) + 48)
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	b.WriteString("herd-http/2|")
	writeField(&b, scheme)
	writeField(&b, r.Host)
	writeField(&b, path)
	if hasQuery {
		b.WriteByte('?')
	}
	writeField(&b, canonicalQuery(query))
	if u := r.URL; !urlIsTarget(u, path, query, hasQuery) {
		// A rewritten URL, or an absolute-form target: the handler may read
		// any of these, so all of them are keyed.
		b.WriteString("|url|")
		user := ""
		if u.User != nil {
			user = "@" + u.User.String()
		}
		for _, f := range []string{u.Scheme, u.Opaque, user, u.Host, u.Path, u.RawPath, u.RawQuery, u.Fragment} {
			writeField(&b, f)
		}
		if u.ForceQuery {
			b.WriteByte('?')
		}
	}
	for _, h := range headers {
		writeHeader(&b, h, r.Header.Values(h))
	}
	return b.String()
}

// requestTarget returns the request target as the server received it,
// split at its first '?'. A request that did not come from a server (no
// RequestURI: one built in process) has r.URL's escaped path and raw
// query instead.
func requestTarget(r *http.Request) (path, query string, hasQuery bool) {
	if r.RequestURI == "" {
		path = r.URL.Opaque
		if path == "" {
			path = r.URL.EscapedPath()
		}
		return path, r.URL.RawQuery, r.URL.ForceQuery || r.URL.RawQuery != ""
	}
	return strings.Cut(r.RequestURI, "?")
}

// targetLen is the length of the request target, without building it.
func targetLen(r *http.Request) int {
	if r.RequestURI != "" {
		return len(r.RequestURI)
	}
	return len(r.URL.Opaque) + len(r.URL.Path) + len(r.URL.RawPath) + len(r.URL.RawQuery)
}

// urlIsTarget reports whether u is what net/http parses from an
// origin-form target with this path and query, so that keying the target
// keys everything a handler reads from u.
func urlIsTarget(u *url.URL, path, query string, hasQuery bool) bool {
	if u.Scheme != "" || u.Opaque != "" || u.User != nil || u.Host != "" || u.Fragment != "" || u.RawFragment != "" {
		return false
	}
	if u.RawQuery != query || u.ForceQuery != (hasQuery && query == "") {
		return false
	}
	if u.RawPath != "" && u.RawPath != path {
		return false
	}
	if u.RawPath == "" && !strings.Contains(path, "%") {
		return u.Path == path
	}
	dec, err := url.PathUnescape(path)
	return err == nil && dec == u.Path
}

// writeField writes s length-prefixed.
func writeField(b *strings.Builder, s string) {
	b.WriteString(strconv.Itoa(len(s)))
	b.WriteByte(':')
	b.WriteString(s)
}

// writeHeader writes a header field's name, number of values and values.
func writeHeader(b *strings.Builder, name string, values []string) {
	writeField(b, name)
	b.WriteString(strconv.Itoa(len(values)))
	b.WriteByte('#')
	for _, v := range values {
		writeField(b, v)
	}
}

// canonicalQuery sorts the raw query's parameters stably by name, decoded
// as url.ParseQuery decodes it (the raw name when it does not decode), so
// that parameters the handler sees under one name keep their order.
func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	type param struct{ name, raw string }
	params := make([]param, 0, strings.Count(raw, "&")+1)
	for p := range strings.SplitSeq(raw, "&") {
		name, _, _ := strings.Cut(p, "=")
		if dec, err := url.QueryUnescape(name); err == nil {
			name = dec
		}
		params = append(params, param{name, p})
	}
	slices.SortStableFunc(params, func(a, b param) int { return strings.Compare(a.name, b.name) })
	var b strings.Builder
	b.Grow(len(raw))
	for i, p := range params {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(p.raw)
	}
	return b.String()
}

// forwardedHeaders are the request headers through which a proxy, or a
// client posing as one, tells the origin another host, scheme, port, path
// prefix or URL than the request's own: the headers of the classic cache
// poisoning, where a handler builds links from one of them and the first
// requester's forged value is served to everyone. Unless
// Options.IgnoreForwardedHeaders is set, those a request carries are part
// of its key. Canonical forms, sorted.
var forwardedHeaders = []string{
	"Forwarded",
	"Front-End-Https",
	"X-Forwarded-Host",
	"X-Forwarded-Path",
	"X-Forwarded-Port",
	"X-Forwarded-Prefix",
	"X-Forwarded-Proto",
	"X-Forwarded-Scheme",
	"X-Forwarded-Server",
	"X-Forwarded-Ssl",
	"X-Forwarded-Uri",
	"X-Host",
	"X-Http-Host-Override",
	"X-Original-Host",
	"X-Original-Uri",
	"X-Original-Url",
	"X-Rewrite-Url",
	"X-Url-Scheme",
}

// methodOverrideHeaders turn a request into another method in the
// frameworks that honour them: a GET carrying one may not be a read, so
// it bypasses the cache (neither keyed nor shared).
var methodOverrideHeaders = []string{
	"X-Http-Method",
	"X-Http-Method-Override",
	"X-Method-Override",
}

// forwardedKey returns what the forwarding headers r carries add to its
// key: "" when it carries none (or only those in keyHeaders, which
// defaultKey has keyed). It is appended to defaultKey's key, whose own
// length prefixes fix where it ends, so the whole key stays injective.
// The for= parameters of Forwarded are left out: they carry the client's
// address, a different one for every client, like X-Forwarded-For, which
// is not keyed either.
func forwardedKey(r *http.Request, keyHeaders []string) string {
	var b strings.Builder
	for _, name := range forwardedHeaders {
		vs := r.Header.Values(name)
		if len(vs) == 0 || slices.Contains(keyHeaders, name) {
			continue
		}
		if name == "Forwarded" {
			vs = forwardedWithoutFor(vs)
			if len(vs) == 0 {
				continue
			}
		}
		if b.Len() == 0 {
			b.WriteString("|fwd|")
		}
		writeHeader(&b, name, vs)
	}
	return b.String()
}

// forwardedWithoutFor drops the for= pairs from Forwarded values (RFC
// 7239), and the elements and values left empty; parameter names are
// case-insensitive and lowered. A value that does not parse as RFC 7239
// (pairs not separated by ';' or ',', an unterminated quoted string, a
// bare word) is kept whole, and so is a for= pair whose quoted value holds
// a separator: what herd cannot parse, a lenient parser behind it may
// read, so it stays in the key.
func forwardedWithoutFor(values []string) []string {
	var out []string
	for _, v := range values {
		elems, ok := parseForwarded(v)
		if !ok {
			out = append(out, v)
			continue
		}
		var kept []string
		for _, pairs := range elems {
			var ps []string
			for _, p := range pairs {
				// A for= value with a separator inside its quotes is kept:
				// a parser that is not quote-aware would read pairs in it.
				if !strings.HasPrefix(p, "for=") || strings.ContainsAny(p[len("for="):], ",;=") {
					ps = append(ps, p)
				}
			}
			if len(ps) > 0 {
				kept = append(kept, strings.Join(ps, ";"))
			}
		}
		if len(kept) > 0 {
			out = append(out, strings.Join(kept, ","))
		}
	}
	return out
}

// parseForwarded parses one Forwarded field value: elements separated by
// ',', each of pairs separated by ';', each pair token "=" (token or
// quoted-string), with optional whitespace around the separators. Each
// pair is returned as "name=value", the name lowered and the value as
// written (a quoted string keeps its quotes). ok is false on any syntax
// error.
func parseForwarded(v string) (elems [][]string, ok bool) {
	var cur []string
	i, n := 0, len(v)
	ows := func() {
		for i < n && (v[i] == ' ' || v[i] == '\t') {
			i++
		}
	}
	for {
		ows()
		if i == n {
			break
		}
		switch v[i] {
		case ',':
			elems = append(elems, cur)
			cur = nil
			i++
			continue
		case ';':
			i++
			continue
		}
		start := i
		for i < n && isTokenByte(v[i]) {
			i++
		}
		if i == start || i == n || v[i] != '=' {
			return nil, false
		}
		name := strings.ToLower(v[start:i])
		i++
		vstart := i
		if i < n && v[i] == '"' {
			for i++; i < n && v[i] != '"'; i++ {
				if v[i] == '\\' {
					i++
				}
			}
			if i >= n {
				return nil, false
			}
			i++
		} else {
			for i < n && isTokenByte(v[i]) {
				i++
			}
			if i == vstart {
				return nil, false
			}
		}
		cur = append(cur, name+"="+v[vstart:i])
		ows()
		if i < n && v[i] != ',' && v[i] != ';' {
			return nil, false
		}
	}
	return append(elems, cur), true
}

// isTokenByte reports whether c may appear in an RFC 9110 token.
func isTokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
