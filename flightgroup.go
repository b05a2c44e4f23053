package herd

import (
	"errors"
	"runtime/debug"
	"sync"

	"golang.org/x/sync/singleflight"
)

// flightGroup is the local tier of the flight: the callers of a key in
// this process share one call. DoChan is that of
// golang.org/x/sync/singleflight; join is what GetMany needs besides: it
// tells at once whether its caller started the call, and must finish it,
// or joined one already running, so that a batch knows which keys it
// leads in this process before it sends anything (see many.go).
type flightGroup struct {
	mu sync.Mutex
	m  map[string]*flightCall // calls running, by key
}

// flightCall is one running call. Its fields are guarded by the group's
// mutex.
type flightCall struct {
	waiters []func(singleflight.Result)
	dups    int // waiters beyond the first
	// gate, for a call StartChan started, lets other cold reads join it
	// until the flight closes it (see coldGate).
	gate *coldGate
}

// callers counts the callers waiting for call: its waiters and the cold
// reads its gate admitted. Under the group's mutex.
func (c *flightCall) callers() int {
	n := len(c.waiters)
	if c.gate != nil {
		n += len(c.gate.joiners)
	}
	return n
}

// coldGate is how a cold read's flight (coldread.go) admits other cold
// reads of its key: while open, StartChan adds them as joiners; the
// flight closes it before any look that would not answer them, and may
// then send them away at once (errColdRejoin) to read the key
// themselves. Its fields are guarded by the group's mutex.
type coldGate struct {
	g       *flightGroup
	call    *flightCall
	open    bool
	joiners []func(singleflight.Result) // delivered with the call's result, unless sent away
}

// errColdRejoin is what a cold read that joined a cold flight gets when
// the flight cannot answer it: it reads the key itself (see Get).
var errColdRejoin = errors.New("herd: internal: a cold flight's joiner must read the key itself")

// close stops admitting cold reads; with away, the ones admitted so far
// leave the call at once with errColdRejoin. Nil-safe: a flight that no
// cold read started has no gate.
func (j *coldGate) close(away bool) {
	if j == nil || j.g == nil {
		return
	}
	g := j.g
	g.mu.Lock()
	j.open = false
	var out []func(singleflight.Result)
	if away {
		out, j.joiners = j.joiners, nil
		j.call.dups -= len(out)
	}
	g.mu.Unlock()
	for _, deliver := range out {
		deliver(singleflight.Result{Err: errColdRejoin})
	}
}

// DoChan starts a call of fn for key in a new goroutine, unless one is
// running, and returns a channel that receives the call's result. Shared
// reports that the result went to more than one caller. A panic in fn is
// the call's error (a [*LoadError] holding a [*PanicError]), with
// an empty *flightResult as its value, not a crash.
func (g *flightGroup) DoChan(key string, fn func() (any, error)) <-chan singleflight.Result {
	ch := make(chan singleflight.Result, 1)
	if call, started := g.join(key, func(r singleflight.Result) { ch <- r }); started {
		g.run(key, call, fn)
	}
	return ch
}

// StartChan is DoChan for a cold read (coldread.go), which has not read
// the key: it starts a call of fn when none is running, with gate open
// (the flight closes it), and reports started; or it joins a running
// call whose gate is open. It joins no other call, and returns a nil
// channel then.
func (g *flightGroup) StartChan(key string, gate *coldGate, fn func() (any, error)) (ch <-chan singleflight.Result, started bool) {
	c := make(chan singleflight.Result, 1)
	deliver := func(r singleflight.Result) { c <- r }
	g.mu.Lock()
	if call := g.m[key]; call != nil {
		if call.gate == nil || !call.gate.open {
			g.mu.Unlock()
			return nil, false
		}
		call.dups++
		call.gate.joiners = append(call.gate.joiners, deliver)
		g.mu.Unlock()
		return c, false
	}
	call := g.startLocked(key, deliver)
	gate.g, gate.call, gate.open = g, call, true
	call.gate = gate
	g.mu.Unlock()
	g.run(key, call, fn)
	return c, true
}

// run runs call, started for key, in a new goroutine.
func (g *flightGroup) run(key string, call *flightCall, fn func() (any, error)) {
	go func() {
		var (
			v      any
			err    error
			normal bool
		)
		defer func() {
			if !normal {
				if r := recover(); r != nil {
					err = newLoadError(key, &PanicError{Value: r, Stack: debug.Stack()})
				} else {
					err = errGoexit
				}
				v = &flightResult{}
			}
			g.finish(key, call, v, err)
		}()
		v, err = fn()
		normal = true
	}()
}

// join adds deliver to the waiters of key's running call, or starts a
// call with it as the first waiter: started then reports that the caller
// must end the call with finish. deliver is called once, with the call's
// result, and must not block.
func (g *flightGroup) join(key string, deliver func(singleflight.Result)) (call *flightCall, started bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if call = g.m[key]; call != nil {
		call.dups++
		call.waiters = append(call.waiters, deliver)
		return call, false
	}
	return g.startLocked(key, deliver), true
}

// startLocked registers a new call of key with deliver as its first
// waiter; g.mu is held and no call of key runs.
func (g *flightGroup) startLocked(key string, deliver func(singleflight.Result)) *flightCall {
	if g.m == nil {
		g.m = make(map[string]*flightCall)
	}
	call := &flightCall{waiters: []func(singleflight.Result){deliver}}
	g.m[key] = call
	return call
}

// finish ends call, started for key by join: every waiter gets v and err,
// and the next caller of key starts a new call.
func (g *flightGroup) finish(key string, call *flightCall, v any, err error) {
	g.mu.Lock()
	if g.m[key] == call {
		delete(g.m, key)
	}
	waiters, shared := call.waiters, call.dups > 0
	call.waiters = nil
	if call.gate != nil {
		call.gate.open = false
		waiters = append(waiters, call.gate.joiners...)
		call.gate.joiners = nil
	}
	g.mu.Unlock()
	for _, deliver := range waiters {
		deliver(singleflight.Result{Val: v, Err: err, Shared: shared})
	}
}
