package middleware

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// defaultKey builds the cache key of a request: scheme, host, path and
// canonical query, then the configured request headers. Every component
// is length-prefixed, so no delimiter in one component can make two
// requests share a key. herd hashes the key for Redis, so its length and
// bytes do not matter there.
//
//   - Host is r.Host, as net/http resolved it, case preserved.
//   - The path is r.URL.EscapedPath(): the raw path when it is a valid
//     encoding (what chi routes on), so /a%2Fb and /a/b, /a//b and /a/./b
//     are different keys.
//   - The query is the raw query with its parameters stably sorted by
//     name, decoded as url.ParseQuery decodes it: order of different
//     parameters does not matter, but values, their order for a repeated
//     name (a and %61 are one name) and their encoding do (a=%31 and a=1
//     are different keys: when in doubt, do not share).
func defaultKey(r *http.Request, headers []string) string {
	var b strings.Builder
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	b.WriteString("herd-http/1|")
	writeField(&b, scheme)
	writeField(&b, r.Host)
	writeField(&b, r.URL.EscapedPath())
	writeField(&b, canonicalQuery(r.URL.RawQuery))
	for _, h := range headers {
		writeHeader(&b, h, r.Header.Values(h))
	}
	return b.String()
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
	"X-Forwarded-Port",
	"X-Forwarded-Prefix",
	"X-Forwarded-Proto",
	"X-Forwarded-Scheme",
	"X-Forwarded-Server",
	"X-Forwarded-Ssl",
	"X-Host",
	"X-Http-Host-Override",
	"X-Original-Host",
	"X-Original-Url",
	"X-Rewrite-Url",
	"X-Url-Scheme",
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
// case-insensitive and lowered.
func forwardedWithoutFor(values []string) []string {
	var out []string
	for _, v := range values {
		var elems []string
		for elem := range strings.SplitSeq(v, ",") {
			var pairs []string
			for pair := range strings.SplitSeq(elem, ";") {
				name, val, _ := strings.Cut(strings.TrimSpace(pair), "=")
				name = strings.ToLower(strings.TrimSpace(name))
				if name == "" || name == "for" {
					continue
				}
				pairs = append(pairs, name+"="+strings.TrimSpace(val))
			}
			if len(pairs) > 0 {
				elems = append(elems, strings.Join(pairs, ";"))
			}
		}
		if len(elems) > 0 {
			out = append(out, strings.Join(elems, ","))
		}
	}
	return out
}
