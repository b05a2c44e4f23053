package middleware

import (
	"context"
	"log/slog"
	"sync"
)

// replacements are the deletions of corrupt values that requests of one
// handler run, one per key at a time.
type replacements struct {
	mu      sync.Mutex
	running map[string]*replacement // guarded by mu
}

// replacement is one deletion; err is written once before done is closed.
type replacement struct {
	done chan struct{}
	err  error
}

// replaceCorrupt deletes the value stored under key, which is not a
// response this middleware can serve (cause says why: a value another
// writer stored under the key, corrupt bytes, a gzip body that does not
// decode), so that the request, looking the key up again, leads a rebuild
// that stores a good one, or waits for the one another request leads.
// Without it the value would be bypassed until it expires. It reports
// whether the value was deleted; the caller replaces a value at most
// once, and bypasses the cache if it finds a bad one again (a writer that
// keeps writing the key).
//
// The deletion is Cache.Invalidate: it also fences the rebuilds of key
// in flight, so a rebuild that read the bad value cannot be lost to it
// (at worst, one that started just before is not stored, and a later
// request rebuilds). Requests of this handler that find the value while
// its deletion runs share it; each waits at most until its own context
// ends. Requests in other processes, or that find the value after the
// deletion ended, delete it again: one more Redis write each.
func (h *handler) replaceCorrupt(ctx context.Context, key string, cause error) bool {
	rs := &h.replacing
	rs.mu.Lock()
	rp := rs.running[key]
	lead := rp == nil
	if lead {
		rp = &replacement{done: make(chan struct{})}
		if rs.running == nil {
			rs.running = map[string]*replacement{}
		}
		rs.running[key] = rp
	}
	rs.mu.Unlock()
	if !lead {
		select {
		case <-rp.done:
			return rp.err == nil
		case <-ctx.Done():
			return false
		}
	}
	h.log(slog.LevelWarn, "herd/middleware: stored value is not a response; replacing it", "key", key, "err", cause)
	rp.err = h.c.Invalidate(ctx, key)
	rs.mu.Lock()
	delete(rs.running, key)
	rs.mu.Unlock()
	close(rp.done)
	if rp.err != nil {
		h.log(slog.LevelWarn, "herd/middleware: corrupt value not deleted", "key", key, "err", rp.err)
	}
	return rp.err == nil
}
