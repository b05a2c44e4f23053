package herd

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// runLoader runs load in its own goroutine under a detached context with
// the given timeout. A panic becomes a *PanicError and runtime.Goexit an
// error; neither reaches singleflight (which would crash the process or
// leave DoChan callers hanging). A loader that ignores its context is
// abandoned at the timeout; its goroutine ends when it returns. values,
// if not nil, lends its values (not its cancellation) to that context.
func (c *Cache) runLoader(values context.Context, load LoadFunc, timeout time.Duration, exp *expiry) ([]byte, error) {
	return runLoaderOf(c, values, load, timeout, exp)
}

// valuesFrom is a context with the deadline and cancellation of its
// Context and, besides its own values, those of values: the loader's
// context with what [Observer.StartLoad] lends it.
type valuesFrom struct {
	context.Context
	values context.Context
}

func (v valuesFrom) Value(key any) any {
	if x := v.Context.Value(key); x != nil {
		return x
	}
	return v.values.Value(key)
}

// runLoaderOf is runLoader for a loader of any result type (a
// [ManyLoadFunc] returns a map).
func runLoaderOf[T any](c *Cache, values context.Context, load func(context.Context) (T, error), timeout time.Duration, exp *expiry) (T, error) {
	base := c.ctx
	if values != nil {
		base = valuesFrom{c.ctx, values}
	}
	ctx, cancel := context.WithTimeout(context.WithValue(base, expiryKey{}, exp), timeout)
	defer cancel()
	type outcome struct {
		val T
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		normal := false
		defer func() {
			if !normal {
				if r := recover(); r != nil {
					o.err = &PanicError{Value: r, Stack: debug.Stack()}
				} else {
					o.err = errGoexit
				}
			}
			done <- o
		}()
		o.val, o.err = load(ctx)
		if o.err != nil {
			// An error whose Error method panics (a nil field of a custom
			// type) is the loader's panic here, where it is recovered,
			// rather than in the leader's settle, which would then leave
			// the lease to run out instead of releasing it.
			_ = o.err.Error()
		}
		normal = true
	}()
	var zero T
	select {
	case o := <-done:
		return o.val, o.err
	case <-ctx.Done():
		if c.ctx.Err() != nil {
			return zero, ErrClosed
		}
		return zero, fmt.Errorf("herd: the loader did not return within %v: %w", timeout, ctx.Err())
	}
}

type expiryKey struct{}

// expiry carries a loader's SetExpiry and SetTags to the commit.
type expiry struct {
	mu            sync.Mutex
	ttl, staleFor time.Duration
	tags          tagging
	c             *Cache // the Cache whose rebuild it is (nil: a local load)
}

func (e *expiry) tagging() tagging {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tags
}

func (e *expiry) get() (ttl, staleFor time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ttl, e.staleFor
}

// SetExpiry lets a [LoadFunc] decide how long the value it returns is
// fresh (ttl) and then servable stale (staleFor), overriding the ttl of
// the call and [Options.StaleFor]: for example a TTL read from the loaded
// data, or an HTTP response's max-age. It must be called with the context
// the loader was given, before the loader returns; elsewhere it does
// nothing. A ttl outside [1ms, 50 years] or a staleFor outside
// [0, 50 years] is ignored (see [ErrInvalidTTL]).
func SetExpiry(ctx context.Context, ttl, staleFor time.Duration) {
	e, ok := ctx.Value(expiryKey{}).(*expiry)
	if !ok {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if checkTTL(ttl) == nil {
		e.ttl = ttl
	}
	if staleFor >= 0 && staleFor <= maxTTL {
		e.staleFor = staleFor
	}
}

// loadBudget is how long any loader of the Cache's may run, leased or
// not (a fail-open load too): LoadTimeout or MaxHold, whichever is
// shorter (Options.LoadTimeout). The one rule, so that no load path
// applies one bound and forgets the other.
func (c *Cache) loadBudget() time.Duration { return min(c.cfg.LoadTimeout, c.cfg.MaxHold) }
