package etcd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/lease"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Acquire takes the lock on name for ttl, waiting while another owner
// holds it. It puts its key in the lock's queue (two round trips: the
// etcd lease's grant, then a transaction that puts the key and reads the
// key before it) and, when that is not the first, watches only the key
// just before its own: the predecessor's deletion (a release, a give-up,
// a revoke or an expiry) wakes it, and a re-check (one round trip) tells
// whether it now holds the lock or has a new predecessor to watch. A
// re-check every [Options.Recheck] covers a missed event. While it waits,
// Acquire renews its own etcd lease, so its place in the queue outlasts
// ttl; when it takes the lock after a wait it renews it once more, so the
// lease starts with ttl left.
//
// The wait is bounded by ctx and by [Options.MaxWait]: when ctx ends the
// error joins [herd.ErrLeaseHeld] and ctx.Err(); when MaxWait runs out it
// wraps [herd.ErrWaitTimeout] and ErrLeaseHeld. An etcd error ends the
// wait and is returned wrapped. A wait that ends without the lock revokes
// its etcd lease, which deletes its key from the queue, in the background
// (Acquire returns at once; [Locker.Close] waits for it; when it fails,
// the key goes when the etcd lease runs out, ttl after its last renewal).
// Name and ttl are checked as in [Locker.TryAcquire]. After
// [Locker.Close], and when Close ends its wait, it returns
// [herd.ErrClosed].
func (l *Locker) Acquire(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	if err := l.gate.Enter(); err != nil {
		return nil, err
	}
	defer l.gate.Leave()
	if err := ttls.Prepare(name, ttl); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("herd: acquire %q: %w", name, err)
	}
	maxWait := l.cfg.maxWait
	if maxWait == 0 {
		maxWait = 3 * ttl
		if ttl > math.MaxInt64/3 {
			maxWait = math.MaxInt64 // 3×ttl overflows: no limit but ctx
		}
	}
	bctx, cancel := l.gate.Bound(ctx)
	defer cancel()
	w := &waiter{l: l, name: name, pfx: l.prefix(name), ttl: ttl}
	w.limit = time.NewTimer(maxWait)
	defer w.limit.Stop()
	lease, err := w.run(bctx)
	if err != nil && w.id != 0 {
		l.revokeLater(w.id) // the caller does not wait for a stalled server
	}
	if errors.Is(err, errWaitLimit) {
		err = fmt.Errorf("%w after %v: %w", herd.ErrWaitTimeout, maxWait, herd.ErrLeaseHeld)
	}
	return lease, l.callErr(ctx, name, err)
}

// errWaitLimit is run's error when MaxWait ran out.
var errWaitLimit = errors.New("the wait limit ran out")

// errGone is the error of a re-check or renewal that found the waiter's
// own key or etcd lease gone: it queues again.
var errGone = errors.New("the waiter's key is gone")

// waiter is one Acquire: its place in the queue and its wait.
type waiter struct {
	l     *Locker
	name  string
	pfx   string // the lock's key range
	ttl   time.Duration
	limit *time.Timer // MaxWait

	id      clientv3.LeaseID // the waiter's etcd lease; 0 before enqueue
	key     string           // the waiter's key
	rev     int64            // its create revision: the token if it wins
	renewed time.Time        // when the last grant or renewal was sent
	pred    string           // the key before the waiter's; "" when it holds
	seen    int64            // the revision at which pred was read
}

// run queues and waits until the waiter holds the lock. ctx is the
// caller's, ended by Close too.
func (w *waiter) run(ctx context.Context) (*Lease, error) {
	for {
		if err := w.enqueue(ctx); err != nil {
			return nil, err
		}
		if w.pred == "" {
			return w.l.held(w.name, w.key, w.id, w.ttl, w.rev, w.seen, w.renewed)
		}
		lease, err := w.wait(ctx)
		if !errors.Is(err, errGone) {
			return lease, err
		}
		w.l.revoke(w.id)
		w.id = 0
	}
}

