package herd

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replica wait defaults.
const (
	// defaultReplicaTimeout bounds one WAIT for the replicas.
	defaultReplicaTimeout = 250 * time.Millisecond
	// roleEvery is how often the master's replicas are counted again (an
	// INFO replication sent before the write that finds the count due).
	roleEvery = time.Second
)

// replicaWait runs the scripts that advance a fence (ACQUIRE, COMMIT, SET,
// INVALIDATE) and EXTEND followed by a WAIT for the replicas, pipelined on
// the same connection, so that a write the caller is told about has reached
// the replicas a failover would promote.
//
// In auto mode (acks 0) it waits for every replica this process saw
// attached to the master in the last minute (see sightings): the count is
// learned from INFO replication, sent before a write about once a second,
// so a deposed master whose replicas are leaving it refuses writes
// instead of acknowledging them.
//
// A master whose INFO is refused (an ACL user without +info, which
// -@dangerous removes) cannot be counted. Then a strict wait (the Locker's
// and the FencedStore's: mutual exclusion and fenced writes) reports every
// write it would have waited for as not replicated, with an error that
// names the fix; the Cache's waits for no replica and logs that once
// (warn), since refusing would cost every miss its coalescing.
type replicaWait struct {
	acks     int // <0 never wait, 0 auto, >0 that many replicas
	timeout  time.Duration
	explicit bool                          // the timeout was configured (see fitReadTimeout)
	owner    string                        // "Options", "LockerOptions" or "FencedStore", for messages
	strict   bool                          // a master that cannot be counted refuses (see above)
	warn     func(msg string, args ...any) // the lenient wait's one log of an uncounted master
	warned   atomic.Bool

	now   func() time.Time // the clock of the replica counts; tests replace it
	mu    sync.Mutex
	nodes map[string]*nodeReplicas // by master address; "" for non-cluster clients
}

// nodeReplicas is what is known of one master's replicas.
type nodeReplicas struct {
	known   atomic.Bool  // an INFO has answered
	checked atomic.Int64 // unix nanoseconds of the last INFO sent

	mu      sync.Mutex
	replid  string // the master's replication id when last seen
	count   int    // replicas to wait for: the most this process saw lately
	refused error  // the INFO's error reply: the replicas cannot be counted
}

// sightings is what every Cache, Locker and FencedStore of the process saw
// of each master, by its replication id: the most replicas attached to
// it, and when that many were last seen. A store created after a master's
// replicas left still waits for them, as one created before does.
var sightings = struct {
	mu   sync.Mutex
	byID map[string]sighting
}{byID: make(map[string]sighting)}

type sighting struct {
	count int
	since time.Time
}

// sighted records that c replicas are attached to the master of
// replication id as of now, and returns the count to wait for: the most
// seen in the last replicaMemory (a promoted replica has a new id, and
// its count starts afresh).
func sighted(id string, c int, now time.Time) int {
	sightings.mu.Lock()
	defer sightings.mu.Unlock()
	s, ok := sightings.byID[id]
	if !ok || c >= s.count || now.Sub(s.since) > replicaMemory {
		s = sighting{c, now}
		if !ok && len(sightings.byID) >= 64 {
			for k, o := range sightings.byID {
				if now.Sub(o.since) > replicaMemory {
					delete(sightings.byID, k)
				}
			}
		}
		sightings.byID[id] = s
	}
	return s.count
}

// replicaMemory is how long a master's replica count is remembered after
// fewer replicas are attached: during a failover the deposed master's
// replicas leave it one by one, and a write that only the replica left
// behind acknowledged is lost when that replica follows the new master.
const replicaMemory = time.Minute

func newReplicaWait(acks int, timeout time.Duration) *replicaWait {
	return &replicaWait{acks: acks, timeout: timeout, now: time.Now, nodes: make(map[string]*nodeReplicas)}
}

func (w *replicaWait) node(addr string) *nodeReplicas {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nodes[addr]
	if n == nil {
		n = &nodeReplicas{}
		w.nodes[addr] = n
	}
	return n
}

// need is the number of replicas a write must reach on node n, or, for a
// strict wait on a master that cannot be counted, an error wrapping
// [ErrNotReplicated] to report the write with.
func (w *replicaWait) need(n *nodeReplicas) (int, error) {
	switch {
	case w.acks < 0:
		return 0, nil
	case w.acks > 0:
		return w.acks, nil
	}
	n.mu.Lock()
	count, refused := n.count, n.refused
	n.mu.Unlock()
	if refused == nil {
		return count, nil
	}
	if w.strict {
		return 0, fmt.Errorf("%w: the master's replicas cannot be counted (INFO replication: %v): allow the Redis user INFO (+info), or set %s.ReplicaAcks", ErrNotReplicated, refused, w.owner)
	}
	if w.warn != nil && w.warned.CompareAndSwap(false, true) {
		w.warn("herd: writes wait for no replica: the master's replicas cannot be counted; allow the Redis user INFO (+info), or set Options.ReplicaAcks", "err", refused)
	}
	return 0, nil
}

