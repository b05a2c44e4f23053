package herd

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/herdkit/herd/internal/wire"
)

// softTries bounds the compare-and-swap rounds of one InvalidateSoft. A
// round is lost when another write of the key (a commit, a Set) lands
// between the read and the script; then the script's reply carries the
// value now there, and the next round rewrites that one.
const softTries = 4

// InvalidateSoft makes key's value stale at once, cluster-wide, and
// advances its fence as [Cache.Invalidate] does, but keeps the value
// servable while one rebuild runs. Once InvalidateSoft returns, every
// Get, [Fetch] and Begin of key, in every process, gets the old value at
// once as a stale hit ([OutcomeStale]), and the first of them starts the
// key's background refresh under its lease, exactly as for a value past
// its ttl within [Options.StaleFor]: one rebuild in the whole cluster.
// When it commits, the new value is served. [Cache.Peek] reports the old
// value as stale too.
//
// A rebuild that began before InvalidateSoft cannot store its value
// after it: its commit is fenced, and the stale period goes on until a
// rebuild that began after it commits. While such an older rebuild still
// holds the key's lease, the refresh starts at the first stale hit after
// it ended.
//
// The old value stays servable for as long as it was going to live: up
// to its hard TTL (its ttl plus the StaleFor of the process that wrote
// it), which InvalidateSoft does not lengthen. With StaleFor 0 that is
// what was left of its ttl. If the refresh fails, the old value keeps
// being served (stale-if-error) and refreshes back off, as after any
// failed refresh; a backoff already running when InvalidateSoft is
// called is kept. If the value expires before a refresh lands, the next
// Gets miss and wait for one rebuild, as after Invalidate. A negative
// entry is kept the same way: a remembered [ErrNotFound], now stale.
// When key has no value to keep serving (none, one already expired, a
// pass mark of [Fill.Pass], or bytes that are not an intact envelope),
// InvalidateSoft is Invalidate.
//
// The rewrite is a compare-and-swap: InvalidateSoft reads the value (one
// GET from its master) and one script advances the fence and stores the
// value marked stale, with its time to live unchanged, if the value is
// still the one read. Each write of the key that lands in between costs
// one more script run; after four, InvalidateSoft invalidates the key
// outright, like Invalidate. So InvalidateSoft costs two round trips, and
// the value travels both ways.
//
// Freshness is judged by each reader's clock against the writer's: keep
// hosts in NTP sync. A reader whose clock lags by more than the value's
// age may serve it as fresh until its clock reaches the write.
//
// Errors are those of Invalidate: [ErrInvalidKey], [ErrClosed] after
// Close, [ErrNotReplicated] (the master stored it, too few replicas
// acknowledged it) or the wrapped Redis error. When ctx ends first,
// InvalidateSoft returns at once with an error wrapping ctx.Err(); the
// write may still land. Read-your-writes holds in this form: a call that
// starts after InvalidateSoft returned, in any process, gets the old
// value only as a stale hit (read after the invalidation), or a value
// rebuilt after it; never a fresh hit read before it.
func (c *Cache) InvalidateSoft(ctx context.Context, key string) error {
	if c.isClosed() {
		return ErrClosed
	}
	keys, err := makeKeys(c.cfg.Prefix, key)
	if err != nil {
		return err
	}
	marker := keys.Writes + newOwner() // one id for every round: a retry of a round that wrote is a no-op
	err = c.untilDone(ctx, key, func() error { return c.invalidateSoft(ctx, keys, marker) })
	if err != nil {
		return fmt.Errorf("herd: invalidate soft %q: %w", key, err)
	}
	return nil
}

// invalidateSoft runs the compare-and-swap rounds of InvalidateSoft, then,
// if every round was lost, a plain INVALIDATE.
func (c *Cache) invalidateSoft(ctx context.Context, keys keyFamily, marker string) error {
	b, err := c.readValue(ctx, keys.Value)
	if isInfraError(err) {
		return err
	}
	seen := err == nil // else redis.Nil or a foreign type: no value
	fenceTTL := c.fenceTTL(time.Hour).Milliseconds()
	for range softTries {
		header, size := "", -1
		if seen {
			header, size = string(b[:min(len(b), wire.EnvelopeHeader)]), len(b)
		}
		cmd, werr := c.repl.run(ctx, c.rdb, keys.Fence, softScript, []string{keys.Value, keys.Fence, marker},
			header, size, c.softened(b, seen), fenceTTL, writeMarkerTTL.Milliseconds(), c.nearChan, keys.Hash())
		res, err := cmd.Slice()
		if err != nil {
			return err
		}
		if done, _ := res[0].(int64); done == 1 {
			return werr
		}
		// Lost: another write landed since the read. Try its value.
		b, seen = nil, len(res) > 1
		if seen {
			s, _ := res[1].(string)
			b = []byte(s)
		}
	}
	cmd, werr := c.repl.run(ctx, c.rdb, keys.Fence, invalidateScript, []string{keys.Value, keys.Fence, marker},
		fenceTTL, writeMarkerTTL.Milliseconds(), c.nearChan, keys.Hash())
	if err := cmd.Err(); err != nil {
		return err
	}
	return werr
}

// softened returns b, a value read from Redis, rewritten as stale from
// now on: the same payload, flags, write time and stale window, with its
// fresh period ended (at its write, or now if that is earlier on this
// clock). The fence is stamped by the script. The rebuild time Δ is
// cleared: the rewrite is no rebuild, and readers count each rebuild's Δ
// once, by its writer's fence, which the rewrite changes. It
// returns nil when b is no value to keep serving: none (seen false), not
// an intact envelope, a pass mark, or a value whose stale window ended.
func (c *Cache) softened(b []byte, seen bool) []byte {
	if !seen {
		return nil
	}
	env, ok := wire.DecodeEnvelope(b)
	now := c.now()
	if !ok || env.Pass || !now.Before(env.StaleExp) {
		return nil
	}
	env.SoftExp = env.WrittenAt
	if now.Before(env.SoftExp) {
		env.SoftExp = now
	}
	env.Delta = 0
	return env.Encode()
}
