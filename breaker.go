package herd

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
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

// infraCodes are the error codes of replies that mean the server cannot
// serve right now.
var infraCodes = []string{"LOADING", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "BUSY"}

// scriptErrorPrefix starts the reply of a script whose redis.call failed,
// before Redis 7.0: "ERR Error running script (call to f_<sha>):
// @user_script:12: @user_script: 12: -READONLY You can't write against a
// read only replica." Redis 7.0 replies with the command's own code first
// ("READONLY You can't write ... script: <sha>, on @user_script:12.").
const scriptErrorPrefix = "ERR Error running script"

// isInfraError tells an unreachable or unhealthy Redis from an answer:
// redis.Nil and ordinary error replies (WRONGTYPE, a script error) are
// answers; network errors, timeouts and replies that mean the server
// cannot serve right now are infrastructure errors, also when a script's
// command got them and Redis before 7.0 wrapped them in an ERR.
func isInfraError(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false // our own Close, not Redis
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		if strings.HasPrefix(msg, scriptErrorPrefix) {
			// The command's reply follows the last location, with or
			// without its "-".
			if i := strings.LastIndex(msg, ": "); i >= 0 {
				msg = strings.TrimPrefix(msg[i+2:], "-")
			}
		}
		for _, p := range infraCodes {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	return true
}
