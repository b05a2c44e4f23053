package herd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// envNow is a fixed clock for a worker's Job, in Unix nanoseconds.
const envNow = "HERD_TEST_NOW"

func init() {
	workerRoles["job-ticker"] = jobTickerWorker
	workerRoles["job-paused"] = jobPausedWorker
}

// jobPeriod and jobTick are the ticker workers' period and tick: each
// instance calls Run ten times a period, the instances a third of a tick
// apart.
const (
	jobPeriod = time.Second
	jobTick   = 100 * time.Millisecond
)

// TestJobOncePerPeriodAcrossProcesses: 3 OS processes tick every 100 ms,
// staggered by a third of a tick, and call Job.Run for a job with a 1 s
// period whose run takes 150 ms. Until 5 periods have been run, every
// period that ran ran exactly once in the fleet. (With TryAcquire and a
// deferred Release alone, each period would run about 15 times.)
func TestJobOncePerPeriodAcrossProcesses(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	const procs, periods = 3, 5
	key := "jobs-" + strconv.FormatInt(time.Now().UnixNano(), 36)

	p := startWorkers(t, procs, "job-ticker", envAddr+"="+srv.Addr(), envKey+"="+key, envDuration+"=60s")
	waitFor(t, 90*time.Second, fmt.Sprintf("%d periods run", periods), func() bool {
		n, _ := rdb.HLen(ctx, key+":runs").Result()
		return n >= periods
	})
	if err := rdb.Set(ctx, key+":stop", "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	p.wait(time.Minute)

	runs, err := rdb.HGetAll(ctx, key+":runs").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) < periods {
		t.Fatalf("%d periods run, want at least %d", len(runs), periods)
	}
	for start, n := range runs {
		if n != "1" {
			t.Errorf("period starting %s ran %s times, want 1", start, n)
		}
	}
	ticks, _ := rdb.Get(ctx, key+":ticks").Int()
	by, _ := rdb.HGetAll(ctx, key+":by").Result()
	t.Logf("%d periods; %d calls of Run in all; runs by instance %v", len(runs), ticks, by)
	if ticks < 2*procs*len(runs) {
		t.Errorf("only %d calls of Run for %d periods: the instances hardly contended", ticks, len(runs))
	}
}

