package middleware

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
)

// shopRig is two instances of one service on one Redis, each with its own
// Cache: instance A routes with a ServeMux, instance B with chi. The
// handler serves /products/{id}, tagged "product:<id>" and "all" in
// Surrogate-Key and "shelf:<id mod 2>" in Cache-Tag, and counts its runs
// per id; a gate, when set for an id, holds the handler until closed.
type shopRig struct {
	t          *testing.T
	ca, cb     *herd.Cache
	a, b       *httptest.Server
	mu         sync.Mutex
	runs       map[string]int
	gates      map[string]chan struct{}
	entered    chan string
	version    atomic.Int64 // the body's version: what a purge is about
	extraTags  string       // more Surrogate-Key tags, for every page (guarded by mu)
	streamFrom int          // ids at or above it stream, when > 0 (guarded by mu)
}

func newShopRig(t *testing.T, opt *Options) *shopRig {
	srv := redistest.Start(t)
	r := &shopRig{t: t, runs: map[string]int{}, gates: map[string]chan struct{}{}, entered: make(chan string, 16)}
	r.ca, r.cb = herd.New(srv.Client(t), nil), herd.New(srv.Client(t), nil)
	t.Cleanup(func() { r.ca.Close(); r.cb.Close() })
	o := Options{}
	if opt != nil {
		o = *opt
	}
	o.Scope = "shop" // the two instances listen on different ports
	page := func(w http.ResponseWriter, id string) {
		v := r.version.Load() // the source, as of the handler's start
		r.mu.Lock()
		r.runs[id]++
		gate, extra, streamFrom := r.gates[id], r.extraTags, r.streamFrom
		r.mu.Unlock()
		if gate != nil {
			r.entered <- id
			<-gate
		}
		n, _ := strconv.Atoi(id)
		w.Header().Set("Surrogate-Key", strings.TrimSpace("product:"+id+" all "+extra))
		w.Header().Set("Cache-Tag", "shelf:"+strconv.Itoa(n%2))
		fmt.Fprintf(w, "product %s v%d", id, v)
		if streamFrom > 0 && n >= streamFrom {
			w.(http.Flusher).Flush()
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /products/{id}", New(r.ca, &o)(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		page(w, req.PathValue("id"))
	})))
	router := chi.NewRouter()
	router.Use(chimw.Recoverer)
	router.With(New(r.cb, &o)).Get("/products/{id}", func(w http.ResponseWriter, req *http.Request) {
		page(w, chi.URLParam(req, "id"))
	})
	r.a, r.b = httptest.NewServer(mux), httptest.NewServer(router)
	t.Cleanup(func() { r.a.Close(); r.b.Close() })
	return r
}

// shopHost is the Host of every request to the rig: both instances serve
// one site.
const shopHost = "shop.example"

// get requests product id from an instance and returns the response
// and its body.
func (r *shopRig) get(srv *httptest.Server, id string) (*http.Response, string) {
	r.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/products/"+id, nil)
	req.Host = shopHost
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func (r *shopRig) ran(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[id]
}

// hold makes the next runs of id's handler wait until the returned func
// is called.
func (r *shopRig) hold(id string) (open func()) {
	gate := make(chan struct{})
	r.mu.Lock()
	r.gates[id] = gate
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.gates, id)
		r.mu.Unlock()
		close(gate)
	}
}

func (r *shopRig) waitEntered(id string) {
	r.t.Helper()
	select {
	case got := <-r.entered:
		if got != id {
			r.t.Fatalf("handler entered for %s, want %s", got, id)
		}
	case <-time.After(20 * time.Second):
		r.t.Fatalf("the handler for %s did not start", id)
	}
}

func (r *shopRig) purge(c *herd.Cache, tags ...string) {
	r.t.Helper()
	if err := InvalidateTag(context.Background(), c, tags...); err != nil {
		r.t.Fatalf("InvalidateTag %q: %v", tags, err)
	}
}

