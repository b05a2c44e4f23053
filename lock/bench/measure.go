package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdkit/herd"
)

// result is one backend's figures.
type result struct {
	name       string
	tryAcquire []time.Duration // uncontended TryAcquire of a free key
	release    []time.Duration // Release of that lease
	handoff    []time.Duration // holder's Release starts → the waiter's Acquire (another Lock) returns
	contended  float64         // acquisitions per second, cfg.workers goroutines on two Locks, one key
	acquired   int64           // acquisitions counted in the contended phase
	err        error           // the backend could not be measured (or not to the end)
}

// phase runs step until n steps are done (n > 0) or d has passed,
// stopping at the first error.
func phase(ctx context.Context, n int, d time.Duration, step func() error) error {
	end := time.Now().Add(d)
	for i := 0; n > 0 && i < n || n <= 0 && time.Now().Before(end); i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// measure runs every phase on one deployment.
func measure(ctx context.Context, name string, dep *deployment, cfg config) (res result) {
	res.name = name
	a, closeA, err := dep.open()
	if err != nil {
		res.err = err
		return res
	}
	defer func() { res.err = errors.Join(res.err, closeA()) }()
	b, closeB, err := dep.open()
	if err != nil {
		res.err = err
		return res
	}
	defer func() { res.err = errors.Join(res.err, closeB()) }()
	base := "lockbench:" + randHex()
	ttl := cfg.ttl

	// Warm-up, not counted: connections, scripts loaded, a waiter's
	// listening connection opened. Its first acquire dials every server;
	// on a busy machine a Redlock round that dials five masters can take
	// longer than its node timeout (a tenth of the lease), so the warm-up
	// tries again, up to five times, while no quorum answered.
	for range 5 {
		if err = uncontended(ctx, a, base+":warm", ttl, nil, nil); !errors.Is(err, herd.ErrNoQuorum) {
			break
		}
	}
	if err != nil {
		res.err = fmt.Errorf("warm-up: %w", err)
		return res
	}
	if _, err := handoff(ctx, a, b, base+":warm", ttl, cfg.settle); err != nil {
		res.err = fmt.Errorf("warm-up handoff: %w", err)
		return res
	}

	key := base + ":free"
	if err := phase(ctx, cfg.n, cfg.duration, func() error {
		return uncontended(ctx, a, key, ttl, &res.tryAcquire, &res.release)
	}); err != nil {
		res.err = fmt.Errorf("uncontended: %w", err)
		return res
	}
	key = base + ":handoff"
	if err := phase(ctx, cfg.n, cfg.duration, func() error {
		d, err := handoff(ctx, a, b, key, ttl, cfg.settle)
		res.handoff = append(res.handoff, d)
		return err
	}); err != nil {
		res.err = fmt.Errorf("handoff: %w", err)
		return res
	}
	if cfg.contend > 0 {
		res.acquired, res.contended, err = contended(ctx, []herd.Lock[herd.LeaseHandle]{a, b}, base+":contended", ttl, cfg)
		if err != nil {
			res.err = fmt.Errorf("contended: %w", err)
		}
	}
	return res
}

// uncontended takes a free key and gives it back, timing both calls.
func uncontended(ctx context.Context, l herd.Lock[herd.LeaseHandle], key string, ttl time.Duration, acq, rel *[]time.Duration) error {
	start := time.Now()
	lease, err := l.TryAcquire(ctx, key, ttl)
	took := time.Since(start)
	if err != nil {
		return err
	}
	start = time.Now()
	err = lease.Release(ctx)
	released := time.Since(start)
	if err != nil {
		return err
	}
	if acq != nil {
		*acq = append(*acq, took)
		*rel = append(*rel, released)
	}
	return nil
}

// handoff lets holder take key, starts an Acquire of it on waiter, gives
// the waiter settle to be blocked (subscribed, listening), then releases:
// the figure is from the start of that Release to the return of the
// waiter's Acquire.
func handoff(ctx context.Context, holder, waiter herd.Lock[herd.LeaseHandle], key string, ttl, settle time.Duration) (time.Duration, error) {
	held, err := holder.TryAcquire(ctx, key, ttl)
	if err != nil {
		return 0, err
	}
	type got struct {
		lease herd.LeaseHandle
		at    time.Time
		err   error
	}
	done := make(chan got, 1)
	wctx, cancel := context.WithTimeout(ctx, ttl) // a waiter never woken fails the run, it does not hang it
	defer cancel()
	go func() {
		l, err := waiter.Acquire(wctx, key, ttl)
		done <- got{l, time.Now(), err}
	}()
	timer := time.NewTimer(settle)
	select {
	case <-timer.C:
	case g := <-done:
		timer.Stop()
		_ = held.Release(ctx)
		if g.err == nil {
			_ = g.lease.Release(ctx)
			return 0, fmt.Errorf("the waiter took %q while it was held", key)
		}
		return 0, g.err
	}
	start := time.Now()
	if err := held.Release(ctx); err != nil {
		cancel()
		<-done
		return 0, err
	}
	g := <-done
	if g.err != nil {
		return 0, g.err
	}
	return g.at.Sub(start), g.lease.Release(ctx)
}

// contended runs cfg.workers goroutines, spread over locks, each taking
// key with Acquire and releasing it at once, until cfg.n acquisitions in
// all (n > 0) or cfg.contend has passed; it returns the acquisitions and
// their rate.
func contended(ctx context.Context, locks []herd.Lock[herd.LeaseHandle], key string, ttl time.Duration, cfg config) (int64, float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var count atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	stopAt := time.Now().Add(cfg.contend)
	start := time.Now()
	for w := range cfg.workers {
		l := locks[w%len(locks)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if cfg.n > 0 && count.Load() >= int64(cfg.n) || cfg.n <= 0 && !time.Now().Before(stopAt) || ctx.Err() != nil {
					return
				}
				lease, err := l.Acquire(ctx, key, ttl)
				if err == nil {
					err = lease.Release(context.WithoutCancel(ctx))
				}
				if err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
						cancel()
					}
					return
				}
				count.Add(1)
			}
		}()
	}
	wg.Wait()
	n := count.Load()
	return n, float64(n) / time.Since(start).Seconds(), first
}

// percentile returns the p-th percentile (0 < p ≤ 100) of ds, nearest
// rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func randHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
