package etcd

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/lease"
	"github.com/herdkit/herd/internal/lockgate"
	"github.com/herdkit/herd/internal/lockopt"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Options configures a [Locker]. A nil *Options, and every zero field,
// means the documented default. Invalid values make [New] panic: they are
// programming errors, not request-time conditions.
type Options struct {
	// Prefix is the etcd key prefix under which the Locker keeps its
	// locks: the lock on name is the range Prefix + escaped name + "/",
	// one key per holder or waiter. Lockers that share locks must share
	// the prefix. Default: "herd/lock/".
	Prefix string

	// MaxWait bounds how long [Locker.Acquire] waits for a held lock, on
	// top of the caller's context. Default: three times the lease length.
	MaxWait time.Duration

	// Recheck is the fallback re-check of a waiting Acquire: every
	// Recheck (with jitter) it looks up its predecessor in the queue
	// again, in case a watch event was missed. A watch that ends with an
	// error is re-established at once, whatever Recheck is. Default: 5s.
	Recheck time.Duration

	// Timeout bounds each request the Locker and its leases send to etcd
	// (the client waits for a connection that is down rather than fail at
	// once), on top of the caller's context. Default: 5s.
	Timeout time.Duration
}

// config is Options with every default applied.
type config struct {
	prefix           string
	maxWait, recheck time.Duration
	timeout          time.Duration
}

func (o *Options) resolve() config {
	var in Options
	if o != nil {
		in = *o
	}
	c := config{prefix: "herd/lock/", maxWait: in.MaxWait, recheck: 5 * time.Second, timeout: 5 * time.Second}
	if in.Prefix != "" {
		c.prefix = in.Prefix
	}
	lockopt.NonNegative("etcd", map[string]time.Duration{"MaxWait": in.MaxWait, "Recheck": in.Recheck, "Timeout": in.Timeout})
	if in.Recheck > 0 {
		c.recheck = in.Recheck
	}
	if in.Timeout > 0 {
		c.timeout = in.Timeout
	}
	return c
}

// The lease lengths a Locker accepts: an etcd lease's TTL is a whole
// number of seconds, from 1 to clientv3.MaxLeaseTTL. A ttl is rounded up
// to the next whole second for the server.
const (
	minLease = time.Second
	maxLease = clientv3.MaxLeaseTTL * time.Second
)

// ttls checks a lease length against them.
var ttls = lockopt.TTLRange{Min: minLease, Max: maxLease, Lease: "an etcd lease",
	Why: ": etcd lease TTLs are whole seconds, and a ttl is rounded up to the next one"}

// seconds is the etcd lease TTL for ttl: ttl rounded up to whole seconds.
func seconds(ttl time.Duration) int64 {
	return int64((ttl + time.Second - 1) / time.Second)
}

// Locker is a lock in etcd: each holding and each waiter is a key of its
// own under the lock's prefix, attached to an etcd lease of its own
// (granted with the herd lease length), and the holder is the key with
// the lowest create revision. It implements [herd.Lock] with leases of
// type *[Lease].
//
// Waiters queue in the order of their keys' create revisions, and each
// watches only the key just before its own, so a release wakes one
// waiter, not all of them. The token is the create revision of the
// holder's key.
//
// A Locker is safe for concurrent use. It uses the caller's client and
// never closes it: call [Locker.Close], then release the leases and close
// the client.
type Locker struct {
	cli *clientv3.Client
	cfg config

	gate lockgate.Gate // the running calls, and Close

	checked func() // a test's hook: called before each re-check of a waiter
}

// New returns a Locker on cli's etcd cluster. It sends nothing until it
// is used. A nil opt means the defaults of [Options]. New panics on a nil
// client or an invalid option.
func New(cli *clientv3.Client, opt *Options) *Locker {
	if cli == nil {
		panic("etcd: New with a nil *clientv3.Client")
	}
	l := &Locker{cli: cli, cfg: opt.resolve()}
	l.gate.Init()
	return l
}

// Close stops the Locker: TryAcquire and Acquire called after it return
// [herd.ErrClosed], and an Acquire still waiting returns it at once;
// Close returns once the waiters' places in the queue are deleted (or
// that failed, within a second each). Leases already handed out are
// not released by Close: they use the client, which is the caller's, and
// their Extend, KeepAlive and Release keep working while it is open.
// Close is idempotent.
func (l *Locker) Close() error {
	if !l.gate.Close() {
		return nil
	}
	return nil
}

// request returns ctx bounded by the Locker's request timeout.
func (l *Locker) request(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, l.cfg.timeout)
}

// prefix is the key range of a lock name: the Locker's prefix, the name
// with "/" (and what else PathEscape escapes) escaped, and a "/". Escaped
// names hold no "/", so no lock's range holds another's.
func (l *Locker) prefix(name string) string {
	return l.cfg.prefix + url.PathEscape(name) + "/"
}

