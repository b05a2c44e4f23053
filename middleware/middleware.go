package middleware

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/herdkit/herd"
)

// Cache-Status values (RFC 9211), with herd as the cache's name.
const (
	statusHit       = "herd; hit"
	statusStale     = "herd; fwd=stale"
	statusMiss      = "herd; fwd=miss"
	statusStored    = "herd; fwd=miss; stored"
	statusCollapsed = "herd; fwd=miss; collapsed"
	statusBypass    = "herd; fwd=bypass"
)

// Options configures the middleware. A nil *Options, and every zero field,
// means the documented default. Invalid values make [New] panic.
type Options struct {
	// TTL is how long a stored 200 or 301 response is fresh. Default: 1m.
	TTL time.Duration

	// StaleFor keeps a response servable that long after it goes stale:
	// a stale hit is served at once while one request in the cluster
	// refreshes it in the background. Never for a response that says
	// must-revalidate or proxy-revalidate. Default: 0, no stale serving.
	//
	// It wins over the Cache's herd.Options.StaleFor for every response
	// the middleware stores, a zero included: the middleware decides the
	// stale window response by response (must-revalidate makes it zero)
	// and hands it to herd with the response (herd.SetExpiry), so the
	// Cache's StaleFor applies only to the Cache's own Get and Fetch
	// calls. One Cache can then serve pages and values with windows of
	// their own.
	StaleFor time.Duration

	// StatusTTL maps the response statuses that may be stored to their
	// TTL; a status not in it is not stored. Default: 200 and 301 for TTL,
	// 404 for NotFoundTTL. 5xx, 206 and 1xx are never stored: New panics
	// if they are listed.
	StatusTTL map[int]time.Duration

	// NotFoundTTL is the default StatusTTL of 404. Default: 10s.
	NotFoundTTL time.Duration

	// KeyFunc, if set, replaces the default key (scheme, host, path,
	// canonical query, KeyHeaders, KeyCookies and forwarding headers);
	// returning ok false bypasses the cache for the request. The key must
	// include everything the response depends on. It is still prefixed
	// with the Scope.
	KeyFunc func(r *http.Request) (key string, ok bool)

	// KeyHeaders are request headers that become part of the key, for
	// handlers whose response depends on them (Accept-Language, say).
	// Listing Authorization or Cookie here makes credentialed requests
	// cacheable per credential. To key on some cookies only, use
	// KeyCookies instead. Listing Accept-Encoding keys its bucket, not
	// its value (see the Compression section of the package doc).
	KeyHeaders []string

	// KeyCookies names the request cookies (case-sensitive names) that
	// are part of the key: a request's other cookies are then neither
	// keyed nor credentials, so requests that differ only in them (_ga,
	// consent, ...) share an entry, while each value of a listed cookie
	// gets its own. The handler still gets the whole request, every cookie
	// included; it must not read a cookie that is not listed. A listed
	// cookie that is absent, present with an empty value, or repeated
	// (every value is keyed, in order) makes a key of its own, and so
	// does a cookie whose name a lenient parser could read as a listed
	// one (Lang, %6Cang, "lang =" for lang, or lang after a ',' or a
	// space inside another pair: "x=1, lang=de"). Authorization and the other
	// credentials still bypass (see AllowAuthorized). A response that
	// says Vary: Cookie is not stored (the key holds the listed cookies,
	// not the Cookie header). See "Cookies" in the package documentation.
	// New panics on a name that is not a token, and when IgnoreCookies,
	// KeyFunc or a KeyHeaders entry Cookie is set too. Default: none.
	KeyCookies []string

	// IgnoreCookies makes a request's cookies neither part of the key nor
	// credentials: requests that differ only in their cookies share an
	// entry. Set it only on routes whose handlers, and the middlewares
	// between herd and them, read no cookie: the first requester's
	// response is everyone's. A response that sets a cookie, is private
	// or no-store, or says Vary: Cookie is still never stored. New panics
	// when KeyCookies or a KeyHeaders entry Cookie is set too. It may be
	// used with KeyFunc. Default: false.
	IgnoreCookies bool

	// MaxBodyBytes is the largest body stored. A larger response streams
	// to its own client, uncached, and the requests waiting for it run the
	// handler themselves. Keep it below the Cache's MaxValueBytes (4 MiB
	// by default) with room for the headers: a response that fits
	// MaxBodyBytes but not MaxValueBytes is not stored either; the
	// requests waiting for it in this process get it, and those in other
	// processes run the handler themselves. Default: 1 MiB.
	MaxBodyBytes int

	// RespectCacheControl takes a stored response's TTL from the
	// freshness it states (s-maxage, else max-age, else Expires less
	// Date; less the Age it came with) instead of StatusTTL. Without it,
	// that freshness only matters when it is 0 or less (stale on arrival:
	// never stored) or the response says must-revalidate or
	// proxy-revalidate (the TTL is at most what is left of it).
	RespectCacheControl bool

	// AllowAuthorized lets requests with credentials (Authorization,
	// Cookie, a TLS client certificate, an identity header such as
	// X-Forwarded-User or X-Forwarded-Client-Cert) use the cache. A response to a request with
	// credentials that are not part of the key is then stored only if it
	// says public, s-maxage or must-revalidate (RFC 9111 §3.5), and, like
	// every response, not if its s-maxage or max-age is 0. Under
	// KeyCookies or IgnoreCookies the Cookie header is not a credential,
	// with or without AllowAuthorized: the options say which cookies the
	// responses depend on.
	AllowAuthorized bool

	// WaitTimeout bounds how long a request waits for another request's
	// response before running the handler itself. Default: the Cache's
	// wait budget.
	WaitTimeout time.Duration

	// ErrorHandler writes the response of a request that waited on a
	// rebuild that failed twice. Default: 502 Bad Gateway with a short
	// text body.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)

	// IgnoreForwardedHeaders leaves the forwarding headers out of the
	// key. They are, compared under any case and with '_' taken as '-':
	// every X-Forwarded-* (X-Forwarded-Host, -Proto, -Protocol, -Prefix,
	// and any other) except X-Forwarded-For and the identity headers
	// (which are credentials, see AllowAuthorized); Forwarded (without
	// its for= parameters, when it parses as RFC 7239; a value that does
	// not is keyed whole); Front-End-Https, X-Host, X-Http-Host-Override,
	// X-Original-Host, X-Original-URI, X-Original-URL, X-Rewrite-URL and
	// X-Url-Scheme; and a Host field in the Header of an HTTP/2 request
	// (beside :authority, which is r.Host). By default each of them a
	// request carries is part of its key, as if listed in KeyHeaders, so
	// that a client forging one (the classic cache poisoning request) only
	// ever gets its own entry; behind a proxy that sets them, every
	// request carries the same values and shares entries as usual. Set it
	// only if no handler behind the middleware reads them, or a proxy in
	// front overwrites them on every request. X-Forwarded-For and
	// X-Real-IP, which differ per client, are never keyed: a handler must
	// not read them on a cached route.
	IgnoreForwardedHeaders bool

	// MaxKeyBytes bounds a request's key: a request whose target, host,
	// keyed headers and keyed cookies add up to more bypasses the cache
	// (reason [BypassKeyTooLarge]), checked on the target's length before any
	// work on its query. It bounds the memory each key holds in this
	// process (the local fill registry, the lease calibration) and the
	// work done per request. It also applies to KeyFunc's keys. Default:
	// 8 KiB (nginx's default limit on a request line).
	MaxKeyBytes int

	// OnBypass, if set, is called for each request that bypasses the
	// cache before any lookup, and for each request served directly
	// because a lookup found its URL's hit-for-miss mark, with the reason
	// (one of the Bypass constants): count them to see what the cache
	// does not serve, and the attacks that try to blow up its bounds
	// (github.com/herdkit/herd/prometheus has NewBypassCounter for it).
	// It is called in the request's goroutine and must be fast.
	OnBypass func(r *http.Request, reason string)

	// HitForMiss is how long a URL whose response could not be shared
	// (see the package documentation) is remembered as such, in Redis,
	// for every instance: until then its requests run the handler at
	// once, side by side, instead of waiting for each other's responses
	// (Cache-Status "herd; fwd=bypass; detail=hit-for-miss", OnBypass
	// reason [BypassHitForMiss]). Default: 5s. Negative: off (every
	// request for the URL leads a rebuild, and the requests that arrive
	// meanwhile wait for it). At most 1h; below 1ms (but not negative)
	// New panics.
	HitForMiss time.Duration

	// Class, if set, names a request's route for metrics: it becomes
	// part of the key, and [KeyClass], set as the Cache's
	// herd.Options.KeyClass, reads it back, so that herd's metrics (and
	// its lease calibration) are per route ("/products/{id}") instead of
	// one class for every page. [RoutePattern] is the usual choice. It
	// must return few distinct values (a route, not a URL: herd's
	// Prometheus adapter reports classes beyond its MaxClasses as
	// "other"), and the same for a GET and a HEAD of a URL (a HEAD is
	// served from the GET entry of the same key). Classes are cut to 128
	// bytes; "" is no class. Default: none (keys without a class).
	Class func(r *http.Request) string

	// Scope is the key namespace of this middleware: two requests share
	// an entry only if their scopes are equal. By default there is none,
	// and the listener is no part of the key: the instances of a service
	// share entries wherever they listen (several processes on one host,
	// on different ports, behind one proxy; one port per pod), and so do
	// the listeners of one server. The middlewares made on one Cache must
	// have distinct scopes (no Scope counts as one): New panics on a
	// second one without a Scope, or with a Scope another has. So an
	// internal and a public server in one process, each with its own
	// middleware on one Cache, never serve each other's entries, whatever
	// Host a client sends, in whichever instance an entry was stored.
	// Wrap several routes of one server with one middleware to keep them
	// in one scope; one middleware in front of two servers (an internal
	// and a public one) shares their entries, as the listener is not in
	// the key: give each server its own middleware. Give the middlewares of every instance of a service the same
	// Scopes (they are the same code). A scope stays taken for the life of
	// the Cache: a program that rebuilds its handlers (a configuration
	// reload) makes its middlewares once, or uses a new Cache. It applies to
	// KeyFunc's keys too. At most 256 bytes.
	Scope string

	// Logger receives store decisions (debug) and failures (warn).
	// Default: silent.
	Logger *slog.Logger

	// Compress stores the responses worth it gzip-coded: a body of
	// CompressMinBytes or more, of a text type (text/*, JSON, JavaScript,
	// XML, SVG, ...), without Cache-Control: no-transform, that gzip
	// shrinks by an eighth at least. A client that accepts gzip gets the
	// stored bytes, any other the decoded body, each representation with
	// an ETag of its own; one entry serves both. It may not be set with
	// Accept-Encoding in KeyHeaders. See the Compression section of the
	// package doc. Default: off (bodies are stored as the handler coded
	// them).
	Compress bool

	// CompressMinBytes is the smallest body Compress compresses.
	// Default: 1 KiB.
	CompressMinBytes int

	// CompressLevel is the gzip level of Compress, from 1 (fastest) to 9
	// (smallest). An entry is compressed once and served many times:
	// the default favours size. BenchmarkCompress has the trade-off on a
	// 32 KiB page. Default: 6 (what gzip.DefaultCompression stands for).
	CompressLevel int

	// KeepTagHeaders keeps Surrogate-Key and Cache-Tag, the fields a
	// handler tags its response with (see [InvalidateTag]), in the
	// responses sent to clients and in the stored entries, for a CDN in
	// front that purges by the same tags. By default herd removes them
	// from every response it stores or serves: they name what a page is
	// built from, which is no client's business.
	KeepTagHeaders bool

	// Standard makes the middleware the shared cache RFC 9111 describes,
	// for a cache in front of an origin that says how its responses are
	// cached (see "The standard mode" in the package documentation):
	//   - a response is stored only for the freshness it states
	//     (Herd-Cache-Control, else CDN-Cache-Control (RFC 9213), else
	//     Cache-Control and Expires, parsed strictly) or the heuristic
	//     §4.2.2 allows (a tenth of the time since Last-Modified, at most a
	//     day, for the heuristically cacheable statuses and public ones),
	//     whatever its status (a 5xx included), but a 206 or a 304; one
	//     that states none is not stored. TTL, NotFoundTTL and StatusTTL
	//     do not apply (New panics if StatusTTL is set);
	//   - its Date is kept on every hit;
	//   - a request with credentials outside the key may use the cache,
	//     and a response to it is stored only if it says public, s-maxage
	//     or must-revalidate (§3.5), as with AllowAuthorized;
	//   - a response's stale-while-revalidate is its stale window, in
	//     place of StaleFor;
	//   - a stale response with a validator is revalidated with the
	//     handler by a conditional request, and a 304 updates it;
	//   - a GET with one byte range is served from the whole stored
	//     response;
	//   - a response that varies on request fields outside the key is
	//     stored per variant.
	// The Age of every response, the cluster-wide single flight and the
	// invalidation by unsafe methods are those of every mode. Default:
	// false.
	Standard bool
}

