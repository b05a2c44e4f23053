// Package pubsub is herd's notifier: it multiplexes every wake-up channel
// a Locker or Cache listens to over a few Redis pub/sub connections,
// started on first use and stopped by Close:
//
//   - a single server, a failover client, or a cluster without sharded
//     pub/sub: one connection, with plain SUBSCRIBE (PUBLISH in the
//     scripts);
//   - a Redis Cluster of version 7 or later (one node answers COMMAND
//     INFO SPUBLISH; 6.2 answers nil and takes the case above): one
//     connection per master, with sharded pub/sub (SSUBSCRIBE,
//     SPUBLISH), so a message travels only to the master that owns the
//     key's slot;
//   - a *redis.Ring: one connection per shard, with plain SUBSCRIBE. The
//     channel carries the key's hash tag, so the Ring sends the scripts
//     and the subscription to the same shard, and the scripts' PUBLISH
//     reaches it.
//
// Subscriptions are reference-counted per channel. Callers only register
// and unregister (under mu, no pub/sub I/O; the cluster's one-time
// SPUBLISH probe runs in its own goroutine); one worker goroutine per
// connection sends the SUBSCRIBE and UNSUBSCRIBE commands, reconciling what is wanted
// with what it has sent. So a subscribe waits for the network only as long
// as its caller's ctx allows, a release never waits for it, and an
// UNSUBSCRIBE can never overtake a newer SUBSCRIBE of the same channel.
//
// Reconnects. go-redis re-dials a dropped pub/sub connection and re-sends
// every channel of the PubSub in one command. With plain pub/sub that
// works. With sharded pub/sub it does not: one master's connection
// carries channels of many slots, and the server rejects an SSUBSCRIBE
// whose channels span slots (CROSSSLOT), which left every subscription of
// that master dead after any disconnect (a killed connection, a server
// restart, the pub/sub output-buffer limit). So herd runs its own receive
// loop instead of go-redis's Channel: every connection error it sees (and
// a CROSSSLOT reply, the mark of go-redis's failed resubscription) makes
// the worker send the connection's channels again, one SSUBSCRIBE per
// channel, which can never span slots. Each confirmation wakes that
// channel's subscribers, so they re-check whatever a message lost during
// the outage would have told them.
//
// Why not one connection per slot in use: a follow of a cold key would
// then usually dial a new connection (16384 slots, a few in use at a
// time), and a busy process would hold one connection per awaited key.
// Re-sending channels after a reconnect costs one command per channel,
// only after a disconnect; the common path stays one SSUBSCRIBE on a
// connection that already exists.
//
// go-redis routes a sharded PubSub by the first channel it knows of, so
// a master's connection never gives up its last channel: it stays
// subscribed (messages for it are dropped) until another channel is
// subscribed, and a reconnect of an idle connection still lands on the
// right master. A slot that migrates to another master takes its
// channels with it: the old master ends them, and their subscribers rely
// on polling until the keys are next subscribed by a new waiter.
//
// A subscriber never depends on the notifier alone: it also polls, so a
// lost message, a dead connection or a slow reconnect costs latency, never
// liveness.
//
// The package knows nothing of what a message means (herd's message kinds
// and how a Cache or a Locker reads them are herd's) and has no dependency
// on herd: the herd package itself uses it.
package pubsub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/herdkit/herd/internal/lease"
	"github.com/redis/go-redis/v9"
)

// Health check of an idle pub/sub connection: after pingIdle without any
// message the receiver sends a PING, and a connection that then stays
// silent for pingTimeout is dropped and dialled again.
const (
	pingIdle    = 3 * time.Second
	pingTimeout = 5 * time.Second
)

// Notifier is the pub/sub connections of one client (see the package
// doc). Its zero value is not usable: call New.
type Notifier struct {
	rdb       redis.UniversalClient
	errClosed error                // returned after Close: the caller's own error
	cluster   *redis.ClusterClient // nil unless rdb is a cluster client
	ring      *redis.Ring          // nil unless rdb is a Ring

	// ctx bounds every command the Notifier's goroutines send; Close
	// cancels it. wg counts those goroutines.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex // guards everything below and the psConns' shared fields
	closed   bool
	probed   bool // the sharded question is settled
	sharded  bool
	probing  *probe // the probe in progress, if any
	conns    map[string]*psConn
	topics   map[string]*topic
	closeErr error
}

