package middleware

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"time"
)

// Invalidation by unsafe methods (RFC 9111 §4.4): after a non-error
// response (2xx or 3xx) to a request whose method is not safe (PUT,
// DELETE, POST, PATCH, ...), the entry of its target URI is invalidated,
// and those of the URIs in the response's Location and Content-Location
// when they have the request's origin.

// statusRecorder passes a response through and records its status.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the client's methods.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// isSafe reports whether method is safe (RFC 9110 §9.2.1).
func isSafe(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// serveUnsafe runs the handler for r, whose method is unsafe, and
// invalidates what RFC 9111 §4.4 says once its response is a non-error.
func (h *handler) serveUnsafe(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w}
	h.next.ServeHTTP(rec, r)
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	if status < 200 || status >= 400 {
		return
	}
	targets := []*url.URL{{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}}
	for _, f := range []string{"Location", "Content-Location"} {
		v := w.Header().Get(f)
		if v == "" {
			continue
		}
		u, err := r.URL.Parse(v)
		if err != nil || (u.Host != "" && u.Host != r.Host) {
			continue // another origin's: never invalidated
		}
		targets = append(targets, &url.URL{Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery})
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 2*time.Second)
	defer cancel()
	for _, u := range targets {
		if key, ok := h.readKey(r, u); ok {
			if err := h.c.Invalidate(ctx, key); err != nil {
				h.log(slog.LevelWarn, "herd/middleware: invalidation after an unsafe method failed", "err", err)
			}
			if h.cfg.Standard {
				// The copy kept for revalidation too: an invalidated
				// response is never served stale (revalidate.go).
				if err := h.c.Invalidate(ctx, revalidationKey(key)); err != nil {
					h.log(slog.LevelWarn, "herd/middleware: invalidation after an unsafe method failed", "err", err)
				}
			}
		}
	}
}

// readKey is the key a plain GET of u, with r's other header fields,
// would have: the entry an unsafe request to u invalidates.
func (h *handler) readKey(r *http.Request, u *url.URL) (string, bool) {
	g := r.Clone(r.Context())
	g.Method = http.MethodGet
	g.Body, g.ContentLength, g.TransferEncoding = http.NoBody, 0, nil
	g.URL = u
	g.RequestURI = u.RequestURI()
	for name := range g.Header {
		if foldEqual(name, "x-http-method-override") || foldEqual(name, "x-http-method") || foldEqual(name, "x-method-override") {
			delete(g.Header, name)
		}
	}
	if !h.cfg.authKeyed {
		g.Header.Del("Authorization")
	}
	if !h.cfg.cookieKeyed && !h.cfg.cookiesDeclared {
		g.Header.Del("Cookie")
	}
	key, why := h.keyOrBypass(g)
	if why != "" {
		return "", false
	}
	return h.classKey(g) + key, true
}
