package middleware

import (
	"net/http"
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
//     name: order of different parameters does not matter, but values,
//     their order for a repeated name and their encoding do (a=%31 and
//     a=1 are different keys: when in doubt, do not share).
func defaultKey(r *http.Request, headers []string) string {
	var b strings.Builder
	field := func(s string) {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	b.WriteString("herd-http/1|")
	field(scheme)
	field(r.Host)
	field(r.URL.EscapedPath())
	field(canonicalQuery(r.URL.RawQuery))
	for _, h := range headers {
		field(h)
		vs := r.Header.Values(h)
		b.WriteString(strconv.Itoa(len(vs)))
		b.WriteByte('#')
		for _, v := range vs {
			field(v)
		}
	}
	return b.String()
}

// canonicalQuery sorts the raw query's parameters stably by raw name.
func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	params := strings.Split(raw, "&")
	slices.SortStableFunc(params, func(a, b string) int {
		an, _, _ := strings.Cut(a, "=")
		bn, _, _ := strings.Cut(b, "=")
		return strings.Compare(an, bn)
	})
	return strings.Join(params, "&")
}