// jobTickerWorker calls Job.Run on every tick until the test sets
// envKey:stop or envDuration passes. Its job counts its run of each period
// (by the period's start) and which instance ran it, then works 150 ms.
func jobTickerWorker(ctx context.Context, _ string) error {
	key := os.Getenv(envKey)
	d, err := time.ParseDuration(os.Getenv(envDuration))
	if err != nil {
		return err
	}
	inst, _ := strconv.Atoi(os.Getenv(envInstance))
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envAddr)})
	defer rdb.Close()
	locker := NewLocker(rdb, nil)
	defer locker.Close()
	locks, done := AnyLock(locker), NewFencedStore(rdb, "")

	time.Sleep(time.Duration(inst) * jobTick / 3)
	tick := time.NewTicker(jobTick)
	defer tick.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); <-tick.C {
		if n, _ := rdb.Exists(ctx, key+":stop").Result(); n > 0 {
			return nil
		}
		now := time.Now()
		start := now.Truncate(jobPeriod)
		j := Job{Name: key, Period: jobPeriod, Lock: locks, Done: done, Lease: 2 * time.Second,
			Now: func() time.Time { return now }}
		rdb.Incr(ctx, key+":ticks")
		_, err := j.Run(ctx, func(ctx context.Context, lease LeaseHandle) error {
			pipe := rdb.TxPipeline()
			pipe.HIncrBy(ctx, key+":runs", strconv.FormatInt(start.UnixNano(), 10), 1)
			pipe.HIncrBy(ctx, key+":by", strconv.Itoa(inst), 1)
			if _, err := pipe.Exec(ctx); err != nil {
				return err
			}
			work := time.NewTimer(150 * time.Millisecond)
			defer work.Stop()
			select {
			case <-work.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// TestJobPausedHolderFencedAcrossProcesses: holder A, an OS process, runs
// the job and is SIGSTOPped in it (a GC pause, a frozen VM) past its
// 500 ms lease. B takes the lock, finds the period not done, runs the job
// and records the period. A resumes, finishes the job as a holder that
// ignores its ctx would, and records: its record is refused with
// ErrFenced. The period is recorded once, by B's token.
func TestJobPausedHolderFencedAcrossProcesses(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	key := "paused-job-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

	p := startWorkers(t, 1, "job-paused", envAddr+"="+srv.Addr(), envKey+"="+key,
		envNow+"="+strconv.FormatInt(now.UnixNano(), 10))
	var tokenA uint64
	waitFor(t, 30*time.Second, "A to run the job", func() bool {
		tokenA, _ = rdb.Get(ctx, key+":token").Uint64()
		return tokenA != 0
	})
	pid := p.pids()[0]
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}()

	locker := NewLocker(rdb, nil)
	defer locker.Close()
	done := NewFencedStore(rdb, "")
	b := &Job{Name: key, Period: time.Hour, Lock: AnyLock(locker), Done: done, Lease: 500 * time.Millisecond,
		Now: func() time.Time { return now }}
	var tokenB uint64
	ran, err := runUntilRan(b, func(_ context.Context, lease LeaseHandle) error { // A's lease runs out first
		tokenB = lease.Token()
		return nil
	})
	if !ran || err != nil {
		t.Fatalf("B: ran %v, err %v; want it run", ran, err)
	}
	if tokenB <= tokenA {
		t.Fatalf("B's token %d is not above A's %d", tokenB, tokenA)
	}
	if err := rdb.RPush(ctx, key+":wake", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	p.wait(time.Minute) // the worker fails unless its record was fenced

	val, tok, err := done.Get(ctx, key+":done")
	if want := strconv.FormatInt(now.Truncate(time.Hour).UnixNano(), 10); err != nil || tok != tokenB || string(val) != want {
		t.Errorf("record %q token %d (%v), want %q by B's token %d", val, tok, err, want, tokenB)
	}
	if late, _ := rdb.Get(ctx, key+":late").Result(); !strings.Contains(late, ErrFenced.Error()) {
		t.Errorf("A's record: %q, want it fenced", late)
	}
	if ran, err := b.Run(ctx, func(context.Context, LeaseHandle) error { return nil }); ran || err != nil {
		t.Errorf("a third run: ran %v, err %v; want the period done", ran, err)
	}
}

// jobPausedWorker runs the job with a 500 ms lease on the clock envNow.
// The job publishes its token and waits for envKey:wake, ignoring its ctx
// (the test SIGSTOPs the process meanwhile). It stores Run's error in
// envKey:late and fails unless the job ran and its record was fenced.
func jobPausedWorker(ctx context.Context, _ string) error {
	key := os.Getenv(envKey)
	ns, err := strconv.ParseInt(os.Getenv(envNow), 10, 64)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envAddr)})
	defer rdb.Close()
	locker := NewLocker(rdb, nil)
	defer locker.Close()
	j := &Job{Name: key, Period: time.Hour, Lock: AnyLock(locker), Done: NewFencedStore(rdb, ""),
		Lease: 500 * time.Millisecond, Now: func() time.Time { return time.Unix(0, ns) }}
	ran, err := j.Run(ctx, func(_ context.Context, lease LeaseHandle) error {
		if err := rdb.Set(ctx, key+":token", lease.Token(), time.Minute).Err(); err != nil {
			return err
		}
		return rdb.BLPop(ctx, time.Minute, key+":wake").Err()
	})
	late := "<nil>"
	if err != nil {
		late = err.Error()
	}
	if serr := rdb.Set(ctx, key+":late", late, time.Minute).Err(); serr != nil {
		return serr
	}
	if !ran || !errors.Is(err, ErrFenced) {
		return fmt.Errorf("ran %v, err %v; want the job run and its record fenced", ran, err)
	}
	return nil
}
