package middleware

import (
	"bytes"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// defaultKey builds the cache key of a request: its scope (see
// Options.Scope), scheme, host without its port, the
// request target as the server received it (its path and canonical
// query), the URL as the handler sees it when that is not what the target
// parses to, then the configured request headers. Every component is
// length-prefixed, so no delimiter in one component can make two requests
// share a key. herd hashes the key for Redis, so its bytes do not matter
// there; its length is bounded by Options.MaxKeyBytes.
//
//   - Host is r.Host, as net/http resolved it, in lower case, without
//     its port (hostKey): the port a client dialled is the listener's,
//     and the instances of a service listen where they are told to.
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
func defaultKey(r *http.Request, scope string, headers []string) string {
	path, query, hasQuery := requestTarget(r)
	var b strings.Builder
	b.Grow(len(path) + len(query) + len(r.Host) + len(scope) + 56)
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	b.WriteString("herd-http/3|")
	writeField(&b, scope)
	writeField(&b, scheme)
	writeField(&b, hostKey(r.Host))
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
// as url.ParseQuery decodes it (the raw name when it does not decode) and
// folded as the backends that merge names do (mergeName), so that
// parameters any of them sees under one name keep their order.
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
		params = append(params, param{mergeName(name), p})
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

// The forwarding rule. A request header is a forwarding header, through
// which a proxy (or a client posing as one) tells the origin another host,
// scheme, port, path prefix or URL than the request's own, if its name,
// compared case-insensitively and with '_' taken as '-' (as CGI, PHP,
// Rack and WSGI servers do), is
//
//   - any X-Forwarded-* other than X-Forwarded-For (which differs per
//     client) and the identity headers below: every one, not a list, so
//     that X-Forwarded-Protocol (Echo), X-Forwarded-Prefix and whatever
//     a framework invents next are keyed;
//   - one of otherForwarding (Forwarded, X-Original-URL and the like);
//   - Host: net/http removes it from an HTTP/1 request's Header, but an
//     HTTP/2 request may carry a Host field beside :authority (r.Host),
//     and a handler reading r.Header.Get("Host") reads that one.
//
// The classic cache poisoning is a handler building links from one of
// them: unless Options.IgnoreForwardedHeaders is set, those a request
// carries are part of its key, so the first requester's forged value is
// only ever its own.
var otherForwarding = []string{
	"forwarded",
	"front-end-https",
	"host",
	"x-host",
	"x-http-host-override",
	"x-original-host",
	"x-original-uri",
	"x-original-url",
	"x-rewrite-url",
	"x-url-scheme",
}

// Identity headers: what an authenticating proxy in front (oauth2-proxy,
// Envoy's mTLS XFCC, Traefik, nginx, cloud load balancers and access
// proxies) sets to tell the origin who the user is. A request carrying one
// is a request with credentials, like Authorization: it bypasses the
// cache unless Options.AllowAuthorized is set or the header is listed in
// KeyHeaders (one entry per user). An X-Forwarded-* header is an identity
// header when its name holds one of identityWords (X-Forwarded-User,
// -Email, -Preferred-Username, -Groups, -Access-Token, -Client-Cert,
// -Tls-Client-Cert-Info, ...); other names are in identityHeaders or start
// with one of identityPrefixes. All lower case, '_' as '-'.
var (
	identityWords    = []string{"user", "email", "group", "token", "cert", "jwt", "principal", "identity", "session", "login", "subject"}
	identityPrefixes = []string{"x-auth-request-", "x-amzn-oidc-", "x-goog-authenticated-user-", "x-ms-client-principal", "x-ms-token-"}
	identityHeaders  = []string{
		"cf-access-jwt-assertion", "proxy-authorization", "remote-user", "ssl-client-cert",
		"x-client-cert", "x-goog-iap-jwt-assertion", "x-pomerium-jwt-assertion",
		"x-remote-user", "x-ssl-client-cert", "x-ssl-client-dn", "x-ssl-client-s-dn",
	}
)

// identityWordBytes is identityWords as bytes.
var identityWordBytes = func() [][]byte {
	out := make([][]byte, len(identityWords))
	for i, w := range identityWords {
		out[i] = []byte(w)
	}
	return out
}()

// foldByte lowers an ASCII letter and maps '_' to '-'.
func foldByte(c byte) byte {
	switch {
	case 'A' <= c && c <= 'Z':
		return c + 'a' - 'A'
	case c == '_':
		return '-'
	}
	return c
}

// foldEqual reports whether name equals want (lower case, '-') under
// foldByte, without allocating.
func foldEqual(name, want string) bool {
	if len(name) != len(want) {
		return false
	}
	for i := range len(name) {
		if foldByte(name[i]) != want[i] {
			return false
		}
	}
	return true
}

// foldHasPrefix is strings.HasPrefix under foldByte.
func foldHasPrefix(name, prefix string) bool {
	return len(name) >= len(prefix) && foldEqual(name[:len(prefix)], prefix)
}

// foldContains is strings.Contains under foldByte.
func foldContains(name, word string) bool {
	for i := 0; i+len(word) <= len(name); i++ {
		if foldEqual(name[i:i+len(word)], word) {
			return true
		}
	}
	return false
}

// isIdentityHeader reports whether the request header name is an
// identity header (see identityHeaders).
func isIdentityHeader(name string) bool {
	if foldHasPrefix(name, "x-forwarded-") {
		rest := name[len("x-forwarded-"):]
		var buf [64]byte
		if len(rest) > len(buf) {
			for _, w := range identityWords {
				if foldContains(rest, w) {
					return true
				}
			}
			return false
		}
		low := buf[:len(rest)]
		for i := range len(rest) {
			low[i] = foldByte(rest[i])
		}
		for _, w := range identityWordBytes {
			if bytes.Contains(low, w) {
				return true
			}
		}
		return false
	}
	if c := foldByte(name[0]); c != 'x' && c != 'c' && c != 'p' && c != 'r' && c != 's' {
		return false // what follows starts with one of these
	}
	for _, p := range identityPrefixes {
		if foldHasPrefix(name, p) {
			return true
		}
	}
	for _, n := range identityHeaders {
		if foldEqual(name, n) {
			return true
		}
	}
	return false
}

// isForwardingHeader reports whether the request header name is a
// forwarding header (see otherForwarding). Forwarded is one, although
// its for= parameters are not keyed.
func isForwardingHeader(name string) bool {
	if foldHasPrefix(name, "x-forwarded-") {
		return !foldEqual(name, "x-forwarded-for") && !isIdentityHeader(name)
	}
	if c := foldByte(name[0]); c != 'f' && c != 'h' && c != 'x' {
		return false // what follows starts with one of these
	}
	for _, n := range otherForwarding {
		if foldEqual(name, n) {
			return true
		}
	}
	return false
}

// methodOverrideHeaders turn a request into another method in the
// frameworks that honour them: a GET carrying one may not be a read, so
// it bypasses the cache (neither keyed nor shared). They are compared
// under foldByte (any case, '_' taken as '-'), the rule the forwarding
// headers follow: a backend behind CGI, PHP, Rack or WSGI reads
// X_HTTP_Method_Override as X-HTTP-Method-Override.
var methodOverrideHeaders = []string{
	"x-http-method",
	"x-http-method-override",
	"x-method-override",
}

// hasMethodOverride reports whether r carries a method-override header
// (see methodOverrideHeaders) under any spelling.
func hasMethodOverride(r *http.Request) bool {
	for name := range r.Header {
		if len(name) < len("x-http-method") || foldByte(name[0]) != 'x' {
			continue
		}
		for _, o := range methodOverrideHeaders {
			if foldEqual(name, o) {
				return true
			}
		}
	}
	return false
}

// requestHeaders is what one pass over a request's header names finds:
// the forwarding headers it carries that are not in KeyHeaders (sorted)
// and the identity headers that are not.
type requestHeaders struct {
	forwarding []string
	identity   bool
}

// scanHeaders reads r's header names once. keyHeaders are canonical.
func scanHeaders(r *http.Request, keyHeaders []string) requestHeaders {
	var rh requestHeaders
	for name, vs := range r.Header {
		if len(vs) == 0 || slices.Contains(keyHeaders, name) {
			continue
		}
		if len(name) < 4 {
			continue // no forwarding or identity header is that short
		}
		switch {
		case isIdentityHeader(name):
			rh.identity = true
		case isForwardingHeader(name):
			if rh.forwarding == nil {
				rh.forwarding = make([]string, 0, 4)
			}
			rh.forwarding = append(rh.forwarding, name)
		}
	}
	slices.Sort(rh.forwarding)
	return rh
}

// forwardedKey returns what the forwarding headers add to a request's
// key: "" when it carries none. It is appended to defaultKey's key, whose
// own length prefixes fix where it ends, so the whole key stays
// injective. The for= parameters of Forwarded are left out: they carry
// the client's address, a different one for every client, like
// X-Forwarded-For, which is not keyed either.
func forwardedKey(r *http.Request, names []string) string {
	var b strings.Builder
	for _, name := range names {
		vs := r.Header[name]
		if foldEqual(name, "forwarded") {
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

// mergeName folds a decoded parameter name the way the backends that
// merge names do: ASCII case (ASP.NET, and frameworks that look names up
// case-insensitively), '.' and ' ' as '_' (PHP), and what follows a '['
// (PHP's and Rails' a[x], a[]). Two parameters whose names fold alike are
// never reordered, so a=1&A=2 and A=2&a=1 keep different keys: a handler
// behind such a backend sees the values in different orders. Names that
// do not fold alike are sorted as before. It allocates only for a name
// that changes.
func mergeName(name string) string {
	if i := strings.IndexByte(name, '['); i >= 0 {
		name = name[:i]
	}
	if !strings.ContainsFunc(name, func(c rune) bool { return ('A' <= c && c <= 'Z') || c == '.' || c == ' ' }) {
		return name
	}
	return strings.Map(func(c rune) rune {
		switch {
		case 'A' <= c && c <= 'Z':
			return c + 'a' - 'A'
		case c == '.' || c == ' ':
			return '_'
		}
		return c
	}, name)
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
