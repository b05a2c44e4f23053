package herd

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// notifier multiplexes every wake-up channel a Locker (or Cache) listens to
// over one Redis pub/sub connection, started on first use and stopped by
// close. Subscriptions are reference-counted per channel: the first
// subscriber of a channel sends SUBSCRIBE, the last one to leave sends
// UNSUBSCRIBE. go-redis re-establishes the connection and its channel set
// after a network error; each (re)subscription confirmation wakes that
// channel's subscribers, so they re-check whatever a message lost during
// the outage would have told them.
//
// A subscriber never depends on the notifier alone: it also polls, so a
// lost message, a dead connection or a slow reconnect costs latency, never
// liveness.
type notifier struct {
	rdb redis.UniversalClient

	// cmdMu serialises SUBSCRIBE/UNSUBSCRIBE decisions with the commands
	// themselves, so an UNSUBSCRIBE for a channel that was just released
	// can never overtake the SUBSCRIBE of a newer subscriber.
	cmdMu sync.Mutex

	mu     sync.Mutex // guards everything below
	ps     *redis.PubSub
	done   chan struct{} // closed when the dispatcher has exited
	closed bool
	topics map[string]*topic
}

type topic struct {
	refs int
	live bool // the server confirmed the subscription
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
	return &notifier{rdb: rdb, topics: make(map[string]*topic)}
}

// subscribe registers a subscriber for channel. live reports whether the
// server had already confirmed the channel's subscription, in which case
// every message published from now on reaches C; otherwise the first
// notice on C is the confirmation. A non-nil error means the SUBSCRIBE
// could not be sent: the subscription stays registered (go-redis sends it
// when the connection comes back) and the caller should rely on polling.
// The caller must call release exactly when it stops listening.
func (n *notifier) subscribe(ctx context.Context, channel string) (sub *subscription, live bool, err error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, false, ErrClosed
	}
	if n.ps == nil {
		n.ps = n.rdb.Subscribe(context.WithoutCancel(ctx))
		n.done = make(chan struct{})
		go n.dispatch(n.ps.ChannelWithSubscriptions(redis.WithChannelSize(256)), n.done)
	}
	t := n.topics[channel]
	if t == nil {
		t = &topic{subs: make(map[*subscription]struct{})}
		n.topics[channel] = t
	}
	t.refs++
	sub = &subscription{n: n, channel: channel, C: make(chan notice, 1)}
	t.subs[sub] = struct{}{}
	first, live, ps := t.refs == 1, t.live, n.ps
	n.mu.Unlock()

	if first {
		n.cmdMu.Lock()
		err = ps.Subscribe(ctx, channel)
		n.cmdMu.Unlock()
	}
	return sub, live, err
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
	ps := n.ps
	n.mu.Unlock()
	if !last || ps == nil {
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
	_ = ps.Unsubscribe(ctx, s.channel)
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
			if m.Kind == "subscribe" {
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
			// Replace the unread notice with the newer one.
			select {
			case <-s.C:
			default:
			}
			s.C <- nt
		}
	}
}

// close stops the pub/sub connection and waits for the dispatcher.
// Subscriptions still registered are dropped; their owners keep polling.
func (n *notifier) close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	ps, done := n.ps, n.done
	n.mu.Unlock()
	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-done
	return err
}
