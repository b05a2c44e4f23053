package herd

import (
	"context"
	"errors"
	"math"
	"time"
)

// Freshness: stale-while-revalidate, stale-if-error and probabilistic
// early refresh. A stale hit (within Options.StaleFor after the fresh
// period) returns at once and starts one background refresh; a fresh hit
// may start an early one (XFetch, Options.EarlyRefresh). Either way the
// refresh runs under the key's lease, in refresh mode: it does not start
// if another process already replaced the envelope this process saw, or
// while failed refreshes back off. So every process may try, and exactly
// one refresh per expiry reaches the source.

const (
	OutcomeUnknown      Outcome = iota // the call failed before the cache decided
	OutcomeHit                         // a fresh value from Redis
	OutcomeStale                       // a stale value within StaleFor or after InvalidateSoft; a refresh started (not by Peek)
	OutcomeEarlyRefresh                // a fresh value; an early refresh started (XFetch)
	OutcomeNegative                    // a remembered ErrNotFound
	OutcomeLeader                      // this process rebuilt the value
	OutcomeFollower                    // waited for another process's rebuild
	OutcomeFallback                    // loaded locally: wait budget spent, or Redis unreachable
	OutcomePass                        // Begin found a pass mark (Fill.Pass): the caller builds its own value
)

// xfetchDue reports whether a fresh envelope should be refreshed early:
// now − Δ·β·ln(u) ≥ expiry with u uniform in (0, 1], Δ the rebuild time
// recorded in the envelope (so every process knows it, even one that never
// rebuilt the key) and β = Options.EarlyRefresh (Vattani, Chierichetti and
// Lowenstein, "Optimal Probabilistic Cache Stampede Prevention", VLDB
// 2015). The probability at time t before expiry is exp(−t/(βΔ)).
func (c *Cache) xfetchDue(env envelope, now time.Time) bool {
	beta := c.cfg.EarlyRefresh
	if beta <= 0 || env.Delta <= 0 || env.Negative {
		return false
	}
	u := 1 - c.rand() // in (0, 1]
	gap := -float64(env.Delta) * beta * math.Log(u)
	return float64(env.SoftExp.Sub(now)) <= gap
}

// refreshAsync starts one background refresh of f's key, unless one is
// already running in this process or the pool of MaxRefreshes is full
// (then it is dropped and counted: the next stale hit tries again).
func (c *Cache) refreshAsync(f *flight, seen envelope) {
	if f.refresh == nil && f.prepare == nil {
		return // Begin without a refresh function
	}
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	if _, busy := c.refreshing[f.key]; busy {
		return
	}
	if until, ok := c.backingOff[f.key]; ok {
		if time.Now().Before(until) {
			return // refreshes of this key back off: no need to ask Redis again
		}
		delete(c.backingOff, f.key)
	}
	select {
	case c.refreshSem <- struct{}{}:
	default:
		c.stats.refreshesDropped.Add(1)
		c.sig.refresh(f.key, RefreshDropped)
		return
	}
	done, ok := c.track()
	if !ok {
		<-c.refreshSem
		return
	}
	c.refreshing[f.key] = struct{}{}
	load := f.refresh
	if f.prepare != nil {
		// Begin's caller captures what the refresh needs from it now,
		// while it is still waiting in Begin (an HTTP request's state).
		// nil: the caller has left; there is nothing safe to capture.
		if load = f.prepare(); load == nil {
			delete(c.refreshing, f.key)
			<-c.refreshSem
			done()
			return
		}
	}
	rf := &flight{c: c, key: f.key, keys: f.keys, ttl: f.ttl, load: load, refresh: load}
	fence := (&envelope{Fence: seen.Fence}).Encode()[2:10]
	go func() {
		defer func() {
			c.refreshMu.Lock()
			delete(c.refreshing, rf.key)
			c.refreshMu.Unlock()
			<-c.refreshSem
			done()
		}()
		c.refresh(rf, fence)
	}()
}

// refresh rebuilds a key whose stale or early value is being served, if
// this process wins its lease.
func (c *Cache) refresh(f *flight, seenFence []byte) {
	if !c.brk.allow() {
		return
	}
	gr := c.newGenRead()
	r, err := c.locker.attempt(c.ctx, f.key, f.keys, c.leaseFor(f.key), modeRefresh, seenFence, awaiting{}, gr.side())
	if err != nil {
		// This call may be the breaker's probe: every outcome reports to
		// the breaker, or no other call would reach Redis again.
		switch {
		case errors.Is(err, ErrLeaseHeld):
			c.redisAnswered()
		case errors.Is(err, context.Canceled):
			c.brk.probeDone() // Close, not Redis: no verdict
		case isInfraError(err):
			c.redisFailed(err)
		default:
			c.redisAnswered() // an error reply (a foreign value, say): Redis answered
		}
		return
	}
	c.redisAnswered()
	if r.lease == nil {
		c.sig.refresh(f.key, RefreshSkipped) // refreshed elsewhere already, or backing off
		if r.backoff && r.pttl > 0 {
			c.refreshMu.Lock()
			if len(c.backingOff) >= 10000 {
				clear(c.backingOff) // a bound; forgetting only costs a round trip
			}
			c.backingOff[f.key] = time.Now().Add(r.pttl)
			c.refreshMu.Unlock()
		}
		return
	}
	f.gen = c.genResult(gr) // before the load begins
	c.stats.refreshes.Add(1)
	c.sig.refresh(f.key, RefreshStarted)
	_, _ = c.lead(f, r.lease, true)
}