// queueKey is the key of one holder or waiter in the range pfx: its
// etcd lease's ID, unique in the cluster.
func queueKey(pfx string, id clientv3.LeaseID) string {
	return fmt.Sprintf("%s%016x", pfx, uint64(id))
}

// TryAcquire takes the lock on name for ttl, or fails at once with an
// error wrapping [herd.ErrLeaseHeld] when another owner holds it or
// waits for it. It takes two round trips when it wins (the etcd lease's
// grant, then a transaction that puts the holder's key if the lock's
// range is empty), and three when the lock is held (the unused etcd lease
// is revoked). Any string of 1 to [herd.MaxLockKeyBytes] bytes is a valid
// name ([herd.ErrInvalidKey] otherwise, before any request); ttl must be
// between 1s and clientv3.MaxLeaseTTL seconds, and is rounded up to whole
// seconds for the server ([herd.ErrInvalidTTL]). An etcd error is
// returned wrapped, and after [Locker.Close] it returns [herd.ErrClosed].
// Each request is bounded by ctx and by [Options.Timeout].
func (l *Locker) TryAcquire(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	if err := l.gate.Enter(); err != nil {
		return nil, err
	}
	defer l.gate.Leave()
	if err := ttls.Prepare(name, ttl); err != nil {
		return nil, err
	}
	bctx, cancel := l.gate.Bound(ctx)
	defer cancel()
	lease, err := l.try(bctx, name, ttl)
	return lease, l.callErr(ctx, name, err)
}

// try is one TryAcquire attempt.
func (l *Locker) try(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	start := time.Now()
	id, err := l.grant(ctx, ttl)
	if err != nil {
		return nil, err
	}
	pfx := l.prefix(name)
	key := queueKey(pfx, id)
	rctx, cancel := l.request(ctx)
	defer cancel()
	resp, err := l.cli.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(pfx).WithPrefix(), "=", 0)).
		Then(clientv3.OpPut(key, name, clientv3.WithLease(id))).
		Commit()
	if err != nil || !resp.Succeeded {
		// The revoke also deletes the key, if an ambiguous error hides a
		// put; in the background when ctx ended, which may be a stall.
		if ctx.Err() != nil {
			l.revokeLater(id)
		} else {
			l.revoke(id)
		}
		if err != nil {
			return nil, fmt.Errorf("take the lock: %w", err)
		}
		return nil, fmt.Errorf("%w: %q", herd.ErrLeaseHeld, name)
	}
	rev := resp.Header.Revision
	return l.held(name, key, id, ttl, rev, rev, start)
}

// held returns the lease of a holder whose key, created at token, was
// seen at the head of its queue at revision seen, after a grant or
// renewal of its etcd lease sent at start.
func (l *Locker) held(name, key string, id clientv3.LeaseID, ttl time.Duration, token, seen int64, start time.Time) (*Lease, error) {
	deadline := start.Add(ttl - lease.Drift(ttl))
	if time.Until(deadline) <= 0 {
		l.revoke(id)
		return nil, fmt.Errorf("%w: %q: the acquire's reply came after the lease's validity", herd.ErrLeaseHeld, name)
	}
	return newLease(l, name, key, id, ttl, uint64(token), seen, start, deadline), nil
}

// grant grants an etcd lease for ttl.
func (l *Locker) grant(ctx context.Context, ttl time.Duration) (clientv3.LeaseID, error) {
	rctx, cancel := l.request(ctx)
	defer cancel()
	g, err := l.cli.Grant(rctx, seconds(ttl))
	if err != nil {
		return 0, fmt.Errorf("grant an etcd lease: %w", err)
	}
	return g.ID, nil
}

// revoke revokes an etcd lease, deleting its keys, as cleanup: whatever
// context the call had (it may have ended), bounded by the request
// timeout. A failure leaves the keys until the lease runs out.
func (l *Locker) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), min(l.cfg.timeout, time.Second))
	defer cancel()
	_, _ = l.cli.Revoke(ctx, id)
}

// revokeLater is revoke in a goroutine of its own, for a call that must
// return at once (its context ended) even when etcd does not answer. The
// caller holds a call of the Locker (Enter), so Close waits for it.
func (l *Locker) revokeLater(id clientv3.LeaseID) {
	l.gate.Go(func() { l.revoke(id) })
}

// callErr maps an attempt's error for the caller: the context's end
// (joined with ErrLeaseHeld, as a wait cut short), Close's, or etcd's.
func (l *Locker) callErr(ctx context.Context, name string, err error) error {
	if err == nil || errors.Is(err, herd.ErrLeaseHeld) && ctx.Err() == nil {
		return err
	}
	if e := l.gate.Ended(ctx, name); e != nil {
		return e
	}
	if errors.Is(err, herd.ErrWaitTimeout) {
		return err
	}
	return fmt.Errorf("herd: acquire %q: %w", name, err)
}

// Locker satisfies herd's lock interface.
var _ herd.Lock[*Lease] = (*Locker)(nil)
