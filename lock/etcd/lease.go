package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/lease"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lease is one holding of a [Locker]'s lock: the key at the head of the
// lock's queue, attached to an etcd lease of its own. Its methods are safe
// for concurrent use. Release it when the protected work is done.
//
// While the lease is held, a goroutine of its own watches its key, so
// that a deletion by the server (the etcd lease revoked, or run out) or by
// anyone else is seen as soon as the watch delivers it, and Lost closed.
type Lease struct {
	locker *Locker
	name   string
	key    string
	token  uint64

	op sync.Mutex // serialises the lease's requests that change it: extend, release

	rel sync.Mutex // serialises Release: a second call sees the first's outcome

	// life's length is the current one: the acquire's, or the last
	// Extend's. Its lock also guards the fields below.
	life    lease.State
	id      clientv3.LeaseID
	secs    int64 // the etcd lease's TTL, in seconds
	stopMon context.CancelFunc
	monDone chan struct{}
	bg      sync.WaitGroup // lose's revokes
}

func newLease(l *Locker, name, key string, id clientv3.LeaseID, ttl time.Duration, token uint64, seen int64, start, deadline time.Time) *Lease {
	lease := &Lease{
		locker:  l,
		name:    name,
		key:     key,
		token:   token,
		id:      id,
		secs:    seconds(ttl),
		monDone: make(chan struct{}),
	}
	ctx, cancel := context.WithCancel(context.Background())
	lease.life.Lock()
	lease.stopMon = cancel
	lease.life.Unlock()
	lease.life.Init(ttl, start, deadline, nil, lease.lose)
	go lease.monitor(ctx, seen+1)
	return lease
}

// Token returns the lease's fencing token: the create revision of its
// key. etcd's revision is one counter for the whole cluster, advanced by
// every change and agreed by a majority before a write is acknowledged,
// and each holder's key was created after the key of the holder before
// it, so tokens of one name strictly increase from one holder to the
// next, across Lockers, processes, server restarts and leader changes
// (they are not consecutive: other writes advance the revision too).
// Pass it to the protected resource, which must reject a token lower
// than the highest it has seen.
func (l *Lease) Token() uint64 { return l.token }

// Key returns the lock name the lease was acquired for.
func (l *Lease) Key() string { return l.name }

// Deadline returns the local time until which the lease is known valid:
// the grant or last successful renewal of its etcd lease was sent before
// it by the lease length, less an allowance for clock drift (1% + 2ms),
// and no later than KeepAlive's cap. The server frees the lock no sooner:
// it counts the etcd lease's TTL, the lease length rounded up to whole
// seconds, from the request's arrival.
func (l *Lease) Deadline() time.Time { return l.life.Deadline() }

// Lost returns a channel that is closed when the lease is known to be
// lost: its key was deleted (its etcd lease revoked, or run out on the
// server), a renewal found the etcd lease gone, its deadline passed
// without a successful renewal, or [Lease.KeepAlive] reached its cap. A
// lease lost for one of the last two reasons is revoked at once (when
// etcd answers), so the next owner need not wait for the server's TTL.
// Release does not close it. Once closed, the lease stays lost: stop the
// protected work and call Release.
func (l *Lease) Lost() <-chan struct{} { return l.life.Lost() }

// monitor watches the lease's key, from revision from on, until it is
// deleted (the lease is lost then), the lease ends or the client closes.
func (l *Lease) monitor(ctx context.Context, from int64) {
	defer close(l.monDone)
	cli := l.locker.cli
	pause := time.NewTimer(0)
	pause.Stop()
	defer pause.Stop()
	for {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range cli.Watch(wctx, l.key, clientv3.WithRev(from)) {
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					cancel()
					l.lose()
					return
				}
			}
			from = resp.Header.Revision + 1
		}
		cancel()
		if ctx.Err() != nil || cli.Ctx().Err() != nil {
			return // released or lost, or the client closed: the deadline still applies
		}
		// The watch ended with an error (no leader, compaction): pause,
		// check that the key is still this lease's, and watch again.
		pause.Reset(lease.Jitter(100 * time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-pause.C:
		}
		rctx, cancelGet := l.locker.request(ctx)
		resp, err := cli.Get(rctx, l.key, clientv3.WithKeysOnly())
		cancelGet()
		switch {
		case err != nil:
			continue // watch again from the same revision
		case len(resp.Kvs) == 0 || uint64(resp.Kvs[0].CreateRevision) != l.token:
			l.lose()
			return
		}
		from = resp.Header.Revision + 1
	}
}

