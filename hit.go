package herd

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// The hit path. A Get reads the key's value in its caller's goroutine,
// before any flight: a fresh value (or a fresh negative entry) is the
// answer, with no goroutine hand-off and no shared state but a few
// atomic counters. Everything else (a miss, a stale value, an early
// refresh, a pass mark, unreadable bytes, an unreachable Redis) goes to
// the key's flight, which takes the read's result instead of reading
// again when this caller starts it.
//
// Each caller sends its own GET, as a plain go-redis GET would: a reply
// that another caller asked for before this one started could predate a
// write that returned in between (read-your-writes, see currency), so
// hits are not shared. Coalescing starts at the miss.

// preRead is the result of a Get's own read, handed to the flight it
// starts.
type preRead struct {
	sent time.Time // when the GET was sent
	env  envelope
	ok   bool  // env is an intact envelope
	due  bool  // env is fresh and its early refresh was drawn due
	err  error // an infrastructure error, already recorded by the breaker
}

// hit reads key's value (at vkey) in the caller's goroutine. done reports
// that val, err are the caller's answer; otherwise pre is the read for
// the flight (nil: the flight reads itself).
func (c *Cache) hit(ctx context.Context, key, vkey string) (val []byte, done bool, pre *preRead, err error) {
	if c.brk.troubled.Load() {
		// The breaker decides who probes a troubled Redis: the flight asks.
		return nil, false, nil, nil
	}
	sent := time.Now()
	b, err := c.readHit(ctx, vkey) // the breaker has the GET's result
	switch {
	case err == nil:
	case ctx.Err() != nil:
		// The caller's own deadline or cancellation, not Redis.
		return nil, true, nil, ctx.Err()
	case errors.Is(err, ErrClosed) || c.ctx.Err() != nil:
		return nil, true, nil, ErrClosed
	case isInfraError(err):
		return nil, false, &preRead{sent: sent, err: err}, nil
	}
	if err != nil {
		return nil, false, &preRead{sent: sent}, nil // redis.Nil or a wrong-type reply: a miss
	}
	env, ok := decodeEnvelope(b)
	if !ok {
		c.countCorrupt(key, len(b))
		return nil, false, &preRead{sent: sent}, nil
	}
	o, fresh, due := c.freshHit(key, vkey, env)
	if !fresh {
		return nil, false, &preRead{sent: sent, env: env, ok: true, due: due}, nil
	}
	recordOutcome(ctx, o)
	if o == OutcomeNegative {
		return nil, true, nil, ErrNotFound
	}
	return env.payload, true, nil, nil
}

// freshHit reports whether env, read at vkey for key, answers the read as
// it is: a fresh value or negative entry (o says which), counted. A stale
// value, an early refresh due or a pass mark is for the flight; due
// reports the early refresh, which the flight takes as drawn here (set
// flight.early) instead of drawing again.
func (c *Cache) freshHit(key, vkey string, env envelope) (o Outcome, fresh, due bool) {
	now := c.now()
	live := now.Before(env.softExp)
	due = live && !env.pass && c.xfetchDue(env, now)
	if env.pass || !live || due {
		return OutcomeUnknown, false, due
	}
	c.calib.observeRebuild(vkey, key, c.cfg.classLabel, env.fence, env.delta)
	if env.negative {
		c.stats.negativeHits.Add(1)
		c.reportLookup(key, OutcomeNegative)
		return OutcomeNegative, true, false
	}
	c.stats.hits.Add(1)
	c.reportLookup(key, OutcomeHit)
	return OutcomeHit, true, false
}

// hitReply is a GET's reply, from the goroutine that sent it.
type hitReply struct {
	b   []byte
	err error
}

// readHit GETs vkey for a hit and records the result with the breaker.
// With a ctx that cannot end (Background, WithoutCancel) it sends the GET
// itself. Otherwise the GET runs in a goroutine of its own and the caller
// leaves as soon as ctx ends or Close begins (go-redis cannot give up a
// command it has sent, and its client timeouts may be long); Close waits
// for that GET. The hand-off costs a goroutine and two allocations, less
// than the round trip but two goroutine wake-ups. With
// [Options.InlineHits] the caller sends the GET itself, detached from
// ctx's end (its values kept): it then leaves at the client's timeouts.
func (c *Cache) readHit(ctx context.Context, vkey string) ([]byte, error) {
	if ctx.Done() == nil || c.cfg.InlineHits {
		if ctx.Done() != nil {
			ctx = context.WithoutCancel(ctx)
		}
		b, err := c.readValue(ctx, vkey)
		c.account(err)
		return b, err
	}
	h := hitCalls.Get().(*hitCall)
	h.c, h.vkey = c, vkey
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return nil, ErrClosed
	}
	c.wg.Add(1)
	c.mu.RUnlock()
	go h.run()
	select {
	case r := <-h.reply:
		h.c, h.vkey = nil, ""
		hitCalls.Put(h)
		return r.b, r.err
	case <-ctx.Done():
		return nil, ctx.Err() // h is left to the GC: its reply comes later
	case <-c.ctx.Done():
		return nil, ErrClosed // Close: likewise
	}
}

// hitCall is a GET handed to a goroutine of its own, pooled with its reply
// channel.
type hitCall struct {
	c     *Cache
	vkey  string
	reply chan hitReply
}

var hitCalls = sync.Pool{New: func() any { return &hitCall{reply: make(chan hitReply, 1)} }}

func (h *hitCall) run() {
	c := h.c
	defer c.wg.Done()
	b, err := c.readValue(c.ctx, h.vkey)
	// Here, not in the caller: a caller that left on its ctx would drop
	// the result, and a stalled Redis would never open the breaker.
	c.account(err)
	h.reply <- hitReply{b, err}
}

// account records the result of a hit's GET with the breaker. The GET ran
// under c.ctx or under a ctx that cannot end, so no error of it is a
// caller's deadline or cancellation; one that came with Close is not
// Redis's either.
func (c *Cache) account(err error) {
	switch {
	case c.ctx.Err() != nil:
		c.brk.probeDone() // Close, not Redis: no verdict (a Peek may probe)
	case isInfraError(err):
		c.redisFailed(err)
	default:
		c.redisAnswered() // a reply, an error reply included
	}
}

// countCorrupt records bytes at a value key that are not an intact
// envelope.
func (c *Cache) countCorrupt(key string, n int) {
	c.stats.corrupt.Add(1)
	c.sig.corrupt(key)
	c.log(slog.LevelWarn, "herd: value in Redis is not an intact envelope; treating it as a miss", "key", key, "bytes", n)
}

// valueKey returns the Redis name of key's value, as makeKeys does, in
// one allocation.
func valueKey(prefix, key string) (string, error) {
	if key == "" {
		return "", fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	sum := sha256.Sum256([]byte(key))
	var buf [maxPrefixLen + 2 + 43 + 3]byte
	b := append(buf[:0], prefix...)
	b = append(b, ":{"...)
	b = base64.RawURLEncoding.AppendEncode(b, sum[:])
	b = append(b, "}:v"...)
	return string(b), nil
}
