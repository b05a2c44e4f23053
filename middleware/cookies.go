package middleware

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// resolveCookies checks KeyCookies and IgnoreCookies against the rest of
// c (KeyHeaders already canonical in c.keyHeaders) and fills in what the
// request path needs. It panics, naming the option, on a configuration
// that cannot mean what it says.
func (c *config) resolveCookies() {
	if len(c.KeyCookies) == 0 && !c.IgnoreCookies {
		return
	}
	listsCookie := slices.Contains(c.keyHeaders, "Cookie")
	switch {
	case len(c.KeyCookies) > 0 && c.IgnoreCookies:
		panic("herd/middleware: Options.KeyCookies and Options.IgnoreCookies are both set: key on some cookies, or on none")
	case len(c.KeyCookies) > 0 && c.KeyFunc != nil:
		panic("herd/middleware: Options.KeyCookies with Options.KeyFunc: KeyFunc replaces the default key, so the cookies could not be part of it; read them in KeyFunc")
	case listsCookie && len(c.KeyCookies) > 0:
		panic("herd/middleware: Options.KeyCookies with Cookie in Options.KeyHeaders: the whole Cookie header is then the key; list one or the other")
	case listsCookie:
		panic("herd/middleware: Options.IgnoreCookies with Cookie in Options.KeyHeaders: the Cookie header cannot be both keyed and ignored")
	}
	c.cookiesDeclared = true
	if c.IgnoreCookies {
		return
	}
	for _, name := range c.KeyCookies {
		if !validCookieName(name) {
			panic(fmt.Sprintf("herd/middleware: invalid Options.KeyCookies entry %q: a cookie name is a non-empty token (letters, digits and !#$%%&'*+-.^_`|~)", name))
		}
		c.keyCookieFolds = append(c.keyCookieFolds, cookieFold(name))
	}
	slices.Sort(c.keyCookieFolds)
	c.keyCookieFolds = slices.Compact(c.keyCookieFolds)
}

// validCookieName reports whether name is a cookie-name of RFC 6265
// (§4.1.1): an HTTP token.
func validCookieName(name string) bool {
	if name == "" {
		return false
	}
	for i := range len(name) {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// cookieFold is what a cookie name may be read as by some parser: trimmed
// of spaces, percent-decoded as PHP decodes it ('+' as a space, and cut
// at a decoded NUL, where PHP's C string ends), then
// folded as mergeName folds a query parameter (ASCII case, '.' and ' ' as
// '_', nothing from '['). A request cookie whose name folds as a listed
// one does is keyed, under its own raw name: Go's r.Cookie("lang") does
// not read Lang, %6Cang or "lang =", but a backend behind the handler (a
// proxied PHP or ASP.NET application, a hand-written parser) may, and a
// cookie that one of them reads must not be left out of the key. Names
// that fold alike keep their order. It allocates only for a name that
// changes.
func cookieFold(name string) string {
	name = strings.TrimSpace(name)
	if strings.ContainsAny(name, "%+") {
		if dec, err := url.QueryUnescape(name); err == nil {
			if i := strings.IndexByte(dec, 0); i >= 0 {
				dec = dec[:i] // PHP reads the decoded name up to its first NUL
			}
			name = strings.TrimSpace(dec)
		}
	}
	return mergeName(name)
}

// cookieKey returns what Options.KeyCookies add to a request's key:
// "|ck|", the number of keyed cookie pairs and each of them, with the
// index of the Cookie field it came in. A pair is keyed when its name
// folds (cookieFold) as a listed name does; it is keyed as written, less
// the spaces before it, so that what any parser makes of its value (the
// quotes of lang="en", a %-escape, a trailing space) is in the key. Pairs
// are sorted stably by folded name: the order of different cookies does
// not matter, the order of a repeated one does (r.Cookie reads the first,
// other parsers the last). A listed cookie that is absent adds nothing,
// one present with an empty value adds "lang=", so the two never share a
// key; "lang" without '=' is a third key. The component is written even
// when it holds no pair, and it is length-prefixed throughout, so the key
// stays injective with forwardedKey after it. folds are the listed
// names' cookieFold, sorted. A pair that holds a listed name after a ','
// or whitespace ("x=1, lang=de", "x=1 lang=de") is keyed too: see
// listedInside.
func cookieKey(r *http.Request, folds []string) string {
	type pair struct {
		fold, raw string
		field     int
	}
	var buf [4]pair
	pairs, size := buf[:0], 0
	for field, line := range r.Header.Values("Cookie") {
		for rest := line; rest != ""; {
			var part string
			part, rest, _ = strings.Cut(rest, ";")
			part = strings.TrimLeft(part, " \t")
			if strings.TrimSpace(part) == "" {
				continue
			}
			name, _, _ := strings.Cut(part, "=")
			f := cookieFold(name)
			_, ok := slices.BinarySearch(folds, f)
			if !ok {
				f, ok = listedInside(part, folds)
			}
			if ok {
				pairs = append(pairs, pair{f, part, field})
				size += len(part) + 2*len(strconv.Itoa(len(part))) + 2
			}
		}
	}
	if len(pairs) > 1 {
		slices.SortStableFunc(pairs, func(a, b pair) int { return strings.Compare(a.fold, b.fold) })
	}
	var b strings.Builder
	b.Grow(len("|ck|#") + 4 + size)
	b.WriteString("|ck|")
	b.WriteString(strconv.Itoa(len(pairs)))
	b.WriteByte('#')
	for _, p := range pairs {
		b.WriteString(strconv.Itoa(p.field))
		b.WriteByte('@')
		writeField(&b, p.raw)
	}
	return b.String()
}

// listedInside reports whether the cookie pair part holds, after a ',' or
// whitespace, a name that folds as a listed one does, and returns that
// fold. Parsers that split a Cookie header on more than ';' read such a
// pair as two cookies: Rack 2 and RFC 2965 parsers split on ',', Python's
// http.cookies on whitespace, so "x=1, lang=de" is lang=de to them while
// r.Cookie reads one cookie x. It does not allocate for a pair without a
// listed name.
func listedInside(part string, folds []string) (string, bool) {
	i := strings.IndexAny(part, ", \t")
	for i >= 0 {
		part = part[i+1:]
		end := strings.IndexAny(part, ", \t")
		seg := part
		if end >= 0 {
			seg = part[:end]
		}
		if name, _, _ := strings.Cut(seg, "="); name != "" {
			if f := cookieFold(name); f != "" {
				if _, ok := slices.BinarySearch(folds, f); ok {
					return f, true
				}
			}
		}
		i = end
	}
	return "", false
}