// The reasons [Options.OnBypass] is given.
const (
	BypassMethod         = "method"          // not GET or HEAD
	BypassMethodOverride = "method_override" // X-HTTP-Method-Override and the like
	BypassBody           = "body"            // a request body, whatever the protocol
	BypassRange          = "range"           // a Range header
	BypassCredentials    = "credentials"     // Authorization, Cookie (unless KeyCookies or IgnoreCookies), an identity header or a TLS client certificate outside the key
	BypassKeyFunc        = "keyfunc"         // KeyFunc said no
	BypassKeyTooLarge    = "key_too_large"   // the key would exceed MaxKeyBytes
	BypassUpgrade        = "upgrade"         // Upgrade (WebSocket, h2c) or Connection: upgrade
	BypassNoStore        = "no_store"        // Cache-Control: no-store in the request (RFC 9111 §5.2.1.5)
	BypassHitForMiss     = "hit_for_miss"    // a lookup found the URL's hit-for-miss mark (see Options.HitForMiss)
)

type config struct {
	Options
	keyHeaders    []string // canonical, without Accept-Encoding
	encodingKeyed bool     // Accept-Encoding is in KeyHeaders: the key holds its bucket
	authKeyed     bool     // Authorization is part of the key
	cookieKeyed   bool     // Cookie is part of the key

	cookiesDeclared bool     // KeyCookies or IgnoreCookies: the Cookie header is no credential
	keyCookieFolds  []string // KeyCookies' cookieFold, sorted; nil without KeyCookies
}

