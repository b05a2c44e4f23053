package herd

import (
	"context"
	"sync"
)

// leaveOnDone runs call, one Redis round trip, and returns its result, or
// ctx's error as soon as ctx ends: go-redis waits for the reply of a
// command it has sent, whatever its context says, for up to the client's
// ReadTimeout. The call then goes on in its own goroutine (tracked by
// track, which reports false when the owner is closed: then call runs in
// the caller's goroutine); abandon, if not nil, gets its late result, for
// example to give back a lease won after the caller left.
func leaveOnDone[T any](ctx context.Context, track func() (done func(), ok bool), call func() (T, error), abandon func(T, error)) (T, error) {
	if ctx.Done() == nil {
		return call()
	}
	finished, ok := track()
	if !ok {
		return call()
	}
	type result struct {
		v   T
		err error
	}
	var (
		mu   sync.Mutex
		gone bool
	)
	ch := make(chan result, 1)
	go func() {
		defer finished()
		v, err := call()
		mu.Lock()
		defer mu.Unlock()
		if gone {
			if abandon != nil {
				abandon(v, err)
			}
			return
		}
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case r := <-ch:
		return r.v, r.err // it came at the same time
	default:
	}
	gone = true
	var zero T
	return zero, ctx.Err()
}

// untracked is leaveOnDone's track for an owner without a Close (a
// FencedStore): the call's goroutine ends with its round trip, bounded by
// the client's timeouts.
func untracked() (done func(), ok bool) { return func() {}, true }

// endWith returns ctx, ended also when owner ends (a Cache's or Locker's
// Close): for a round trip that outlives its caller (ctx is then
// WithoutCancel of the caller's) but must not be retried by go-redis once
// Close began, since Close waits for it and every retry into a blackhole
// waits out the client's timeouts again. stop releases it.
func endWith(ctx, owner context.Context) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	unhook := context.AfterFunc(owner, cancel)
	return ctx, func() { unhook(); cancel() }
}
