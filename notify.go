package herd

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Messages published on a key's channel. The first byte is the kind.
const (
	msgReleased = "R" // the lease was released without a value: look again
	msgValue    = 'V' // followed by the new envelope
	msgWritten  = "W" // a value was written, too large to send: GET it
	msgFailed   = 'F' // followed by a failure kind and the error text
)

// Failure kinds after msgFailed.
const (
	failError     = 'e' // the loader returned an error
	failPanic     = 'p' // the loader panicked
	failNotFound  = 'n' // the loader returned ErrNotFound and negatives are not cached
	failNotShared = 'u' // the value is not for sharing (Fill.Abort with ErrNotShared)
)

// notifier multiplexes every wake-up channel a Locker or Cache listens to
// over one Redis pub/sub connection (one per master with sharded pub/sub
// on a cluster), started on first use and stopped by close. Subscriptions
// are reference-counted per channel: the first subscriber of a channel
// sends SUBSCRIBE, the last one to leave sends UNSUBSCRIBE. go-redis
// re-establishes a connection and its channel set after a network error;
// each (re)subscription confirmation wakes that channel's subscribers, so
// they re-check whatever a message lost during the outage would have told
// them.
//
// On a Redis Cluster of version 7 or later the notifier uses sharded
// pub/sub (SSUBSCRIBE, and SPUBLISH in the scripts), so a message travels
// only to the master that owns the key's slot instead of every node.
//
// A subscriber never depends on the notifier alone: it also polls, so a
// lost message, a dead connection or a slow reconnect costs latency, never
// liveness.
type notifier struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // nil unless rdb is a cluster client

	// cmdMu serialises SUBSCRIBE/UNSUBSCRIBE decisions with the commands
	// themselves, so an UNSUBSCRIBE for a channel that was just released
	// can never overtake the SUBSCRIBE of a newer subscriber.
	cmdMu sync.Mutex

	mu      sync.Mutex // guards everything below
	closed  bool
	probed  bool // the sharded question is settled
	sharded bool
	conns   map[string]*psConn // by master address; "" in plain mode
	topics  map[string]*topic
}

// psConn is one pub/sub connection and its dispatcher.
type psConn struct {
	ready chan struct{} // closed once ps is set and subscribed to its first channel
	ps    *redis.PubSub
	done  chan struct{} // closed when the dispatcher has exited
}

type topic struct {
	refs int
	live bool // the server confirmed the subscription
	conn *psConn
	subs map[*subscription]struct{}
}

// notice is what a subscriber is woken with: a published message, or
// (resub set) the confirmation that the channel is (again) subscribed.
type notice struct {
	payload string
	resub   bool
}

// subscription is one subscriber's view of a channel. C holds at most one
// pending notice; a newer notice replaces an unread older one.
type subscription struct {
	n       *notifier
	channel string
	C       chan notice
	once    sync.Once
}

func newNotifier(rdb redis.UniversalClient) *notifier {
	n := &notifier{rdb: rdb, conns: make(map[string]*psConn), topics: make(map[string]*topic)}
	n.cluster, _ = rdb.(*redis.ClusterClient)
	return n
}

// isSharded reports whether sharded pub/sub is in use. Only a cluster
// client asks the server (once it answers); every process that shares the
// cluster gets the same answer, so publishers and subscribers agree.
func (n *notifier) isSharded(ctx context.Context) bool {
	n.mu.Lock()
	probed, sharded := n.probed || n.cluster == nil, n.sharded
	n.mu.Unlock()
	if probed {
		return sharded
	}
	res, err := n.cluster.Do(ctx, "COMMAND", "INFO", "SPUBLISH").Slice()
	if err != nil {
		return false // undecided: ask again next time
	}
	sharded = len(res) == 1 && res[0] != nil
	n.mu.Lock()
	n.probed, n.sharded = true, sharded
	n.mu.Unlock()
	return sharded
}

// publishCmd is the command the scripts publish with.
func (n *notifier) publishCmd(ctx context.Context) string {
	if n.isSharded(ctx) {
		return "SPUBLISH"
	}
	return "PUBLISH"
}