func (o *Options) resolve() config {
	var c config
	if o != nil {
		c.Options = *o
	}
	for name, d := range map[string]time.Duration{"TTL": c.TTL, "StaleFor": c.StaleFor, "NotFoundTTL": c.NotFoundTTL, "WaitTimeout": c.WaitTimeout} {
		if d < 0 {
			panic(fmt.Sprintf("herd/middleware: Options.%s is negative (%v)", name, d))
		}
	}
	if c.TTL == 0 {
		c.TTL = time.Minute
	}
	if c.TTL < time.Millisecond {
		panic(fmt.Sprintf("herd/middleware: Options.TTL %v is below 1ms", c.TTL))
	}
	if c.NotFoundTTL == 0 {
		c.NotFoundTTL = 10 * time.Second
	}
	if c.MaxBodyBytes < 0 {
		panic(fmt.Sprintf("herd/middleware: Options.MaxBodyBytes is negative (%d)", c.MaxBodyBytes))
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.MaxKeyBytes < 0 {
		panic(fmt.Sprintf("herd/middleware: Options.MaxKeyBytes is negative (%d)", c.MaxKeyBytes))
	}
	if c.MaxKeyBytes == 0 {
		c.MaxKeyBytes = 8 << 10
	}
	if c.CompressMinBytes < 0 {
		panic(fmt.Sprintf("herd/middleware: Options.CompressMinBytes is negative (%d)", c.CompressMinBytes))
	}
	if c.CompressMinBytes == 0 {
		c.CompressMinBytes = defaultCompressMinBytes
	}
	if c.CompressLevel < 0 || c.CompressLevel > gzip.BestCompression {
		panic(fmt.Sprintf("herd/middleware: Options.CompressLevel %d is not a gzip level (1 to 9)", c.CompressLevel))
	}
	if c.CompressLevel == 0 {
		c.CompressLevel = 6 // gzip.DefaultCompression is -1
	}
	if len(c.Scope) > 256 {
		panic(fmt.Sprintf("herd/middleware: Options.Scope is %d bytes, above 256", len(c.Scope)))
	}
	if c.Standard && c.StatusTTL != nil {
		panic("herd/middleware: Options.StatusTTL with Options.Standard: in the standard mode a response's own freshness says how long it is stored")
	}
	if c.Standard {
		c.AllowAuthorized = true // stored only when public, s-maxage or must-revalidate (§3.5)
	}
	if c.StatusTTL == nil {
		c.StatusTTL = map[int]time.Duration{200: c.TTL, 301: c.TTL, 404: c.NotFoundTTL}
	}
	for code, d := range c.StatusTTL {
		if code < 200 || code > 599 || code >= 500 || code == http.StatusPartialContent {
			panic(fmt.Sprintf("herd/middleware: status %d may not be cached (5xx, 206 and 1xx never are)", code))
		}
		if d < time.Millisecond {
			panic(fmt.Sprintf("herd/middleware: StatusTTL[%d] = %v is below 1ms", code, d))
		}
	}
	if c.ErrorHandler == nil {
		c.ErrorHandler = defaultErrorHandler
	}
	c.HitForMiss = resolveHitForMiss(c.HitForMiss)
	for _, h := range c.KeyHeaders {
		if h == "" || strings.ContainsAny(h, " :\r\n") {
			panic(fmt.Sprintf("herd/middleware: invalid KeyHeaders entry %q", h))
		}
		ch := textproto.CanonicalMIMEHeaderKey(h)
		if ch == "Accept-Encoding" {
			// The key holds its bucket (encoding.go), never the raw field;
			// with KeyFunc, KeyHeaders are not part of the key.
			c.encodingKeyed = c.KeyFunc == nil
			continue
		}
		c.keyHeaders = append(c.keyHeaders, ch)
		// With KeyFunc, KeyHeaders are not part of the key.
		c.authKeyed = c.authKeyed || (ch == "Authorization" && c.KeyFunc == nil)
		c.cookieKeyed = c.cookieKeyed || (ch == "Cookie" && c.KeyFunc == nil)
	}
	slices.Sort(c.keyHeaders)
	c.keyHeaders = slices.Compact(c.keyHeaders)
	c.resolveCookies()
	if c.Compress && c.encodingKeyed {
		panic("herd/middleware: Options.Compress with Accept-Encoding in Options.KeyHeaders: Compress keeps one entry for all encodings, KeyHeaders one per encoding bucket")
	}
	return c
}

func defaultErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	http.Error(w, "502 bad gateway: the response could not be built", http.StatusBadGateway)
}

// New returns the middleware, caching in c. It panics on a nil Cache, an
// invalid option, or a Scope (none included) that another middleware on
// c has already (see [Options.Scope]). The middleware it returns may wrap
// any number of handlers.
func New(c *herd.Cache, opt *Options) func(http.Handler) http.Handler {
	if c == nil {
		panic("herd/middleware: New with a nil Cache")
	}
	cfg := opt.resolve()
	claimScope(c, cfg.Scope)
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("herd/middleware: nil handler")
		}
		return &handler{c: c, cfg: cfg, next: next, memo: newEntryMemo()}
	}
}

type handler struct {
	c    *herd.Cache
	cfg  config
	next http.Handler

	replacing replacements // see replaceCorrupt
	memo      *entryMemo   // the last header block decoded per key (entrymemo.go)
}