// lose marks the lease lost: it closes Lost, stops the expiry timer and
// the monitor, and revokes the lease's etcd lease, so that the next owner
// need not wait for the server's TTL (a no-op when the server ended it
// already). Only the first call does anything, and none after Release
// was called: Release does not close Lost (its own deletion of the key
// reaches the monitor too).
func (l *Lease) lose() {
	l.life.Lock()
	if l.life.GoneLocked() {
		l.life.Unlock()
		return
	}
	l.life.LoseLocked()
	l.stopMon()
	id := l.id
	l.bg.Add(1) // under the lock, before Release can wait for it
	l.life.Unlock()
	defer l.bg.Done()
	l.locker.revoke(id)
}

// Extend gives the lease ttl from now: it renews the lease's etcd lease
// when ttl rounds to the same whole seconds as its TTL (a keep-alive and
// a check that the key is still this lease's: two round trips), and
// otherwise moves the key to a new etcd lease with ttl's TTL (a grant, a
// transaction that re-attaches the key if it is still this lease's, and
// the old etcd lease's revoke: three round trips), which keeps the key's
// create revision, and so the token. Deadline moves to ttl (less the drift
// allowance) after the call's start, and KeepAlive renews for ttl from
// then on.
//
// It returns an error wrapping [herd.ErrLeaseLost] when the lease is
// known lost or released, or turns out to be (Lost is then closed), and
// ctx's error, without touching the lease, when ctx has ended before the
// call. Its requests are bounded by ctx, by [Options.Timeout] and by the
// lease's deadline; an etcd error leaves the lease as it was, and is
// returned wrapped. ttl is checked as in [Locker.TryAcquire]. Extend keeps
// working after [Locker.Close], while the client is open.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l == nil {
		return herd.ErrLeaseLost
	}
	if err := ttls.Check(ttl); err != nil {
		return err
	}
	return l.extend(ctx, ttl, l.life.Cap()) // after KeepAlive, held to its cap
}

// extend is Extend with KeepAlive's cap (none when zero) on the deadline.
func (l *Lease) extend(ctx context.Context, ttl time.Duration, capAt time.Time) error {
	l.op.Lock()
	defer l.op.Unlock()
	l.life.Lock()
	gone := l.life.GoneLocked()
	id, secs, deadline := l.id, l.secs, l.life.DeadlineLocked()
	l.life.Unlock()
	if gone {
		return fmt.Errorf("%w: %q", herd.ErrLeaseLost, l.name)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("herd: extend lease %q: %w", l.name, err)
	}
	start := time.Now()
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	rctx, cancelReq := l.locker.request(rctx)
	defer cancelReq()
	cli := l.locker.cli
	want := seconds(ttl)
	next := id
	if want == secs {
		if _, err := cli.KeepAliveOnce(rctx, id); err != nil {
			return l.extendErr(err)
		}
		resp, err := cli.Txn(rctx).If(l.owned(id)...).Commit()
		if err != nil {
			return l.extendErr(err)
		}
		if !resp.Succeeded {
			l.lose()
			return fmt.Errorf("%w: %q: its key is gone", herd.ErrLeaseLost, l.name)
		}
	} else {
		g, err := cli.Grant(rctx, want)
		if err != nil {
			return l.extendErr(err)
		}
		resp, err := cli.Txn(rctx).If(l.owned(id)...).
			Then(clientv3.OpPut(l.key, l.name, clientv3.WithLease(g.ID))).Commit()
		if err != nil {
			l.locker.revoke(g.ID) // the key, if the put went through, is lost: the monitor sees it
			return l.extendErr(err)
		}
		if !resp.Succeeded {
			l.locker.revoke(g.ID)
			l.lose()
			return fmt.Errorf("%w: %q: its key is gone", herd.ErrLeaseLost, l.name)
		}
		next = g.ID
	}
	end := start.Add(ttl - lease.Drift(ttl))
	if !capAt.IsZero() && end.After(capAt) {
		end = capAt
	}
	l.life.Lock()
	lost := !l.life.RenewedLocked(end, ttl)
	if !lost {
		l.id, l.secs = next, want
	}
	l.life.Unlock()
	if next != id {
		l.locker.revoke(id) // holds no key now
		if lost {
			l.locker.revoke(next) // lose revoked the old one, not the key's
		}
	}
	if lost {
		return fmt.Errorf("%w: %q: its deadline passed or it was released while extending", herd.ErrLeaseLost, l.name)
	}
	return nil
}

