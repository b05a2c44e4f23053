package herd

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// Fill.Commit's doc: "Calls after the first Commit or Abort do nothing and
// return nil", and Cache.Close's: "A Fill that Close aborted has given its
// lease back: its Commit and Abort do nothing and return nil". A late
// Commit whose arguments would have been refused on a live Fill (an
// oversized value, a bad ttl) still does nothing, so it must return nil
// too: a caller that logs or counts Commit's error after Close (the HTTP
// middleware finishing a response while the server shuts down) must not
// see a failure for a Fill that no longer exists.
func TestFillCommitAfterCloseAbortedItReturnsNil(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, &Options{MaxValueBytes: 8})
	ctx := context.Background()
	key := testKey(t)
	hit, fill, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || hit != nil || fill == nil || !fill.Leased() {
		t.Fatalf("Begin on a cold key = (%v, %v, %v), want a leased Fill", hit, fill, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, mustKeys(t, key).Lease).Val(); n != 0 {
		t.Fatalf("lease still held after Close aborted the Fill")
	}
	for name, commit := range map[string]func() error{
		"a value above MaxValueBytes": func() error { return fill.Commit([]byte(strings.Repeat("x", 64)), time.Minute, 0) },
		"a ttl of zero":               func() error { return fill.Commit([]byte("v"), 0, 0) },
		"a valid value":               func() error { return fill.Commit([]byte("v"), time.Minute, 0) },
	} {
		if err := commit(); err != nil {
			t.Errorf("Commit with %s after Close aborted the Fill = %v, want nil (the doc: it does nothing and returns nil)", name, err)
		}
	}
	if err := fill.Pass(nil, 0); err != nil {
		t.Errorf("Pass with a ttl of zero after Close aborted the Fill = %v, want nil (Pass's doc: calls after the first Commit, Abort, Handover or Pass do nothing and return nil)", err)
	}
}

// The same for a Fill that was already committed.
func TestFillSecondCommitReturnsNil(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, &Options{MaxValueBytes: 8})
	ctx := context.Background()
	key := testKey(t)
	_, fill, err := c.Begin(ctx, key, time.Minute, nil)
	if err != nil || fill == nil {
		t.Fatalf("Begin on a cold key: fill %v, err %v", fill, err)
	}
	if err := fill.Commit([]byte("built"), time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	if err := fill.Commit([]byte(strings.Repeat("x", 64)), time.Minute, 0); err != nil {
		t.Errorf("second Commit (oversized) = %v, want nil: calls after the first Commit do nothing and return nil", err)
	}
	if err := fill.Commit([]byte("late"), 0, 0); err != nil {
		t.Errorf("second Commit (ttl 0) = %v, want nil: calls after the first Commit do nothing and return nil", err)
	}
	got, found, err := c.Peek(ctx, key)
	if err != nil || !found || string(got) != "built" {
		t.Errorf("Peek after the late Commits = (%q, %v, %v), want the first Commit's value", got, found, err)
	}
}