// wantHit checks that a request is served from the cache with body.
func (r *shopRig) wantHit(srv *httptest.Server, id, body string) {
	r.t.Helper()
	runs := r.ran(id)
	res, got := r.get(srv, id)
	if !strings.HasPrefix(res.Header.Get("Cache-Status"), statusHit) || got != body || r.ran(id) != runs {
		r.t.Fatalf("GET %s: Cache-Status %q, body %q, handler runs %d→%d; want a hit with %q", id, res.Header.Get("Cache-Status"), got, runs, r.ran(id), body)
	}
}

// wantRebuild checks that a request runs the handler and stores body.
func (r *shopRig) wantRebuild(srv *httptest.Server, id, body string) {
	r.t.Helper()
	runs := r.ran(id)
	res, got := r.get(srv, id)
	if !sameStatus(res.Header.Get("Cache-Status"), statusStored) || got != body || r.ran(id) != runs+1 {
		r.t.Fatalf("GET %s: Cache-Status %q, body %q, handler runs %d→%d; want one run storing %q", id, res.Header.Get("Cache-Status"), got, runs, r.ran(id), body)
	}
}

// A purge in one instance invalidates the pages of the tag stored by the
// other, by Surrogate-Key (space separated) and Cache-Tag (comma
// separated), and a cache-aside value with the same tag: tags are one
// namespace per Cache prefix.
func TestTagPurgeAcrossInstances(t *testing.T) {
	r := newShopRig(t, nil)
	ctx := context.Background()
	for _, id := range []string{"1", "2", "3"} {
		r.wantRebuild(r.a, id, "product "+id+" v0")
		r.wantHit(r.b, id, "product "+id+" v0")
	}
	if err := r.ca.Set(ctx, "price:1", []byte("9.99"), time.Hour, "product:1"); err != nil {
		t.Fatal(err)
	}
	r.version.Store(1)
	r.purge(r.cb, "product:1")
	r.wantRebuild(r.b, "1", "product 1 v1")
	r.wantHit(r.a, "1", "product 1 v1")
	r.wantHit(r.a, "2", "product 2 v0")
	var loads atomic.Int64
	v, err := r.ca.Get(ctx, "price:1", time.Hour, func(context.Context) ([]byte, error) {
		loads.Add(1)
		return []byte("8.99"), nil
	})
	if err != nil || string(v) != "8.99" || loads.Load() != 1 {
		t.Fatalf("the cache-aside value with the page's tag: %q, %v, %d loads; want it purged too", v, err, loads.Load())
	}
	r.purge(r.ca, "shelf:1") // Cache-Tag: products 1 and 3
	r.wantRebuild(r.a, "3", "product 3 v1")
	r.wantRebuild(r.b, "1", "product 1 v1")
	r.wantHit(r.b, "2", "product 2 v0")
	r.purge(r.ca, "all")
	for _, id := range []string{"1", "2", "3"} {
		r.wantRebuild(r.b, id, "product "+id+" v1")
	}
}

// A purge during an in-flight rebuild, in the other instance: the rebuild
// started before the purge, so its response goes to its client but is
// not stored; the next request runs the handler. First when the page is
// not in the tag's index yet (its first build), then when it is (a
// rebuild after another tag of the page was purged).
func TestTagPurgeDuringRebuild(t *testing.T) {
	r := newShopRig(t, nil)
	r.purge(r.ca, "warm-up") // both Caches read the purge generation from now on
	r.purge(r.cb, "warm-up")

	open := r.hold("1")
	done := make(chan string, 1)
	go func() {
		_, body := r.get(r.a, "1")
		done <- body
	}()
	r.waitEntered("1")
	r.version.Store(1)
	r.purge(r.cb, "product:1")
	open()
	if body := <-done; body != "product 1 v0" {
		t.Fatalf("the in-flight request got %q, want the response its handler built", body)
	}
	r.wantRebuild(r.b, "1", "product 1 v1")
	r.wantHit(r.a, "1", "product 1 v1")

	// The page is in the index of product:1; a purge of "all" drops it,
	// and its rebuild, on B, is in flight when A purges product:1.
	r.purge(r.ca, "all")
	open = r.hold("1")
	go func() {
		_, body := r.get(r.b, "1")
		done <- body
	}()
	r.waitEntered("1")
	r.version.Store(2)
	r.purge(r.ca, "product:1")
	open()
	if body := <-done; body != "product 1 v1" {
		t.Fatalf("the in-flight request got %q, want the response its handler built", body)
	}
	r.wantRebuild(r.a, "1", "product 1 v2")
	r.wantHit(r.b, "1", "product 1 v2")
}

