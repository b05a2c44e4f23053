package zookeeper

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/lease"
	"github.com/herdkit/herd/internal/lockgate"
	"github.com/herdkit/herd/internal/lockopt"
)

// Options configures a [Locker]. A nil *Options, and every zero field,
// means the documented default. Invalid values make [New] panic: they are
// programming errors, not request-time conditions.
type Options struct {
	// Root is the znode under which each lock name has its parent node
	// (a container node, which the server deletes some time after its
	// last child is gone). Lockers that share a root share their locks.
	// Default: "/herd/lock".
	Root string

	// ACL is the ACL of the nodes the Locker creates. Default:
	// zk.WorldACL(zk.PermAll).
	ACL []zk.ACL

	// MaxWait bounds how long [Locker.Acquire] waits for a held lock, on
	// top of the caller's context. Default: three times the lease length.
	MaxWait time.Duration

	// Recheck is the fallback re-check of a waiting Acquire: it looks at
	// the lock's queue again after about this long (with jitter) without
	// a watch event. The watch on its predecessor's node is what wakes it;
	// the re-check covers a watch that was lost. Default: 1s.
	Recheck time.Duration

	// IdleSessions is how many established sessions without a lock the
	// Locker keeps for later attempts with the same lease length (a
	// session's timeout is the lease length, fixed when it is opened).
	// Default: 2.
	IdleSessions int

	// Dialer opens the TCP connections to the servers. Default:
	// net.DialTimeout.
	Dialer zk.Dialer

	// Logger receives the messages of the ZooKeeper client library (a
	// failed dial, a connection that ended), at level Info. Default: none.
	Logger *slog.Logger
}

// config is Options with every default applied.
type config struct {
	root    string
	acl     []zk.ACL
	maxWait time.Duration
	recheck time.Duration
	idle    int
}

func (o *Options) resolve() (config, zk.Dialer, *slog.Logger) {
	var in Options
	if o != nil {
		in = *o
	}
	c := config{root: "/herd/lock", acl: zk.WorldACL(zk.PermAll), maxWait: in.MaxWait, recheck: time.Second, idle: 2}
	if in.Root != "" {
		c.root = strings.TrimRight(in.Root, "/")
		if !strings.HasPrefix(c.root, "/") || c.root == "" || path.Clean(c.root) != c.root {
			panic(fmt.Sprintf("zookeeper: Options.Root %q is not an absolute, clean znode path", in.Root))
		}
	}
	if in.ACL != nil {
		c.acl = in.ACL
	}
	lockopt.NonNegative("zookeeper", map[string]time.Duration{"MaxWait": in.MaxWait, "Recheck": in.Recheck})
	if in.Recheck > 0 {
		c.recheck = in.Recheck
	}
	c.idle = lockopt.Count("zookeeper", "IdleSessions", in.IdleSessions, c.idle)
	dialer := in.Dialer
	if dialer == nil {
		dialer = net.DialTimeout
	}
	return c, dialer, in.Logger
}

// The lease lengths a Locker accepts before asking the server: at least
// 10ms (1% + 2ms of every lease is the clock-drift allowance) and at most
// what a session timeout can carry (2^31−1 ms). The server narrows it to
// its own range, minSessionTimeout to maxSessionTimeout.
const (
	minLease = 10 * time.Millisecond
	maxLease = (1<<31 - 1) * time.Millisecond
)

// ttls checks a lease length against them.
var ttls = lockopt.TTLRange{Min: minLease, Max: maxLease, Lease: "a ZooKeeper lease", Why: ", and within the server's session timeouts"}

