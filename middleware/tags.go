package middleware

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/herdkit/herd"
)

// The response fields that carry a response's tags: Surrogate-Key
// (Fastly, Varnish's xkey and others), whose tags are separated by
// spaces, and Cache-Tag (Cloudflare), whose tags are separated by commas.
const (
	fieldSurrogateKey = "Surrogate-Key"
	fieldCacheTag     = "Cache-Tag"
)

// InvalidateTag invalidates every entry stored with any of tags, in every
// instance that shares the Cache's Redis and prefix: the responses whose
// handler set one of them in Surrogate-Key or Cache-Tag, and the values
// the Cache stored with them (tags form one namespace per Cache prefix).
// When it returns nil, no rebuild that began before it was called stores
// its response afterwards: the next request for each of those URLs runs
// the handler. It is [herd.Cache.InvalidateTag]; see there for its cost
// and errors.
func InvalidateTag(ctx context.Context, c *herd.Cache, tags ...string) error {
	if c == nil {
		return errors.New("herd/middleware: InvalidateTag with a nil Cache")
	}
	return c.InvalidateTag(ctx, tags...)
}

// responseTags returns the tags of a response: every Surrogate-Key field
// split at spaces and every Cache-Tag field split at commas, under any
// case of the field names, trimmed, without empty ones.
func responseTags(h http.Header) []string {
	var tags []string
	for name, vs := range h {
		var sep func(rune) bool
		switch {
		case strings.EqualFold(name, fieldSurrogateKey):
			sep = func(r rune) bool { return r == ' ' || r == '\t' }
		case strings.EqualFold(name, fieldCacheTag):
			sep = func(r rune) bool { return r == ',' }
		default:
			continue
		}
		for _, v := range vs {
			for _, t := range strings.FieldsFunc(v, sep) {
				if t = strings.TrimSpace(t); t != "" {
					tags = append(tags, t)
				}
			}
		}
	}
	slices.Sort(tags)
	return slices.Compact(tags)
}

// minted reports whether the key of r, whose response has status, is one
// any client can mint without bound: a URL with a query string (?utm=N),
// or an error page (a 404 for any path). Its tags are recorded with
// herd.SetMintedTags: such keys take at most half of a tag's index
// (herd.Options.MaxTagEntries), so that a flood of them, which would
// otherwise fill the index of a tag every page carries and keep every
// other page with that tag from being stored, leaves the other half to
// the site's own pages.
func minted(r *http.Request, status int) bool {
	return r.URL.RawQuery != "" || r.URL.ForceQuery || status >= 400
}

// isTagField reports whether name is Surrogate-Key or Cache-Tag, in any
// case.
func isTagField(name string) bool {
	switch len(name) {
	case len(fieldSurrogateKey):
		return strings.EqualFold(name, fieldSurrogateKey)
	case len(fieldCacheTag):
		return strings.EqualFold(name, fieldCacheTag)
	}
	return false
}

// stripTags deletes Surrogate-Key and Cache-Tag, in any case, from h.
func stripTags(h http.Header) {
	for name := range h {
		if isTagField(name) {
			delete(h, name)
		}
	}
}

// takeTags returns the tags of the response header h, and removes their
// fields from h unless KeepTagHeaders.
func (h *handler) takeTags(hdr http.Header) []string {
	tags := responseTags(hdr)
	if !h.cfg.KeepTagHeaders {
		stripTags(hdr)
	}
	return tags
}