// errServerError is the cause of a leader's failure after which one
// waiter leads instead.
var errServerError = errors.New("herd/middleware: the handler answered with a server error")

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, why := h.keyOrBypass(r)
	if why == BypassMethod && !isSafe(r.Method) {
		if h.cfg.OnBypass != nil {
			h.cfg.OnBypass(r, why)
		}
		w.Header().Set("Cache-Status", withDetail(statusBypass, detailMethod))
		h.serveUnsafe(w, r)
		return
	}
	if why != "" {
		h.bypass(w, r, why, withDetail(statusBypass, h.bypassDetail(r, why)))
		return
	}
	key = h.classKey(r) + key
	if h.cfg.Standard && parseDirectives(r.Header["Cache-Control"]).has("only-if-cached") {
		h.onlyIfCached(w, r, key)
		return
	}
	ctx := r.Context()
	retried, replaced := false, false
	var varied *variedKey // the secondary key's marker, once a vary marker was found (vary.go)
	for {
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if h.cfg.WaitTimeout > 0 {
			wctx, cancel = context.WithTimeout(ctx, h.cfg.WaitTimeout)
		}
		hit, fill, err := h.c.Begin(wctx, key, h.cfg.TTL, h.refresher(r, key, varied))
		cancel()
		switch {
		case hit != nil && h.cfg.Standard:
			if m, err := decodeEntry(hit.Value); err == nil {
				if gen, names, ok := varyMarker(m); ok {
					if varied != nil || len(key) > 4*h.cfg.MaxKeyBytes {
						// A marker where a variant belongs: serve directly.
						w.Header().Set("Cache-Status", statusBypass)
						h.next.ServeHTTP(w, r)
						return
					}
					varied = &variedKey{names: names, primary: key}
					key = varyKey(key, gen, names, r)
					continue // this request's variant
				}
			}
			fallthrough
		case hit != nil:
			e, err := h.hitEntry(r, key, hit)
			if err == nil {
				h.serveHit(w, r, hit, e)
				return
			}
			if !replaced && h.replaceCorrupt(ctx, key, err) {
				replaced = true
				continue // look again: this request, or another, rebuilds it
			}
			// Not ours (another writer keeps writing the key) or not
			// deleted: run the handler, uncached.
			h.log(slog.LevelWarn, "herd/middleware: stored value is not a response; bypassing", "key", key, "err", err)
			w.Header().Set("Cache-Status", withDetail(statusBypass, detailUnservable))
			h.next.ServeHTTP(w, r)
			return
		case fill != nil:
			h.lead(w, r, key, fill, varied)
			return
		case ctx.Err() != nil:
			return // the client went away
		case errors.Is(err, herd.ErrLoadFailed) && !retried:
			retried = true
			continue // the leader failed: one of the waiters leads now
		case errors.Is(err, herd.ErrLoadFailed):
			h.log(slog.LevelWarn, "herd/middleware: the response failed twice; answering with ErrorHandler", "key", key, "err", err)
			w.Header().Set("Cache-Status", withDetail(statusMiss, detailError)) // ErrorHandler may replace it
			h.cfg.ErrorHandler(w, r, err)
			return
		case errors.Is(err, herd.ErrNotFound) && !replaced:
			// A negative entry: the middleware never writes one, so it is
			// another writer's value (a Cache.Get whose loader said
			// ErrNotFound), replaced as a corrupt value is rather than
			// bypassed until it expires.
			if h.replaceCorrupt(ctx, key, err) {
				replaced = true
				continue
			}
			w.Header().Set("Cache-Status", withDetail(statusBypass, detailUnservable))
			h.next.ServeHTTP(w, r)
			return
		case errors.Is(err, herd.ErrPass):
			// The URL's hit-for-miss mark: no response of it is shared
			// now, so nobody waits for anybody.
			h.bypass(w, r, BypassHitForMiss, statusHitForMiss)
			return
		default:
			// Not shared, wait budget spent, Redis unavailable, a
			// foreign value: serve this request directly, uncached.
			h.log(slog.LevelDebug, "herd/middleware: serving uncached", "key", key, "err", err)
			w.Header().Set("Cache-Status", withDetail(statusBypass, errDetail(err)))
			h.next.ServeHTTP(w, r)
			return
		}
	}
}

// key returns the request's cache key, or false to bypass the cache.
func (h *handler) key(r *http.Request) (string, bool) {
	k, why := h.keyOrBypass(r)
	return k, why == ""
}

// keyOrBypass returns the request's cache key, or why it bypasses the
// cache (one of the Bypass constants).
func (h *handler) keyOrBypass(r *http.Request) (key, bypass string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return "", BypassMethod
	}
	if hasMethodOverride(r) {
		return "", BypassMethodOverride
	}
	// ContentLength is -1 for a body of unknown length: chunked in
	// HTTP/1.1, DATA frames without content-length in HTTP/2 and 3.
	if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		return "", BypassBody
	}
	if rs := r.Header["Range"]; len(rs) > 0 && !(h.cfg.Standard && r.Method == http.MethodGet && len(rs) == 1) {
		// In the standard mode one Range of a GET is served from the
		// whole response (ranges.go).
		return "", BypassRange
	}
	if isUpgrade(r) {
		return "", BypassUpgrade
	}
	if requestNoStore(r) {
		return "", BypassNoStore
	}
	rh := h.scanHeaders(r)
	if !h.cfg.AllowAuthorized && h.unkeyedCredentials(r, rh) {
		return "", BypassCredentials
	}
	limit := h.cfg.MaxKeyBytes
	if h.cfg.KeyFunc != nil {
		k, ok := h.cfg.KeyFunc(r)
		switch {
		case !ok || k == "":
			return "", BypassKeyFunc
		case len(k) > limit:
			return "", BypassKeyTooLarge
		}
		var b strings.Builder
		b.WriteString("herd-http/custom2|")
		writeField(&b, h.scope(r))
		b.WriteString(k)
		b.WriteString(h.encodingKey(r))
		return b.String(), ""
	}
	if targetLen(r)+len(r.Host) > limit {
		return "", BypassKeyTooLarge // before any work on the query
	}
	k := defaultKey(r, h.scope(r), h.cfg.keyHeaders)
	if h.cfg.keyCookieFolds != nil {
		k += cookieKey(r, h.cfg.keyCookieFolds)
	}
	if !h.cfg.IgnoreForwardedHeaders {
		k += forwardedKey(r, rh.forwarding)
	}
	if len(k) > limit {
		return "", BypassKeyTooLarge
	}
	return k + h.encodingKey(r), ""
}

// unkeyedCredentials reports whether r carries Authorization, Cookie or
// an identity header (X-Forwarded-User, X-Forwarded-Client-Cert and the
// like; see isIdentityHeader) that is not part of its key, or a TLS
// client certificate (mTLS), which never is. Under KeyCookies or
// IgnoreCookies, Cookie is no credential: the listed cookies are keyed,
// and the options say the others do not change a response.
// Authorization still is. rh is r's scanHeaders.
func (h *handler) unkeyedCredentials(r *http.Request, rh requestHeaders) bool {
	return (!h.cfg.authKeyed && len(r.Header["Authorization"]) > 0) ||
		(!h.cfg.cookieKeyed && !h.cfg.cookiesDeclared && len(r.Header["Cookie"]) > 0) ||
		rh.identity ||
		(r.TLS != nil && len(r.TLS.PeerCertificates) > 0)
}

