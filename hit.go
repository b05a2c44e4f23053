package herd

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/herdkit/herd/internal/wire"
)

// The hit path. A Get reads the key's value before any flight, through
// the shared read (sharedread.go): a fresh value (or a fresh negative
// entry) is the answer, with no flight. Everything else (a miss, a stale
// value, an early refresh, a pass mark, unreadable bytes, an unreachable
// Redis) goes to the key's flight, which takes the read's result instead
// of reading again when this caller starts it.

// preRead is the result of a Get's own read, handed to the flight it
// starts.
type preRead struct {
	sent time.Time // when the GET was sent
	env  envelope
	ok   bool  // env is an intact envelope
	due  bool  // env is fresh and its early refresh was drawn due
	err  error // an infrastructure error, already recorded by the breaker
	// unknown: a miss of a key this process did not know (coldread.go),
	// which the flight it starts counts.
	unknown bool
}

// hit reads key's value (at vkey) in the caller's goroutine. done reports
// that val, err are the caller's answer; otherwise pre is the read for
// the flight (nil: the flight reads itself).
//
// A key this process has not seen in Redis lately may skip the read (see
// coldread.go): pre is then coldLook, and the flight's ACQUIRE reads.
//
// behind is for Get's read after a cold read found the key's flight
// running in this process: a miss in progress, which its concurrent
// callers are likely to share. Such a read is never cold, and it is sent
// only while no other read of the key is on the wire: else it gathers
// behind that one (see sharedRead), so a wave's callers send about one
// GET per round trip, not two.
func (c *Cache) hit(ctx context.Context, key, vkey string, behind bool) (val []byte, done bool, pre *preRead, err error) {
	id := warmID(vkey)
	known := c.warm.known(id)
	if !behind && !known && c.warm.cold() && !c.brk.troubled.Load() {
		return nil, false, coldLook, nil
	}
	wires := readWires
	if behind {
		wires = 1
	}
	env, done, pre, err := c.hitEnv(ctx, key, vkey, true, wires)
	if !known {
		c.countUnknown(id, done, err, pre, behind)
	}
	if !done || err != nil {
		return nil, done, pre, err
	}
	return env.Payload, true, nil, nil
}

// countUnknown gives the cold-read score (coldread.go) the outcome of a
// read of a key this process did not know, whose ID is id: done, err and
// pre as hit or nearGet return them. The score counts keys, not callers:
// a found key by the caller that marks it (not behind a cold read, whose
// ACQUIRE counts it), a missing one by the flight it starts (see Get).
func (c *Cache) countUnknown(id uint64, done bool, err error, pre *preRead, behind bool) {
	switch present := (done && (err == nil || errors.Is(err, ErrNotFound))) || (pre != nil && pre.ok); {
	case present:
		if c.warm.mark(id) && !behind {
			c.warm.found(true)
		}
	case pre != nil && pre.err == nil && pre != coldLook:
		pre.unknown = true // a miss, or bytes that are not an envelope
	}
}

// coldLook is the pre of a Get that did not read: its flight starts at
// the ACQUIRE, which reads the value with the lease (see coldread.go).
var coldLook = &preRead{}

// hitEnv is hit with the envelope of the value: on a fresh hit, env is
// it, its payload the caller's own. inline and wires are sharedRead's.
func (c *Cache) hitEnv(ctx context.Context, key, vkey string, inline bool, wires int) (env envelope, done bool, pre *preRead, err error) {
	if c.brk.troubled.Load() {
		// The breaker decides who probes a troubled Redis: the flight asks.
		return env, false, nil, nil
	}
	sent := time.Now()
	r := c.sharedRead(ctx, key, vkey, inline, wires) // the breaker has the GET's result
	switch err := r.err; {
	case err == nil:
	case ctx.Err() != nil:
		// The caller's own deadline or cancellation, not Redis.
		return env, true, nil, ctx.Err()
	case errors.Is(err, ErrClosed) || c.ctx.Err() != nil:
		return env, true, nil, ErrClosed
	case isInfraError(err):
		return env, false, &preRead{sent: sent, err: err}, nil
	}
	if !r.ok {
		// redis.Nil, a wrong-type reply or bytes that are not an envelope
		// (counted by the read): a miss.
		return env, false, &preRead{sent: sent}, nil
	}
	o, fresh, due := c.freshHit(key, vkey, r.env)
	if !fresh {
		return env, false, &preRead{sent: sent, env: r.env, ok: true, due: due}, nil
	}
	recordOutcome(ctx, o)
	if o == OutcomeNegative {
		return env, true, nil, ErrNotFound
	}
	return r.env, true, nil, nil
}

// freshHit reports whether env, read at vkey for key, answers the read as
// it is: a fresh value or negative entry (o says which), counted. A stale
// value, an early refresh due or a pass mark is for the flight; due
// reports the early refresh, which the flight takes as drawn here (set
// flight.early) instead of drawing again.
func (c *Cache) freshHit(key, vkey string, env envelope) (o Outcome, fresh, due bool) {
	now := c.now()
	live := now.Before(env.SoftExp)
	due = live && !env.Pass && c.xfetchDue(env, now)
	if env.Pass || !live || due {
		return OutcomeUnknown, false, due
	}
	c.calib.observeRebuild(vkey, key, c.cfg.classLabel, env.Fence, env.Delta)
	if env.Negative {
		c.stats.negativeHits.Add(1)
		c.reportLookup(key, OutcomeNegative)
		return OutcomeNegative, true, false
	}
	c.stats.hits.Add(1)
	c.reportLookup(key, OutcomeHit)
	return OutcomeHit, true, false
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
	var buf [wire.MaxPrefixLen + 2 + 43 + 3]byte
	b := append(buf[:0], prefix...)
	b = append(b, ":{"...)
	b = base64.RawURLEncoding.AppendEncode(b, sum[:])
	b = append(b, "}:v"...)
	return string(b), nil
}

// lookup is Get's read before the flight, after a near miss: the near
// cache's fill when it is on, then, unless it answered or read for the
// flight, the hit path. A key this process does not know, while cold
// reads are on, skips both (coldread.go): the fill's GET is the read a
// cold read saves. The fill's read of an unknown key counts for the score
// as the hit path's does.
func (c *Cache) lookup(ctx context.Context, key, vkey string) (val []byte, done bool, pre *preRead, err error) {
	if c.near != nil {
		id := warmID(vkey)
		known := c.warm.known(id)
		if !known && c.warm.cold() && !c.brk.troubled.Load() {
			return nil, false, coldLook, nil
		}
		if val, done, pre, err = c.nearGet(ctx, key, vkey); done || pre != nil {
			if !known {
				c.countUnknown(id, done, err, pre, false)
			}
			return val, done, pre, err
		}
	}
	return c.hit(ctx, key, vkey, false)
}