// probe is one run of the sharded-pub/sub question.
type probe struct {
	done    chan struct{}
	sharded bool
	err     error
}

// psConn is one pub/sub connection: its worker, which sends the commands,
// and its receiver, which reads and dispatches.
type psConn struct {
	n       *Notifier
	sharded bool
	newPS   func() *redis.PubSub
	kick    chan struct{} // capacity 1: the worker has something to look at

	// Owned by the worker goroutine.
	ps        *redis.PubSub
	receiving bool

	// Under n.mu.
	topics  map[string]*topic     // the channels wanted now
	chans   map[string]*chanState // the channels in the PubSub's own set
	gen     uint64                // incremented when the connection was lost
	failing error                 // the last error, while the worker backs off after it
	// lostSince is set by lost and cleared by the next confirmation: a
	// CROSSSLOT reply meanwhile is the failed resubscription of the very
	// reconnect that lost already handled.
	lostSince bool
}

// chanState is what herd knows about one channel of a connection.
type chanState struct {
	busy      bool // the worker is sending a command for it
	sent      bool // subscribed on the current connection, as far as herd knows
	confirmed bool // the server confirmed it on the current connection
}

type topic struct {
	refs    int
	conn    *psConn
	subs    map[*Subscription]struct{}
	settled chan struct{} // closed once the worker has tried to subscribe
	err     error         // the outcome of that try; set before settled is closed
}

// settle records the outcome of the channel's first SUBSCRIBE. Under n.mu.
func (t *topic) settle(err error) {
	select {
	case <-t.settled:
	default:
		t.err = err
		close(t.settled)
	}
}

// notice is what a subscriber is woken with: a published message, or
// (resub set) the confirmation that the channel is (again) subscribed.
type Notice struct {
	Payload string
	Resub   bool
}

// subscription is one subscriber's view of a channel. C holds at most one
// pending notice; a newer notice replaces an unread older one.
type Subscription struct {
	n       *Notifier
	t       *topic
	channel string
	C       chan Notice
	// ping, if not nil, is also sent to, without blocking, on every
	// notice: one channel that several notifiers' subscriptions share
	// (a Redlock waiter's, one per master). Capacity 1 coalesces them.
	ping chan<- struct{}
	once sync.Once
}

// New returns the Notifier of rdb. It dials nothing until the first
// subscription. errClosed is what Subscribe, Listen and IsSharded return
// once Close has been called (herd passes its ErrClosed).
func New(rdb redis.UniversalClient, errClosed error) *Notifier {
	n := &Notifier{rdb: rdb, errClosed: errClosed, conns: make(map[string]*psConn), topics: make(map[string]*topic)}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.cluster, _ = rdb.(*redis.ClusterClient)
	n.ring, _ = rdb.(*redis.Ring)
	return n
}