// scanHeaders is scanHeaders(r, KeyHeaders): with KeyFunc, KeyHeaders are
// not part of the key.
func (h *handler) scanHeaders(r *http.Request) requestHeaders {
	if h.cfg.KeyFunc != nil {
		return scanHeaders(r, nil)
	}
	return scanHeaders(r, h.cfg.keyHeaders)
}

// scope is r's key namespace (see Options.Scope): the configured one,
// or none.
func (h *handler) scope(*http.Request) string {
	if h.cfg.Scope != "" {
		return "=" + h.cfg.Scope
	}
	return ""
}

// isUpgrade reports whether r asks to switch protocols (RFC 9110 §7.8):
// a WebSocket handshake, h2c. Its answer is a 101 and a connection, never
// a page to share, and a plain GET's page must not answer it.
func isUpgrade(r *http.Request) bool {
	if len(r.Header["Upgrade"]) > 0 {
		return true
	}
	for _, v := range r.Header["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

// hitEntry decodes a stored value into the representation r's client
// gets (see variant). An error means the value is not a response this
// middleware can serve (see replaceCorrupt).
func (h *handler) hitEntry(r *http.Request, key string, hit *herd.Hit) (*entry, error) {
	e, err := h.memo.decode(key, hit.Value)
	if err != nil {
		return nil, err
	}
	return h.variant(r, e, nil)
}

// serveHit writes e, the representation of a stored response for r.
func (h *handler) serveHit(w http.ResponseWriter, r *http.Request, hit *herd.Hit, e *entry) {
	status := statusHit
	switch hit.Outcome {
	case herd.OutcomeStale:
		status = statusStale
	case herd.OutcomeFollower:
		status = statusCollapsed
	}
	now := time.Now() // one clock read for the ttl and the age
	if hit.Outcome == herd.OutcomeHit || hit.Outcome == herd.OutcomeEarlyRefresh {
		var buf [64]byte
		b := append(append(buf[:0], status...), "; ttl="...)
		status = string(strconv.AppendInt(b, int64(hit.Expires.Sub(now)/time.Second), 10))
	}
	age := max(now.Sub(hit.WrittenAt), 0)
	h.write(w, r, e, status, age, nil)
}

// write sends e with the herd headers, or 304 or 412 when the request's
// conditional header fields say so (evaluated on e, never by the
// handler).
//
// trailers, for a leader's own response, are the trailer fields its
// handler set (takeTrailers): they follow the body, which is then sent
// without Content-Length so that net/http can send them (chunked). A
// stored response is served without trailers.
func (h *handler) write(w http.ResponseWriter, r *http.Request, e *entry, status string, age time.Duration, trailers http.Header) {
	dst := w.Header()
	// One pass over what is there already. The fields that describe the
	// bytes are e's alone: a leader's header map holds what its handler
	// set, which may describe another representation (a gzip body herd
	// decoded for this client). Tag fields go unless KeepTagHeaders (also
	// those of an entry another instance stored with them: skipped below).
	// A trailer an outer handler announced by net/http's prefix keeps the
	// body from having a Content-Length.
	strip := !h.cfg.KeepTagHeaders
	prefixed := false
	facts := e.headerFacts()
	trailer := facts.trailer // a Trailer field in dst, from e or already there
	for name := range dst {
		if isRepresentationField(name) || strip && isTagField(name) {
			delete(dst, name)
			continue
		}
		if _, ok := cutTrailerPrefix(name); ok {
			prefixed = true
		}
		if len(name) == len("Trailer") && strings.EqualFold(name, "Trailer") {
			trailer = true
		}
	}
	// The copies of a shared entry's values and herd's three fields
	// (Cache-Status, Age, Content-Length), in one allocation; each field
	// gets a slice capped at its values, so that an append by an outer
	// handler copies.
	n := 3
	if !e.owned {
		for _, vs := range e.header {
			n += len(vs)
		}
	}
	backing := make([]string, 0, n)
	field := func(v string) []string {
		backing = append(backing, v)
		i := len(backing)
		return backing[i-1 : i : i]
	}
	for name, vs := range e.header {
		if _, trailer := cutTrailerPrefix(name); trailer || isPerUser(name) || strip && isTagField(name) {
			continue // never replayed, even from an entry stored before this rule
		}
		if name == "Vary" {
			// Added to what an outer middleware set (CORS's Vary: Origin):
			// the entry's Vary may be herd's own (compress.go).
			merged := slices.Clone(dst[name]) // never appended in place
			for _, v := range vs {
				if !slices.Contains(merged, v) {
					merged = append(merged, v)
				}
			}
			dst[name] = merged
			continue
		}
		if !e.owned {
			i := len(backing)
			backing = append(backing, vs...)
			vs = backing[i:len(backing):len(backing)] // an append by an outer handler copies
		}
		dst[name] = vs
	}
	dst["Cache-Status"] = field(status)
	age += facts.age // the Age it had when it was stored
	dst["Age"] = field(strconv.FormatInt(int64(age/time.Second), 10))
	if code := precondition(r, e); code != 0 {
		for _, f := range []string{"Content-Type", "Content-Length", "Content-Encoding"} {
			dst.Del(f)
		}
		w.WriteHeader(code)
		return
	}
	code, body := h.servedRange(r, e, dst)
	if (prefixed || trailer && len(declaredTrailers(dst)) > 0) && r.Method != http.MethodHead {
		delete(dst, "Content-Length")
	} else {
		dst["Content-Length"] = field(strconv.Itoa(len(body)))
	}
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
	for k, vs := range trailers {
		dst[k] = vs // after the header went out: net/http sends them as trailers
	}
}

// representationFields describe one representation's bytes: write sends
// e's, never others left in the response's header map.
var representationFields = append([]string{"Content-Encoding", "Etag"}, digestFields...)

// isRepresentationField reports whether name is one of
// representationFields, in any case.
func isRepresentationField(name string) bool {
	for _, f := range representationFields {
		if len(f) == len(name) && strings.EqualFold(f, name) {
			return true
		}
	}
	return false
}

// conditionalHeaders are the request fields that make a handler answer
// 304 or 412 instead of the representation (RFC 9110 §13.1). The request
// that builds a shared entry never carries them: the entry is the full
// response, and herd answers each request's conditionals from it.
var conditionalHeaders = []string{"If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since", "If-Range"}

// withoutConditionals returns r, or a copy of it without conditional
// header fields, as a GET.
func withoutConditionals(r *http.Request) *http.Request {
	has := r.Method != http.MethodGet
	for _, name := range conditionalHeaders {
		has = has || len(r.Header.Values(name)) > 0
	}
	if !has {
		return r
	}
	req := r.Clone(r.Context())
	req.Method = http.MethodGet
	for _, name := range conditionalHeaders {
		req.Header.Del(name)
	}
	return req
}

// lead runs the handler for a Fill and stores, shares or abandons its
// response. A panic is re-raised after the Fill is aborted, so an outer
// recoverer sees it. The handler gets the request as a GET without its
// conditional header fields, with its bucket's Accept-Encoding
// (handlerRequest): the entry it builds is for everyone.
//
// varied is nil for a primary key, the marker's fields for a variant's
// key (vary.go).
func (h *handler) lead(w http.ResponseWriter, r *http.Request, key string, fill *herd.Fill, varied *variedKey) {
	head := r.Method == http.MethodHead
	req := h.handlerRequest(r)
	var old *entry // the response kept for revalidation (standard mode)
	var oldTag string
	if h.cfg.Standard {
		if old, oldTag = h.keptResponse(r.Context(), varied.primaryOr(key), r); old != nil {
			if now := time.Now(); maxStale(r, old, now) {
				// The client takes it stale (§5.2.1.2): the rebuild is
				// another request's.
				fill.Handover()
				h.write(w, r, old, statusStale, sinceStored(old, now), nil)
				return
			}
			req = conditional(req, old, oldTag)
		}
	}
	before := snapshotHeader(w.Header())
	cw := newCaptureWriter(w, h.cfg.MaxBodyBytes, head)
	cw.onPassthrough = func() {
		if !h.cfg.KeepTagHeaders {
			stripTags(w.Header()) // before the header goes out
		}
		// Release the waiters now, not when a stream (maybe endless) ends.
		_, cached := h.cfg.StatusTTL[cw.status]
		if h.cfg.Standard {
			cached = standardCached(cw.status)
		}
		switch {
		case cw.hijacked:
			h.notShared(r, fill, "the response was hijacked", true)
		case cw.status >= 500:
			// A failure, streamed or not: one waiter leads again, the
			// others wait for it (never one handler run per waiter), and
			// the URL is not marked.
			fill.Abort(errServerError)
		case !cached:
			// A status without a TTL (a 429, a 403) may be passing, or
			// this client's: the waiters run the handler, nothing is
			// marked, as when it does not stream.
			h.notShared(r, fill, "status "+strconv.Itoa(cw.status)+" is not cached, and it streamed", false)
		default:
			h.notShared(r, fill, "the response streamed or outgrew MaxBodyBytes", true)
		}
	}
	done := false
	defer func() {
		if done {
			return
		}
		v := recover()
		if v == http.ErrAbortHandler && r.Context().Err() != nil {
			fill.Handover() // the client went away: not the handler's failure
		} else {
			fill.Abort(&herd.PanicError{Value: v, Stack: debug.Stack()})
		}
		if v != nil {
			panic(v)
		}
	}()
	start := time.Now()
	h.next.ServeHTTP(cw, req)
	done = true
	finished := time.Now()

	if cw.passthrough {
		// Streamed or hijacked: the client has it; waiters serve themselves.
		fill.Abort(herd.ErrNotShared)
		return
	}
	tags := h.takeTags(w.Header())
	if cw.truncated() {
		h.sendTruncated(w, r, fill, cw)
		return
	}
	trailers := takeTrailers(w.Header())
	e := &entry{status: cw.finalStatus(), header: storedHeader(w.Header(), before), body: cw.buf.Bytes()}
	age := initialAge(w.Header(), start, finished, h.cfg.Standard)
	full, etag := w.Header(), headerGet(w.Header(), "Etag")
	if old != nil && e.status >= 500 && staleIfError(old, finished) {
		// The handler failed: the kept response stands in for it (RFC
		// 5861 stale-if-error). The waiters retry, as after any 5xx.
		fill.Abort(errServerError)
		h.write(w, r, old, statusStale, sinceStored(old, finished), nil)
		return
	}
	if old != nil && e.status == http.StatusNotModified {
		e, full = updated(old, w.Header())
		etag = cmp.Or(etag, oldTag)
	}
	if h.cfg.Standard {
		standardStoredHeader(e.header, full, finished)
	}
	v := h.decide(r, e, full, before, age)
	setStoredAge(e, age)
	var p packed
	if v.ttl > 0 || (v.shared && e.status < 500) {
		var why string
		if p, why = h.pack(e); why != "" {
			v = verdict{why: why, detail: detailEncoding, mark: true} // the response's own encoding: the URL's
		} else if s, err := h.variant(r, p.stored, p.plain); err == nil {
			// What a hit would serve this client, stored or not: each
			// representation with its own ETag.
			e = s
		}
	}
	if v.ttl > 0 && fill.Leased() && len(tags) > 0 {
		set := fill.SetTags
		if minted(r, e.status) {
			set = fill.SetMintedTags
		}
		if err := set(tags...); err != nil {
			v = verdict{why: "its tags cannot be recorded: " + err.Error(), detail: detailTagsInvalid, mark: true}
		}
	}
	switch {
	case r.Context().Err() != nil:
		// Maybe a partial body: never stored. The client's going away is
		// no failure of the handler's: hand the rebuild to a waiter,
		// without spending the waiters' retry.
		fill.Handover()
		return
	case v.ttl > 0 && fill.Leased():
		enc := p.stored.encode()
		switch {
		case varied != nil && !slices.Equal(varied.names, v.vary):
			v = verdict{why: "its Vary is not the one its URL's other responses gave"}
			h.notShared(r, fill, v.why, false)
			h.write(w, r, e, statusMiss, 0, trailers)
			return
		case varied == nil && len(v.vary) > 0:
			// Stored under its variant's key; the primary key gets the
			// marker (vary.go).
			marker, gen := newVaryMarker(v.vary)
			vkey := varyKey(key, gen, v.vary, r)
			if minted(r, e.status) && len(tags) > 0 {
				fill.Abort(fmt.Errorf("%w: a tagged variant of a minted key", herd.ErrNotShared))
				h.write(w, r, e, statusMiss, 0, trailers)
				return
			}
			if err := h.setVariant(r.Context(), vkey, enc, v.ttl, tags); err != nil {
				h.log(slog.LevelWarn, "herd/middleware: response not stored", "err", err)
				fill.Abort(fmt.Errorf("%w: its variant could not be stored", herd.ErrNotShared))
				h.write(w, r, e, statusMiss, 0, trailers)
				return
			}
			enc = marker.encode()
		}
		if err := fill.Commit(enc, v.ttl, v.staleFor); err != nil {
			h.log(slog.LevelWarn, "herd/middleware: response not stored", "err", err)
			h.write(w, r, e, withDetail(statusMiss, detailStoreFailed), 0, trailers)
			return
		}
		if len(tags) > 0 && !h.storedAs(r, key, enc) {
			// Commit hands a value whose tags could not be recorded (a
			// full tag index, herd.ErrTagFull) to the waiters without
			// storing it: Cache-Status says what happened.
			h.write(w, r, e, withDetail(statusMiss, detailTagsNotRecorded), 0, trailers)
			return
		}
		if h.cfg.Standard {
			h.keepForRevalidation(r.Context(), varied.primaryOr(key), p.stored, etag, v.ttl, tags, minted(r, e.status), variantOf(r, v.vary))
		}
		h.write(w, r, e, statusStored, 0, trailers)
		return
	case v.ttl > 0 || v.shared:
		if v.revalidate {
			h.keepForRevalidation(r.Context(), varied.primaryOr(key), p.stored, etag, 0, tags, minted(r, e.status), variantOf(r, v.vary))
		}
		// Shareable but not stored (an unleased fill, or an error status):
		// local waiters could take it, but a 5xx is retried by one waiter.
		if e.status >= 500 {
			fill.Abort(errServerError)
		} else if fill.Leased() {
			fill.Abort(fmt.Errorf("%w: %s", herd.ErrNotShared, v.why))
		} else {
			_ = fill.Commit(p.stored.encode(), max(v.ttl, time.Millisecond), 0) // local waiters only
		}
	default:
		h.notShared(r, fill, v.why, v.mark)
	}
	h.log(slog.LevelDebug, "herd/middleware: response not stored", "status", e.status, "reason", v.why)
	h.write(w, r, e, withDetail(statusMiss, h.missDetail(fill, v)), 0, trailers)
}

// storedAs reports whether Redis holds enc under key (one GET): whether
// a tagged Commit stored its value.
func (h *handler) storedAs(r *http.Request, key string, enc []byte) bool {
	val, found, err := h.c.Peek(context.WithoutCancel(r.Context()), key)
	return err == nil && found && bytes.Equal(val, enc)
}

// errTruncated is the cause of a leader's failure whose handler wrote
// less than the Content-Length it declared.
var errTruncated = errors.New("herd/middleware: the handler wrote less body than its Content-Length")

// sendTruncated ends fill for a response whose body is shorter than the
// Content-Length its handler declared: never stored nor shared (RFC 9111
// §3.3), a failure (the waiters retry once, as after a 5xx). Its own
// client gets what net/http would send it without herd: the header with
// the declared length and the bytes written, after which net/http closes
// the connection (the client sees the body end early).
func (h *handler) sendTruncated(w http.ResponseWriter, r *http.Request, fill *herd.Fill, cw *captureWriter) {
	fill.Abort(errTruncated)
	h.log(slog.LevelWarn, "herd/middleware: response not stored: its body is shorter than its Content-Length", "declared", cw.declared, "written", cw.buf.Len())
	w.Header().Set("Cache-Status", withDetail(statusMiss, detailTruncated))
	w.WriteHeader(cw.finalStatus())
	if r.Method != http.MethodHead {
		_, _ = w.Write(cw.buf.Bytes())
	}
}

// verdict is what decide says of a response.
type verdict struct {
	ttl      time.Duration // how long it may be stored; 0: not stored
	staleFor time.Duration // how long it may be served stale after ttl
	shared   bool          // the requests waiting for it may take it
	why      string        // why it is not stored
	detail   string        // why, as a Cache-Status detail (status.go)
	mark     bool          // not stored for a reason of the URL's, not of this request's: hit-for-miss

	revalidate bool     // not stored fresh, but kept for revalidation (standard mode: no-cache, stale on arrival)
	vary       []string // request fields outside the key it varies on (standard mode: stored under a secondary key, vary.go)
}

// setStoredAge records in e its corrected initial age (the Age it came
// with and the time the handler took, see initialAge), which the Age of
// each response sent from it includes (RFC 9111 §4.2.3), whether it is
// stored or not.
func setStoredAge(e *entry, age time.Duration) {
	if age >= time.Second {
		e.header["Age"] = []string{strconv.FormatInt(int64(age/time.Second), 10)}
	}
}

// decide says how long e may be stored and served stale, whether it may
// be shared with the requests waiting for it, and why not. full is the
// response's header map, before its snapshot before the handler ran: Vary
// is judged on what the handler wrote, not on what an outer middleware
// set for every response (CORS's Vary: Origin).
//
// age is the response's corrected initial age (see initialAge).
func (h *handler) decide(r *http.Request, e *entry, full http.Header, before headerSnapshot, age time.Duration) verdict {
	if h.cfg.Standard {
		return h.decideStandard(r, e, full, before, age)
	}
	if name := perUserField(full); name != "" {
		return verdict{why: "sets " + name + ", which is per user", detail: perUserDetail(name), mark: true}
	}
	cc := parseCacheControl(full)
	for _, d := range []string{"private", "no-store", "no-cache"} {
		if cc.has(d) {
			return verdict{why: "Cache-Control forbids a shared cache", detail: d, mark: true}
		}
	}
	for _, v := range handlerValues(full, before, "Vary") {
		for name := range strings.SplitSeq(v, ",") {
			name = textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))
			if name == "" {
				continue
			}
			if name == "*" || !h.keyed(name) {
				return verdict{why: "varies on " + name + ", which is not part of the key", detail: detailVary, mark: true}
			}
		}
	}
	if h.unkeyedCredentials(r, h.scanHeaders(r)) && !(cc.has("public") || cc.has("s-maxage") || cc.has("must-revalidate")) {
		return verdict{why: "a response to a request with credentials outside the key, without public, s-maxage or must-revalidate", detail: detailCredentials}
	}
	ttl, ok := h.cfg.StatusTTL[e.status]
	if !ok {
		return verdict{shared: e.status >= 500, why: "status " + strconv.Itoa(e.status) + " is not cached", detail: detailStatus}
	}
	f := responseFreshness(full, cc, time.Now())
	f.age = age
	left := f.remaining()
	if f.stated && left <= 0 {
		// Stale at once (RFC 9111 §4.2): s-maxage, max-age or Expires of
		// 0 or past, given twice with different values, or an Age past
		// it. It could only be served after a revalidation, which herd
		// does not do.
		return verdict{why: "stale on arrival (s-maxage, max-age or Expires, less Age)", detail: detailStale, mark: true}
	}
	if h.cfg.RespectCacheControl && f.stated {
		ttl = left
	}
	staleFor := h.cfg.StaleFor
	if cc.has("must-revalidate") || cc.has("proxy-revalidate") {
		// Never served stale, nor past the lifetime it states, less the
		// Age it came with (§5.2.2.2, §4.2.3).
		staleFor = 0
		if f.stated {
			ttl = min(ttl, left)
		}
	}
	return verdict{ttl: ttl, staleFor: staleFor, shared: true}
}

