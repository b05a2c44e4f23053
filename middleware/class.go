package middleware

import (
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
)

// Per-route metrics. herd's metrics are labelled with the class that
// herd.Options.KeyClass gives a key; the middleware cannot change the
// Cache's options, so it writes the request's class (Options.Class) at
// the front of its key, and KeyClass reads it back. The hit path pays
// nothing for it beyond the bytes: the class is in the key, not in a
// context value the core would have to look up.

// classPrefix starts the key of a request with a class: the class
// follows, length-prefixed, then the key as it would be without one.
const classPrefix = "herd-http/class|"

// maxClassBytes bounds a class in the key.
const maxClassBytes = 128

// classKey is what r's key starts with: its class, or nothing.
func (h *handler) classKey(r *http.Request) string {
	if h.cfg.Class == nil {
		return ""
	}
	class := h.cfg.Class(r)
	if class == "" {
		return ""
	}
	if len(class) > maxClassBytes {
		n := maxClassBytes
		for n > 0 && !utf8.RuneStart(class[n]) {
			n-- // never inside a character: metrics labels must be UTF-8
		}
		class = class[:n]
	}
	var b strings.Builder
	b.Grow(len(classPrefix) + len(class) + 4)
	b.WriteString(classPrefix)
	writeField(&b, class)
	return b.String()
}

// KeyClass returns a function for herd.Options.KeyClass that gives each
// of the middleware's keys the class its request had ([Options.Class]),
// "http" for a key without a class, and other keys (the Cache's own Get
// calls) next(key), or "" when next is nil:
//
//	cache := herd.New(rdb, &herd.Options{
//		Observer: herdprom.NewObserver(reg, nil),
//		KeyClass: middleware.KeyClass(nil),
//	})
//
// The class also groups keys for herd's lease calibration, which is what
// a route's rebuild times are for. The function is safe for concurrent
// use and does not allocate.
func KeyClass(next func(key string) string) func(key string) string {
	return func(key string) string {
		if rest, ok := strings.CutPrefix(key, classPrefix); ok {
			if n, body, ok := strings.Cut(rest, ":"); ok {
				if l, err := strconv.Atoi(n); err == nil && l >= 0 && l <= len(body) {
					return body[:l]
				}
			}
		}
		if strings.HasPrefix(key, "herd-http/") {
			return "http"
		}
		if next != nil {
			return next(key)
		}
		return ""
	}
}

// RoutePattern is an [Options.Class] for the middleware in chi's r.Use,
// which runs before the router has matched a route (r.Pattern is empty
// or a mount's "/*" then): it finds the pattern that will serve r from
// chi's root router, a second walk of the routing tree. Elsewhere
// (http.ServeMux, chi's r.With or a route's handler), and when chi finds
// no route, it is r.Pattern, which the router has set by then. A HEAD request gets its GET route's pattern, so that it is
// served from the GET entry.
func RoutePattern(r *http.Request) string {
	if rc := chi.RouteContext(r.Context()); rc != nil && rc.Routes != nil {
		method := r.Method
		if method == http.MethodHead {
			method = http.MethodGet
		}
		path := r.URL.RawPath
		if path == "" {
			path = r.URL.Path
		}
		if p := rc.Routes.Find(chi.NewRouteContext(), method, path); p != "" {
			return p
		}
	}
	return r.Pattern
}
