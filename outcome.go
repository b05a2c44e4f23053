package herd

import "context"

// Outcome says how a call was served. Read it with [WithOutcome].
type Outcome uint8

var outcomeNames = [...]string{"unknown", "hit", "stale", "early-refresh", "negative", "leader", "follower", "fallback", "pass"}

// String returns the outcome's name, such as "early-refresh".
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "Outcome(" + string(rune('0'+o)) + ")"
}

type outcomeKey struct{}

// WithOutcome returns a context that makes [Cache.Get], [Fetch] and
// [Cache.Peek] record how the call was served in *o: declare an Outcome
// per call, pass WithOutcome(ctx, &o) to it, and read o after it
// returns (see the example). The recording is a context value so that
// Get, Fetch and Peek keep one signature, and so that a middleware or a
// helper between the caller and herd passes it through untouched.
// Callers of one flight in a process share its outcome. The HTTP
// middleware uses it for the Cache-Status header. Get, Fetch and Peek
// write o in the calling goroutine, before they return.
func WithOutcome(ctx context.Context, o *Outcome) context.Context {
	return context.WithValue(ctx, outcomeKey{}, o)
}

func recordOutcome(ctx context.Context, o Outcome) {
	if p, ok := ctx.Value(outcomeKey{}).(*Outcome); ok && p != nil {
		*p = o
	}
}

// reportLookup reports how one call was served to the Observer and
// counts a follower's call in Stats.Follows, so that the two agree.
func (c *Cache) reportLookup(key string, o Outcome) {
	if o == OutcomeFollower {
		c.stats.follows.Add(1)
	}
	c.sig.lookup(key, o)
}