// keyed reports whether the request header name (canonical) is part of
// every key: a KeyHeaders entry, or a forwarding header (but not
// Forwarded, whose for= parameters are not keyed).
func (h *handler) keyed(name string) bool {
	if name == "Accept-Encoding" {
		return true // reduced to what every key holds (encoding.go)
	}
	if h.cfg.KeyFunc == nil && slices.Contains(h.cfg.keyHeaders, name) {
		return true // with KeyFunc, KeyHeaders are not part of the key
	}
	return h.cfg.KeyFunc == nil && !h.cfg.IgnoreForwardedHeaders && name != "Forwarded" && isForwardingHeader(name)
}

// refresher returns what a stale hit refreshes with: when herd starts a
// refresh (in the request's goroutine, while the request is alive) it
// snapshots the request, and the LoadFunc runs the handler on that copy in
// the background, detached from the client. The snapshot copies chi's
// route context, which chi recycles once the request returns; other
// request-scoped context values must stay valid after the request.
func (h *handler) refresher(r *http.Request, key string, varied *variedKey) func() herd.LoadFunc {
	return func() herd.LoadFunc {
		base := context.WithoutCancel(r.Context())
		if rc := chi.RouteContext(base); rc != nil {
			base = context.WithValue(base, chi.RouteCtxKey, copyRouteContext(rc))
		}
		snap := r.Clone(base)
		return func(ctx context.Context) ([]byte, error) {
			return h.refresh(ctx, snap, key, varied)
		}
	}
}