// learn records an INFO replication reply, as of now. The count to wait
// for is the most replicas this process saw attached to this master (this
// replication id: a promoted replica starts a new one, and its count
// starts afresh) in the last replicaMemory (see sighted); a process that
// never saw the master learns what is attached now. (Redis's replication
// backlog says nothing useful here: it lives repl-backlog-ttl, an hour by
// default, after the last replica left, so counting it refused every
// write of a new process for that hour after a replica was removed for
// good.) A NOPERM error reply (an ACL) marks the master uncountable.
func (n *nodeReplicas) learn(cmd *redis.StringCmd, now time.Time) {
	info, err := cmd.Result()
	if err != nil {
		// NOPERM: an ACL keeps this user from INFO, and the master may
		// have replicas. Another error reply (a server without the
		// section, such as miniredis) is a server without replicas.
		if !isInfraError(err) && strings.HasPrefix(err.Error(), "NOPERM") {
			n.mu.Lock()
			n.refused = err
			n.mu.Unlock()
		}
		return
	}
	if infoValue(info, "role") != "master" {
		return
	}
	c, _ := strconv.Atoi(infoValue(info, "connected_slaves"))
	id := infoValue(info, "master_replid")
	if id != "" {
		c = sighted(id, c, now)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.replid, n.count, n.refused = id, c, nil
}

// infoValue returns field's value in an INFO reply ("" when absent).
func infoValue(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			return v
		}
	}
	return ""
}

// pipeliner is what a pipeline runs on: a client for one master.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// run runs s with keys and args on rdb and then, in the same pipeline, the
// WAIT. route is a key of the script, which picks the master of a
// Cluster. The first result is the script's command (check its Err); the
// second is an error wrapping [ErrNotReplicated] when the script ran but
// too few replicas acknowledged within the timeout, or the WAIT's own
// error. Callers ignore the second when the script wrote nothing.
func (w *replicaWait) run(ctx context.Context, rdb redis.UniversalClient, route string, s *script, keys []string, args ...any) (*redis.Cmd, error) {
	return w.runWith(ctx, rdb, route, nil, s, keys, args...)
}

// runWith is run with side, when not nil, a command sent in the same
// pipeline as the script, ahead of the WAIT. rdb must then be a client of
// one master (not a Cluster or a Ring, where side's key may live on
// another master). side has its result when runWith returns.
func (w *replicaWait) runWith(ctx context.Context, rdb redis.UniversalClient, route string, side redis.Cmder, s *script, keys []string, args ...any) (*redis.Cmd, error) {
	if w.acks < 0 || s.kind != writes {
		return runScript(ctx, rdb, side, s, keys, args...), nil
	}
	target, addr, cluster, err := pipelineTarget(ctx, rdb, route)
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd, nil
	}
	n := w.node(addr)
	// Count the replicas before the write, not after it: a replica that
	// attached since the last count must be waited for by this write.
	if w.due(n) {
		w.probe(ctx, target, n)
	}
	need, nerr := w.need(n)
	if need == 0 {
		return runScript(ctx, rdb, side, s, keys, args...), nerr
	}
	for attempt := 0; ; attempt++ {
		pipe := target.Pipeline()
		var cmd *redis.Cmd
		if attempt == 0 {
			cmd = s.rs.EvalSha(ctx, pipe, keys, args...)
			if side != nil {
				_ = pipe.Process(ctx, side)
			}
		} else {
			cmd = s.rs.Eval(ctx, pipe, keys, args...)
		}
		var wait *redis.IntCmd
		if need > 0 {
			wait = redis.NewIntCmd(ctx, "WAIT", need, w.timeout.Milliseconds())
			_ = pipe.Process(ctx, wait)
		}
		_, _ = pipe.Exec(ctx)
		if attempt == 0 && isNoScript(cmd.Err()) {
			continue // the server does not have the script yet: send it
		}
		if cluster && isRedirect(cmd.Err()) {
			// The key's slot moved: run it where the cluster client says.
			// The replicas of that master were not waited for.
			if cmd = s.rs.Run(ctx, rdb, keys, args...); cmd.Err() != nil || wait == nil {
				return cmd, nil
			}
			return cmd, fmt.Errorf("%w: the key's slot moved while waiting", ErrNotReplicated)
		}
		if cmd.Err() != nil {
			return cmd, nil
		}
		return cmd, waitError(wait, need, w.timeout)
	}
}

