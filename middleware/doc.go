// Package middleware is herd's HTTP middleware for read paths: across a
// whole fleet of instances that share a Redis, one request runs the
// handler for a cold URL, and every other request, in every instance, is
// served its response.
//
// It works with any router that takes func(http.Handler) http.Handler:
//
//	mux := http.NewServeMux()
//	mux.Handle("GET /products/{id}", middleware.New(cache, nil)(http.HandlerFunc(productHandler)))
//
//	r := chi.NewRouter()
//	r.Use(chimw.GetHead) // chi's: HEAD requests reach Get routes
//	r.Use(middleware.New(cache, &middleware.Options{TTL: 30 * time.Second}))
//	r.With(middleware.New(cache, nil)).Get("/catalog", catalogHandler)
//
// (productHandler and catalogHandler are plain func(http.ResponseWriter,
// *http.Request); see "Hosts and routers" for HEAD and path parameters.)
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
// # Hosts and routers
//
// The Host a request names, with its port, is part of the key, as net/http
// reports it (r.Host, case kept). Two names for one server are two
// entries: in a local test, http://localhost:8080/p and
// http://127.0.0.1:8080/p fill the cache twice, and so do example.com and
// example.com:443. Behind a load balancer, instances share entries when it
// passes the client's Host on, so that every instance sees the same one; a
// balancer that rewrites Host to each instance's own address
// (10.0.0.7:8080) leaves each instance with entries of its own. Make it
// pass the Host through (nginx: proxy_set_header Host $host), or key on
// what the pages depend on with [Options.KeyFunc]. The listener's port is
// in the key too, unless [Options.Scope] is set (see Security).
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
// the key (or *), stale on arrival, a stream, a hijack, a body past
// MaxBodyBytes (marked as soon as it streams, so the waiters do not wait
// for its end), or a Content-Encoding herd cannot serve to every client
// of the key (see Compression). It does not when the reason is a failure or this request:
// a 5xx (one waiter retries, as before), a status without a TTL in
// StatusTTL (a 403 or a 429 may be passing), a response to a request
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
// ([herd.Options.MaxTagEntries]), or Redis failing to record them. A stale entry's background refresh stores the tags its
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
