package lockgate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/sentinel"
)

// isDone reports whether ch has closed, waiting at most d.
func isDone(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// TestGateCloseEndsAndWaitsForTheRunningCalls: Close cancels the contexts
// of the running calls (Bound, Root), returns only once they and the
// goroutines they started (Go) have ended, and refuses later calls with
// sentinel.ErrClosed; a second Close returns false at once, and Wait
// waits for the calls as the first Close does.
func TestGateCloseEndsAndWaitsForTheRunningCalls(t *testing.T) {
	var g Gate
	g.Init()
	if err := g.Enter(); err != nil {
		t.Fatalf("Enter before Close: %v", err)
	}
	ctx, cancel := g.Bound(context.Background())
	defer cancel()
	release := make(chan struct{})
	goDone := make(chan struct{})
	g.Go(func() { // a goroutine of the call that outlives the call's cancellation
		<-ctx.Done()
		<-release
		close(goDone)
	})
	closed := make(chan struct{})
	go func() {
		if !g.Close() {
			t.Error("the first Close reported false")
		}
		close(closed)
	}()
	if !isDone(ctx.Done(), 5*time.Second) || !isDone(g.Root().Done(), time.Second) {
		t.Fatal("Close did not cancel the running call's context")
	}
	if err := g.Enter(); !errors.Is(err, sentinel.ErrClosed) {
		t.Fatalf("Enter after Close: %v, want ErrClosed", err)
	}
	if g.Close() {
		t.Fatal("a second Close reported true")
	}
	waited := make(chan struct{})
	go func() { g.Wait(); close(waited) }()
	if isDone(closed, 50*time.Millisecond) || isDone(waited, 0) {
		t.Fatal("Close or Wait returned while a call and its goroutine still ran")
	}
	g.Leave()
	if isDone(closed, 50*time.Millisecond) {
		t.Fatal("Close returned while the call's goroutine still ran")
	}
	close(release)
	if !isDone(closed, 5*time.Second) || !isDone(waited, 5*time.Second) || !isDone(goDone, time.Second) {
		t.Fatal("Close or Wait did not return once the call and its goroutine ended")
	}
}
