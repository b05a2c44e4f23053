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

// A nightly job that three instances try on every tick: it runs once a
// day, and a failed run is retried at the next tick.
func ExampleJob_Run() {
	mr, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	locker := herd.NewLocker(rdb, nil)
	defer locker.Close()

	now := time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)
	job := &herd.Job{
		Name: "nightly-report", Period: 24 * time.Hour,
		Lock: herd.AnyLock(locker), Done: herd.NewFencedStore(rdb, ""),
		Now: func() time.Time { return now }, // a fixed clock for the example; default time.Now
	}
	attempts := 0
	report := func(ctx context.Context, lease herd.LeaseHandle) error {
		attempts++
		if attempts == 1 {
			return errors.New("database busy")
		}
		return nil // the report, written with lease.Token()
	}
	for _, instance := range []string{"a", "b", "c"} {
		ran, err := job.Run(context.Background(), report)
		fmt.Println(instance, ran, err)
	}
	now = now.Add(24 * time.Hour) // the next night
	ran, err := job.Run(context.Background(), report)
	fmt.Println("next day:", ran, err)
	// Output:
	// a true herd: job "nightly-report": database busy
	// b true <nil>
	// c false <nil>
	// next day: true <nil>
}
