package herd

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// scriptCall is one run of a script in a batch (see runBatch): its route
// (a key of the script, which picks the master of a Cluster), keys and
// arguments, and, once the batch ran, its command and the replica wait's
// error, as run returns them.
type scriptCall struct {
	route string
	keys  []string
	args  []any
	cmd   *redis.Cmd
	werr  error
	sent  time.Time // when its pipeline (or its redirected run) was sent; zero if never
}

// batchSize bounds the scripts sent in one pipeline.
const batchSize = 256

// runBatch runs s once for each call, as run does, but pipelined: the
// calls are grouped by master, each group is sent in pipelines of up to
// batchSize scripts, each followed by one WAIT for the replicas, and
// every pipeline is sent at once. Every call has its cmd when runBatch
// returns.
func (w *replicaWait) runBatch(ctx context.Context, rdb redis.UniversalClient, s *script, calls []*scriptCall) {
	type group struct {
		target pipeliner
		addr   string
		calls  []*scriptCall
	}
	groups := make(map[string]*group)
	cluster := false
	for _, call := range calls {
		target, addr, cl, err := pipelineTarget(ctx, rdb, call.route)
		cluster = cluster || cl
		if err != nil {
			call.cmd = redis.NewCmd(ctx)
			call.cmd.SetErr(err)
			continue
		}
		g := groups[addr]
		if g == nil {
			g = &group{target: target, addr: addr}
			groups[addr] = g
		}
		g.calls = append(g.calls, call)
	}
	// Every pipeline goes at once, each master's chunks too: a batch's
	// leases count from their ACQUIREs, and with the chunks one after the
	// other the first ones lapsed while the last were on their way once a
	// few round trips added up to a lease.
	var wg sync.WaitGroup
	for _, g := range groups {
		for chunk := range slices.Chunk(g.calls, batchSize) {
			wg.Go(func() { w.runChunk(ctx, rdb, g.target, g.addr, cluster, s, chunk) })
		}
	}
	wg.Wait()
}

// runChunk sends calls, all for the master at addr, in one pipeline on
// target, with the WAIT after them; the ones the master did not have the
// script for go again with the script's body, and the ones a Cluster
// redirected go through run.
func (w *replicaWait) runChunk(ctx context.Context, rdb redis.UniversalClient, target pipeliner, addr string, cluster bool, s *script, calls []*scriptCall) {
	need := 0
	var nerr error // a strict wait on a master that cannot be counted
	if w.acks >= 0 && s.kind == writes {
		n := w.node(addr)
		if w.due(n) {
			w.probe(ctx, target, n)
		}
		need, nerr = w.need(n)
	}
	pending := calls
	for attempt := 0; len(pending) > 0 && attempt < 2; attempt++ {
		pipe := target.Pipeline()
		for _, c := range pending {
			if attempt == 0 {
				c.cmd = s.rs.EvalSha(ctx, pipe, c.keys, c.args...)
			} else {
				c.cmd = s.rs.Eval(ctx, pipe, c.keys, c.args...)
			}
		}
		var wait *redis.IntCmd
		if need > 0 {
			wait = redis.NewIntCmd(ctx, "WAIT", need, w.timeout.Milliseconds())
			_ = pipe.Process(ctx, wait)
		}
		sent := time.Now()
		for _, c := range pending {
			c.sent = sent
		}
		_, _ = pipe.Exec(ctx)
		var again []*scriptCall
		for _, c := range pending {
			switch err := c.cmd.Err(); {
			case attempt == 0 && isNoScript(err):
				again = append(again, c) // the master does not have the script yet
			case cluster && isRedirect(err):
				c.sent = time.Now()
				c.cmd, c.werr = w.run(ctx, rdb, c.route, s, c.keys, c.args...)
			case err == nil && wait != nil:
				c.werr = waitError(wait, need, w.timeout)
			case err == nil:
				c.werr = nerr
			}
		}
		pending = again
	}
}

// waitError is the error of a WAIT for need replicas: nil when enough
// acknowledged, else one wrapping [ErrNotReplicated].
func waitError(wait *redis.IntCmd, need int, timeout time.Duration) error {
	if err := wait.Err(); err != nil {
		return fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err)
	}
	if got := wait.Val(); got < int64(need) {
		return fmt.Errorf("%w: %d of %d replicas acknowledged within %v", ErrNotReplicated, got, need, timeout)
	}
	return nil
}
