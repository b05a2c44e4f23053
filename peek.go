package herd

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
)

// Peek returns the value Redis holds for key, without loading it: it
// never calls a loader, never takes the key's lease and never starts a
// refresh or a rebuild. It is one GET from the key's master, so a Peek
// that starts after a Set, Invalidate or InvalidateSoft of key returned,
// in any process, sees that write.
//
// found reports whether Redis holds an answer for key, and the other
// results are that answer, as Get would return it:
//
//   - a fresh value: (value, true, nil);
//   - a stale value, within its stale window ([Options.StaleFor], or
//     after [Cache.InvalidateSoft]): (value, true, nil) too;
//   - a negative entry, a remembered [ErrNotFound]: (nil, true,
//     ErrNotFound);
//   - nothing, a value past its stale window, a pass mark left by
//     [Fill.Pass], or bytes that are not an intact envelope (counted in
//     [Stats].Corrupt): (nil, false, nil).
//
// With a ctx from [WithOutcome], Peek records which it was:
// [OutcomeHit], [OutcomeStale] (a stale value or negative entry; no
// refresh is started), [OutcomeNegative], [OutcomePass], or
// [OutcomeUnknown] for nothing usable and for errors.
//
// Errors: [ErrInvalidKey] for an empty key, [ErrClosed] after Close (and
// when Close is called while Peek waits for Redis), ctx.Err() as soon as
// ctx ends, and, when Redis cannot be reached or the circuit breaker is
// open, an error wrapping [ErrUnavailable] and the cause, whatever
// [Options.FailClosed] says: with no loader there is nothing to fail open
// to. Peek is not counted in the lookup counters of [Stats] nor reported
// to [Observer].Lookup. The returned slice is the caller's own.
func (c *Cache) Peek(ctx context.Context, key string) (val []byte, found bool, err error) {
	recordOutcome(ctx, OutcomeUnknown)
	if c.isClosed() {
		return nil, false, ErrClosed
	}
	name, err := valueName(c.cfg.Prefix, key)
	if err != nil {
		return nil, false, err
	}
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	b, there, err := c.peekRead(ctx, name)
	if err != nil {
		if errors.Is(err, ErrClosed) || ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, false, err
		}
		return nil, false, fmt.Errorf("%w: peek %q: %w", ErrUnavailable, key, err)
	}
	if !there {
		return nil, false, nil
	}
	env, ok := decodeEnvelope(b)
	if !ok {
		c.stats.corrupt.Add(1)
		c.sig.corrupt(key)
		c.log(slog.LevelWarn, "herd: value in Redis is not an intact envelope; treating it as a miss", "key", key, "bytes", len(b))
		return nil, false, nil
	}
	now := c.now()
	outcome := OutcomeHit
	switch {
	case env.pass:
		if now.Before(env.softExp) {
			recordOutcome(ctx, OutcomePass)
		}
		return nil, false, nil
	case now.Before(env.softExp):
		if env.negative {
			outcome = OutcomeNegative
		}
	case now.Before(env.staleExp):
		outcome = OutcomeStale
	default:
		return nil, false, nil // past its stale window: Redis is about to drop it
	}
	recordOutcome(ctx, outcome)
	if env.negative {
		return nil, true, ErrNotFound
	}
	return env.payload, true, nil
}

// peekRead GETs a value key for Peek. there is false when there is no
// value (none, or one of a foreign type); err is an infrastructure
// error, ErrClosed or ctx's error. The GET runs in its own goroutine,
// detached from ctx and bounded by the client's timeouts (go-redis waits
// for the reply of a command it has sent, whatever its context says): the
// caller leaves at once when ctx ends or Close is called, and the GET's
// verdict still reaches the circuit breaker. Close waits for it.
func (c *Cache) peekRead(ctx context.Context, name string) (b []byte, there bool, err error) {
	if !c.brk.allow() {
		return nil, false, errBreakerOpen
	}
	done, ok := c.track()
	if !ok {
		c.brk.probeDone()
		return nil, false, ErrClosed
	}
	type result struct {
		b     []byte
		there bool
		err   error
	}
	ch := make(chan result, 1)
	go func() {
		defer done()
		b, there, err := c.peekGet(name)
		ch <- result{b, there, err}
	}()
	select {
	case r := <-ch:
		return r.b, r.there, r.err
	case <-ctx.Done():
		return nil, false, ctx.Err()
	case <-c.ctx.Done():
		return nil, false, ErrClosed
	}
}

// peekGet is the GET of peekRead, with its verdict for the breaker.
func (c *Cache) peekGet(name string) (b []byte, there bool, err error) {
	b, err = c.readValue(c.ctx, name)
	switch {
	case err == nil:
		c.redisAnswered()
		return b, true, nil
	case c.ctx.Err() != nil:
		c.brk.probeDone() // Close, not Redis: no verdict
		return nil, false, ErrClosed
	case isInfraError(err):
		c.redisFailed(err)
		return nil, false, err
	}
	c.redisAnswered() // redis.Nil, or a value of another type: no value
	return nil, false, nil
}

// valueName is makeKeys(prefix, key).value, without the key's other
// names (a Peek needs only this one).
func valueName(prefix, key string) (string, error) {
	if key == "" {
		return "", fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	sum := sha256.Sum256([]byte(key))
	return prefix + ":{" + base64.RawURLEncoding.EncodeToString(sum[:]) + "}:v", nil
}