// IsSharded reports whether sharded pub/sub is in use, waiting for the
// answer at most until ctx ends. Only a cluster client asks the server
// (once it answers); every process that shares the cluster gets the same
// answer, so publishers and subscribers agree. err is non-nil while the
// question is undecided.
func (n *Notifier) IsSharded(ctx context.Context) (bool, error) {
	if n.cluster == nil {
		return false, nil
	}
	n.mu.Lock()
	if n.probed {
		s := n.sharded
		n.mu.Unlock()
		return s, nil
	}
	if n.closed {
		n.mu.Unlock()
		return false, n.errClosed
	}
	p := n.probing
	if p == nil {
		p = &probe{done: make(chan struct{})}
		n.probing = p
		n.wg.Add(1)
		go n.runProbe(p)
	}
	n.mu.Unlock()
	select {
	case <-p.done:
		return p.sharded, p.err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// runProbe asks the cluster whether it knows SPUBLISH. It runs in its own
// goroutine so that no caller waits for it longer than its ctx allows.
func (n *Notifier) runProbe(p *probe) {
	defer n.wg.Done()
	res, err := n.cluster.Do(n.ctx, "COMMAND", "INFO", "SPUBLISH").Slice()
	n.mu.Lock()
	if err == nil {
		n.probed, n.sharded = true, len(res) == 1 && res[0] != nil
		p.sharded = n.sharded
	} else {
		p.err = fmt.Errorf("herd: pub/sub: ask the cluster for SPUBLISH: %w", err)
	}
	n.probing = nil
	n.mu.Unlock()
	close(p.done)
}

// PublishCmd is the command the scripts publish with. While the sharded
// question is undecided (and ctx ends first) it is PUBLISH.
func (n *Notifier) PublishCmd(ctx context.Context) string {
	if s, _ := n.IsSharded(ctx); s {
		return "SPUBLISH"
	}
	return "PUBLISH"
}

// route returns the connection a channel belongs to: its key in n.conns,
// whether it uses sharded pub/sub, and how to create its PubSub.
func (n *Notifier) route(ctx context.Context, channel string) (key string, sharded bool, newPS func() *redis.PubSub, err error) {
	if n.ring != nil {
		shard, err := n.ring.GetShardClientForKey(channel)
		if err != nil {
			return "", false, nil, fmt.Errorf("herd: pub/sub: ring shard for %q: %w", channel, err)
		}
		return "ring " + shard.Options().Addr, false, func() *redis.PubSub { return shard.Subscribe(context.Background()) }, nil
	}
	sharded, err = n.IsSharded(ctx)
	if err != nil {
		return "", false, nil, err
	}
	if !sharded {
		return "", false, func() *redis.PubSub { return n.rdb.Subscribe(context.Background()) }, nil
	}
	master, err := n.cluster.MasterForKey(ctx, channel)
	if err != nil {
		return "", false, nil, fmt.Errorf("herd: pub/sub: master for %q: %w", channel, err)
	}
	// SSubscribe without channels creates the PubSub without dialling;
	// the first SSUBSCRIBE then connects it to the channel's master.
	return master.Options().Addr, true, func() *redis.PubSub { return n.cluster.SSubscribe(context.Background()) }, nil
}

// Subscribe registers a subscriber for channel. live reports whether the
// server had already confirmed the channel's subscription, in which case
// every message published from now on reaches C; otherwise the first
// notice on C is the confirmation.
//
// Subscribe waits for the channel's SUBSCRIBE to be sent at most until ctx
// ends; then it unregisters and returns ctx.Err() with a nil subscription.
// Any other error but ErrClosed means the SUBSCRIBE could not be sent: the
// subscription stays registered (it is sent again, and the confirmation
// arrives, once the connection comes back) and the caller should rely on
// polling. With a nil error or such an error, the caller must call
// release when it stops listening.
func (n *Notifier) Subscribe(ctx context.Context, channel string) (sub *Subscription, live bool, err error) {
	sub, live, err = n.register(ctx, channel, nil)
	if err != nil {
		return nil, false, err
	}
	t := sub.t
	select {
	case <-t.settled:
		return sub, live, t.err
	case <-ctx.Done():
		sub.Release()
		return nil, false, ctx.Err()
	case <-n.ctx.Done():
		sub.Release()
		return nil, false, n.errClosed
	}
}

// Listen registers a subscriber for channel as subscribe does, but does
// not wait for the SUBSCRIBE to be sent: it returns as soon as the
// subscription is registered, so a master that is down or stalled never
// holds up the caller (ctx bounds only the routing of a cluster or ring
// client; a *redis.Client needs no I/O for it). Every notice for the
// subscription, the confirmation as well as each message, also sends to
// ping without blocking. live is as for subscribe: when false, the
// confirmation comes as a notice once the server has it (never, while
// the master is unreachable). With a nil error the caller must call
// release when it stops listening.
func (n *Notifier) Listen(ctx context.Context, channel string, ping chan<- struct{}) (sub *Subscription, live bool, err error) {
	return n.register(ctx, channel, ping)
}

// register is the part of subscribe and listen that records the
// subscriber and wakes the worker; it does not wait for the worker.
func (n *Notifier) register(ctx context.Context, channel string, ping chan<- struct{}) (sub *Subscription, live bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	key, sharded, newPS, err := n.route(ctx, channel)
	if err != nil {
		return nil, false, err
	}

	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, false, n.errClosed
	}
	t := n.topics[channel]
	if t == nil {
		c := n.conns[key]
		if c == nil {
			c = &psConn{n: n, sharded: sharded, newPS: newPS, kick: make(chan struct{}, 1),
				topics: make(map[string]*topic), chans: make(map[string]*chanState)}
			n.conns[key] = c
			n.wg.Add(1)
			go c.work()
		}
		t = &topic{conn: c, subs: make(map[*Subscription]struct{}), settled: make(chan struct{})}
		n.topics[channel] = t
		c.topics[channel] = t
		switch st := c.chans[channel]; {
		case st != nil && st.sent && !st.busy:
			t.settle(nil) // still subscribed from an earlier topic
		case c.failing != nil:
			// The worker is backing off after an error: do not wait for
			// its next try (it subscribes the channel then).
			t.settle(c.failing)
		default:
			c.poke()
		}
	}
	t.refs++
	sub = &Subscription{n: n, t: t, channel: channel, C: make(chan Notice, 1), ping: ping}
	t.subs[sub] = struct{}{}
	if st := t.conn.chans[channel]; st != nil && st.confirmed && !st.busy {
		live = true
	}
	return sub, live, nil
}

// Release ends the subscription. It is safe to call more than once, and
// never waits for Redis.
func (s *Subscription) Release() {
	s.once.Do(func() { s.n.release(s) })
}

func (n *Notifier) release(s *Subscription) {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := s.t
	delete(t.subs, s)
	t.refs--
	if t.refs > 0 {
		return
	}
	if n.topics[s.channel] == t {
		delete(n.topics, s.channel)
	}
	if t.conn.topics[s.channel] == t {
		delete(t.conn.topics, s.channel)
	}
	t.conn.poke() // the worker sends the UNSUBSCRIBE
}

// poke wakes the worker without blocking.
func (c *psConn) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// work is the connection's worker: it sends SUBSCRIBE and UNSUBSCRIBE
// until what the server has matches what is wanted, and retries with
// backoff after an error. It closes the PubSub when the notifier closes.
func (c *psConn) work() {
	n := c.n
	defer n.wg.Done()
	defer func() {
		if c.ps == nil {
			return
		}
		if err := c.ps.Close(); err != nil {
			n.mu.Lock()
			if n.closeErr == nil {
				n.closeErr = err
			}
			n.mu.Unlock()
		}
	}()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	backoff := time.Duration(0)
	for {
		if backoff > 0 {
			// Kicks wait for the retry: a dead server is not hammered.
			select {
			case <-n.ctx.Done():
				return
			case <-retry.C:
			}
			n.mu.Lock()
			c.failing = nil
			n.mu.Unlock()
		} else {
			select {
			case <-n.ctx.Done():
				return
			case <-c.kick:
			}
		}
		for {
			more, err := c.pass()
			if n.ctx.Err() != nil {
				return
			}
			if err != nil {
				n.mu.Lock()
				c.failing = err
				n.mu.Unlock()
				backoff = min(max(2*backoff, 50*time.Millisecond), 2*time.Second)
				retry.Reset(lease.Jitter(backoff))
				break
			}
			backoff = 0
			if !more {
				break
			}
		}
	}
}

// pass sends one round of commands. more reports whether it sent any (so
// another pass may find more to do).
func (c *psConn) pass() (more bool, err error) {
	n := c.n
	n.mu.Lock()
	var subs, unsubs []string
	for ch := range c.topics {
		if st := c.chans[ch]; st == nil || !st.sent {
			subs = append(subs, ch)
		}
	}
	for ch := range c.chans {
		if c.topics[ch] == nil {
			unsubs = append(unsubs, ch)
		}
	}
	if c.sharded && len(c.topics) == 0 && len(unsubs) > 0 && len(unsubs) == len(c.chans) {
		// Keep one channel: go-redis routes the PubSub's reconnects by it.
		unsubs = unsubs[1:]
	}
	for _, ch := range subs {
		st := c.chans[ch]
		if st == nil {
			st = &chanState{}
			c.chans[ch] = st
		}
		st.busy = true
	}
	for _, ch := range unsubs {
		c.chans[ch].busy = true
	}
	gen := c.gen
	n.mu.Unlock()
	if len(subs) == 0 && len(unsubs) == 0 {
		return false, nil
	}

	if err := c.ensurePS(); err != nil {
		c.settle(subs, gen, err)
		c.settle(unsubs, gen, err)
		return true, err
	}
	ctx := n.ctx
	// SUBSCRIBE first: a failure then leaves unsubs marked for the next
	// pass, and their messages are dropped meanwhile.
	if c.sharded {
		for i, ch := range subs {
			// One channel per SSUBSCRIBE: it can never span slots.
			err = c.ps.SSubscribe(ctx, ch)
			c.startReceiving()
			c.settle(subs[i:i+1], gen, err)
			if err != nil {
				c.settle(subs[i+1:], gen, err)
				c.settle(unsubs, gen, err)
				c.lost()
				return true, err
			}
		}
	} else if len(subs) > 0 {
		err = c.ps.Subscribe(ctx, subs...)
		c.startReceiving()
		c.settle(subs, gen, err)
		if err != nil {
			c.settle(unsubs, gen, err)
			c.lost()
			return true, err
		}
	}
	// go-redis drops a channel from its set before sending UNSUBSCRIBE, so
	// even a failed one is not subscribed again after a reconnect.
	if c.sharded {
		for _, ch := range unsubs {
			if e := c.ps.SUnsubscribe(ctx, ch); e != nil && err == nil {
				err = e
			}
		}
	} else if len(unsubs) > 0 {
		err = c.ps.Unsubscribe(ctx, unsubs...)
	}
	n.mu.Lock()
	for _, ch := range unsubs {
		delete(c.chans, ch)
	}
	n.mu.Unlock()
	if err != nil {
		c.lost()
	}
	return true, nil // an unsent UNSUBSCRIBE is not retried
}

// ensurePS creates the PubSub on first use. A client whose Subscribe
// panics (there should be none) makes every subscription of this
// connection fail instead of the caller's goroutine.
func (c *psConn) ensurePS() (err error) {
	if c.ps != nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("herd: pub/sub: the client cannot subscribe: %v", r)
		}
	}()
	c.ps = c.newPS()
	return nil
}

