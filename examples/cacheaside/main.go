// Command cacheaside shows herd's cache-aside helper inside a service:
// Fetch[T] with a struct, a negative entry for a missing row, SetValue and
// Invalidate after each write to the source, and how each call was served.
//
//	go run ./examples/cacheaside                 # embedded Redis
//	go run ./examples/cacheaside -redis 127.0.0.1:6379
//
// With -redis, run it on a Redis without the keys of an earlier run
// (user:42 and user:7 live 5 minutes and 30 s): a second run finds them
// cached and queries the database less.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/herdkit/herd"
	"github.com/redis/go-redis/v9"
)

// User is what the "database" returns.
type User struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
}

// db is a slow database of users, counting its queries.
type db struct {
	queries atomic.Int64
	mu      sync.Mutex
	users   map[int]User
}

func (d *db) loadUser(ctx context.Context, id int) (User, error) {
	d.queries.Add(1)
	select {
	case <-time.After(80 * time.Millisecond):
	case <-ctx.Done():
		return User{}, ctx.Err()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	u, ok := d.users[id]
	if !ok {
		return User{}, fmt.Errorf("user %d: %w", id, herd.ErrNotFound) // cached as a negative entry
	}
	return u, nil
}

func (d *db) updateUser(_ context.Context, u User) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.users[u.ID] = u
	return nil
}

func main() {
	redisAddr := flag.String("redis", "", "Redis address (default: an embedded Redis)")
	flag.Parse()
	if *redisAddr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			log.Fatal(err)
		}
		mr.ClockTTL(true) // keys expire in real time, as in Redis
		defer mr.Close()
		*redisAddr = mr.Addr()
	}
	rdb := redis.NewClient(&redis.Options{
		Addr: *redisAddr,
		// Fail fast when Redis is gone (the README's settings): herd then
		// loads locally, and its breaker stops asking Redis.
		DialTimeout: 250 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
		MaxRetries: -1, DialerRetries: 1,
	})
	defer rdb.Close()

	cache := herd.New(rdb, &herd.Options{
		StaleFor:    time.Minute,      // serve a stale user at once while one refresh runs
		NegativeTTL: 30 * time.Second, // remember "no such user"
	})
	defer cache.Close()
	database := &db{users: map[int]User{42: {ID: 42, Name: "Ada Lovelace"}}}
	ctx := context.Background()

	getUser := func(ctx context.Context, id int) (User, herd.Outcome, error) {
		var how herd.Outcome
		u, err := herd.Fetch(herd.WithOutcome(ctx, &how), cache, fmt.Sprintf("user:%d", id), 5*time.Minute,
			func(ctx context.Context) (User, error) { return database.loadUser(ctx, id) })
		return u, how, err
	}

	// 100 concurrent requests for a cold user: one query.
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			if _, _, err := getUser(ctx, 42); err != nil {
				log.Print(err)
			}
		})
	}
	wg.Wait()
	fmt.Printf("100 concurrent Fetch of user 42: %d database query\n", database.queries.Load())

	u, how, err := getUser(ctx, 42)
	fmt.Printf("again: %+v (%v, err %v)\n", u, how, err)

	for range 2 {
		_, how, err = getUser(ctx, 7)
		fmt.Printf("user 7: %v (%v, ErrNotFound: %v)\n", err, how, errors.Is(err, herd.ErrNotFound))
	}

	// A write: update the source, then Set (or Invalidate) the key. Both
	// advance the key's fence, so a rebuild that read the old row before
	// the write cannot store it afterwards. SetValue encodes with the
	// Cache's codec, the one Fetch decodes with.
	renamed := User{ID: 42, Name: "Augusta Ada King"}
	if err := database.updateUser(ctx, renamed); err != nil {
		log.Fatal(err)
	}
	if err := herd.SetValue(ctx, cache, "user:42", renamed, 5*time.Minute); err != nil {
		log.Fatal(err)
	}
	u, how, _ = getUser(ctx, 42)
	fmt.Printf("after the update and Set: %+v (%v)\n", u, how)

	// Or update the source and Invalidate: the next Fetch reads the new row.
	renamed.Name = "Countess of Lovelace"
	if err := database.updateUser(ctx, renamed); err != nil {
		log.Fatal(err)
	}
	if err := cache.Invalidate(ctx, "user:42"); err != nil {
		log.Fatal(err)
	}
	u, how, _ = getUser(ctx, 42)
	fmt.Printf("after the update and Invalidate: %+v (%v)\n", u, how)
	fmt.Printf("database queries in all: %d\n", database.queries.Load())
}
