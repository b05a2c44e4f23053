package herd

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// commit runs the COMMIT script. The value goes to the local callers
// whatever happens here: a fenced or failed commit only means it is not
// stored. It returns the value's currency for them: current from when the
// script was sent if it was stored, from the load's start (loadStart,
// when the key's local write count was writes) otherwise. A value with
// tags is recorded in their indexes first, and not stored when a purge of
// one of them may have come after the load began (see tags.go).
func (c *Cache) commit(f *flight, lease *Lease, env *envelope, loadStart time.Time, writes uint64, tags tagging) currency {
	b := env.Encode()
	ttl := env.StaleExp.Sub(env.WrittenAt) // the hard TTL in Redis
	if tags.any() {
		// The index must cover the value until it expires: its PX counts
		// from now, not from the COMMIT.
		deadline := time.Now().Add(ttl)
		if cur, ok := c.indexTags(f, lease, tags, ttl, loadStart); !ok {
			return cur
		}
		ttl = max(time.Until(deadline), time.Millisecond)
	}
	msg := msgWritten
	if len(b) <= c.cfg.NotifyMaxBytes {
		msg = string(msgValue) + string(b)
	}
	traced := c.sig.startCommit(f, lease)
	sent := time.Now()
	cmd, werr := c.runCommit(f, []string{f.keys.Value, f.keys.Lease, f.keys.Fence, f.keys.Backoff},
		strconv.FormatUint(lease.token, 10), b, ttl.Milliseconds(), lease.value,
		c.notify.PublishCmd(c.ctx), f.keys.Channel, msg, msgReleased, c.nearChan, f.keys.Hash())
	c.nearWrote(f.key) // this process's near copy goes before the value reaches anyone
	ok, err := cmd.Int()
	if err == nil && ok == 1 && werr != nil {
		// Stored and published on the master, not confirmed on its
		// replicas: a failover may lose it. Say so, not "not stored".
		if traced != nil {
			traced(CommitUnreplicated)
		}
		c.stats.commitsUnreplicated.Add(1)
		c.sig.commit(f.key, CommitUnreplicated)
		c.redisFailed(werr) // an outage only if the WAIT found Redis down
		c.log(slog.LevelWarn, "herd: commit stored on the master, not confirmed on its replicas; a failover may lose it", "key", f.key, "err", werr)
		return currency{from: sent} // current on the master when it ran
	}
	if traced != nil {
		switch {
		case err != nil:
			traced(CommitError)
		case ok == 0:
			traced(CommitFenced)
		default:
			traced(CommitStored)
		}
	}
	switch {
	case err != nil:
		c.stats.commitErrors.Add(1)
		c.sig.commit(f.key, CommitError)
		c.redisFailed(err)
		c.log(slog.LevelWarn, "herd: commit failed; the value was returned but not stored", "key", f.key, "err", err)
		if isInfraError(err) {
			// Redis became unreachable: like a load while it is down,
			// nothing can check the value (see currency).
			return currency{unchecked: true, writes: writes}
		}
		return currency{from: loadStart}
	case ok == 0:
		c.stats.fenced.Add(1)
		c.sig.commit(f.key, CommitFenced)
		c.log(slog.LevelWarn, "herd: commit fenced: a newer lease, Set or Invalidate came first (a duplicate or stale rebuild); value not stored", "key", f.key, "fence", lease.token)
	default:
		c.sig.commit(f.key, CommitStored)
		return currency{from: sent}
	}
	return currency{from: loadStart} // fenced: a write or a newer lease came after the load began
}

// commitBatch pipelines the COMMITs of the keys that one runMany leads.
// Each key settles in its own goroutine and either hands its COMMIT to
// run, which returns once the pipeline of all of them ran, or, when it
// commits nothing, calls skip. The last key to arrive sends the pipeline.
type commitBatch struct {
	c     *Cache
	mu    sync.Mutex
	left  int // keys that have not arrived
	calls []*scriptCall
	done  chan struct{} // closed when the pipeline ran
}

// run adds a COMMIT to the pipeline and returns its result, once the
// pipeline ran.
func (b *commitBatch) run(route string, keys []string, args []any) (*redis.Cmd, error) {
	call := &scriptCall{route: route, keys: keys, args: args}
	b.mu.Lock()
	b.calls = append(b.calls, call)
	b.left--
	last := b.left == 0
	b.mu.Unlock()
	if last {
		b.flush()
	} else {
		<-b.done
	}
	return call.cmd, call.werr
}

// skip tells the batch that a key commits nothing.
func (b *commitBatch) skip() {
	b.mu.Lock()
	b.left--
	last := b.left == 0
	b.mu.Unlock()
	if last {
		b.flush()
	}
}

func (b *commitBatch) flush() {
	if len(b.calls) > 0 {
		ctx, cancel := b.c.commitCtx()
		defer cancel()
		b.c.repl.runBatch(ctx, b.c.rdb, commitScript, b.calls)
	}
	close(b.done)
}

// runCommit runs a COMMIT of f's key: in f's commit batch if it has one.
// The COMMIT is sent even once Close has begun (see commitCtx; the
// client's timeouts bound it, as they bound every command Close waits
// for): a load that ended is stored and its lease released, instead of
// the lease being left to block the key for other processes until it
// expires. In a batch the COMMIT waits for the other keys, so the window
// between the load's end and the COMMIT is not small.
func (c *Cache) runCommit(f *flight, keys []string, args ...any) (*redis.Cmd, error) {
	if b := f.commits; b != nil {
		f.commits = nil
		return b.run(f.keys.Fence, keys, args)
	}
	ctx, cancel := c.commitCtx()
	defer cancel()
	return c.repl.run(ctx, c.rdb, f.keys.Fence, commitScript, keys, args...)
}

// commitCtx is the context of a COMMIT about to be sent: detached from
// c.ctx, so that it is sent even once Close has begun. A COMMIT sent
// before Close ends with Close, though (see endWith).
func (c *Cache) commitCtx() (_ context.Context, stop func()) {
	ctx := context.WithoutCancel(c.ctx)
	if c.ctx.Err() != nil {
		return ctx, func() {} // sent after Close began
	}
	return endWith(ctx, c.ctx)
}

// skipCommit tells f's commit batch, if it still has one, that f commits
// nothing.
func (f *flight) skipCommit() {
	if b := f.commits; b != nil {
		f.commits = nil
		b.skip()
	}
}
