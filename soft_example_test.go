package herd_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/herdkit/herd"
	"github.com/redis/go-redis/v9"
)

// After InvalidateSoft, a Get returns the old value at once, marked
// stale, while one background refresh rebuilds it.
func ExampleCache_InvalidateSoft() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	c := herd.New(rdb, nil)
	defer c.Close()
	ctx := context.Background()

	price := "9.99"
	rebuilt := make(chan struct{})
	load := func(context.Context) ([]byte, error) {
		if price == "12.50" {
			defer close(rebuilt)
		}
		return []byte(price), nil
	}
	v, _ := c.Get(ctx, "price:7", time.Hour, load)
	fmt.Printf("cached: %s\n", v)

	price = "12.50" // the source changes
	if err := c.InvalidateSoft(ctx, "price:7"); err != nil {
		fmt.Println(err)
	}
	var o herd.Outcome
	v, _ = c.Get(herd.WithOutcome(ctx, &o), "price:7", time.Hour, load)
	fmt.Printf("at once: %s (%v)\n", v, o)

	<-rebuilt
	for {
		v, _ = c.Get(herd.WithOutcome(ctx, &o), "price:7", time.Hour, load)
		if o == herd.OutcomeHit {
			break
		}
		time.Sleep(time.Millisecond) // the refresh is committing
	}
	fmt.Printf("rebuilt: %s (%v)\n", v, o)
	// Output:
	// cached: 9.99
	// at once: 9.99 (stale)
	// rebuilt: 12.50 (hit)
}

// Peek reads a key without a loader: it never starts a rebuild.
func ExampleCache_Peek() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	c := herd.New(rdb, nil)
	defer c.Close()
	ctx := context.Background()

	_, found, err := c.Peek(ctx, "user:42")
	fmt.Println(found, err)

	_ = c.Set(ctx, "user:42", []byte("Ada"), time.Minute)
	var o herd.Outcome
	v, found, err := c.Peek(herd.WithOutcome(ctx, &o), "user:42")
	fmt.Printf("%s %v %v %v\n", v, found, err, o)
	// Output:
	// false <nil>
	// Ada true <nil> hit
}
