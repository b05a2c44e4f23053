// Package lockgate is the gate of the calls of a lock backend's Locker
// (herd's Locker and Redlock, lock/postgres, lock/mysql, lock/etcd,
// lock/zookeeper): it registers each call while it runs, refuses calls
// with herd.ErrClosed once Close has begun, ends the contexts of the
// running calls at Close, and lets Close wait for them and for the
// goroutines they started. It does not import herd, which uses it: its
// errors are the values of package sentinel, which herd exports as
// herd.ErrClosed and herd.ErrLeaseHeld.
package lockgate

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/herdkit/herd/internal/sentinel"
)

// Gate is a Locker's call gate. Its zero value is not ready: call Init
// once, in the Locker's constructor. It is safe for concurrent use.
type Gate struct {
	root   context.Context // cancelled by Close
	cancel context.CancelFunc
	mu     sync.Mutex // guards closed against calls starting
	closed bool
	calls  sync.WaitGroup // running calls, and goroutines started by them
}

// Init makes g ready.
func (g *Gate) Init() {
	g.root, g.cancel = context.WithCancel(context.Background())
}

// Enter registers a call; it fails with herd.ErrClosed after Close. Every
// successful Enter is paired with a Leave.
func (g *Gate) Enter() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return sentinel.ErrClosed
	}
	g.calls.Add(1)
	return nil
}

// Leave ends a call registered by Enter.
func (g *Gate) Leave() { g.calls.Done() }

// Go runs f in a goroutine that Close waits for. It is called only inside
// a call (between Enter and Leave), so that Close's wait sees it.
func (g *Gate) Go(f func()) {
	g.calls.Add(1)
	go func() {
		defer g.calls.Done()
		f()
	}()
}

// Close refuses the calls that come after it, cancels the running calls'
// contexts ([Gate.Bound], [Gate.Root]) and waits for them and for the
// goroutines of [Gate.Go]. It reports false, at once, when Close was
// called before (the Locker's Close is idempotent).
func (g *Gate) Close() bool {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return false
	}
	g.closed = true
	g.cancel()
	g.mu.Unlock()
	g.calls.Wait()
	return true
}

// Wait waits for the running calls and the goroutines of [Gate.Go], as
// Close does, without closing the gate: for a Locker whose every Close,
// not only the first, returns only once those have ended.
func (g *Gate) Wait() { g.calls.Wait() }

// Root is the context that Close cancels.
func (g *Gate) Root() context.Context { return g.root }

// Bound returns ctx, also cancelled by Close.
func (g *Gate) Bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(g.root, cancel)
	return ctx, func() { stop(); cancel() }
}

// Ended is the error of an acquire of key whose attempt failed because
// ctx (the caller's) or Close ended it: ctx's error joined with
// herd.ErrLeaseHeld (a wait cut short), or herd.ErrClosed. It is nil when
// neither has ended.
func (g *Gate) Ended(ctx context.Context, key string) error {
	switch {
	case ctx.Err() != nil:
		return errors.Join(sentinel.ErrLeaseHeld, ctx.Err())
	case g.root.Err() != nil:
		return fmt.Errorf("%w: acquire %q", sentinel.ErrClosed, key)
	}
	return nil
}

// AcquireErr maps an attempt's error, err, for Acquire's caller: nil
// stays nil, an attempt ended by ctx or Close gets [Gate.Ended]'s error,
// and any other error is returned as it is.
func (g *Gate) AcquireErr(ctx context.Context, key string, err error) error {
	if err == nil {
		return nil
	}
	if e := g.Ended(ctx, key); e != nil {
		return e
	}
	return err
}
