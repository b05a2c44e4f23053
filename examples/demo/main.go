// Command demo shows a cache stampede and herd stopping it.
//
// It starts an embedded Redis and a slow "database" (an HTTP server that
// counts its calls), then runs several instance processes of this program,
// each with many concurrent requests for the same cold key, released at
// the same instant: first with plain cache-aside code (GET, on a miss ask
// the database and SET), then with herd. It prints how many times the
// database was called and how long the requests took.
//
//	go run ./examples/demo
//	go run ./examples/demo -instances 8 -requests 100 -redis 127.0.0.1:6379
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/herdkit/herd"
	"github.com/redis/go-redis/v9"
)

func main() {
	role := flag.String("role", "", "internal: run as an instance process")
	instances := flag.Int("instances", 4, "instance processes")
	requests := flag.Int("requests", 64, "concurrent requests per instance")
	latency := flag.Duration("db-latency", 100*time.Millisecond, "how long the database takes")
	redisAddr := flag.String("redis", "", "Redis address (default: an embedded Redis)")
	dbURL := flag.String("db", "", "internal: the database URL")
	mode := flag.String("mode", "", "internal: plain or herd")
	key := flag.String("key", "", "internal: the key")
	start := flag.Int64("start", 0, "internal: the start time, Unix nanoseconds")
	flag.Parse()
	if *role == "instance" {
		if err := instance(*redisAddr, *dbURL, *mode, *key, *requests, time.Unix(0, *start)); err != nil {
			log.Fatal(err)
		}
		return
	}

	embedded := *redisAddr == ""
	if embedded {
		mr, err := miniredis.Run()
		if err != nil {
			log.Fatal(err)
		}
		mr.ClockTTL(true) // keys expire in real time, as in Redis
		defer mr.Close()
		*redisAddr = mr.Addr()
	}
	var calls atomic.Int64
	db := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		time.Sleep(*latency)
		fmt.Fprintf(w, `{"id":42,"name":"Ada Lovelace","at":%q}`, time.Now().Format(time.RFC3339Nano))
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go db.Serve(ln)
	defer db.Close()

	where := "an embedded Redis"
	if !embedded {
		where = "Redis at " + *redisAddr
	}
	fmt.Printf("%d instances × %d concurrent requests for one cold key, a database that takes %v, on %s\n\n",
		*instances, *requests, *latency, where)
	for _, m := range []string{"plain", "herd"} {
		calls.Store(0)
		lat, err := run(*redisAddr, "http://"+ln.Addr().String(), m, *instances, *requests)
		if err != nil {
			log.Fatal(err)
		}
		slices.Sort(lat)
		name := map[string]string{"plain": "without herd", "herd": "with herd"}[m]
		fmt.Printf("%-13s %4d database calls   requests: p50 %v, p99 %v, max %v\n", name+":", calls.Load(),
			pct(lat, 0.5), pct(lat, 0.99), lat[len(lat)-1].Round(time.Millisecond))
	}
	fmt.Println()
	if embedded {
		fmt.Println("Run it against a real Redis: go run ./examples/demo -redis 127.0.0.1:6379")
	}
}

// run starts the instance processes for one mode and collects every
// request's latency.
func run(redisAddr, dbURL, mode string, instances, requests int) ([]time.Duration, error) {
	key := fmt.Sprintf("demo:%s:%d", mode, time.Now().UnixNano())
	start := time.Now().Add(time.Second) // every process waits for this instant
	var (
		mu  sync.Mutex
		lat []time.Duration
		wg  sync.WaitGroup
	)
	errs := make(chan error, instances)
	for range instances {
		cmd := exec.Command(os.Args[0], "-role", "instance", "-redis", redisAddr, "-db", dbURL, "-mode", mode,
			"-key", key, "-requests", strconv.Itoa(requests), "-start", strconv.FormatInt(start.UnixNano(), 10))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		wg.Go(func() {
			var got []time.Duration
			if err := json.NewDecoder(bufio.NewReader(out)).Decode(&got); err != nil {
				errs <- fmt.Errorf("instance output: %w", err)
			}
			_, _ = io.Copy(io.Discard, out)
			if err := cmd.Wait(); err != nil {
				errs <- err
			}
			mu.Lock()
			lat = append(lat, got...)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	return lat, errors.Join(slices.Collect(func(yield func(error) bool) {
		for err := range errs {
			if !yield(err) {
				return
			}
		}
	})...)
}

// instance is one process: requests concurrent requests for key at start.
func instance(redisAddr, dbURL, mode, key string, requests int, start time.Time) error {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: requests + 10})
	defer rdb.Close()
	cache := herd.New(rdb, nil)
	defer cache.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fetch := func(ctx context.Context) ([]byte, error) {
		res, err := http.Get(dbURL)
		if err != nil {
			return nil, err
		}
		defer res.Body.Close()
		return io.ReadAll(res.Body)
	}
	get := map[string]func() error{
		// The usual cache-aside code: every miss goes to the database.
		"plain": func() error {
			if _, err := rdb.Get(ctx, key).Bytes(); err == nil {
				return nil
			} else if !errors.Is(err, redis.Nil) {
				return err
			}
			v, err := fetch(ctx)
			if err != nil {
				return err
			}
			return rdb.Set(ctx, key, v, time.Minute).Err()
		},
		"herd": func() error {
			_, err := cache.Get(ctx, key, time.Minute, fetch)
			return err
		},
	}[mode]

	lat := make([]time.Duration, requests)
	var wg sync.WaitGroup
	var failed atomic.Value
	time.Sleep(time.Until(start))
	for i := range requests {
		wg.Go(func() {
			t := time.Now()
			if err := get(); err != nil {
				failed.Store(err)
			}
			lat[i] = time.Since(t)
		})
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(lat)
}

func pct(sorted []time.Duration, p float64) time.Duration {
	return sorted[int(p*float64(len(sorted)-1))].Round(time.Millisecond)
}
