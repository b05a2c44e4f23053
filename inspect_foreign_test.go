package herd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// TestInspectBackoffAndForeignValue: Inspect's refresh backoff
// fields after a failed refresh (untested so far), and a value key of a
// foreign type: "a nil field means the thing is absent", but a hash at
// the value's name is not absent; Inspect must show something there
// (read as corrupt, with its TTL) rather than "value: none".
func TestInspectBackoffAndForeignValue(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	failed := make(chan struct{}, 1)
	c := newTestCache(t, rdb, &Options{StaleFor: time.Hour, Observer: &Observer{Refresh: func(_ string, ev RefreshEvent) {
		if ev == RefreshFailed {
			select {
			case failed <- struct{}{}:
			default:
			}
		}
	}}})
	ctx := context.Background()
	key := testKey(t)
	if err := c.Set(ctx, key, []byte("v"), 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) { return nil, errors.New("source down") })
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-failed:
		case <-time.After(50 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("no failed refresh")
			}
			continue
		}
		break
	}
	in, err := c.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if in.RefreshFailures != 1 || in.Backoff <= 0 || in.Value == nil || in.Lease != nil {
		t.Errorf("after a failed refresh: failures %d, backoff %v, value %v, lease %v; want 1, >0, the stale value, free",
			in.RefreshFailures, in.Backoff, in.Value, in.Lease)
	}

	foreign := testKey(t) + ":foreign"
	k, _ := makeKeys(c.cfg.Prefix, foreign)
	if err := rdb.HSet(ctx, k.Value, "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.PExpire(ctx, k.Value, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	in, err = c.Inspect(ctx, foreign)
	if err != nil {
		t.Fatal(err)
	}
	if in.Value == nil || !in.Value.Corrupt || in.Value.TTL <= 0 {
		t.Errorf("a hash at the value's name: Inspect shows %+v; want a corrupt value with its TTL\n%s", in.Value, in)
	}
	// "read as a miss", as Inspect's String says.
	if v, err := c.Get(ctx, foreign, time.Minute, func(context.Context) ([]byte, error) { return []byte("w"), nil }); err != nil || string(v) != "w" {
		t.Errorf("Get over the foreign value: %q, %v; want the loader's value", v, err)
	}
}