// settle records the outcome of the commands for chans, sent while the
// connection was in generation gen. Subscribes are settled for their
// current topics; an outcome from an older generation counts as unsent.
func (c *psConn) settle(chans []string, gen uint64, err error) {
	n := c.n
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ch := range chans {
		st := c.chans[ch]
		if st == nil || !st.busy {
			continue
		}
		st.busy = false
		st.sent = err == nil && gen == c.gen
		if t := c.topics[ch]; t != nil {
			t.settle(err)
		}
	}
}

// startReceiving starts the receive loop after the first command, so that
// a sharded PubSub knows a channel to route its connection by.
func (c *psConn) startReceiving() {
	if c.receiving {
		return
	}
	c.receiving = true
	c.n.wg.Add(1)
	go c.receive(c.ps)
}

// lost records that the connection was (or may have been) replaced: no
// channel is confirmed on the new one, and with sharded pub/sub none is
// subscribed either (go-redis's resubscription failed or covered one slot
// only), so the worker sends them again.
func (c *psConn) lost() {
	n := c.n
	n.mu.Lock()
	c.gen++
	c.lostSince = true
	for _, st := range c.chans {
		st.confirmed = false
		if c.sharded {
			st.sent = false
		}
	}
	n.mu.Unlock()
	if c.sharded {
		c.poke()
	}
}

