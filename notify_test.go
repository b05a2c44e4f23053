package herd

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// A subscriber that finds the shared connection still being created waits
// for it without holding cmdMu, which the creator needs to dial: holding
// it deadlocked both (and with them every later subscribe and Close).
func TestSubscribeWaitsForTheConnectionOutsideCmdMu(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	n := newNotifier(rdb)

	// The creator of the connection has registered it but not dialled yet.
	conn := &psConn{ready: make(chan struct{}), done: make(chan struct{})}
	n.mu.Lock()
	n.conns[""] = conn
	n.mu.Unlock()

	returned := make(chan error, 1)
	go func() {
		sub, _, err := n.subscribe(context.Background(), "y")
		if sub != nil {
			defer sub.release()
		}
		returned <- err
	}()
	waitFor(t, 5*time.Second, "the second subscriber to register", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.topics["y"] != nil
	})
	time.Sleep(20 * time.Millisecond) // let it reach its wait; the check below holds either way
	if !n.cmdMu.TryLock() {
		t.Fatal("a subscriber waiting for the connection holds cmdMu: the creator could never dial")
	}
	// Play the creator: dial under cmdMu, then let the waiter go on.
	err := n.dial(context.Background(), conn, false, "x")
	n.cmdMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-returned:
		if err != nil {
			t.Errorf("subscribe: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting subscriber did not return once the connection was ready")
	}
	if err := n.close(); err != nil {
		t.Errorf("close: %v", err)
	}
}
