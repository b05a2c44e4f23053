package herd

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options.LoadTimeout's doc: "The loader's context is detached from
// every caller's ... and ends after LoadTimeout or MaxHold, whichever is
// shorter, or on Close." A loader run without a lease (Redis down:
// fail-open) is one run of a loader too; its context must end at
// MaxHold when MaxHold is the shorter. The leader's run honours it
// (flight.go lead); the local run does not.
func TestLocalLoadContextEndsAtMaxHoldWhenShorter(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there: Redis is down
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 100 * time.Millisecond,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	const maxHold = 200 * time.Millisecond
	c := newTestCache(t, rdb, &Options{LoadTimeout: time.Minute, MaxHold: maxHold})
	for _, name := range []string{"Get", "GetMany"} {
		var left time.Duration
		var had bool
		probe := func(ctx context.Context) {
			var dl time.Time
			dl, had = ctx.Deadline()
			left = time.Until(dl)
		}
		switch name {
		case "Get":
			if _, err := c.Get(context.Background(), testKey(t)+name, time.Minute, func(ctx context.Context) ([]byte, error) {
				probe(ctx)
				return []byte("v"), nil
			}); err != nil {
				t.Fatalf("Get with Redis down: %v", err)
			}
		case "GetMany":
			if _, err := c.GetMany(context.Background(), []string{testKey(t) + name}, time.Minute, func(ctx context.Context, keys []string) (map[string][]byte, error) {
				probe(ctx)
				return map[string][]byte{keys[0]: []byte("v")}, nil
			}); err != nil {
				t.Fatalf("GetMany with Redis down: %v", err)
			}
		}
		if st := c.Stats(); st.LocalLoads == 0 {
			t.Fatalf("%s: no local load (stats %+v)", name, st)
		}
		if !had || left > maxHold {
			t.Errorf("%s's fail-open loader ran with %v left on its ctx (deadline set: %v), want at most MaxHold %v (LoadTimeout 1m): the doc says whichever is shorter", name, left.Round(time.Millisecond), had, maxHold)
		}
	}
}