// Locker is a lock in ZooKeeper, the lock recipe of ZooKeeper's
// documentation: each attempt creates an ephemeral sequential node under
// the lock name's parent node, the lowest node holds the lock, and each
// waiter watches only the node just before its own. It implements
// [herd.Lock] with leases of type *[Lease].
//
// Each attempt, and the lease it turns into, has a ZooKeeper session of
// its own, opened with the lease length as its session timeout, so that
// the server ends the session of a holder that stops talking to it for
// the lease length, and deletes its node, which frees the lock. The
// server must accept that timeout: see the package documentation.
//
// A Locker is safe for concurrent use. Call [Locker.Close] when done.
type Locker struct {
	servers []string
	cfg     config
	dialer  zk.Dialer
	log     zk.Logger

	idleMu sync.Mutex
	idle   []*session // established sessions that hold no node

	rangeMu        sync.Mutex
	minTTL, maxTTL time.Duration // the server's session timeouts, as learned (0: not known)

	rootMu sync.Mutex
	rootOK bool // the root's ancestors exist

	gate lockgate.Gate // the running calls, and Close
}

// New returns a Locker on the ZooKeeper ensemble whose client addresses
// (host:port) are servers. It opens no session until it is used. A nil
// opt means the defaults of [Options]. New panics on an empty server list
// or an invalid option.
func New(servers []string, opt *Options) *Locker {
	if len(servers) == 0 {
		panic("zookeeper: New with no server")
	}
	cfg, dialer, logger := opt.resolve()
	l := &Locker{servers: append([]string(nil), servers...), cfg: cfg, dialer: dialer, log: zkLogger{logger}}
	l.gate.Init()
	return l
}

// zkLogger routes the zk library's messages to a *slog.Logger, or drops
// them.
type zkLogger struct{ l *slog.Logger }

func (z zkLogger) Printf(format string, args ...any) {
	if z.l != nil {
		z.l.Info("zookeeper: " + fmt.Sprintf(format, args...))
	}
}

// Close stops the Locker: TryAcquire and Acquire called after it return
// [herd.ErrClosed], an Acquire still waiting returns it at once (its
// session is closed, which deletes its node), and the idle sessions are
// closed. Leases already handed out are not released by Close: each keeps
// its own session, and its Extend, KeepAlive and Release keep working.
// Close waits for the ZooKeeper client's goroutines of every session it
// closes. It is idempotent.
func (l *Locker) Close() error {
	if !l.gate.Close() {
		return nil
	}
	l.idleMu.Lock()
	idle := l.idle
	l.idle = nil
	l.idleMu.Unlock()
	for _, s := range idle {
		s.close()
	}
	return nil
}

// prepare checks the arguments, and the lease length against the server's
// session timeouts as far as the Locker has learned them.
func (l *Locker) prepare(name string, ttl time.Duration) error {
	if err := ttls.Prepare(name, ttl); err != nil {
		return err
	}
	if ttl%time.Millisecond != 0 {
		return fmt.Errorf("%w: %v (a ZooKeeper session timeout is a whole number of milliseconds)", herd.ErrInvalidTTL, ttl)
	}
	l.rangeMu.Lock()
	lo, hi := l.minTTL, l.maxTTL
	l.rangeMu.Unlock()
	if (lo > 0 && ttl < lo) || (hi > 0 && ttl > hi) {
		return l.rangeErr(ttl, 0)
	}
	return nil
}

// rangeErr is the ErrInvalidTTL of a lease length outside the server's
// session timeouts; got is what the server negotiated, or 0.
func (l *Locker) rangeErr(ttl, got time.Duration) error {
	l.rangeMu.Lock()
	lo, hi := l.minTTL, l.maxTTL
	l.rangeMu.Unlock()
	bound := "from " + durOr(lo, "minSessionTimeout") + " to " + durOr(hi, "maxSessionTimeout")
	msg := fmt.Sprintf("%v: the ZooKeeper server accepts session timeouts %s (2 and 20 ticks by default)", ttl, bound)
	if got > 0 {
		msg += fmt.Sprintf("; it offered %v", got)
	}
	return fmt.Errorf("%w: %s", herd.ErrInvalidTTL, msg)
}

func durOr(d time.Duration, name string) string {
	if d == 0 {
		return name
	}
	return d.String()
}

