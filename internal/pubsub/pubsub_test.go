package pubsub

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/herdkit/herd/internal/redistest.(*Server).launchLocked.func1"))
}

var errTestClosed = errors.New("test: closed")

func waitNotice(t *testing.T, sub *Subscription, what string) Notice {
	t.Helper()
	select {
	case nt := <-sub.C:
		return nt
	case <-time.After(10 * time.Second):
		t.Fatalf("no notice: %s", what)
		return Notice{}
	}
}

// One server: a subscription is confirmed, then gets what is published on
// its channel (and the shared ping with it); a released subscription
// leaves nothing registered; after Close, subscribing returns the
// caller's error.
func TestNotifierSingleServer(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	n := New(rdb, errTestClosed)
	if cmd := n.PublishCmd(ctx); cmd != "PUBLISH" {
		t.Fatalf("PublishCmd = %s, want PUBLISH on a single server", cmd)
	}

	sub, live, err := n.Subscribe(ctx, "a:{t}:n")
	if err != nil {
		t.Fatal(err)
	}
	if !live {
		if nt := waitNotice(t, sub, "the confirmation"); !nt.Resub {
			t.Fatalf("first notice %+v, want the confirmation", nt)
		}
	}
	ping := make(chan struct{}, 1)
	other, _, err := n.Listen(ctx, "a:{t}:n", ping)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Publish(ctx, "a:{t}:n", "Vhello").Err(); err != nil {
		t.Fatal(err)
	}
	for nt := waitNotice(t, sub, "the message"); nt.Payload != "Vhello"; nt = waitNotice(t, sub, "the message") {
		if !nt.Resub {
			t.Fatalf("notice %+v, want the message", nt)
		}
	}
	select {
	case <-ping:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener's ping was not sent")
	}
	if got := n.Channels(); len(got) != 1 || got[0] != "a:{t}:n" {
		t.Fatalf("Channels = %q, want the one channel", got)
	}
	sub.Release()
	sub.Release() // harmless
	other.Release()
	if got := n.Channels(); len(got) != 0 {
		t.Fatalf("Channels after Release = %q, want none", got)
	}

	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := n.Subscribe(ctx, "a:{t}:n"); !errors.Is(err, errTestClosed) {
		t.Fatalf("Subscribe after Close: %v, want the error given to New", err)
	}
}

// A ctx that has ended registers nothing.
func TestNotifierSubscribeEndedCtx(t *testing.T) {
	srv := redistest.Start(t)
	n := New(srv.Client(t), errTestClosed)
	defer n.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := n.Subscribe(ctx, "c"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Subscribe with an ended ctx: %v, want context.Canceled", err)
	}
	if got := n.Channels(); len(got) != 0 {
		t.Fatalf("Channels = %q, want none", got)
	}
}