// copyRouteContext copies what a handler reads from chi's route context
// (and what chi needs to route again when the middleware sits before the
// router), so the copy does not alias the pooled original.
func copyRouteContext(rc *chi.Context) *chi.Context {
	cp := chi.NewRouteContext()
	cp.Routes = rc.Routes
	cp.RoutePath = rc.RoutePath
	cp.RouteMethod = rc.RouteMethod
	cp.URLParams.Keys = slices.Clone(rc.URLParams.Keys)
	cp.URLParams.Values = slices.Clone(rc.URLParams.Values)
	cp.RoutePatterns = slices.Clone(rc.RoutePatterns)
	return cp
}

// refresh runs the handler on snap, a snapshot of the request that found
// the entry stale, and returns the entry to store. The handler gets it as
// a GET without conditional header fields, as in lead.
func (h *handler) refresh(ctx context.Context, snap *http.Request, key string, varied *variedKey) ([]byte, error) {
	rctx, cancel := context.WithCancel(snap.Context())
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	req := snap.Clone(rctx)
	req.Method = http.MethodGet
	for _, name := range conditionalHeaders {
		req.Header.Del(name)
	}
	req.Header.Del("Range") // the whole response is stored (ranges.go)
	_, shown := h.bucket(snap)
	req.Header.Set("Accept-Encoding", shown)
	var old *entry
	var oldTag string
	if h.cfg.Standard {
		if old, oldTag = h.keptResponse(ctx, varied.primaryOr(key), snap); old != nil {
			req = conditional(req, old, oldTag)
		}
	}
	cw := newCaptureWriter(nil, h.cfg.MaxBodyBytes, false)
	start := time.Now()
	h.next.ServeHTTP(cw, req)
	finished := time.Now()
	if cw.passthrough {
		return nil, fmt.Errorf("herd/middleware: refresh response %w: it streamed, outgrew MaxBodyBytes or was hijacked", herd.ErrNotShared)
	}
	if cw.truncated() {
		return nil, fmt.Errorf("herd/middleware: refresh response not storable: %w", errTruncated)
	}
	tags := h.takeTags(cw.header)
	e := &entry{status: cw.finalStatus(), header: storedHeader(cw.header, nil), body: cw.buf.Bytes()}
	age := initialAge(cw.header, start, finished, h.cfg.Standard)
	full, etag := cw.header, headerGet(cw.header, "Etag")
	if old != nil && e.status == http.StatusNotModified {
		e, full = updated(old, cw.header)
		etag = cmp.Or(etag, oldTag)
	}
	if h.cfg.Standard {
		standardStoredHeader(e.header, full, finished)
	}
	v := h.decide(req, e, full, nil, age)
	setStoredAge(e, age)
	if v.ttl <= 0 && e.status >= 500 {
		return nil, fmt.Errorf("herd/middleware: refresh response not storable: %s", v.why)
	}
	if v.ttl <= 0 {
		// Not a failure: counted as not shared (the stale response stays
		// servable for its stale window, and refreshes back off).
		return nil, fmt.Errorf("herd/middleware: refresh response %w: %s", herd.ErrNotShared, v.why)
	}
	if len(tags) > 0 {
		set := herd.SetTags
		if minted(req, e.status) {
			set = herd.SetMintedTags
		}
		if err := set(ctx, tags...); err != nil {
			return nil, fmt.Errorf("herd/middleware: refresh response %w: its tags cannot be recorded: %w", herd.ErrNotShared, err)
		}
	}
	p, why := h.pack(e)
	if why != "" {
		return nil, fmt.Errorf("herd/middleware: refresh response %w: %s", herd.ErrNotShared, why)
	}
	enc := p.stored.encode()
	switch {
	case varied != nil && !slices.Equal(varied.names, v.vary):
		return nil, fmt.Errorf("herd/middleware: refresh response %w: its Vary is not the one its URL's other responses gave", herd.ErrNotShared)
	case varied == nil && len(v.vary) > 0:
		if minted(req, e.status) && len(tags) > 0 {
			return nil, fmt.Errorf("herd/middleware: refresh response %w: a tagged variant of a minted key", herd.ErrNotShared)
		}
		marker, gen := newVaryMarker(v.vary)
		if err := h.setVariant(ctx, varyKey(key, gen, v.vary, req), enc, v.ttl+v.staleFor, tags); err != nil {
			return nil, fmt.Errorf("herd/middleware: refresh response %w: its variant could not be stored: %w", herd.ErrNotShared, err)
		}
		enc = marker.encode()
	}
	herd.SetExpiry(ctx, v.ttl, v.staleFor)
	if h.cfg.Standard {
		h.keepForRevalidation(ctx, varied.primaryOr(key), p.stored, etag, v.ttl+v.staleFor, tags, minted(req, e.status), variantOf(req, v.vary))
	}
	return enc, nil
}

func (h *handler) log(level slog.Level, msg string, args ...any) {
	if h.cfg.Logger != nil {
		h.cfg.Logger.Log(context.Background(), level, msg, args...)
	}
}