// learn records what a server negotiated for a requested timeout: a
// longer one is its minimum, a shorter one its maximum.
func (l *Locker) learn(asked, got time.Duration) {
	l.rangeMu.Lock()
	defer l.rangeMu.Unlock()
	switch {
	case got > asked:
		l.minTTL = got
	case got < asked:
		l.maxTTL = got
	}
}

// session returns an established session with timeout ttl: an idle one,
// or a new one. A server that negotiates another timeout is ErrInvalidTTL.
func (l *Locker) session(ctx context.Context, ttl time.Duration) (*session, error) {
	l.idleMu.Lock()
	for i := len(l.idle) - 1; i >= 0; i-- {
		s := l.idle[i]
		if s.ttl != ttl {
			continue
		}
		l.idle = append(l.idle[:i], l.idle[i+1:]...)
		l.idleMu.Unlock()
		if _, _, up := s.info(); up {
			return s, nil
		}
		s.close()
		l.idleMu.Lock()
		break
	}
	l.idleMu.Unlock()
	s, err := l.newSession(ttl)
	if err != nil {
		return nil, err
	}
	if err := s.await(ctx); err != nil {
		s.close()
		return nil, err
	}
	if _, got, _ := s.info(); got == 0 {
		s.close()
		return nil, errors.New("the server's connect response carried no session timeout")
	} else if got != ttl {
		s.close()
		l.learn(ttl, got)
		return nil, l.rangeErr(ttl, got)
	}
	return s, nil
}

// putBack keeps s, which holds no node, for a later attempt, or closes it.
func (l *Locker) putBack(s *session) {
	if _, _, up := s.info(); up && l.gate.Root().Err() == nil {
		l.idleMu.Lock()
		if len(l.idle) < l.cfg.idle && l.gate.Root().Err() == nil {
			l.idle = append(l.idle, s)
			l.idleMu.Unlock()
			return
		}
		l.idleMu.Unlock()
	}
	s.close()
}