// receive reads the connection until the PubSub is closed, dispatching
// messages and confirmations and noticing reconnects.
func (c *psConn) receive(ps *redis.PubSub) {
	n := c.n
	defer n.wg.Done()
	pinged := false
	failures := 0
	for {
		var msg any
		var err error
		if pinged {
			// A timeout here counts as a dead connection: go-redis
			// closes it and dials again.
			ctx, cancel := context.WithTimeout(n.ctx, pingTimeout)
			msg, err = ps.ReceiveTimeout(ctx, 0)
			cancel()
		} else {
			msg, err = ps.ReceiveTimeout(n.ctx, pingIdle)
		}
		if n.ctx.Err() != nil || errors.Is(err, redis.ErrClosed) {
			return
		}
		if err != nil {
			var nerr net.Error
			var rerr redis.Error
			switch {
			case !pinged && errors.As(err, &nerr) && nerr.Timeout():
				// Idle: check the connection.
				pctx, cancel := context.WithTimeout(n.ctx, pingTimeout)
				perr := ps.Ping(pctx)
				cancel()
				if perr != nil {
					c.lost()
				} else {
					pinged = true
				}
			case errors.As(err, &rerr):
				// An error reply. CROSSSLOT is go-redis's resubscription
				// of several slots' channels after a reconnect; unless an
				// error already told of that reconnect (go-redis also
				// reconnects silently, e.g. on a server's handoff
				// notice), send the channels again.
				if strings.HasPrefix(err.Error(), "CROSSSLOT") {
					n.mu.Lock()
					handled := c.lostSince
					n.mu.Unlock()
					if !handled {
						c.lost()
					}
					continue
				}
				// Another refusal (an ACL without rights on the channel, a
				// MOVED from a stale slot map): a SUBSCRIBE that will never
				// be confirmed, of a channel the reply does not name. Every
				// subscriber of the connection looks now, rather than at
				// its first poll.
				c.wakeAll()
			default:
				pinged = false
				c.lost()
				failures++
				if failures > 1 {
					select {
					case <-n.ctx.Done():
						return
					case <-time.After(lease.Jitter(min(time.Duration(failures)*50*time.Millisecond, time.Second))):
					}
				}
			}
			continue
		}
		failures, pinged = 0, false
		switch m := msg.(type) {
		case *redis.Message:
			c.deliver(m.Channel, Notice{Payload: m.Payload}, false)
		case *redis.Subscription:
			if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
				c.deliver(m.Channel, Notice{Resub: true}, true)
			}
		}
	}
}