// Surrogate-Key and Cache-Tag never reach clients by default, neither on
// the response that built an entry, nor on hits, nor when it streamed;
// the entry does not hold them (an instance that keeps them serves none
// from an entry another stored). With KeepTagHeaders they are sent and
// stored, for a CDN in front.
func TestTagHeadersStripped(t *testing.T) {
	r := newShopRig(t, nil)
	r.mu.Lock()
	r.streamFrom = 9
	r.mu.Unlock()
	noTags := func(res *http.Response, what string) {
		t.Helper()
		for name := range res.Header {
			if isTagField(name) {
				t.Fatalf("%s: the response carries %s", what, name)
			}
		}
	}
	res, _ := r.get(r.a, "1")
	noTags(res, "the response that built the entry")
	res, _ = r.get(r.a, "1")
	noTags(res, "a hit")
	res, _ = r.get(r.a, "9")
	noTags(res, "a streamed response")

	keep := &Options{KeepTagHeaders: true}
	kc, _ := newCache(t, nil)
	srv := httptest.NewServer(New(kc, keep)(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header()["surrogate-key"] = []string{"a b"} // not canonical: still a tag field
		w.Header().Set("Cache-Tag", "c,d")
		fmt.Fprint(w, "kept")
	})))
	defer srv.Close()
	for _, what := range []string{"miss", "hit"} {
		res, _ := get(t, srv.URL+"/x")
		if res.Header.Get("Surrogate-Key") != "a b" || res.Header.Get("Cache-Tag") != "c,d" {
			t.Fatalf("%s with KeepTagHeaders: Surrogate-Key %q, Cache-Tag %q", what, res.Header.Get("Surrogate-Key"), res.Header.Get("Cache-Tag"))
		}
	}
	if err := kc.InvalidateTag(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	if res, _ := get(t, srv.URL+"/x"); !sameStatus(res.Header.Get("Cache-Status"), statusStored) {
		t.Fatalf("after purging a non-canonical Surrogate-Key's tag: Cache-Status %q, want a rebuild", res.Header.Get("Cache-Status"))
	}

	// One that does not keep them serves an entry stored with them
	// without them.
	plain := httptest.NewServer(New(kc, &Options{Scope: "k"})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("the handler ran: want a hit of the entry stored with its tags")
	})))
	defer plain.Close()
	kept := httptest.NewServer(New(kc, &Options{Scope: "k", KeepTagHeaders: true})(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Surrogate-Key", "a b")
		fmt.Fprint(w, "kept")
	})))
	defer kept.Close()
	hostGet := func(srv *httptest.Server) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/y", nil)
		req.Host = shopHost
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	if res := hostGet(kept); res.Header.Get("Surrogate-Key") != "a b" {
		t.Fatalf("KeepTagHeaders: Surrogate-Key %q", res.Header.Get("Surrogate-Key"))
	}
	res = hostGet(plain)
	if !strings.HasPrefix(res.Header.Get("Cache-Status"), statusHit) {
		t.Fatalf("the instance without KeepTagHeaders: Cache-Status %q, want a hit", res.Header.Get("Cache-Status"))
	}
	noTags(res, "a hit of an entry stored with them")

	// An instance that keeps them, on the rig's Redis and scope, serves
	// an entry stored by one that does not: without them.
	shareScopes(r.cb) // kb stands for another instance of the program, on B's Cache
	kb := New(r.cb, &Options{Scope: "shop", KeepTagHeaders: true})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("the handler ran: want a hit of the entry instance A stored")
	}))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/products/1", nil)
	req.Host = shopHost
	kb.ServeHTTP(rec, req)
	if !strings.HasPrefix(rec.Header().Get("Cache-Status"), statusHit) {
		t.Fatalf("the keeping instance: Cache-Status %q, want a hit", rec.Header().Get("Cache-Status"))
	}
	noTags(rec.Result(), "a hit of an entry stored without them")
}

