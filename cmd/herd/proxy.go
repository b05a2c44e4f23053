package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/middleware"
	"github.com/redis/go-redis/v9"
)

// proxyCmd is herd proxy: herd's middleware in front of
// httputil.ReverseProxy. Every instance started with the same Redis,
// -prefix and -scope shares one cache, and a cold or stale URL is fetched
// from the origin once across all of them. -mode default uses the
// middleware's shared-cache settings (freshness from the response's
// Cache-Control and Expires, else the TTL); -mode standard is
// middleware.Options.Standard, RFC 9111 as the standard reads it.
var proxyCmd = &command{
	name:    "proxy",
	summary: "a caching reverse proxy to -origin, one origin request per URL across the instances",
	flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
		var pc proxyConfig
		r := redisFlags(fs, e)
		fs.StringVar(&pc.origin, "origin", "", "the origin's URL, http://host:port (required)")
		fs.StringVar(&pc.listen, "listen", "127.0.0.1:8080", "address to listen on")
		fs.StringVar(&pc.mode, "mode", "default", "default (the TTL unless the response says otherwise) or standard (RFC 9111)")
		fs.StringVar(&pc.scope, "scope", "", "key scope shared by the instances (default: the origin URL)")
		fs.IntVar(&pc.maxBody, "max-body", 0, "largest body stored, in bytes (default: the middleware's, 1 MiB)")
		fs.BoolVar(&pc.verbose, "v", false, "log store decisions")
		return func(ctx context.Context) error {
			if err := pc.check(fs.NArg()); err != nil {
				return err
			}
			pc.prefix = *r.prefix
			rdb, err := r.client(e)
			if err != nil {
				return err
			}
			defer rdb.Close()
			pctx, cancel := context.WithTimeout(ctx, *r.timeout)
			err = rdb.Ping(pctx).Err()
			cancel()
			if err != nil {
				return fmt.Errorf("proxy: Redis: %w", err)
			}
			return serveProxy(ctx, rdb, pc, e.stdout)
		}
	},
}

// proxyConfig is what the flags of herd proxy say.
type proxyConfig struct {
	origin, listen, mode, scope, prefix string
	maxBody                             int
	verbose                             bool
}

// check validates the flags (nargs: the arguments after them).
func (pc *proxyConfig) check(nargs int) error {
	switch {
	case nargs != 0:
		return usageError{msg: "proxy takes no arguments"}
	case pc.origin == "":
		return usageError{msg: "proxy: -origin is required"}
	case pc.mode != "default" && pc.mode != "standard":
		return usageError{msg: fmt.Sprintf("proxy: -mode %q is neither default nor standard", pc.mode)}
	}
	u, err := url.Parse(pc.origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageError{msg: fmt.Sprintf("proxy: -origin %q is not an http or https URL", pc.origin)}
	}
	if pc.scope == "" {
		pc.scope = pc.origin
	}
	return nil
}

// serveProxy serves the proxy until ctx ends (or SIGINT, SIGTERM), then
// shuts it down. It writes the address it listens on to out.
func serveProxy(ctx context.Context, rdb redis.UniversalClient, pc proxyConfig, out io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := herd.New(rdb, &herd.Options{Prefix: pc.prefix})
	defer c.Close()

	ln, err := net.Listen("tcp", pc.listen)
	if err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	srv := &http.Server{
		Handler:           newProxyHandler(c, pc),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	fmt.Fprintf(out, "herd proxy: listening on http://%s, origin %s, mode %s\n", ln.Addr(), pc.origin, pc.mode)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("proxy: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	<-served
	return err
}

// newProxyHandler is herd's middleware in front of a ReverseProxy to the
// origin of pc.
func newProxyHandler(c *herd.Cache, pc proxyConfig) http.Handler {
	origin, _ := url.Parse(pc.origin) // checked by parseProxyFlags
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(origin)
			r.Out.Host = r.In.Host // the client's Host, as a reverse proxy passes it
			r.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, "502 bad gateway: the origin did not answer", http.StatusBadGateway)
		},
	}
	opt := &middleware.Options{
		Scope:        pc.scope,
		MaxBodyBytes: pc.maxBody,
		// The proxy is the shared cache in front of the origin: a
		// response's own freshness rules it.
		RespectCacheControl: true,
		// The proxy sets X-Forwarded-* for the origin itself, after the
		// key is made; the client's own are passed on, so they stay keyed.
	}
	if pc.mode == "standard" {
		opt = &middleware.Options{Scope: pc.scope, MaxBodyBytes: pc.maxBody, Standard: true}
	}
	if pc.verbose {
		opt.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	mw := middleware.New(c, opt)
	return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rp.ServeHTTP(&heldFlushes{ResponseWriter: w}, r)
	}))
}

// heldFlushes hides ReverseProxy's flushes from the middleware, except
// for an event stream: ReverseProxy flushes every response without a
// Content-Length (a chunked origin response) at once, and the middleware
// takes a flushed response as a stream it must not store. A body larger
// than the middleware's MaxBodyBytes still streams to its client.
type heldFlushes struct {
	http.ResponseWriter
}

// FlushError flushes an event stream; any other response is held.
func (w *heldFlushes) FlushError() error {
	if ct, _, _ := mime.ParseMediaType(w.Header().Get("Content-Type")); ct != "text/event-stream" {
		return nil
	}
	err := http.NewResponseController(w.ResponseWriter).Flush()
	if errors.Is(err, http.ErrNotSupported) {
		return nil
	}
	return err
}

// Flush is FlushError for http.Flusher.
func (w *heldFlushes) Flush() { _ = w.FlushError() }

// Unwrap lets http.ResponseController reach the client's other methods
// (Hijack, for an upgrade ReverseProxy passes on).
func (w *heldFlushes) Unwrap() http.ResponseWriter { return w.ResponseWriter }
