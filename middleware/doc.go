// Package middleware is herd's HTTP middleware for read paths: across a
// whole fleet of instances that share a Redis, one request runs the
// handler for a cold URL, and every other request, in every instance, is
// served its response.
//
// It works with any router that takes func(http.Handler) http.Handler:
//
//	cached := middleware.New(cache, &middleware.Options{TTL: 30 * time.Second})
//
//	mux := http.NewServeMux()
//	mux.Handle("GET /products/{id}", cached(http.HandlerFunc(productHandler)))
//
//	r := chi.NewRouter()
//	r.Use(chimw.GetHead) // chi's: HEAD requests reach Get routes
//	r.With(cached).Get("/catalog", catalogHandler)
//
// (productHandler and catalogHandler are plain func(http.ResponseWriter,
// *http.Request); see "Hosts and routers" for HEAD and path parameters.)
// One middleware wraps any number of routes; a second one on the same
// Cache (other options for other routes) needs an [Options.Scope] of its
// own.
//
// # What is cached
//
// Only GET and HEAD requests are looked up (HEAD is served from the GET
// entry, without a body); other methods pass through to the handler. A
// non-error (2xx, 3xx) response to an unsafe method (PUT, DELETE, POST,
// PATCH, ...) invalidates the entry of its target URI, and of the
// same-origin URIs in its Location and Content-Location (RFC 9111 §4.4),
// in every instance: each is the entry a GET of that URI with the
// request's other header fields would have. Requests
// bypass the cache when they carry credentials: Authorization, Cookie, a
// TLS client certificate, or an identity header that an authenticating
// proxy sets (X-Forwarded-User, -Email, -Groups, -Access-Token,
// -Client-Cert and any X-Forwarded-* naming a user, token or
// certificate; X-Auth-Request-*, X-Amzn-Oidc-*, X-Ssl-Client-Cert, ...)
// (unless [Options.AllowAuthorized] is set or that header is part of the
// key); a body (of any length, in any protocol: an HTTP/2 GET with DATA
// frames too), a Range header, a method override
// (X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override, under any
// case and with '_' for '-'), a protocol
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
// every header the handler varies on (Vary) is part of the key (the
// standard mode stores the others per variant), its body
// is as long as the Content-Length the handler declared (RFC 9111 §3.3:
// a shorter one is sent as net/http sends it, the connection then cut,
// and is a failure, as a 5xx is; writes past it are refused with
// [http.ErrContentLength]), and the handler neither flushed nor hijacked. A must-revalidate or
// proxy-revalidate response is never served stale, nor past the lifetime
// it states less its Age. Hop-by-hop headers, the per-user fields above,
// trailers (the fields named in Trailer, and those set through
// [http.TrailerPrefix]: RFC 9111 §3.1 forbids taking them for header
// fields; the leading request's client gets them as trailers, a hit
// none), Date and Age are never stored as set; Date is regenerated
// (kept in the standard mode), and Age computed when serving, on every
// response, stored or not: the Age the handler's response came with (the
// first member of its first Age field, ignored unless it is digits) plus
// the time the handler took and the time herd held the response (RFC
// 9111 §4.2.3).
//
// # The standard mode
//
// [Options.Standard] is one setting for a cache in front of an origin
// that says how its responses may be cached (herd proxy -mode standard
// is it, in front of a URL). The freshness of a response then comes from
// the response alone, as RFC 9111 reads: from Herd-Cache-Control, herd's
// targeted field, else CDN-Cache-Control (RFC 9213: the first of them
// that is a valid Structured Field dictionary rules, and Cache-Control
// and Expires are then ignored), else Cache-Control's s-maxage or
// max-age (its first value when given twice; a directive whose name is
// no token, "max-age =60", is ignored), else Expires less Date (an
// HTTP-date parsed strictly: anything else is in the past), else a
// heuristic (§4.2.2: a tenth of the time since Last-Modified, at most a
// day) for a heuristically cacheable status or a response marked public.
// A response that states no freshness is not stored, whatever TTL says;
// one that does is stored whatever its status, 5xx included (but 206 and
// 304, and 1xx, which are not final); must-understand lets a status herd
// knows be stored despite no-store. A no-cache listing fields
// (no-cache="Set-Cookie") stores the response without them. Date is kept,
// so a hit says when its response was generated. Requests with
// credentials use the cache as under [Options.AllowAuthorized]: a
// response to one is stored only if it says public, s-maxage or
// must-revalidate (§3.5). A response's stale-while-revalidate is its
// stale window. The per-user fields above still keep a response from
// being stored, and every other rule of this section applies.
//
// A stored response with a validator (its handler's ETag, or
// Last-Modified) is also kept, in Redis under a key of its own, for an
// hour past its freshness, and so is one that could not be stored fresh
// (no-cache, or stale on arrival). The request that then leads the
// rebuild of its URL, under the key's lease (the others, in every
// instance, wait for it: one revalidation across the fleet), and a
// background refresh, send the handler If-None-Match and
// If-Modified-Since from it. The handler's 304 updates the kept
// response's header fields (not Content-Length, Content-Encoding,
// Content-Range or the digests: they describe the stored bytes, RFC 9111
// §3.2), and that response is what is served and stored, for the
// freshness the 304 gives it. A 200 is a new response. The kept copy
// carries the response's tags (a tagged response of a key any client can
// mint, see Tag purges, is not kept), and a purge of one of them, or an
// unsafe method's invalidation, removes it with the entry: an
// invalidated response is never served stale nor revalidated. Keeping costs one
// more SET per stored response with a validator, one GET per rebuild, and
// Redis memory for the copy.
//
// A response that varies (Vary) on request fields outside the key is
// stored in the standard mode too, once per variant: under a secondary
// key, the primary key plus the request's values of those fields
// (field lines combined, spaces around commas dropped, the Accept fields
// without case), while the primary key holds a marker naming the fields
// and a generation. A request that finds the marker looks up its
// variant, built once across the fleet under its own lease; a new marker
// (after an invalidation, a purge, a new response) has a new generation,
// so the variants of the old one are never served again. A lookup of a
// varying URL costs two GETs. Vary: *, and Vary on Cookie or
// Authorization, are still never stored, nor a tagged variant of a key
// any client can mint.
//
// A GET with one byte range (Range: bytes=0-99, 100-, -100) does not
// bypass the cache in the standard mode: it is looked up under the key
// of the whole response, whose rebuild runs the handler without Range,
// and gets its range of the complete stored 200 (206 with Content-Range,
// 416 when the range starts past the end). Several ranges, another unit,
// or an If-Range that does not name the stored response get the whole
// response, as a server may answer (RFC 9110 §14.2).
//
// A kept response (one with a validator, or with stale-if-error) that
// is stale stands in for the handler's 5xx while its stale-if-error
// covers how stale it is (RFC 5861), unless it says must-revalidate,
// proxy-revalidate, no-cache or s-maxage; its Cache-Status is then
// "herd; fwd=stale". Of a request's own Cache-Control, the standard mode
// honours no-store (as every mode), only-if-cached (the stored response,
// else 504, never the handler: §5.2.1.7) and max-stale (a kept stale
// response is served to that client); max-age, min-fresh and no-cache
// are preferences (§5.2.1) that herd does not honour in any mode, for
// the reason given above: they would let any client send requests past
// the fleet-wide single flight.
//
// A request's own Cache-Control: no-store bypasses the cache too (its
// response must not be stored, RFC 9111 §5.2.1.5). Its no-cache, Pragma:
// no-cache and max-age=0 (what a browser sends on reload) are ignored,
// as shared caches commonly do: they only state a preference (§5.2.1.4),
// and honouring them would let any client send every request past the
// coalescing to the handler.
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
// Served entries carry an ETag (the handler's, or a hash of the body).
//
// # Cache-Status
//
// Every response carries Cache-Status (RFC 9211) with herd as the
// cache's name: "herd; hit; ttl=N", "herd; fwd=stale" (a stale response
// served while one refresh runs), "herd; fwd=miss; stored", "herd;
// fwd=miss; collapsed" (the request waited for another's response), or,
// with a detail parameter (RFC 9211 §2.8) that says why, "herd; fwd=miss;
// detail=D" (the handler ran and its response was not stored) or "herd;
// fwd=bypass; detail=D" (the cache did not handle the request). The
// details:
//
//   - Bypasses before any lookup, one per [Options.OnBypass] reason,
//     with '-' for '_': method (not GET or HEAD), method-override, body,
//     range, keyfunc, key-too-large, upgrade, no-store (the request's
//     own Cache-Control); and for credentials, the credential:
//     authorization, cookie, identity-header or client-cert.
//   - Bypasses after a lookup: hit-for-miss (see Hit-for-miss),
//     redis-unavailable (Redis unreachable under herd.Options.FailClosed),
//     wait-timeout ([Options.WaitTimeout] or the Cache's wait budget
//     spent), not-shared (the response this request waited for could not
//     be shared), unservable-value (a stored value that is no response
//     and could not be replaced), closed (the Cache is closed), error (any
//     other), and, for a leader whose response went to its client as it
//     came, streamed (the handler flushed) or too-large (the body outgrew
//     [Options.MaxBodyBytes]).
//   - Misses not stored: redis-unavailable (fail-open: Redis is
//     unreachable and the handler ran for this request alone; [herd.Stats]
//     counts it in FailOpen), wait-timeout (the wait for another process's
//     rebuild was spent: built for this process), status (no TTL in
//     [Options.StatusTTL]; a 5xx never has one), set-cookie or
//     per-user-field (Set-Cookie, or another per-user field below),
//     private, no-store or no-cache (the response's Cache-Control), vary
//     (a Vary on a header outside the key), credentials (a response to a
//     request with credentials outside the key, without public, s-maxage
//     or must-revalidate), stale-on-arrival, encoding (a Content-Encoding
//     herd cannot serve every client of the key), tags-invalid and
//     tags-not-recorded (a full tag index; see Tag purges), store-failed
//     (Redis refused the write) and truncated (a body shorter than its
//     Content-Length).
//
// # Security
//
// The key is its scope ([Options.Scope]: none by default; the
// middlewares on one Cache must have distinct scopes, so that an internal
// and a public server, each with its own middleware, never share an entry
// whatever Host a client sends), scheme, host without its port, the
// request target exactly
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
// # Hosts and routers
//
// The key holds the host a request names without its port (r.Host as
// net/http reports it, case kept, less a trailing ":digits"), and the
// target: what nginx's $host$request_uri holds. Neither the listener nor
// the port a client dialled is in it, so the instances of a service share
// entries wherever they listen: in a local test,
// http://127.0.0.1:8080/p and http://127.0.0.1:8081/p are one entry, and
// so are example.com and example.com:443. A handler that writes the
// request's port into its page (an absolute link built from r.Host) must
// key on it, with [Options.KeyFunc] or a Scope per port. Two names for
// one server are two entries: localhost and 127.0.0.1 fill the cache
// twice. Behind a load balancer, instances share entries when it passes
// the client's Host on; a balancer that rewrites Host to each instance's
// own address (10.0.0.7 and 10.0.0.8) leaves each instance with entries
// of its own. Make it pass the Host through (nginx: proxy_set_header Host
// $host), or key on what the pages depend on with [Options.KeyFunc].
//
// Two servers in one process that answer the same URLs differently (an
// internal listener and a public one) each need their own middleware,
// and New refuses two middlewares on one Cache without distinct Scopes
// (see [Options.Scope]). docs/middleware.md in the repository has a
// two-instance recipe.
//
// A ServeMux pattern "GET /path" matches HEAD as well. chi routes a HEAD
// to a Get route only through chi's middleware.GetHead
// (r.Use(middleware.GetHead)); without it chi answers 405 and herd never
// sees the request. herd serves a HEAD from the GET entry, and a HEAD for
// a cold URL builds that entry (the handler runs as a GET).
//
// Read path parameters as the router says: r.PathValue under ServeMux,
// chi.URLParam under chi (chi v5 sets r.PathValue too, and either works).
// Both hold in a stale refresh, which runs the handler in the background
// after the request that found the entry stale returned: it runs on a
// clone of that request, with a copy of chi's route context (which chi
// recycles). Other values a middleware put in the request's context must
// stay valid after the request.
//
// # Cookies
//
// By default a request with a Cookie header bypasses the cache: herd
// cannot tell a session cookie from an analytics one, and a page built for
// one session must not reach another. On a real site nearly every request
// carries cookies (_ga, a consent banner's, an A/B bucket), so say which
// ones the pages depend on:
//
//	mw := middleware.New(cache, &middleware.Options{
//		KeyCookies: []string{"lang", "currency"}, // _ga, consent and the like are ignored
//	})
//
// [Options.KeyCookies] lists the cookies that are part of the key:
// requests that differ only in other cookies share an entry, and each
// value of a listed cookie has its own. [Options.IgnoreCookies] keys on
// no cookie, for routes whose handlers read none. Either way the handler
// still gets the whole request, every cookie included, and must read only
// the listed cookies (none under IgnoreCookies): the first requester's
// response is everyone's.
//
// What a typical site sets:
//
//   - Pages the same for every visitor, whatever their cookies (a
//     catalog, a blog, an API whose clients send a browser's cookies
//     along): IgnoreCookies: true.
//   - Pages that depend on a preference cookie (language, currency,
//     region): KeyCookies: []string{"lang", "currency"}.
//   - Pages that change for a signed-in visitor: list the session cookie
//     too (KeyCookies: []string{"lang", "session"}). Visitors without a
//     session share entries; each session has entries of its own, for the
//     TTL. Or keep those routes out of the middleware. Never IgnoreCookies
//     there, nor on a route behind a session middleware that reads the
//     session cookie.
//
// Under either option the Cookie header is no longer a credential outside
// the key (the options say which cookies matter): a response to a request
// with cookies is stored without the public, s-maxage or must-revalidate
// that [Options.AllowAuthorized] otherwise asks for, and AllowAuthorized
// is not needed. Authorization, a TLS client certificate and the identity
// headers still are credentials, and bypass the cache as before. The
// response's own rules still hold: a response that sets a cookie
// (Set-Cookie, under any case) is never stored nor given to the requests
// waiting for it; nor is one that is private, no-store or no-cache; and
// one that says Vary: Cookie is not stored, since the key holds the listed
// cookies, not the Cookie header (list Cookie in [Options.KeyHeaders]
// instead to key the whole header).
//
// How the listed cookies are keyed. Names are case-sensitive, as for
// [http.Request.Cookie]. Every pair of a listed cookie is keyed as written
// (quotes and escapes in its value included), in the order the request
// sends it, with the index of the Cookie field it came in (HTTP/1 clients
// send one; net/http joins HTTP/2's); the order of different cookies does
// not matter. So a listed cookie that is absent, one with an empty value
// (lang=), one without '=' (lang), a quoted one (lang="de") and a repeated
// one (lang=de; lang=fr, which r.Cookie reads as de and other parsers as
// fr) each have a key of their own. A cookie whose name another parser
// could read as a listed one (Lang, LANG, %6Cang, lang%00, "lang =",
// lang[x] for lang: PHP and ASP.NET read some of these as lang) is keyed
// too, under its own name, so it cannot poison the entry of the requests
// without it; so is a pair that holds a listed name after a ',' or
// whitespace (x=1, lang=de: Rack 2 and RFC 2965 parsers split on ',',
// Python's http.cookies on spaces), which r.Cookie reads as one cookie x.
// [New] panics on a name that is not a token (RFC 6265), and on KeyCookies
// with IgnoreCookies, with KeyFunc, or with Cookie in KeyHeaders.
//
// # Hit-for-miss
//
// A URL whose response could not be shared is remembered as such, in
// Redis, for [Options.HitForMiss] (default 5s; negative turns it off):
// Varnish's hit-for-miss. Without it every request for, say, a page that
// sets a session cookie would lead a rebuild that nobody can take, and
// the requests arriving meanwhile would wait for it only to run the
// handler themselves afterwards: twice the handler's latency, and the
// requests of a URL served one wave at a time. With it, the first such
// response marks the URL ([herd.Fill.Pass]); the requests waiting for it,
// in every instance, run the handler at once, and until the mark expires
// each request for the URL runs the handler at once, side by side, with
// no lease and no waiting, at the cost of the one GET a hit costs. They
// carry Cache-Status "herd; fwd=bypass; detail=hit-for-miss" (RFC 9211's
// bypass: the cache chose not to handle the request; the detail says
// why) and are reported to [Options.OnBypass] as [BypassHitForMiss].
//
// A response marks its URL when the reason it is not stored is the
// response's own: a per-user field (Set-Cookie and the others above),
// Cache-Control private, no-store or no-cache, a Vary on a header outside
// the key (or *), stale on arrival, a stream (of a status with a TTL in
// StatusTTL), a hijack, a body past
// MaxBodyBytes (marked as soon as it streams, so the waiters do not wait
// for its end), or a Content-Encoding herd cannot serve to every client
// of the key (see Compression). It does not when the reason is a failure or this request:
// a 5xx, streamed or not (one waiter retries, as before), a status
// without a TTL in StatusTTL, streamed or not (a 403 or a 429 may be
// passing), a response to a request
// with credentials outside the key (under AllowAuthorized: it says
// nothing of anyone else's), a response the client left before it was
// complete, or a rebuild that is not leased (Redis unreachable). The mark
// holds no response, only the reason, and is never served as a page: it
// is a herd envelope with a flag of its own, which herd never hands out
// as a value (herd before it reads it as a corrupt value: a miss). It
// expires with its TTL in Redis, and
// a Set or Invalidate of the key (a purge) removes it at once. The first
// request after it expires leads again: the URL is cached again if its
// response has become shareable, or marked again. A background refresh
// of a stale entry whose response has become unshareable leaves no mark:
// it fails, counted as not shared, and the stale response is served for
// the rest of its stale window while refreshes back off, as after any
// failed refresh; the first request after the window marks the URL.
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
// [herd.MaxTags] tags or a tag longer than [herd.MaxTagBytes] (the URL is
// then marked, as under Hit-for-miss), a tag whose index is full
// ([herd.Options.MaxTagEntries]), or Redis failing to record them; its
// Cache-Status then says "herd; fwd=miss" with detail tags-invalid (too
// many or too long) or tags-not-recorded (the rest), never "stored" (herd
// reads the key back once after committing a tagged response to tell).
//
// A tag's index is shared by every page with the tag, and any client can
// mint keys: the URL with a query string (/blog?utm=N for every N) and
// the error page (a 404 for any path). So that such a flood cannot fill
// the index of a tag every page carries (the layout's, say) and keep
// every other page with it from being stored, the minted keys are
// recorded with [herd.Fill.SetMintedTags]: they take at most half of
// the index, and past that their responses are served but not stored;
// the pages without a query string, of a 2xx or 3xx status, keep the
// other half. Two kinds of key are not counted as minted, and a flood
// of them can still fill an index: the paths of a catch-all route that
// answers 200 for any path, and the Hosts of a server that answers any
// Host (the Host is in the key). Such a site should answer only its own
// hosts (a ServeMux host pattern, a front proxy's server names), not tag
// catch-all responses with a tag every page carries, or give the Cache a
// MaxTagEntries beyond what a flood can fill in a TTL. A stale entry's background refresh stores the tags its
// response carries then. Tags are one namespace per Cache: a purge also
// removes cache-aside values tagged the same ([herd.SetTags],
// [herd.Cache.Set] with tags). [herd.Cache.InvalidateTag] has the costs and
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
// A request's Accept-Encoding is reduced to the content codings herd
// negotiates, gzip and br, that it accepts (RFC 9110 §12.5.3: names in any
// case, x-gzip as gzip, "*" for the codings not listed, q=0 refusing one).
// Whatever is in doubt is refused: a q-value that does not parse, a
// coding listed twice once with q=0. A request without the field, or
// with an empty one, accepts identity only: RFC 9110 lets a server pick
// any coding for it, but not every such client decodes one. zstd,
// deflate and compress are not negotiated. The handler that builds an
// entry is shown an Accept-Encoding derived from that reduction alone,
// never the client's own field. So every spelling of one preference
// ("gzip, deflate, br, zstd", "br;q=1.0, gzip;q=0.8", "*") shares an
// entry, and a response with Vary: Accept-Encoding is stored. Sharing is
// safe because the handler's choice of coding depends only on what the
// key holds, and every client that shares the entry accepts what the
// handler chose or gets it decoded.
//
// By default every client shares one entry per URL. The handler is shown
// Accept-Encoding: gzip when its own client accepts gzip, else identity.
// So what streams past the cache to that client (a flushed or oversized
// response) is always one it accepts. A gzip body (a handler that
// compresses, or chi's Compress middleware inside the cache) is stored as
// it is, once herd has checked that it decodes within MaxBodyBytes. A
// client that accepts gzip gets those bytes, any other client the decoded
// body. The entry's ETag (the handler's, else a hash of the decoded body)
// belongs to the identity representation. The gzip representation gets
// the same ETag with "-gzip" inside its closing quote (W/"x" becomes
// W/"x-gzip"), since RFC 9110 §8.8.3 gives each representation a
// validator of its own. Content-Length, HEAD, If-None-Match and If-Match
// follow the representation served, and both carry Vary:
// Accept-Encoding. A response that herd could not serve to every client
// is not stored: one in another coding (br, zstd), a gzip body that does
// not decode or decodes past MaxBodyBytes, or a gzip body with
// Cache-Control: no-transform.
//
// [Options.Compress] also stores gzip-coded the identity bodies worth it:
// [Options.CompressMinBytes] (1 KiB) or more, of a text type (text/*,
// JSON, JavaScript, XML, their +json and +xml kin, SVG; not a response
// without Content-Type, nor images, video or archives, which are
// compressed already), without no-transform, that gzip at
// [Options.CompressLevel] shrinks by an eighth at least. It keeps the same
// keys, so it may be turned on or off in a running fleet: each setting
// serves the other's entries. BenchmarkCompress measures it on a shared
// 2-vCPU machine. A 32 KiB HTML page takes 5.7 KB in Redis instead of
// 33 KB (5.8x less; 6.8x for 24 KiB of JSON). A hit for a gzip client
// costs 0.7x what it costs without Compress (fewer bytes to read and
// write), but a hit for an identity client pays the decoding (0.15 ms
// more), and a miss the compression (1.2 ms more at level 6). At level 1
// the page takes 7.2 KB (4.6x less) and a miss costs what it does
// without Compress.
//
// With Accept-Encoding in [Options.KeyHeaders] (for a handler that codes
// with br itself), the key holds the client's bucket instead, one of four:
// br and gzip, br, gzip, identity. The handler is shown exactly the
// bucket's codings ("br, gzip", "br", "gzip" or "identity"). Every client
// in a bucket accepts every coding in it, so whatever the handler picks
// is served, as stored, to all of them. A URL then has an entry per
// bucket its clients fall in. This cannot be combined with Compress.
//
// A Range request bypasses the cache, so no byte range ever meets a
// recoded body.
//
// A stored value that herd cannot serve is not bypassed until it
// expires. That covers another writer's value (a negative entry of a
// Cache.Get whose loader said ErrNotFound too), corrupt bytes, and a gzip
// body that does not decode within MaxBodyBytes (a gzip bomb; only a
// client without gzip finds that out, since a gzip client gets the
// stored bytes as they are). The first request that finds it deletes it with [herd.Cache.Invalidate], which
// also fences the rebuilds in flight, and then leads the rebuild (or
// waits for the request that does). The requests of a process that find
// the value while it is being deleted share that one deletion. A request
// deletes at most once: if it finds a bad value again (a writer that
// keeps rewriting the key), it is served by the handler, uncached.
//
// # Metrics
//
// herd's [herd.Observer] (and the Prometheus adapter in
// github.com/herdkit/herd/prometheus) sees the middleware's lookups as
// any other Begin call: one lookup per request that reaches the cache
// (two for a request that waited on a failed rebuild and asks again, and
// for one that found a value it cannot serve and replaced it: the core
// counts that first lookup as a hit, since only the middleware can tell
// a stored value is no response),
// with its outcome: hit, stale, leader (the request ran the handler for
// everyone), follower (it waited for another request's response, in this
// instance or another, whatever that response was) or pass (its URL's
// hit-for-miss mark). Each leader is one load, whatever its result:
// ok (stored), not_shared (a response that could not be shared: no
// failure; [herd.Stats] counts it in NotShared, not in LoadErrors) or
// error (a 5xx or a panic); a leader whose client went away has none. A
// stale lookup's background refresh is a load too, without a lookup.
// [herd.Cache.Stats] holds the same counts.
//
// Requests that bypass the cache never reach herd: [Options.OnBypass]
// reports each of them, and each request served because of its URL's
// hit-for-miss mark, with the reason (method, method_override, body,
// range, credentials, keyfunc, key_too_large, upgrade, no_store,
// hit_for_miss). The Prometheus adapter's NewBypassCounter counts them:
//
//	reg := prometheus.NewRegistry()
//	cache := herd.New(rdb, &herd.Options{
//		Observer: herdprom.NewObserver(reg, nil),
//		KeyClass: middleware.KeyClass(nil), // per-route classes, below
//	})
//	mw := middleware.New(cache, &middleware.Options{
//		OnBypass: herdprom.NewBypassCounter(reg, nil),
//		Class:    middleware.RoutePattern,
//	})
//
// Per route: herd labels its metrics with the class herd.Options.KeyClass
// gives a key, and the middleware cannot change the Cache's options. So
// [Options.Class] names the request's route, the middleware writes that
// name at the front of the request's key, and [KeyClass], plugged into
// herd.Options.KeyClass, reads it back: metrics then show
// "/products/{id}" rather than one class for every page, and lease
// lengths are calibrated per route. Nothing is added to the hit path but
// the name's bytes in the key (no context value for the core to look
// up). [RoutePattern] is the pattern of the route that serves the
// request: r.Pattern, which http.ServeMux and chi set before they call a
// route's handler, or, for the middleware in chi's r.Use (which runs
// before the router matched), the route chi finds for the request. A
// class must be a route, not a URL: the Prometheus adapter reports
// classes beyond its Options.MaxClasses (100 by default) as "other", and the Cache's calibration keeps a bounded number of them.
// Setting Class changes every key, so the first requests after the
// change are cold.
package middleware