// Tags a Cache cannot record keep a response from being stored (a purge
// could not find it): too many, too long. Odd bytes are fine.
func TestTagHostileHeaders(t *testing.T) {
	c, _ := newCache(t, nil)
	var runs atomic.Int64
	var tags atomic.Value
	srv := httptest.NewServer(New(c, nil)(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		runs.Add(1)
		w.Header().Set("Surrogate-Key", tags.Load().(string))
		fmt.Fprint(w, "page")
	})))
	defer srv.Close()
	many := make([]string, herd.MaxTags+1)
	for i := range many {
		many[i] = "t" + strconv.Itoa(i)
	}
	for _, tc := range []struct {
		name, header string
		stored       bool
	}{
		{"too-many", strings.Join(many, " "), false},
		{"too-long", strings.Repeat("x", herd.MaxTagBytes+1), false},
		{"most", strings.Join(many[:herd.MaxTags], " ") + " " + many[0], true},
		{"odd", "{a} }{ a}{b \x7f ключ", true},
		{"blank", "   ", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tags.Store(tc.header)
			url := srv.URL + "/" + tc.name
			get(t, url)
			before := runs.Load()
			res, body := get(t, url)
			stored := runs.Load() == before
			if body != "page" || stored != tc.stored {
				t.Fatalf("second GET: body %q, Cache-Status %q, stored %v; want stored %v", body, res.Header.Get("Cache-Status"), stored, tc.stored)
			}
			if !tc.stored && !sameStatus(res.Header.Get("Cache-Status"), statusHitForMiss) {
				// The tags are the response's own: its URL is marked
				// (hit-for-miss), like one that cannot be shared.
				t.Fatalf("second GET: Cache-Status %q, want %q", res.Header.Get("Cache-Status"), statusHitForMiss)
			}
		})
	}
	// The odd tags are purgeable one by one.
	for _, tag := range []string{"{a}", "}{", "a}{b", "\x7f", "ключ"} {
		tags.Store("{a} }{ a}{b \x7f ключ")
		get(t, srv.URL+"/odd")
		if err := InvalidateTag(context.Background(), c, tag); err != nil {
			t.Fatal(err)
		}
		before := runs.Load()
		get(t, srv.URL+"/odd")
		if runs.Load() != before+1 {
			t.Fatalf("after purging %q the page was not rebuilt", tag)
		}
	}
}

// A background refresh of a stale page, in flight when the page's tag is
// purged, does not store its response: the next request runs the handler.
func TestTagPurgeDuringRefresh(t *testing.T) {
	r := newShopRig(t, &Options{TTL: 300 * time.Millisecond, StaleFor: time.Hour})
	r.purge(r.ca, "warm-up")
	r.wantRebuild(r.a, "1", "product 1 v0")
	time.Sleep(400 * time.Millisecond) // past the TTL: the next request is stale
	open := r.hold("1")
	res, body := r.get(r.a, "1")
	if !sameStatus(res.Header.Get("Cache-Status"), statusStale) || body != "product 1 v0" {
		t.Fatalf("stale GET: Cache-Status %q, body %q", res.Header.Get("Cache-Status"), body)
	}
	r.waitEntered("1") // the refresh
	r.version.Store(1)
	r.purge(r.cb, "product:1")
	open()
	// The purge deleted the stale entry; this request waits for the
	// refresh's lease, which its refused commit releases, and rebuilds.
	r.wantRebuild(r.b, "1", "product 1 v1")
}

// A background refresh stores its response with the tags it carries now:
// a tag the page did not have before purges the refreshed entry.
func TestTagRefreshStoresItsTags(t *testing.T) {
	r := newShopRig(t, &Options{TTL: 300 * time.Millisecond, StaleFor: time.Hour})
	r.wantRebuild(r.a, "1", "product 1 v0")
	time.Sleep(400 * time.Millisecond) // past the TTL: the next request is stale
	r.mu.Lock()
	r.extraTags = "new-tag"
	r.mu.Unlock()
	r.version.Store(1)
	if res, _ := r.get(r.a, "1"); !sameStatus(res.Header.Get("Cache-Status"), statusStale) {
		t.Fatalf("stale GET: Cache-Status %q", res.Header.Get("Cache-Status"))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, body := r.get(r.a, "1")
		if strings.HasPrefix(res.Header.Get("Cache-Status"), statusHit) && body == "product 1 v1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refresh did not land: Cache-Status %q, body %q", res.Header.Get("Cache-Status"), body)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.version.Store(2)
	r.purge(r.cb, "new-tag")
	r.wantRebuild(r.b, "1", "product 1 v2")
}