// parent is the znode whose children queue for the lock on name: the
// root, then the name with every byte outside [A-Za-z0-9_:@=-] written as
// %XX (so a name is one path component, never "." or "..").
func (l *Locker) parent(name string) string {
	var b strings.Builder
	b.WriteString(l.cfg.root)
	b.WriteByte('/')
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("_:@=-", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// TryAcquire takes the lock on name for ttl, or fails at once with an
// error wrapping [herd.ErrLeaseHeld] when another owner holds it: it
// creates its node and, when that is not the lowest in the queue, deletes
// it again. A win takes four round trips on an idle session (create,
// children, exists with a watch on its own node), plus the session's
// connect when the Locker has no idle session with that timeout; the
// first attempt also creates the parent nodes. Any string of 1 to
// [herd.MaxLockKeyBytes] bytes is a valid name ([herd.ErrInvalidKey]
// otherwise, before any request); ttl must be a whole number
// of milliseconds within the server's session timeouts
// ([herd.ErrInvalidTTL], which names the range; the Locker learns it from
// the server's first answer). A server error is returned wrapped, and
// after [Locker.Close] it returns [herd.ErrClosed]. A context that ends
// during the call closes the attempt's session, which deletes its node.
func (l *Locker) TryAcquire(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	return l.acquire(ctx, name, ttl, false)
}

// Acquire takes the lock on name for ttl, waiting while another owner
// holds it. It queues a node of its own and watches only the node just
// before it (no herd effect: a release wakes one waiter), so it is woken
// when that node is deleted, by a release, a lost lease or a session the
// server ended; a bounded re-check ([Options.Recheck]) covers a lost
// watch. The wait is bounded by ctx and by [Options.MaxWait]: when ctx
// ends the error joins [herd.ErrLeaseHeld] and ctx.Err(); when MaxWait
// runs out it wraps [herd.ErrWaitTimeout] and ErrLeaseHeld. Either way
// its session is closed, which deletes its node, before it returns. The
// wait survives a lost connection (zk reconnects within the session
// timeout) and a session the server expired (the attempt queues again at
// the end). Name and ttl are checked as in [Locker.TryAcquire]. After
// [Locker.Close], and when Close ends its wait, it returns
// [herd.ErrClosed]. A wait cut short returns at once, even when the
// server does not answer; the closing of its session goes on in the
// background, and Close waits for it.
func (l *Locker) Acquire(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	return l.acquire(ctx, name, ttl, true)
}

func (l *Locker) acquire(ctx context.Context, name string, ttl time.Duration, wait bool) (*Lease, error) {
	if err := l.gate.Enter(); err != nil {
		return nil, err
	}
	defer l.gate.Leave()
	if err := l.prepare(name, ttl); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("herd: acquire %q: %w", name, err)
	}
	start := time.Now()
	bctx, cancel := l.gate.Bound(ctx)
	defer cancel()
	// The attempt runs in a goroutine of its own, so that the call
	// returns as soon as ctx ends (or Close is called) even when the
	// server does not answer: zk's requests, and the closing of a
	// session, wait for the connection until zk gives it up (two thirds
	// of the session timeout). That goroutine finishes the attempt in the
	// background, and Close waits for it.
	type result struct {
		lease *Lease
		err   error
	}
	done := make(chan result, 1)
	l.gate.Go(func() { // within this call: Close waits for it
		lease, err := l.try(bctx, name, ttl, wait, start)
		done <- result{lease, err}
	})
	select {
	case r := <-done:
		return r.lease, l.acquireErr(ctx, name, r.err)
	case <-bctx.Done():
	}
	select {
	case r := <-done:
		if r.lease == nil {
			return nil, l.acquireErr(ctx, name, r.err)
		}
		r.lease.abandon() // won as the wait was cut short
	default:
		l.gate.Go(func() {
			if r := <-done; r.lease != nil {
				r.lease.abandon()
			}
		})
	}
	return nil, l.acquireErr(ctx, name, context.Cause(bctx))
}

// try runs one TryAcquire or Acquire on a session of its own.
func (l *Locker) try(bctx context.Context, name string, ttl time.Duration, wait bool, start time.Time) (*Lease, error) {
	s, err := l.session(bctx, ttl)
	if err != nil {
		return nil, err
	}
	// A context that ends, or Close, closes the session: a request in
	// flight fails once zk's connection ends, and the server deletes the
	// node.
	stop := context.AfterFunc(bctx, s.close)
	a := &attempt{l: l, s: s, name: name, parent: l.parent(name), ttl: ttl, start: start}
	lease, err := a.run(bctx, wait)
	if !stop() || err != nil {
		if err == nil {
			err = context.Cause(bctx) // it ended as the attempt won
		}
		if lease != nil {
			lease.abandon()
			lease = nil
		}
		a.give(err)
		return nil, err
	}
	return lease, nil
}

// acquireErr maps an attempt's error for the caller: the context's end
// (joined with ErrLeaseHeld, as a wait cut short), or Close's.
func (l *Locker) acquireErr(ctx context.Context, name string, err error) error {
	if err == nil {
		return nil
	}
	if e := l.gate.Ended(ctx, name); e != nil {
		return e
	}
	if errors.Is(err, herd.ErrLeaseHeld) || errors.Is(err, herd.ErrInvalidTTL) || errors.Is(err, herd.ErrWaitTimeout) {
		return err
	}
	return fmt.Errorf("herd: acquire %q: %w", name, err)
}

// attempt is one TryAcquire or Acquire: its session and its node.
type attempt struct {
	l      *Locker
	s      *session
	name   string
	parent string
	ttl    time.Duration
	node   string    // the full path of its node, "" before it is created
	start  time.Time // the lease starts no later: see run
	mark   string    // the _c_<guid>- prefix of its node's name
	unsure bool      // a create's outcome is unknown: look for mark first
}

// give ends an attempt that did not win: it deletes the node and keeps
// the session, or closes the session (which deletes the node too) when
// the session cannot be trusted any more.
func (a *attempt) give(err error) {
	if errors.Is(err, herd.ErrLeaseHeld) && !errors.Is(err, herd.ErrWaitTimeout) && a.l.gate.Root().Err() == nil {
		if _, _, up := a.s.info(); up && a.node != "" {
			if derr := a.s.conn.Delete(a.node, -1); derr == nil || errors.Is(derr, zk.ErrNoNode) {
				a.l.putBack(a.s)
				return
			}
		}
	}
	a.s.close()
}

// run creates the node and then, in a loop, looks at the queue: the
// lowest node wins; otherwise TryAcquire fails, and Acquire watches its
// predecessor and waits.
func (a *attempt) run(ctx context.Context, wait bool) (*Lease, error) {
	var limit <-chan time.Time
	if wait {
		maxWait := a.l.cfg.maxWait
		if maxWait == 0 {
			maxWait = 3 * a.ttl
		}
		t := time.NewTimer(maxWait)
		defer t.Stop()
		limit = t.C
	}
	recheck := time.NewTimer(time.Hour)
	defer recheck.Stop()
	// pause waits for ev, a change of the session's state, the re-check,
	// or the end of the wait.
	//
	// The lease's length counts from a.start: the call's start, or, after
	// a pause, the start of the next look at the queue, which comes before
	// the lock can have become this attempt's.
	pause := func(ev <-chan zk.Event) error {
		recheck.Reset(lease.Jitter(a.l.cfg.recheck))
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-limit:
			return fmt.Errorf("%w after %v: %w", herd.ErrWaitTimeout, a.maxWait(), herd.ErrLeaseHeld)
		case <-ev:
		case <-a.s.changes():
		case <-recheck.C:
		}
		a.start = time.Now()
		return nil
	}
	for {
		if a.node == "" {
			if err := a.create(ctx); err != nil {
				if wait && isConnErr(err) {
					if err := pause(nil); err != nil {
						return nil, err
					}
					continue
				}
				return nil, err
			}
		}
		children, _, err := a.s.conn.Children(a.parent)
		if err != nil {
			if wait && isConnErr(err) {
				if err := pause(nil); err != nil {
					return nil, err
				}
				continue
			}
			return nil, fmt.Errorf("list the queue: %w", err)
		}
		pred, found := predecessor(children, path.Base(a.node))
		if !found {
			// The node is gone: the session expired (zk opened a new
			// one), or someone deleted it. Queue again.
			if !wait {
				return nil, fmt.Errorf("the attempt's node %s vanished", a.node)
			}
			a.node = ""
			continue
		}
		if pred == "" {
			lease, err := a.win()
			if err != nil && wait && isConnErr(err) {
				if err := pause(nil); err != nil {
					return nil, err
				}
				continue
			}
			if lease == nil && err == nil {
				continue // the node vanished
			}
			return lease, err
		}
		if !wait {
			return nil, fmt.Errorf("%w: %q", herd.ErrLeaseHeld, a.name)
		}
		ok, _, ev, err := a.s.conn.ExistsW(a.parent + "/" + pred)
		if err != nil {
			if isConnErr(err) {
				if err := pause(nil); err != nil {
					return nil, err
				}
				continue
			}
			return nil, fmt.Errorf("watch %s: %w", pred, err)
		}
		if !ok {
			continue // gone already: look again
		}
		if err := pause(ev); err != nil {
			return nil, err
		}
	}
}