// owned is the comparison that holds while the lease's key is the
// lease's, attached to etcd lease id.
func (l *Lease) owned(id clientv3.LeaseID) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(l.key), "=", int64(l.token)),
		clientv3.Compare(clientv3.LeaseValue(l.key), "=", id),
	}
}

// extendErr maps a renewal's error: a missing etcd lease is the lease's
// loss; anything else leaves the lease as it was.
func (l *Lease) extendErr(err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		l.lose()
		return fmt.Errorf("%w: %q: its etcd lease is gone", herd.ErrLeaseLost, l.name)
	}
	return fmt.Errorf("herd: extend lease %q: %w", l.name, err)
}

// KeepAlive starts a watchdog that renews the lease, each time for its
// current length (the acquire's, or the last Extend's), at a random point
// between a third and a half of that length, until Release, until the
// lease is lost, or until maxHold after the acquire. maxHold is not an
// interval but an absolute cap on the whole holding: renewals move the
// deadline no further than the cap, and at the cap the lease is revoked
// (Lost closes), so a stuck holder cannot keep the lock for ever; etcd
// cannot shorten an etcd lease, so the revoke, not a shorter last
// renewal, ends it there (if etcd is unreachable then, the server frees
// the lock at the end of the last renewal's TTL). A maxHold of zero or
// less means no cap.
//
// A renewal that fails on an etcd error is retried until the lease's
// deadline; then [Lease.Lost] is closed. The watchdog goroutine ends with
// the lease and Release waits for it. Calling KeepAlive again, or after
// the lease ended, does nothing.
//
// After KeepAlive with a cap, an Extend is held to the cap as well: it
// never moves the lease, or its Deadline, past it.
func (l *Lease) KeepAlive(maxHold time.Duration) {
	if l == nil {
		return
	}
	l.life.KeepAlive(context.Background(), maxHold, func(ctx context.Context, capAt time.Time) {
		l.life.Renew(ctx, capAt, lease.Renewal{
			Extend: func(ctx context.Context, d time.Duration) error { return l.extend(ctx, d, capAt) },
			Final:  func(err error) bool { return errors.Is(err, herd.ErrLeaseLost) },
			Uncut:  true,
		})
	})
}

// stopMonitor stops the watch of the lease's key and waits for it, and
// for lose's revokes.
func (l *Lease) stopMonitor() {
	l.life.Lock()
	l.stopMon()
	l.life.Unlock()
	<-l.monDone
	l.bg.Wait()
}

// releaseTimeout bounds Release's requests.
const releaseTimeout = 5 * time.Second

// Release stops the watchdog, if any, and deletes the lease's key in a
// transaction that first checks the key's create revision is the lease's
// token, so that it never deletes another holder's key; the deletion
// wakes the next waiter. It then revokes the lease's etcd lease (two
// round trips in all). It returns an error wrapping [herd.ErrLeaseLost]
// when the lease was already lost, or its key turns out to be gone: the
// lock may have passed to another owner, whom Release leaves alone.
// Release does not stop for ctx (an interrupted Release would leave the
// lock held until the server's TTL ran out): its requests are bounded by
// 5 seconds. When etcd does not answer, the error is returned wrapped,
// and the server frees the lock when the etcd lease runs out. Release is
// nil-safe, and releasing again after a successful Release returns nil.
// It keeps working after [Locker.Close], while the client is open.
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return nil
	}
	l.rel.Lock()
	defer l.rel.Unlock()
	freed, lost, _ := l.life.Release()
	if freed {
		return nil
	}
	l.life.StopWatchdog()
	l.op.Lock()
	defer l.op.Unlock()
	if lost {
		l.stopMonitor()
		return fmt.Errorf("%w: %q: it was lost before release", herd.ErrLeaseLost, l.name)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	cli := l.locker.cli
	l.life.Lock()
	id := l.id
	l.life.Unlock()
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", int64(l.token))).
		Then(clientv3.OpDelete(l.key)).Commit()
	_, rerr := cli.Revoke(ctx, id)
	switch {
	case err != nil && rerr == nil:
		// The revoke deleted the key, if it was still attached.
	case err != nil:
		return fmt.Errorf("herd: release lease %q: %w (the server frees the lock when its etcd lease runs out)", l.name, err)
	case !resp.Succeeded:
		l.stopMonitor()
		return fmt.Errorf("%w: %q: its key was gone", herd.ErrLeaseLost, l.name)
	}
	l.stopMonitor()
	l.life.Freed()
	return nil
}

// Lease satisfies herd's lease interface.
var _ herd.LeaseHandle = (*Lease)(nil)
