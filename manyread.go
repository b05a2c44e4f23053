package herd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

// readReply is the reply of the read of one value key.
type readReply struct {
	b   []byte
	err error // redis.Nil for none
}

// read reads every key's value, leaving on ctx, and answers those it
// can: fresh values, and stale ones (a refresh starts).
func (m *manyCall) read(ctx context.Context) {
	c := m.c
	n := c.near
	if n != nil {
		// Near copies first, as Get's: no Redis for those keys.
		todo := m.todo[:0]
		for _, k := range m.todo {
			if e, ok := c.nearCopy(k.key); ok {
				c.stats.nearHits.Add(1)
				val, err := c.nearAnswer(ctx, k.key, e.val, e.negative)
				m.answer(k.key, val, err)
				continue
			}
			todo = append(todo, k)
		}
		m.todo = todo
		if len(todo) == 0 {
			return
		}
	}
	if !c.brk.allow() {
		for _, k := range m.todo {
			k.down = errBreakerOpen
		}
		return
	}
	names := make([]string, len(m.todo))
	for i, k := range m.todo {
		names[i] = k.vkey
	}
	var snaps []nearSnap // the near cache's state before the read, per key
	if n != nil {
		snaps = make([]nearSnap, len(m.todo))
		for i, k := range m.todo {
			snaps[i] = n.snapshot(c.nearIDOfValueKey(k.vkey))
		}
	}
	sent := time.Now()
	replies, err := leaveOnDone(ctx, c.track, func() ([]readReply, error) {
		r := c.readMany(c.ctx, names)
		c.readVerdict(r)
		return r, nil
	}, nil)
	if err != nil {
		for _, k := range m.todo {
			m.fail(k.key, err) // ctx ended
		}
		m.todo = nil
		return
	}
	todo := m.todo[:0]
	for i, k := range m.todo {
		r := replies[i]
		if r.err != nil {
			if isInfraError(r.err) {
				k.down = r.err
			}
			todo = append(todo, k) // a miss (redis.Nil, an error reply), or unreachable
			continue
		}
		env, ok := wire.DecodeEnvelope(r.b)
		if !ok {
			c.countCorrupt(k.key, len(r.b))
			todo = append(todo, k)
			continue
		}
		o, fresh, due := c.freshHit(k.key, k.vkey, env)
		if fresh {
			// As Get's hit path: a fresh value or negative entry, counted,
			// and copied to the near cache as a near fill would (refused
			// if a drop or flush came since the snapshot).
			if n != nil && snaps[i].live {
				if e, ok := c.nearEntryOf(c.nearIDOfValueKey(k.vkey), env, snaps[i]); ok {
					e.val = bytes.Clone(e.val) // the caller gets env.payload itself
					n.insert(k.key, e, snaps[i])
				}
			}
			if o == OutcomeNegative {
				m.answer(k.key, nil, ErrNotFound)
			} else {
				m.answer(k.key, env.Payload, nil)
			}
			continue
		}
		// Stale, an early refresh due, or a pass mark: as Get's flight.
		f := m.newFlight(k)
		f.seen, f.early = sent, due // the read's one early-refresh draw
		if f.served(env) {
			c.reportLookup(k.key, f.outcome)
			m.answer(k.key, f.ans.val, f.ans.err)
			continue
		}
		todo = append(todo, k)
	}
	m.todo = todo
}

// readVerdict reports the replies of a read to the breaker. A read that
// any master answered is an answer, as a probe's is: on a Cluster with one
// master down every batch that spans the masters has replies of both
// kinds, and counting it as a failure would open the breaker for the keys
// of the live masters too, and keep it open, since every probe batch
// would fail again. The keys whose reply was an infrastructure error go
// without Redis all the same (see read).
func (c *Cache) readVerdict(replies []readReply) {
	var infra error
	answered := false
	for _, r := range replies {
		switch {
		case isInfraError(r.err):
			infra = r.err
		case !errors.Is(r.err, context.Canceled):
			answered = true
		}
	}
	switch {
	case answered:
		c.redisAnswered()
	case infra != nil:
		c.redisFailed(infra)
	default:
		c.brk.probeDone() // Close, not Redis: no verdict
	}
}

