// Command lease runs a "nightly job" from three instances at once: herd's
// Locker lets one run it, and the job writes its result through a
// FencedStore, so that an instance that paused past its lease (a GC pause,
// a frozen VM) cannot overwrite the work of the instance that took over.
// The lock stops runs that overlap, not repeated ones: instances whose
// ticks come a little apart each take the free lock in turn. For a job
// that must run once per period, use herd.RunJob or herd.Job (README, "The
// short lease on its own").
//
//	go run ./examples/lease                 # embedded Redis
//	go run ./examples/lease -redis 127.0.0.1:6379
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/herdkit/herd"
	"github.com/redis/go-redis/v9"
)

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
	locker := herd.NewLocker(rdb, nil)
	defer locker.Close()
	results := herd.NewFencedStore(rdb, "")
	ctx := context.Background()

	// Three instances start the job at the same moment: one runs it. The
	// job is written against herd.Lock, so another backend (Redlock, or
	// github.com/herdkit/herd/lock/postgres) changes only the constructor.
	jobLocks := herd.AnyLock(locker)
	var wg sync.WaitGroup
	for i := 1; i <= 3; i++ {
		wg.Go(func() { nightlyJob(ctx, jobLocks, results, i) })
	}
	wg.Wait()

	// Fencing: A takes a lease and stalls past it; B takes over and writes;
	// A wakes up and tries to write its stale result.
	a, err := locker.TryAcquire(ctx, "rebuild-index", 300*time.Millisecond)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\nA holds token %d, then stalls for longer than its 300ms lease\n", a.Token())
	b, err := locker.Acquire(ctx, "rebuild-index", 300*time.Millisecond) // waits for A's lease to run out
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("B takes over with token %d and writes: %v\n", b.Token(),
		results.Set(ctx, "index", b.Token(), []byte("index by B"), 0))
	b.Release(ctx)
	err = results.Set(ctx, "index", a.Token(), []byte("index by A"), 0)
	fmt.Printf("A wakes up and writes with token %d: %v (ErrFenced: %v)\n", a.Token(), err, errors.Is(err, herd.ErrFenced))
	fmt.Printf("A releases: %v\n", a.Release(ctx))
	v, tok, _ := results.Get(ctx, "index")
	fmt.Printf("the index is %q, written with token %d\n", v, tok)
}

// nightlyJob is one instance's run of the job: it takes the lock or leaves
// it to the instance that has it, and writes its result with its fencing
// token.
func nightlyJob(ctx context.Context, locks herd.Lock[herd.LeaseHandle], results *herd.FencedStore, i int) {
	lease, err := locks.TryAcquire(ctx, "nightly-report", 2*time.Second)
	if errors.Is(err, herd.ErrLeaseHeld) {
		fmt.Printf("instance %d: another instance runs the job\n", i)
		return
	}
	if err != nil {
		log.Print(err)
		return
	}
	defer lease.Release(context.WithoutCancel(ctx))
	lease.KeepAlive(time.Minute) // renew until Release; a minute caps the whole holding (not an interval)
	fmt.Printf("instance %d: running the job with fencing token %d\n", i, lease.Token())
	time.Sleep(300 * time.Millisecond) // the work
	select {
	case <-lease.Lost():
		fmt.Printf("instance %d: lease lost, abandoning\n", i)
	default:
		err := results.Set(ctx, "nightly-report", lease.Token(), []byte(fmt.Sprintf("report by instance %d", i)), 0)
		fmt.Printf("instance %d: result written: %v\n", i, err)
	}
}