// subscribe registers a subscriber for channel. live reports whether the
// server had already confirmed the channel's subscription, in which case
// every message published from now on reaches C; otherwise the first
// notice on C is the confirmation. A non-nil error other than ErrClosed
// means the SUBSCRIBE could not be sent: the subscription stays registered
// (go-redis sends it when the connection comes back) and the caller
// should rely on polling. The caller must call release when it stops
// listening.
func (n *notifier) subscribe(ctx context.Context, channel string) (sub *subscription, live bool, err error) {
	sharded := n.isSharded(ctx)
	addr := ""
	if sharded {
		master, err := n.cluster.MasterForKey(ctx, channel)
		if err != nil {
			return nil, false, err
		}
		addr = master.Options().Addr
	}

	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, false, ErrClosed
	}
	t := n.topics[channel]
	creating := false
	if t == nil {
		conn := n.conns[addr]
		if conn == nil {
			conn = &psConn{ready: make(chan struct{}), done: make(chan struct{})}
			n.conns[addr] = conn
			creating = true
		}
		t = &topic{conn: conn, subs: make(map[*subscription]struct{})}
		n.topics[channel] = t
	}
	t.refs++
	sub = &subscription{n: n, channel: channel, C: make(chan notice, 1)}
	t.subs[sub] = struct{}{}
	first, live, conn := t.refs == 1, t.live, t.conn
	n.mu.Unlock()

	if first {
		if !creating {
			// Wait for the connection's creator outside cmdMu, which the
			// creator needs to dial (bounded by the client's timeouts).
			<-conn.ready
		}
		n.cmdMu.Lock()
		if creating {
			err = n.dial(ctx, conn, sharded, channel)
		} else {
			err = subscribeTo(ctx, conn.ps, sharded, channel)
		}
		n.cmdMu.Unlock()
	}
	return sub, live, err
}

// dial creates conn's pub/sub connection, subscribed to its first channel,
// and then starts its dispatcher. The subscription must come first: with
// sharded pub/sub go-redis connects to the master of the first channel's
// slot, whereas a dispatcher that started receiving on an empty PubSub
// would connect it to a random node.
func (n *notifier) dial(ctx context.Context, conn *psConn, sharded bool, channel string) error {
	if sharded {
		conn.ps = n.cluster.SSubscribe(context.Background())
	} else {
		conn.ps = n.rdb.Subscribe(context.Background())
	}
	// On error go-redis keeps the channel and subscribes it when the
	// connection comes back.
	err := subscribeTo(ctx, conn.ps, sharded, channel)
	go n.dispatch(conn.ps.ChannelWithSubscriptions(redis.WithChannelSize(256)), conn.done)
	close(conn.ready)
	return err
}

func subscribeTo(ctx context.Context, ps *redis.PubSub, sharded bool, channel string) error {
	if sharded {
		return ps.SSubscribe(ctx, channel)
	}
	return ps.Subscribe(ctx, channel)
}

// release ends the subscription. It is safe to call more than once.
func (s *subscription) release() {
	s.once.Do(func() { s.n.release(s) })
}

func (n *notifier) release(s *subscription) {
	n.mu.Lock()
	t := n.topics[s.channel]
	if t == nil {
		n.mu.Unlock()
		return
	}
	delete(t.subs, s)
	t.refs--
	last := t.refs == 0
	if last {
		delete(n.topics, s.channel)
	}
	sharded := n.sharded
	n.mu.Unlock()
	if !last {
		return
	}

	n.cmdMu.Lock()
	defer n.cmdMu.Unlock()
	n.mu.Lock()
	resubscribed := n.topics[s.channel] != nil || n.closed
	n.mu.Unlock()
	if resubscribed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// An error leaves an idle channel subscribed until the next reconnect;
	// its messages find no subscriber and are dropped.
	if sharded {
		_ = t.conn.ps.SUnsubscribe(ctx, s.channel)
	} else {
		_ = t.conn.ps.Unsubscribe(ctx, s.channel)
	}
}

// dispatch fans messages out to the subscribers of their channel until the
// PubSub is closed.
func (n *notifier) dispatch(in <-chan any, done chan struct{}) {
	defer close(done)
	for m := range in {
		switch m := m.(type) {
		case *redis.Message:
			n.deliver(m.Channel, notice{payload: m.Payload}, false)
		case *redis.Subscription:
			if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
				n.deliver(m.Channel, notice{resub: true}, true)
			}
		}
	}
}

func (n *notifier) deliver(channel string, nt notice, confirm bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.topics[channel]
	if t == nil {
		return
	}
	if confirm {
		t.live = true
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
	}
}

// close stops the pub/sub connections and waits for their dispatchers.
// Subscriptions still registered are dropped; their owners keep polling.
func (n *notifier) close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	conns := n.conns
	n.conns = nil
	n.mu.Unlock()
	var first error
	for _, c := range conns {
		<-c.ready
		if err := c.ps.Close(); err != nil && first == nil {
			first = err
		}
		<-c.done
	}
	return first
}
