package herd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// TestFillPassFenced: a pass mark is written like a value, so a Pass by a
// rebuild that started before an Invalidate or a Set of its key (in
// another process) leaves no mark: the purge stands, and the Set's value
// is served. After the mark, a Set or an Invalidate replaces it at once.
func TestFillPassFenced(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestCache(t, b.rdb, nil)
			other := newTestCache(t, b.rdb, nil)
			ctx := context.Background()
			for _, purge := range []string{"invalidate", "set"} {
				key := testKey(t) + "/" + purge
				_, fill, err := c.Begin(ctx, key, time.Minute, nil)
				if err != nil || fill == nil || !fill.Leased() {
					t.Fatalf("Begin on a cold key = (%v, %v), want a leased Fill", fill, err)
				}
				if purge == "set" {
					err = other.Set(ctx, key, []byte("set"), time.Minute)
				} else {
					err = other.Invalidate(ctx, key)
				}
				if err != nil {
					t.Fatal(err)
				}
				_ = fill.Pass(errors.New("sets a cookie"), time.Minute)
				for name, cache := range map[string]*Cache{"this": c, "other": other} {
					hit, f, err := cache.Begin(ctx, key, time.Minute, nil)
					if f != nil {
						f.Abort(nil)
					}
					switch {
					case errors.Is(err, ErrPass):
						t.Errorf("%s after a %s during the rebuild: %s process finds the rebuild's pass mark", purge, purge, name)
					case purge == "set" && (hit == nil || string(hit.Value) != "set"):
						t.Errorf("%s process after a Set during the rebuild: (%v, %v, %v), want the Set's value", name, hit, f, err)
					case purge == "invalidate" && f == nil:
						t.Errorf("%s process after an Invalidate during the rebuild: (%v, %v), want a Fill", name, hit, err)
					}
				}
			}
			// A mark, then a purge of it.
			for _, purge := range []string{"invalidate", "set"} {
				key := testKey(t) + "/after-" + purge
				_, fill, err := c.Begin(ctx, key, time.Minute, nil)
				if err != nil || fill == nil {
					t.Fatal(fill, err)
				}
				if err := fill.Pass(nil, time.Minute); err != nil {
					t.Fatal(err)
				}
				if purge == "set" {
					err = other.Set(ctx, key, []byte("set"), time.Minute)
				} else {
					err = other.Invalidate(ctx, key)
				}
				if err != nil {
					t.Fatal(err)
				}
				hit, f, err := c.Begin(ctx, key, time.Minute, nil)
				if f != nil {
					f.Abort(nil)
				}
				if errors.Is(err, ErrPass) || (purge == "set" && (hit == nil || string(hit.Value) != "set")) || (purge == "invalidate" && f == nil) {
					t.Errorf("after a %s of a marked key: (%v, %v, %v)", purge, hit, f, err)
				}
			}
		})
	}
}

// TestLoadTooLargeCountedAlike: a loader's value above MaxValueBytes is
// a failed load both in Stats and to the Observer (the Prometheus
// adapter's loads_total): Stats counted a load error while the Observer
// was told the load succeeded.
func TestLoadTooLargeCountedAlike(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	co, obs := newCountingObserver()
	c := newTestCache(t, srv.Client(t), &Options{Observer: obs, MaxValueBytes: 1024})
	_, err := c.Get(context.Background(), "big", time.Minute, func(context.Context) ([]byte, error) {
		return make([]byte, 2048), nil
	})
	if !errors.Is(err, ErrValueTooLarge) {
		t.Fatalf("Get of a too large value: %v, want ErrValueTooLarge", err)
	}
	s := c.Stats()
	var failed int
	errs := co.loadErrs()
	for _, e := range errs {
		if e != nil && !errors.Is(e, ErrNotShared) && !errors.Is(e, ErrNotFound) {
			failed++
		}
	}
	if len(errs) != int(s.Loads+s.LocalLoads) || failed != int(s.LoadErrors) {
		t.Errorf("Observer: %d loads, %d failed (%v); Stats: %d loads, %d load errors", len(errs), failed, errs, s.Loads+s.LocalLoads, s.LoadErrors)
	}
}