// enqueue grants the waiter's etcd lease and puts its key at the end of
// the queue, reading the key before it in the same transaction.
func (w *waiter) enqueue(ctx context.Context) error {
	w.renewed = time.Now()
	id, err := w.l.grant(ctx, w.ttl)
	if err != nil {
		return err
	}
	w.id, w.key = id, queueKey(w.pfx, id)
	rctx, cancel := w.l.request(ctx)
	defer cancel()
	// The new key has the highest create revision of the range, so the
	// two newest keys are the waiter's and its predecessor's.
	resp, err := w.l.cli.Txn(rctx).Then(
		clientv3.OpPut(w.key, w.name, clientv3.WithLease(id)),
		clientv3.OpGet(w.pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2)),
	).Commit()
	if err != nil {
		return fmt.Errorf("join the queue: %w", err)
	}
	w.rev, w.seen, w.pred = resp.Header.Revision, resp.Header.Revision, ""
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if kv.CreateRevision < w.rev {
			w.pred = string(kv.Key)
		}
	}
	return nil
}

// wait watches the predecessor until the waiter holds the lock, renewing
// the waiter's etcd lease meanwhile. It returns errGone when the waiter's
// key went (its etcd lease ran out while the server was unreachable).
func (w *waiter) wait(ctx context.Context) (*Lease, error) {
	recheck := time.NewTimer(lease.Jitter(w.l.cfg.recheck))
	defer recheck.Stop()
	renew := time.NewTimer(w.renewIn())
	defer renew.Stop()
	retry := time.NewTimer(0)
	retry.Stop()
	defer retry.Stop()
	for {
		wctx, stopWatch := context.WithCancel(clientv3.WithRequireLeader(ctx))
		events := w.l.cli.Watch(wctx, w.pred, clientv3.WithRev(w.seen+1))
		check := false
		for !check {
			select {
			case <-ctx.Done():
				stopWatch()
				return nil, ctx.Err()
			case <-w.limit.C:
				stopWatch()
				return nil, errWaitLimit
			case resp, ok := <-events:
				if !ok || resp.Err() != nil {
					// The watch ended (no leader, compaction, a closed
					// client): look again after a pause, and watch anew.
					events = nil
					retry.Reset(lease.Jitter(50 * time.Millisecond))
					continue
				}
				for _, ev := range resp.Events {
					if ev.Type == mvccpb.DELETE {
						check = true
					}
				}
			case <-retry.C:
				check = true
			case <-recheck.C:
				recheck.Reset(lease.Jitter(w.l.cfg.recheck))
				check = true
			case <-renew.C:
				err := w.renew(ctx)
				if errors.Is(err, errGone) {
					stopWatch()
					return nil, err
				}
				renew.Reset(max(w.renewIn(), 100*time.Millisecond))
			}
		}
		stopWatch()
		retry.Stop()
		if err := w.check(ctx); err != nil {
			if errors.Is(err, errGone) || ctx.Err() != nil {
				return nil, err
			}
			retry.Reset(lease.Jitter(100 * time.Millisecond)) // etcd unreachable: try again
			continue
		}
		if w.pred == "" {
			// The lock passed to the waiter: renew its etcd lease, so that
			// the holding starts with ttl left.
			if err := w.renew(ctx); err != nil {
				return nil, err
			}
			return w.l.held(w.name, w.key, w.id, w.ttl, w.rev, w.seen, w.renewed)
		}
		// A new predecessor, or the same one: watch it.
	}
}

// renewIn is when the next renewal of the waiter's etcd lease is due: a
// random point between a third and a half of its length after the last.
func (w *waiter) renewIn() time.Duration {
	return time.Until(w.renewed.Add(w.ttl/3 + rand.N(w.ttl/6+1)))
}

// renew renews the waiter's etcd lease. It returns errGone when the etcd
// lease is gone, and another error when etcd did not answer (the next
// renewal or re-check tries again).
func (w *waiter) renew(ctx context.Context) error {
	start := time.Now()
	rctx, cancel := w.l.request(ctx)
	defer cancel()
	if _, err := w.l.cli.KeepAliveOnce(rctx, w.id); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return errGone
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("renew the waiter's etcd lease: %w", err)
	}
	w.renewed = start
	return nil
}

// check reads, in one transaction that also checks the waiter's own key
// is still there, the key just before the waiter's: w.pred is then that
// key, or "" when the waiter is at the head of the queue.
func (w *waiter) check(ctx context.Context) error {
	if w.l.checked != nil {
		w.l.checked()
	}
	rctx, cancel := w.l.request(ctx)
	defer cancel()
	resp, err := w.l.cli.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(w.key), "=", w.rev)).
		Then(clientv3.OpGet(w.pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(w.rev-1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1))).
		Commit()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("look up the queue: %w", err)
	}
	if !resp.Succeeded {
		return errGone
	}
	w.seen, w.pred = resp.Header.Revision, ""
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		w.pred = string(kvs[0].Key)
	}
	return nil
}
