package herd_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/herdkit/herd"
	"github.com/redis/go-redis/v9"
)

// A Redlock over three independent masters: a second owner is refused
// while the first holds the lock, and the next holder's fencing token is
// higher.
func ExampleRedlock() {
	var masters []redis.UniversalClient
	for range 3 {
		mr, _ := miniredis.Run() // embedded Redis; use your own masters in production
		defer mr.Close()
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		defer rdb.Close()
		masters = append(masters, rdb)
	}
	rl := herd.NewRedlock(masters, nil)
	defer rl.Close()
	ctx := context.Background()

	first, err := rl.TryAcquire(ctx, "nightly-report", 30*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = rl.TryAcquire(ctx, "nightly-report", 30*time.Second)
	fmt.Println("second owner refused:", errors.Is(err, herd.ErrLeaseHeld))

	_ = first.Release(ctx)
	next, err := rl.Acquire(ctx, "nightly-report", 30*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer next.Release(ctx)
	fmt.Println("quorum:", rl.Quorum(), "token increased:", next.Token() > first.Token())
	// Output:
	// second owner refused: true
	// quorum: 2 token increased: true
}