func (a *attempt) maxWait() time.Duration {
	if a.l.cfg.maxWait > 0 {
		return a.l.cfg.maxWait
	}
	return 3 * a.ttl
}

// win turns the lowest node into a lease: an exists with a watch on it
// gives its czxid (the token) and proves the session alive at the server
// after a.start. It returns nil, nil when the node vanished.
func (a *attempt) win() (*Lease, error) {
	ok, stat, ev, err := a.s.conn.ExistsW(a.node)
	if err != nil {
		return nil, err
	}
	id, timeout, _ := a.s.info()
	if !ok || stat.EphemeralOwner != id {
		a.node = ""
		return nil, nil
	}
	if timeout != a.ttl {
		a.l.learn(a.ttl, timeout)
		return nil, a.l.rangeErr(a.ttl, timeout)
	}
	return newLease(a, uint64(stat.Czxid), stat.Version, ev, a.start)
}

// create creates the attempt's node, an ephemeral sequential child of the
// parent named _c_<guid>-lock-<sequence>. When the connection is lost
// before the reply, the server may have created it: the attempt then
// looks for its GUID among the children (the protected-node trick of
// ZooKeeper's recipes) once the session is back, before it creates
// anything, however many tries that takes. A missing parent (the first
// use of the name, or a container the server removed when it was empty)
// is created.
func (a *attempt) create(ctx context.Context) error {
	if a.mark == "" {
		var g [16]byte
		_, _ = cryptorand.Read(g[:])
		a.mark = "_c_" + hex.EncodeToString(g[:]) + "-"
	}
	var err error
	for try := 0; try < 5; try++ {
		if a.unsure {
			if err = a.s.await(ctx); err != nil {
				return err
			}
			children, _, err := a.s.conn.Children(a.parent)
			if err != nil && !errors.Is(err, zk.ErrNoNode) {
				return err // still unsure: the next call looks again
			}
			a.unsure = false
			for _, c := range children {
				if strings.HasPrefix(c, a.mark) {
					a.node = a.parent + "/" + c
					return nil
				}
			}
		}
		var p string
		p, err = a.s.conn.Create(a.parent+"/"+a.mark+"lock-", nil, zk.FlagEphemeral|zk.FlagSequence, a.l.cfg.acl)
		switch {
		case err == nil:
			a.node = p
			return nil
		case errors.Is(err, zk.ErrNoNode):
			if err = a.ensureParent(); err != nil {
				return err
			}
		case errors.Is(err, zk.ErrSessionExpired):
			// The node cannot exist: zk opens a new session.
			if err = a.s.await(ctx); err != nil {
				return err
			}
		case isConnErr(err):
			a.unsure = true
		default:
			return fmt.Errorf("create the lock node: %w", err)
		}
	}
	return fmt.Errorf("create the lock node: %w", err)
}

