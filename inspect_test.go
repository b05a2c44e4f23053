package herd

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestInspect reads back, through Inspect, what each of herd's writes
// leaves in Redis, on a real server and a 3-master cluster: a value's
// envelope, a held lease and its token, the fence counter, a failed
// load's marker, a negative entry, corrupt bytes and a FencedStore
// record; and the errors for bad input and after Close.
func TestInspect(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		rdb  func(t *testing.T) redis.UniversalClient
	}{
		{"server", func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t, 3).Client(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := tc.rdb(t)
			c := newTestCache(t, rdb, &Options{StaleFor: time.Minute})
			ctx := context.Background()
			before := time.Now()

			if err := c.Set(ctx, "user:1", []byte("hello"), time.Hour); err != nil {
				t.Fatal(err)
			}
			in, err := c.Inspect(ctx, "user:1")
			if err != nil {
				t.Fatal(err)
			}
			v := in.Value
			if v == nil || v.Bytes != 5 || v.Negative || v.Pass || v.Corrupt || v.Fence == 0 {
				t.Fatalf("value after Set: %+v", v)
			}
			if v.WrittenAt.Before(before.Add(-time.Second)) || !v.FreshUntil.After(before.Add(59*time.Minute)) ||
				!v.StaleUntil.After(v.FreshUntil) || v.TTL <= time.Hour {
				t.Errorf("value times: written %v fresh %v stale %v ttl %v", v.WrittenAt, v.FreshUntil, v.StaleUntil, v.TTL)
			}
			if in.Lease != nil || in.Failure != nil || in.Fence != v.Fence {
				t.Errorf("after Set: lease %+v, failure %+v, fence %d (value's %d)", in.Lease, in.Failure, in.Fence, v.Fence)
			}
			if !strings.Contains(in.String(), "5 bytes") || !strings.Contains(in.String(), "lease:    free") {
				t.Errorf("String:\n%s", in)
			}

			// A rebuild in progress holds the lease; its token is the counter.
			_, fill, err := c.Begin(ctx, "user:2", time.Hour, nil)
			if err != nil || fill == nil {
				t.Fatalf("Begin: %v, %v", fill, err)
			}
			in, err = c.Inspect(ctx, "user:2")
			if err != nil {
				t.Fatal(err)
			}
			if in.Value != nil || in.Lease == nil || in.Lease.Token == 0 || in.Lease.Token != in.Fence || in.Lease.TTL <= 0 || len(in.Lease.Owner) != 32 {
				t.Fatalf("during a rebuild: value %+v, lease %+v, fence %d", in.Value, in.Lease, in.Fence)
			}
			token := in.Lease.Token
			fill.Abort(errors.New("db down"))
			in, err = c.Inspect(ctx, "user:2")
			if err != nil {
				t.Fatal(err)
			}
			if in.Lease != nil || in.Failure == nil || in.Failure.Fence != token || !strings.Contains(in.Failure.Message, "db down") || in.Failure.TTL <= 0 {
				t.Fatalf("after a failed rebuild: lease %+v, failure %+v (token %d)", in.Lease, in.Failure, token)
			}

			// A negative entry.
			if _, err := c.Get(ctx, "user:3", time.Hour, func(context.Context) ([]byte, error) { return nil, ErrNotFound }); !errors.Is(err, ErrNotFound) {
				t.Fatal(err)
			}
			if in, err = c.Inspect(ctx, "user:3"); err != nil || in.Value == nil || !in.Value.Negative {
				t.Fatalf("negative entry: %+v, %v", in, err)
			}

			// Bytes that are not an envelope.
			k, _ := makeKeys(c.cfg.Prefix, "user:4")
			if err := rdb.Set(ctx, k.Value, "garbage", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if in, err = c.Inspect(ctx, "user:4"); err != nil || in.Value == nil || !in.Value.Corrupt || in.Value.Bytes != 7 {
				t.Fatalf("corrupt value: %+v, %v", in.Value, err)
			}

			// A FencedStore record.
			locks := NewLocker(rdb, &LockerOptions{Prefix: c.cfg.Prefix})
			defer locks.Close()
			lease, err := locks.TryAcquire(ctx, "user:5", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := NewFencedStore(rdb, c.cfg.Prefix).Set(ctx, "user:5", lease.Token(), []byte("x"), time.Minute); err != nil {
				t.Fatal(err)
			}
			if in, err = c.Inspect(ctx, "user:5"); err != nil || in.StoreToken != lease.Token() || in.Lease == nil || in.Lease.Token != lease.Token() {
				t.Fatalf("FencedStore record: %+v, %v (token %d)", in, err, lease.Token())
			}

			if _, err := c.Inspect(ctx, ""); !errors.Is(err, ErrInvalidKey) {
				t.Errorf("Inspect of an empty key: %v", err)
			}
			c.Close()
			if _, err := c.Inspect(ctx, "user:1"); !errors.Is(err, ErrClosed) {
				t.Errorf("Inspect after Close: %v", err)
			}
		})
	}
}
