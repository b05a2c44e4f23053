package middleware

import (
	"context"
	"crypto/rand"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Vary in the standard mode (RFC 9111 §4.1). A response that varies on
// request fields outside the key is stored under a secondary key: the
// primary key plus the request's values of those fields (normalised:
// field lines combined, spaces around commas dropped, the Accept fields
// compared without case). The primary key then holds a vary marker, which
// names the fields and a generation: a request that finds the marker
// looks up its own secondary key, and a new marker (after an
// invalidation, a purge, a new response) has a new generation, so the
// variants stored under the old one are never served again. Each
// variant is built once across the fleet, under its own key's lease.
// Vary: *, and Vary on a credential (Cookie, Authorization), are still
// never stored.

// varyField holds, in a marker, its generation and the fields it names;
// ':' is in no field name.
const varyField = ":herd-vary"

// varyMarker returns the generation and fields of a stored vary marker,
// ok false when e is a response.
func varyMarker(e *entry) (gen string, names []string, ok bool) {
	v, found := e.header[varyField]
	if !found || len(v) == 0 {
		return "", nil, false
	}
	gen, list, _ := strings.Cut(v[0], " ")
	return gen, strings.Split(list, ","), true
}

// newVaryMarker is the marker of a response that varies on names.
func newVaryMarker(names []string) (*entry, string) {
	gen := rand.Text()[:16]
	return &entry{status: http.StatusOK, header: http.Header{varyField: {gen + " " + strings.Join(names, ",")}}}, gen
}

// caseless are the fields whose values are compared without case.
var caseless = []string{"Accept", "Accept-Charset", "Accept-Encoding", "Accept-Language"}

// varyKey is the secondary key of r's variant under the marker (gen,
// names) of the primary key.
func varyKey(key, gen string, names []string, r *http.Request) string {
	var b strings.Builder
	b.WriteString(key)
	b.WriteString("|vary:")
	b.WriteString(gen)
	for _, name := range names {
		vs := r.Header.Values(name)
		b.WriteByte('|')
		b.WriteString(name)
		if len(vs) == 0 {
			continue // absent, which differs from empty
		}
		var parts []string
		for _, v := range vs {
			for p := range strings.SplitSeq(v, ",") {
				parts = append(parts, strings.TrimSpace(p))
			}
		}
		v := strings.Join(parts, ",")
		if slices.Contains(caseless, name) {
			v = strings.ToLower(v)
		}
		writeField(&b, v)
	}
	return b.String()
}

// varyNames returns the request fields outside the key that a response
// whose handler wrote the Vary values vs varies on, canonical and
// sorted, and whether the response may be stored at all (not Vary: *,
// nor on a credential).
func (h *handler) varyNames(vs []string) (names []string, ok bool) {
	for _, v := range vs {
		for name := range strings.SplitSeq(v, ",") {
			name = http.CanonicalHeaderKey(strings.TrimSpace(name))
			switch {
			case name == "":
			case name == "*" || name == "Cookie" || name == "Authorization":
				return nil, false
			case !h.keyed(name):
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), true
}

// variedKey is what a request that found a vary marker knows of it: the
// fields it names.
type variedKey struct {
	names   []string
	primary string // the primary key it was found under
}

// primaryOr is the primary key of a variant, or key for none.
func (v *variedKey) primaryOr(key string) string {
	if v == nil {
		return key
	}
	return v.primary
}

// variantOf names r's variant of a response that varies on names (for
// the copy kept for revalidation, which one primary key holds for its
// last variant): the fields and r's values of them; "" for none.
func variantOf(r *http.Request, names []string) string {
	if len(names) == 0 {
		return ""
	}
	return strings.Join(names, ",") + "\n" + varyKey("", "", names, r)
}

// sameVariant reports whether r is of the variant a kept copy recorded
// (variantOf), which a copy without one always is.
func sameVariant(r *http.Request, variant string) bool {
	if variant == "" {
		return true
	}
	names, _, _ := strings.Cut(variant, "\n")
	return variantOf(r, strings.Split(names, ",")) == variant
}

// setVariant stores enc, a variant of a response, under its secondary
// key for ttl, with the response's tags.
func (h *handler) setVariant(ctx context.Context, key string, enc []byte, ttl time.Duration, tags []string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	return h.c.Set(ctx, key, enc, ttl, tags...)
}
