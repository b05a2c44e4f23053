package herd

import (
	"context"
	"errors"
	"fmt"
)

// Peek returns the value Redis holds for key, without loading it: it
// never calls a loader, never takes the key's lease and never starts a
// refresh or a rebuild. It is one GET from the key's master, so a Peek
// that starts after a Set, Invalidate or InvalidateSoft of key returned,
// in any process, sees that write. For that reason it never answers from
// the near cache ([Options.Near]), which bounds staleness only.
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
// when Close is called while Peek waits for Redis, if its ctx can end:
// with one that cannot, such as context.Background, or with
// [Options.InlineHits], Peek sends the GET itself and waits for its reply,
// as Get does), ctx.Err() as soon as ctx ends (with InlineHits, when its
// GET returns: after at most the client's timeouts on a stalled Redis),
// and, when Redis cannot be reached or the circuit breaker is
// open, an error wrapping [ErrUnavailable] and the cause, whatever
// [Options.FailClosed] says: with no loader there is nothing to fail open
// to. Peek is not counted in the lookup counters of [Stats] nor reported
// to [Observer].Lookup. The returned slice is the caller's own.
func (c *Cache) Peek(ctx context.Context, key string) (val []byte, found bool, err error) {
	recordOutcome(ctx, OutcomeUnknown)
	if c.closing.Load() {
		return nil, false, ErrClosed
	}
	name, err := valueKey(c.cfg.Prefix, key)
	if err != nil {
		return nil, false, err
	}
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	r, err := c.peekRead(ctx, key, name)
	if err != nil {
		if errors.Is(err, ErrClosed) || ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, false, err
		}
		return nil, false, fmt.Errorf("%w: peek %q: %w", ErrUnavailable, key, err)
	}
	if !r.ok {
		return nil, false, nil // nothing, a foreign value, or unreadable bytes (counted)
	}
	env := r.env
	now := c.now()
	outcome := OutcomeHit
	switch {
	case env.Pass:
		if now.Before(env.SoftExp) {
			recordOutcome(ctx, OutcomePass)
		}
		return nil, false, nil
	case now.Before(env.SoftExp):
		if env.Negative {
			outcome = OutcomeNegative
		}
	case now.Before(env.StaleExp):
		outcome = OutcomeStale
	default:
		return nil, false, nil // past its stale window: Redis is about to drop it
	}
	recordOutcome(ctx, outcome)
	if env.Negative {
		return nil, true, ErrNotFound
	}
	return env.Payload, true, nil
}

// peekRead GETs key's value at name for Peek through the shared read, as
// a hit does, with the breaker's say: an open breaker skips Redis, and the
// GET's verdict reaches it. err is an infrastructure error, ErrClosed or
// ctx's error; a reply of no value, or of a value of another type, is r
// with r.ok false.
func (c *Cache) peekRead(ctx context.Context, key, name string) (r readResult, err error) {
	if !c.brk.allow() {
		return readResult{}, errBreakerOpen
	}
	r = c.sharedRead(ctx, key, name, true, readWires) // which gives the breaker the GET's verdict
	switch {
	case r.err == nil:
		return r, nil
	case ctx.Err() != nil:
		return readResult{}, ctx.Err() // the caller's, not Redis's
	case errors.Is(r.err, ErrClosed) || c.ctx.Err() != nil:
		return readResult{}, ErrClosed
	case isInfraError(r.err):
		return readResult{}, r.err
	}
	return readResult{}, nil // redis.Nil, or a value of another type: no value
}
