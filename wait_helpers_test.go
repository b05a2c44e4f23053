package herd

// Waits on conditions for the tests of package herd: instead of a sleep
// that hopes a goroutine has reached a point, a test waits (with a
// deadline) for something that says it has.

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// waitFlightJoiners waits until at least n callers besides the one that
// started it have joined c's running local flight of key.
func waitFlightJoiners(t testing.TB, c *Cache, key string, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, strconv.Itoa(n)+" callers to join the flight of "+strconv.Quote(key), func() bool {
		return FlightJoiners(c, key) >= n
	})
}

// acquireCounter is a go-redis hook that counts the ACQUIRE scripts its
// client runs (a Locker's or a Cache's tries for a lease), as they return:
// in all, and by the script's first key.
type acquireCounter struct {
	n     atomic.Int64
	mu    sync.Mutex
	byKey map[string]int64
}

// perKey returns the counts by first key.
func (h *acquireCounter) perKey() map[string]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.byKey)
}

func (h *acquireCounter) count(cmd redis.Cmder) {
	if !isAcquireCmd(cmd) {
		return
	}
	h.n.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byKey == nil {
		h.byKey = make(map[string]int64)
	}
	if a := cmd.Args(); len(a) > 3 {
		h.byKey[fmt.Sprint(a[3])]++
	}
}

func (h *acquireCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *acquireCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count(cmd)
		return err
	}
}
func (h *acquireCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return err
	}
}

// notifierSettled reports whether every pub/sub connection of n has sent
// what its subscribers want (see pubsub.Notifier.Settled).
func notifierSettled(n *notifier) bool { return n.Settled() }

// serverCalls returns how many times the server rdb talks to has run the
// command cmd (lower case), from INFO commandstats.
func serverCalls(t testing.TB, rdb redis.UniversalClient, cmd string) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			t.Fatalf("INFO commandstats: %q: %v", line, err)
		}
		return v
	}
	return 0
}
