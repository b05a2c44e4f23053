package herd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/herdkit/herd"
	"github.com/redis/go-redis/v9"
)

// Ten concurrent callers miss the same key; the loader runs once.
func ExampleCache_Get() {
	mr, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	c := herd.New(rdb, nil)
	defer c.Close()

	var loads atomic.Int32
	load := func(ctx context.Context) ([]byte, error) {
		loads.Add(1)
		time.Sleep(20 * time.Millisecond) // a slow database query
		return []byte("Ada Lovelace"), nil
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if _, err := c.Get(context.Background(), "user:42", time.Minute, load); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	v, _ := c.Get(context.Background(), "user:42", time.Minute, load)
	fmt.Printf("%s, loaded %d time(s)\n", v, loads.Load())
	// Output: Ada Lovelace, loaded 1 time(s)
}

// Fetch caches typed values (JSON by default); ErrNotFound is cached too.
func ExampleFetch() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	c := herd.New(rdb, nil)
	defer c.Close()

	type User struct{ Name string }
	users := map[int]User{42: {"Ada"}}
	loadUser := func(id int) func(context.Context) (User, error) {
		return func(context.Context) (User, error) {
			u, ok := users[id]
			if !ok {
				return User{}, herd.ErrNotFound
			}
			return u, nil
		}
	}
	u, err := herd.Fetch(context.Background(), c, "user:42", time.Minute, loadUser(42))
	fmt.Println(u.Name, err)
	_, err = herd.Fetch(context.Background(), c, "user:7", time.Minute, loadUser(7))
	fmt.Println(errors.Is(err, herd.ErrNotFound))
	// Output:
	// Ada <nil>
	// true
}

// A job that must not run on two instances at once.
func ExampleLocker_TryAcquire() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	locker := herd.NewLocker(rdb, nil)
	defer locker.Close()

	ctx := context.Background()
	lease, err := locker.TryAcquire(ctx, "nightly-report", 30*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	lease.KeepAlive(10 * time.Minute)                                 // renew until Release; 10 minutes caps the whole holding (not an interval)
	_, err = locker.TryAcquire(ctx, "nightly-report", 30*time.Second) // a second instance
	fmt.Println(errors.Is(err, herd.ErrLeaseHeld))
	fmt.Println(lease.Release(ctx))
	// Output:
	// true
	// <nil>
}

// Values tagged with the team they belong to; one purge of the tag
// invalidates them all, in every process.
func ExampleCache_InvalidateTag() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	c := herd.New(rdb, nil)
	defer c.Close()
	ctx := context.Background()

	loads := 0
	loadUser := func(name string) herd.LoadFunc {
		return func(ctx context.Context) ([]byte, error) {
			loads++
			if err := herd.SetTags(ctx, "team:7"); err != nil {
				return nil, err
			}
			return []byte(name), nil
		}
	}
	c.Get(ctx, "user:1", time.Minute, loadUser("Ada"))
	c.Get(ctx, "user:2", time.Minute, loadUser("Grace"))
	c.Set(ctx, "team:7:name", []byte("Analytical Engines"), time.Minute, "team:7")

	if err := c.InvalidateTag(ctx, "team:7"); err != nil {
		fmt.Println(err)
	}
	c.Get(ctx, "user:1", time.Minute, loadUser("Ada"))
	_, err := c.Get(ctx, "team:7:name", time.Minute, func(context.Context) ([]byte, error) {
		return nil, herd.ErrNotFound
	})
	fmt.Printf("loads: %d; team name: %v\n", loads, err)
	// Output: loads: 3; team name: herd: not found
}

// A loader failure is a *LoadError in every process; in the loader's own
// process it unwraps to the loader's error.
func ExampleLoadError() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	c := herd.New(rdb, &herd.Options{RetryFailedLoad: true}) // waiters elsewhere retry once
	defer c.Close()

	errDB := errors.New("db: connection reset")
	_, err := c.Get(context.Background(), "user:404", time.Minute, func(context.Context) ([]byte, error) {
		return nil, errDB
	})
	var le *herd.LoadError
	if errors.As(err, &le) {
		fmt.Println(err)
		fmt.Println(le.Key, le.Remote, errors.Is(err, errDB), errors.Is(err, herd.ErrLoadFailed))
	}
	// Output:
	// herd: load failed: "user:404": db: connection reset
	// user:404 false true true
}

// WithOutcome tells how each call was served: the first Get loads the
// value (leader), the second is a hit. One Outcome variable per call;
// callers of one flight in a process share its outcome.
func ExampleWithOutcome() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	c := herd.New(rdb, nil)
	defer c.Close()

	load := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	for range 2 {
		var o herd.Outcome
		if _, err := c.Get(herd.WithOutcome(context.Background(), &o), "k", time.Minute, load); err != nil {
			fmt.Println(err)
		}
		fmt.Println(o)
	}
	// Output:
	// leader
	// hit
}
