package middleware_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/middleware"
	"github.com/redis/go-redis/v9"
)

// Twenty concurrent requests for a cold URL run the handler once; a later
// request is a hit.
func ExampleNew() {
	mr, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	cache := herd.New(rdb, nil)
	defer cache.Close()

	var runs atomic.Int32
	products := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		time.Sleep(20 * time.Millisecond) // a slow query
		fmt.Fprintf(w, "product %s", r.PathValue("id"))
	})
	mux := http.NewServeMux()
	mux.Handle("GET /products/{id}", middleware.New(cache, &middleware.Options{TTL: time.Minute})(products))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			res, err := http.Get(srv.URL + "/products/7")
			if err == nil {
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		})
	}
	wg.Wait()
	res, _ := http.Get(srv.URL + "/products/7")
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Printf("%s; handler runs: %d; Cache-Status: %.9s\n", body, runs.Load(), res.Header.Get("Cache-Status"))
	// Output: product 7; handler runs: 1; Cache-Status: herd; hit
}