// readMany reads the value keys names from their masters: one MGET per
// master (in chunks of manyChunk keys, pipelined) on a single master or
// a Ring shard; on a Cluster, where every key has its own slot, one
// pipeline per master, of GETs, or of the script that reads from the
// master when the client routes reads to replicas.
func (c *Cache) readMany(ctx context.Context, names []string) []readReply {
	out := make([]readReply, len(names))
	switch rdb := c.rdb.(type) {
	case *redis.ClusterClient:
		c.readCluster(ctx, rdb, names, out)
	case *redis.Ring:
		type shard struct {
			client *redis.Client
			idx    []int
		}
		shards := make(map[*redis.Client]*shard)
		for i, name := range names {
			cl, err := rdb.GetShardClientForKey(name)
			if err != nil {
				out[i].err = err
				continue
			}
			s := shards[cl]
			if s == nil {
				s = &shard{client: cl}
				shards[cl] = s
			}
			s.idx = append(s.idx, i)
		}
		var wg sync.WaitGroup
		for _, s := range shards {
			wg.Go(func() { mget(ctx, s.client, names, s.idx, out) })
		}
		wg.Wait()
	default:
		idx := make([]int, len(names))
		for i := range idx {
			idx[i] = i
		}
		mget(ctx, c.rdb, names, idx, out)
	}
	return out
}

// mget reads the names at idx, all on rdb's one server, into out.
func mget(ctx context.Context, rdb redis.Cmdable, names []string, idx []int, out []readReply) {
	var cmds []*redis.SliceCmd
	if len(idx) <= manyChunk {
		keys := make([]string, len(idx))
		for j, i := range idx {
			keys[j] = names[i]
		}
		cmds = append(cmds, rdb.MGet(ctx, keys...))
	} else {
		pipe := rdb.Pipeline()
		for chunk := range slices.Chunk(idx, manyChunk) {
			keys := make([]string, len(chunk))
			for j, i := range chunk {
				keys[j] = names[i]
			}
			cmds = append(cmds, pipe.MGet(ctx, keys...))
		}
		_, _ = pipe.Exec(ctx)
	}
	for n, cmd := range cmds {
		chunk := idx[n*manyChunk : min((n+1)*manyChunk, len(idx))]
		vals, err := cmd.Result()
		if err == nil && len(vals) != len(chunk) {
			err = fmt.Errorf("%w: MGET of %d keys answered %d values", errBadReply, len(chunk), len(vals))
		}
		for j, i := range chunk {
			if err != nil {
				out[i].err = err
				continue
			}
			switch v := vals[j].(type) {
			case string:
				out[i].b = []byte(v)
			default:
				out[i].err = redis.Nil // none, or not a string
			}
		}
	}
}

// readCluster reads names on a Cluster, one pipeline per master (the
// cluster client splits the pipeline by node and follows redirections).
func (c *Cache) readCluster(ctx context.Context, rdb *redis.ClusterClient, names []string, out []readReply) {
	if !c.masterReads {
		pipe := rdb.Pipeline()
		cmds := make([]*redis.StringCmd, len(names))
		for i, name := range names {
			cmds[i] = pipe.Get(ctx, name)
		}
		_, _ = pipe.Exec(ctx)
		for i, cmd := range cmds {
			out[i].b, out[i].err = cmd.Bytes()
		}
		return
	}
	// The client sends GET to replicas: read with the script, which goes
	// to the master.
	pending := make([]int, len(names))
	for i := range pending {
		pending[i] = i
	}
	for attempt := 0; len(pending) > 0 && attempt < 2; attempt++ {
		pipe := rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(pending))
		for j, i := range pending {
			cmds[j] = queueRead(ctx, pipe, getScript, attempt > 0, []string{names[i]})
		}
		_, _ = pipe.Exec(ctx)
		var again []int
		for j, i := range pending {
			s, err := cmds[j].Text()
			if attempt == 0 && isNoScript(err) {
				again = append(again, i) // that master does not have the script yet
				continue
			}
			out[i].b, out[i].err = []byte(s), err
		}
		pending = again
	}
}
