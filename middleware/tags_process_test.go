package middleware

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func init() { xpWorkerRoles["tagserver"] = xpTagServer }

// TestTagPurgeAcrossProcesses: two worker processes serve tagged pages
// from one redis-server; the test process purges with a Cache of its
// own. A rebuild in flight in one worker when the purge returns is not
// stored (its client still gets its response), and the next request, in
// the other worker, runs the handler: first for a page not yet in the
// tag's index, then for one that is.
func TestTagPurgeAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	run := "mwtag-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	p := xpSpawn(t, 2, "tagserver", xpEnvRedis+"="+srv.Addr(), xpEnvRun+"="+run, xpEnvDeadline+"=60s")
	defer p.stop(10 * time.Second)
	addrs := make([]string, 2)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := p.exited(); err != nil {
			t.Fatal(err)
		}
		lines := rdb.LRange(ctx, run+":addrs", 0, -1).Val()
		if len(lines) == 2 {
			for _, ln := range lines {
				inst, addr, _ := strings.Cut(ln, " ")
				i, _ := strconv.Atoi(inst)
				addrs[i] = addr
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the workers did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cache := herd.New(rdb, nil)
	defer cache.Close()

	fetch := func(worker int, id string) (cacheStatus, body string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addrs[worker]+"/items/"+id, nil)
		req.Host = "catalog.example"
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.Header.Get("Cache-Status"), string(b)
	}
	runs := func(id string) int {
		n, _ := rdb.Get(ctx, run+":runs:"+id).Int()
		return n
	}
	// inFlight starts a request for id on worker whose handler waits for
	// release once it has read the source.
	inFlight := func(worker int, id string) (release func() string) {
		t.Helper()
		rdb.Set(ctx, run+":hold:"+id, "1", time.Minute)
		got := make(chan string, 1)
		go func() {
			_, body := fetch(worker, id)
			got <- body
		}()
		if _, err := rdb.BLPop(ctx, 20*time.Second, run+":entered:"+id).Result(); err != nil {
			t.Fatalf("the handler for %s did not start: %v", id, err)
		}
		return func() string {
			rdb.Del(ctx, run+":hold:"+id)
			rdb.RPush(ctx, run+":gate:"+id, "go")
			return <-got
		}
	}
	purge := func(tag string) {
		t.Helper()
		if err := InvalidateTag(ctx, cache, tag); err != nil {
			t.Fatal(err)
		}
	}
	// Each worker builds a tagged page first: from then on its rebuilds
	// read the purge generation.
	for w := range 2 {
		fetch(w, "warm-"+strconv.Itoa(w))
	}

	release := inFlight(0, "1")
	rdb.Set(ctx, run+":version", "1", 0)
	purge("item:1")
	if body := release(); body != "item 1 v0" {
		t.Fatalf("the in-flight request got %q, want its own handler's response", body)
	}
	if cs, body := fetch(1, "1"); !sameStatus(cs, statusStored) || body != "item 1 v1" || runs("1") != 2 {
		t.Fatalf("after the purge: Cache-Status %q, body %q, %d runs; want the second run, stored", cs, body, runs("1"))
	}
	if cs, body := fetch(0, "1"); !strings.HasPrefix(cs, statusHit) || body != "item 1 v1" {
		t.Fatalf("worker 0 after the rebuild: Cache-Status %q, body %q; want a hit", cs, body)
	}

	// The page is in item:1's index now. Purge it, and purge again while
	// its next rebuild is in flight.
	purge("item:1")
	release = inFlight(1, "1")
	rdb.Set(ctx, run+":version", "2", 0)
	purge("item:1")
	if body := release(); body != "item 1 v1" {
		t.Fatalf("the in-flight request got %q, want its own handler's response", body)
	}
	if cs, body := fetch(0, "1"); !sameStatus(cs, statusStored) || body != "item 1 v2" || runs("1") != 4 {
		t.Fatalf("after the second purge: Cache-Status %q, body %q, %d runs; want the fourth run, stored", cs, body, runs("1"))
	}
}

// xpTagServer is one instance for TestTagPurgeAcrossProcesses: a chi
// router whose /items/{id} counts its runs in Redis, reads the source's
// version, and, when the test holds the id, waits for the test's go.
func xpTagServer() error {
	ctx := context.Background()
	run, addr := os.Getenv(xpEnvRun), os.Getenv(xpEnvRedis)
	inst := os.Getenv(xpEnvInst)
	limit, err := time.ParseDuration(os.Getenv(xpEnvDeadline))
	if run == "" || addr == "" || err != nil {
		return errors.New("missing " + xpEnvRun + ", " + xpEnvRedis + " or " + xpEnvDeadline)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	cache := herd.New(rdb, nil)
	defer cache.Close()
	r := chi.NewRouter()
	r.With(New(cache, &Options{Scope: "catalog"})).Get("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := chi.URLParam(r, "id")
		rdb.Incr(ctx, run+":runs:"+id)
		v, _ := rdb.Get(ctx, run+":version").Result()
		if v == "" {
			v = "0"
		}
		if rdb.Exists(ctx, run+":hold:"+id).Val() == 1 {
			rdb.RPush(ctx, run+":entered:"+id, "in")
			rdb.BLPop(ctx, 30*time.Second, run+":gate:"+id)
		}
		w.Header().Set("Surrogate-Key", "item:"+id+" items")
		fmt.Fprintf(w, "item %s v%s", id, v)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	if err := rdb.RPush(ctx, run+":addrs", inst+" "+ln.Addr().String()).Err(); err != nil {
		return err
	}
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-stop:
	case <-timer.C:
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}