func TestResponseTags(t *testing.T) {
	h := http.Header{
		"Surrogate-Key": {" a  b\tc ", "d"},
		"cache-tag":     {"e, f ,,g", " h "},
		"Other":         {"x"},
	}
	got := strings.Join(responseTags(h), "|")
	if want := "a|b|c|d|e|f|g|h"; got != want {
		t.Fatalf("responseTags = %q, want %q", got, want)
	}
	stripTags(h)
	if len(h) != 1 || h.Get("Other") != "x" {
		t.Fatalf("stripTags left %v", h)
	}
}

// TestCacheStatusHonestWhenTagIndexFull: when a tag's index is full
// (herd.Options.MaxTagEntries), a response carrying the tag is served but
// not stored, and its Cache-Status says so ("fwd=miss" without
// "stored"). From the HTTP issue's hole 5: /blog?utm=N filled the index of
// a tag every page carries, and /home then said "stored" on every
// request though nothing was stored.
func TestCacheStatusHonestWhenTagIndexFull(t *testing.T) {
	c, _ := newCache(t, &herd.Options{MaxTagEntries: 3})
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Surrogate-Key", "layout-"+rt.name)
				io.WriteString(w, "page "+r.URL.String())
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			for i := range 3 {
				// Pages of the site's own (no query: see
				// TestMintedKeysCannotFillATagIndex for the flood of ?utm=N).
				secGet(t, cl, fmt.Sprintf("%s/blog/%d", srv.URL, i))
			}
			for i := range 2 {
				r := secGet(t, cl, srv.URL+"/home")
				if sameStatus(r.cacheStatus(), statusStored) || strings.HasPrefix(r.cacheStatus(), statusHit) {
					t.Errorf("GET %d of /home with the tag's index full: %v, want %q (nothing stored)", i+1, r, statusMiss)
				}
			}
		})
	}
}

// TestMintedKeysCannotFillATagIndex: the keys any client can mint (a URL
// with a query string, a 404 page) take at most half of a tag's index, so
// a flood of /blog?utm=N and of missing paths, all tagged with the tag
// every page carries, leaves the site's own pages stored. From the HTTP
// issue's hole 5: after the flood, /home ran its handler on every request.
func TestMintedKeysCannotFillATagIndex(t *testing.T) {
	c, _ := newCache(t, &herd.Options{MaxTagEntries: 4})
	for _, rt := range secRouters {
		t.Run(rt.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Surrogate-Key", "layout-"+rt.name)
				if strings.HasPrefix(r.URL.Path, "/missing/") {
					w.WriteHeader(http.StatusNotFound)
				}
				io.WriteString(w, "page "+r.URL.String())
			})
			srv, cl := secServe(t, rt.build(New(c, nil), h))
			stored := 0
			for i := range 10 {
				for _, p := range []string{fmt.Sprintf("/blog?utm=%d", i), fmt.Sprintf("/missing/%d", i)} {
					if r := secGet(t, cl, srv.URL+p); r.cacheStatus() == statusStored {
						stored++
					}
				}
			}
			if stored != 2 {
				t.Errorf("minted keys stored: %d, want 2 (half of MaxTagEntries 4)", stored)
			}
			for _, p := range []string{"/home", "/about"} {
				if r := secGet(t, cl, srv.URL+p); r.cacheStatus() != statusStored {
					t.Errorf("GET %s after the flood: %v, want it stored", p, r)
				}
				if r := secGet(t, cl, srv.URL+p); !strings.HasPrefix(r.cacheStatus(), statusHit) {
					t.Errorf("GET %s again: %v, want a hit", p, r)
				}
			}
		})
	}
}
