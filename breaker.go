package herd

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// breaker is the Cache's circuit breaker on Redis. After threshold
// consecutive infrastructure errors it opens: flights skip Redis for
// cooldown, then one flight probes; its success (any answer from Redis,
// an error reply included) closes the breaker, its failure opens it for
// another cooldown. A probe that reports neither within a cooldown is
// presumed lost and the next call probes instead, so the breaker cannot
// stay shut because one probe's path forgot to report.
type breaker struct {
	threshold int
	cooldown  time.Duration

	// troubled is set while there are failures to count or a probe runs,
	// so that the hit path (allow and success with nothing to record)
	// reads one atomic instead of taking the mutex.
	troubled atomic.Bool

	mu         sync.Mutex
	fails      int
	openUntil  time.Time
	probing    bool
	probeUntil time.Time // while probing: when the probe is presumed lost
}

// errBreakerOpen is the cause reported while the breaker is open.
var errBreakerOpen = errors.New("herd: circuit breaker open after repeated Redis errors")

// allow reports whether a flight may call Redis now.
func (b *breaker) allow() bool {
	if !b.troubled.Load() {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fails < b.threshold {
		return true
	}
	now := time.Now()
	if b.probing && now.Before(b.probeUntil) || now.Before(b.openUntil) {
		return false
	}
	b.probing = true // this flight is the probe
	b.probeUntil = now.Add(b.cooldown)
	return true
}

// probeDone ends a probe that got no verdict (its call was cancelled
// before Redis answered): the next call after the cooldown probes again.
func (b *breaker) probeDone() {
	if !b.troubled.Load() {
		return
	}
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

// success records an answer from Redis and reports whether it closed an
// open breaker.
func (b *breaker) success() (closed bool) {
	if !b.troubled.Load() {
		return false
	}
	b.mu.Lock()
	closed = b.fails >= b.threshold
	b.fails, b.probing = 0, false
	b.troubled.Store(false)
	b.mu.Unlock()
	return closed
}

// failure records an infrastructure error and reports whether it opened
// the breaker.
func (b *breaker) failure() (opened bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.troubled.Store(true)
	b.fails++
	if b.probing || b.fails == b.threshold {
		b.openUntil = time.Now().Add(b.cooldown)
		opened = !b.probing
	}
	b.probing = false
	return opened
}

// redisFailed records an infrastructure error with the breaker.
func (c *Cache) redisFailed(err error) {
	if !isInfraError(err) {
		return
	}
	if c.brk.failure() {
		c.stats.breakerOpens.Add(1)
		c.sig.circuit(true)
		c.log(slog.LevelWarn, "herd: circuit breaker opened: loading locally until Redis answers again", "err", err)
	}
}

// redisAnswered records an answer from Redis with the breaker.
func (c *Cache) redisAnswered() {
	if c.brk.success() {
		c.sig.circuit(false)
		c.log(slog.LevelInfo, "herd: circuit breaker closed: Redis answers again")
	}
}