// runScript runs s on rdb, with side, when not nil, in the same pipeline.
func runScript(ctx context.Context, rdb redis.UniversalClient, side redis.Cmder, s *script, keys []string, args ...any) *redis.Cmd {
	if side == nil {
		return s.rs.Run(ctx, rdb, keys, args...)
	}
	pipe := rdb.Pipeline()
	cmd := s.rs.EvalSha(ctx, pipe, keys, args...)
	_ = pipe.Process(ctx, side)
	_, _ = pipe.Exec(ctx)
	if isNoScript(cmd.Err()) {
		cmd = s.rs.Run(ctx, rdb, keys, args...) // side has its answer already
	}
	return cmd
}

// pipelineTarget returns the client whose pipeline reaches the master of
// route, and that master's address ("" for a client of one master, which
// is rdb itself). cluster reports a Cluster, whose master may redirect a
// script sent on its own pipeline.
func pipelineTarget(ctx context.Context, rdb redis.UniversalClient, route string) (target pipeliner, addr string, cluster bool, err error) {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, route)
		if err != nil {
			return nil, "", true, err
		}
		return node, node.Options().Addr, true, nil
	}
	if ring, ok := rdb.(*redis.Ring); ok {
		// A Ring pipeline routes each command by its first argument: WAIT
		// and INFO must go to the script's shard, on its connection.
		shard, err := ring.GetShardClientForKey(route)
		if err != nil {
			return nil, "", false, err
		}
		return shard, shard.Options().Addr, false, nil
	}
	return rdb, "", false, nil
}

// due reports whether n's replicas should be counted again, and if so
// records that they are being counted now.
func (w *replicaWait) due(n *nodeReplicas) bool {
	if now := w.now().UnixNano(); w.acks == 0 && (!n.known.Load() || now-n.checked.Load() > int64(roleEvery)) {
		n.checked.Store(now)
		return true
	}
	return false
}

// probe learns n's replicas with an INFO of its own: before the first
// write (without it, the first writes after start would not wait), and
// on a Cluster, where the script goes through the cluster client (for its
// redirections) when there is nothing to wait for.
func (w *replicaWait) probe(ctx context.Context, target pipeliner, n *nodeReplicas) {
	info := newReplicationInfo(ctx)
	pipe := target.Pipeline()
	_ = pipe.Process(ctx, info)
	_, _ = pipe.Exec(ctx)
	now := w.now()
	n.checked.Store(now.UnixNano()) // counted as of the reply: not due again at once
	n.learn(info, now)
	if err := info.Err(); err == nil || !isInfraError(err) {
		n.known.Store(true) // an INFO refused (ACL) is asked again each roleEvery too
	}
}

// prime runs the probe that run would run first, so that a caller that
// times its command (ACQUIRE: the lease's validity counts from when it
// was sent) can start the clock after it.
func (w *replicaWait) prime(ctx context.Context, rdb redis.UniversalClient, route string) {
	if w.acks != 0 {
		return
	}
	target, addr, _, err := pipelineTarget(ctx, rdb, route)
	if err != nil {
		return
	}
	if n := w.node(addr); w.due(n) {
		w.probe(ctx, target, n)
	}
}

func newReplicationInfo(ctx context.Context) *redis.StringCmd {
	return redis.NewStringCmd(ctx, "INFO", "replication")
}

func isRedirect(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ") || strings.HasPrefix(msg, "TRYAGAIN")
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// fitReadTimeout makes the WAIT end well before the client's ReadTimeout:
// otherwise go-redis gives up reading its reply and fails every command of
// the pipeline, the script that ran included. A ReplicaTimeout at or above
// the ReadTimeout panics; one above half of it is cut to that half.
func (w *replicaWait) fitReadTimeout(rdb redis.UniversalClient) {
	var rt time.Duration
	switch c := rdb.(type) {
	case *redis.Client:
		rt = c.Options().ReadTimeout
	case *redis.ClusterClient:
		rt = c.Options().ReadTimeout
	case *redis.Ring:
		rt = c.Options().ReadTimeout
	}
	if w.acks < 0 || rt <= 0 {
		return
	}
	if w.explicit && w.timeout >= rt {
		panic(fmt.Sprintf("herd: %s.ReplicaTimeout %v is not below the client's ReadTimeout %v: the reply of the WAIT would time out and fail the write before it", w.owner, w.timeout, rt))
	}
	// Leave half the ReadTimeout for the round trip and the script.
	w.timeout = max(min(w.timeout, rt/2), time.Millisecond)
}

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