// wakeAll sends a look notice (Resub, not a confirmation) to every
// subscriber of the connection's channels.
func (c *psConn) wakeAll() {
	n := c.n
	n.mu.Lock()
	chans := make([]string, 0, len(c.topics))
	for ch := range c.topics {
		chans = append(chans, ch)
	}
	n.mu.Unlock()
	for _, ch := range chans {
		c.deliver(ch, Notice{Resub: true}, false)
	}
}

func (c *psConn) deliver(channel string, nt Notice, confirm bool) {
	n := c.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if confirm {
		c.lostSince = false
		if st := c.chans[channel]; st != nil {
			st.confirmed = true
		}
	}
	t := c.topics[channel]
	if t == nil {
		return
	}
	for s := range t.subs {
		select {
		case s.C <- nt:
		default:
			// Replace the unread notice with the newer one. Only deliver
			// sends, under n.mu, so the second send cannot block.
			select {
			case <-s.C:
			default:
			}
			s.C <- nt
		}
		if s.ping != nil {
			select {
			case s.ping <- struct{}{}:
			default:
			}
		}
	}
}

// Close stops the pub/sub connections and waits for the notifier's
// goroutines. Subscriptions still registered are dropped; their owners
// keep polling. A command in flight is cut short where go-redis lets a
// context do that, and otherwise bounded by the client's timeouts.
func (n *Notifier) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	n.cancel()
	n.wg.Wait()
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.closeErr
}

// Channels returns the channels that have a registered subscriber, sorted.
// Tests use it to see what is left registered.
func (n *Notifier) Channels() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	chans := make([]string, 0, len(n.topics))
	for ch := range n.topics {
		chans = append(chans, ch)
	}
	slices.Sort(chans)
	return chans
}

// Settled reports whether every connection of n has sent
// what its subscribers want: each wanted channel subscribed, no channel
// that nobody wants left subscribed (but the one a sharded connection
// keeps for its reconnects), no command in progress and no kick pending.
// A release that wrongly dropped a channel still wanted has then had its
// UNSUBSCRIBE sent. Tests wait for it instead of sleeping.
func (n *Notifier) Settled() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.conns {
		if len(c.kick) > 0 || c.failing != nil {
			return false
		}
		for ch := range c.topics {
			if st := c.chans[ch]; st == nil || !st.sent {
				return false
			}
		}
		unwanted := 0
		for ch, st := range c.chans {
			if st.busy {
				return false
			}
			if c.topics[ch] == nil {
				unwanted++
			}
		}
		if unwanted > 0 && !(c.sharded && len(c.topics) == 0 && unwanted == 1) {
			return false
		}
	}
	return true
}
