// Package middleware is herd's HTTP middleware for read paths: across a
// whole fleet of instances that share a Redis, one request runs the
// handler for a cold URL, and every other request, in every instance, is
// served its response.
//
// It works with any router that takes func(http.Handler) http.Handler:
//
//	mux := http.NewServeMux()
//	mux.Handle("GET /products/{id}", middleware.New(cache, nil)(productHandler))
//
//	r := chi.NewRouter()
//	r.Use(middleware.New(cache, &middleware.Options{TTL: 30 * time.Second}))
//	r.With(middleware.New(cache, nil)).Get("/catalog", catalogHandler)
//
// # What is cached
//
// Only GET and HEAD requests are looked up (HEAD is served from the GET
// entry, without a body); other methods pass through untouched. Requests
// bypass the cache when they carry credentials: Authorization, Cookie, a
// TLS client certificate, or an identity header that an authenticating
// proxy sets (X-Forwarded-User, -Email, -Groups, -Access-Token,
// -Client-Cert and any X-Forwarded-* naming a user, token or
// certificate; X-Auth-Request-*, X-Amzn-Oidc-*, X-Ssl-Client-Cert, ...)
// (unless [Options.AllowAuthorized] is set or that header is part of the
// key); a body (of any length, in any protocol: an HTTP/2 GET with DATA
// frames too), a Range header, a method override
// (X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override), a protocol
// upgrade (Upgrade, or Connection: upgrade: WebSocket, h2c), a key above
// [Options.MaxKeyBytes], or when KeyFunc says no; [Options.OnBypass]
// counts them. A response is stored only if its status has a TTL (by
// default 200 and 301 for TTL, 404 for a short NotFoundTTL; never 5xx or
// 206), its body fits [Options.MaxBodyBytes], it carries none of
// Set-Cookie, Set-Cookie2, Clear-Site-Data, Authentication-Info,
// WWW-Authenticate or Proxy-Authenticate (under any case, with any
// value, as a header or as a trailer: set through [http.TrailerPrefix]
// or announced in the Trailer field), its Cache-Control is not private,
// no-store or no-cache, it is not stale on arrival (RFC 9111 §4.2: an
// s-maxage, else max-age, else Expires less Date, of 0 or less once the
// Age it came with is taken off; an invalid Expires such as "0" is in the
// past, and a directive given twice with different values is stale),
// every header the handler varies on (Vary) is part of the key, and the
// handler neither flushed nor hijacked. A must-revalidate or
// proxy-revalidate response is never served stale, nor past the lifetime
// it states less its Age. Hop-by-hop headers, the per-user fields above,
// trailers, Date and Age are never stored as set; Date is regenerated,
// and Age computed when serving: the Age the handler gave plus the time
// herd held the response.
//
// # How waiting requests are served
//
// The first request for a cold URL runs the handler, in its own goroutine
// (so a panic reaches an outer Recoverer as usual), on a copy of the
// request without its conditional header fields (If-None-Match,
// If-Modified-Since, If-Match, If-Unmodified-Since, If-Range): the entry
// it builds is the full response, and herd answers each request's
// conditionals from it (304, or 412 for a failed If-Match or
// If-Unmodified-Since). Requests that arrive meanwhile wait for its
// response, in this instance and in others. If the response cannot be
// shared (it set a cookie, is private, streamed, or outgrew
// MaxBodyBytes), the waiters run the handler themselves: as soon as it
// starts streaming or outgrows MaxBodyBytes, not when it ends. If the
// leading request's client goes away before the response is complete,
// the rebuild is handed over ([herd.Fill.Handover]): one of the waiters,
// in any instance, leads at once, and no failure is counted, so clients
// that hang up on purpose fail nobody. If it failed (a 5xx, a panic),
// each waiter asks once more: one of them leads a new rebuild and the
// others wait for it. A waiter whose second wait ends in a failure too
// gets [Options.ErrorHandler]'s response; one that wins the key's lease
// after that failure instead runs the handler, so a failing handler runs
// one request at a time, never one per waiter. No wait outlasts
// [Options.WaitTimeout]; then the request runs the handler itself.
//
// Responses carry Cache-Status (RFC 9211): "herd; hit", "herd;
// fwd=stale" (a stale response served while one refresh runs), "herd;
// fwd=miss" (stored when it was stored; collapsed when the request waited
// for another's response), or "herd; fwd=bypass". Served entries carry an
// ETag (the handler's, or a hash of the body).
//
// # Security
//
// The key is its scope ([Options.Scope]: by default the port of the
// listener that accepted the request, so that an internal and a public
// listener, each with its own handler on one Cache, never share an entry
// whatever Host a client sends), scheme, host, the request target exactly
// as the server received it (r.RequestURI: raw bytes, percent-encoding and an
// absolute-form scheme and user info included) with its query's
// parameters sorted (but never those whose names a backend may merge:
// a and A, a.b and a_b, a[x] and a[y]), the URL the handler sees when a
// middleware rewrote it (http.StripPrefix), [Options.KeyHeaders], and the
// forwarding headers a request carries (every X-Forwarded-* but -For,
// under any case and with '_' for '-', Forwarded, X-Original-URL and the
// like, an HTTP/2 Host field beside :authority; see
// [Options.IgnoreForwardedHeaders]). So two requests to one listener
// share an entry only if every router and handler sees the same request: a raw "<" and its
// %3C form, %2F and /, a raw byte and its escape never do, whatever the
// router routes on. A request with a forged X-Forwarded-Host never shares
// an entry with requests without it. A handler must not read other
// request headers that are not in the key on a cached route: the response
// of the first request would be served to everyone. Responses that vary
// on a header outside the key are not stored; a Vary an outer middleware
// set before calling the handler (a CORS middleware's Vary: Origin) is
// that middleware's, not the handler's, and does not count (list Origin
// in KeyHeaders if the handler itself reads it); a Vary the handler
// writes is the handler's even when it equals the outer one (it is told
// apart by identity: Header.Set replaces the field, Header.Add appends to
// it). docs/security.md in the
// repository has the threat model, each attack with its defence and test,
// and the limits that remain.
//
// # Cookies
//
// (to be written)
//
// # Hit-for-miss
//
// (to be written)
//
// # Tag purges
//
// A handler tags its response with Surrogate-Key (tags separated by
// spaces, as Fastly and Varnish's xkey take them) or Cache-Tag (separated
// by commas, as Cloudflare takes them), or both, every field line and any
// case of the field name counted:
//
//	w.Header().Set("Surrogate-Key", "product:42 category:7")
//
// herd records the entry under each tag, and [InvalidateTag] purges every
// entry with one of the tags, in every instance that shares the Redis:
//
//	// after product 42 changed in the database
//	err := middleware.InvalidateTag(ctx, cache, "product:42")
//
// When it returns nil, the next request for each of those pages runs the
// handler, and no rebuild that began before the purge (a request whose
// handler was still reading the old product, in any instance) stores its
// response afterwards; its own client still gets it. A response whose
// tags cannot be recorded is served but not stored: more than
// [herd.MaxTags] tags, a tag longer than [herd.MaxTagBytes], a tag whose
// index is full ([herd.Options.MaxTagEntries]), or Redis failing to
// record them. A stale entry's background refresh stores the tags its
// response carries then. Tags are one namespace per Cache: a purge also
// removes cache-aside values tagged the same ([herd.SetTags],
// [herd.Cache.SetTagged]). [herd.Cache.InvalidateTag] has the costs and
// limits.
//
// Both fields are removed from every response herd stores or serves,
// and never stored, unless [Options.KeepTagHeaders] is set for a CDN in
// front that purges by the same tags; an instance without it serves an
// entry stored with them without them. A response herd does not handle
// (a request that bypasses the cache, or one served directly because the
// cache cannot help: Redis unavailable, the wait budget spent) is the
// handler's own and keeps whatever fields it set.
//
// # Compression
//
// (to be written)
//
// # Metrics
//
// (to be written)
package middleware