// ensureParent creates the root's ancestors (persistent nodes, once per
// Locker) and the name's parent (a container node).
func (a *attempt) ensureParent() error {
	a.l.rootMu.Lock()
	ok := a.l.rootOK
	a.l.rootMu.Unlock()
	if !ok {
		p := ""
		for _, part := range strings.Split(strings.TrimPrefix(a.l.cfg.root, "/"), "/") {
			p += "/" + part
			if _, err := a.s.conn.Create(p, nil, zk.FlagPersistent, a.l.cfg.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return fmt.Errorf("create %s: %w", p, err)
			}
		}
		a.l.rootMu.Lock()
		a.l.rootOK = true
		a.l.rootMu.Unlock()
	}
	if _, err := a.s.conn.CreateContainer(a.parent, nil, zk.FlagContainer, a.l.cfg.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		if errors.Is(err, zk.ErrNoNode) { // the root was deleted
			a.l.rootMu.Lock()
			a.l.rootOK = false
			a.l.rootMu.Unlock()
		}
		return fmt.Errorf("create %s: %w", a.parent, err)
	}
	return nil
}

// predecessor finds own among the queue's children and returns the child
// just before it in sequence order ("" when own is the lowest). Children
// not named like a lock node (…-lock-<sequence>) are ignored.
func predecessor(children []string, own string) (pred string, found bool) {
	mine, ok := sequence(own)
	if !ok {
		return "", false
	}
	best := int64(-1)
	for _, c := range children {
		if c == own {
			found = true
			continue
		}
		n, ok := sequence(c)
		if ok && n < mine && n > best {
			best, pred = n, c
		}
	}
	return pred, found
}

// sequence returns the sequence number of a lock node's name.
func sequence(name string) (int64, bool) {
	i := strings.LastIndex(name, "-lock-")
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(name[i+len("-lock-"):], 10, 64)
	return n, err == nil
}

// Locker satisfies herd's lock interface.
var _ herd.Lock[*Lease] = (*Locker)(nil)
