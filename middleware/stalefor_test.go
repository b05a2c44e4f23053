package middleware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/herdkit/herd"
)

// TestStaleForPrecedence: the middleware's StaleFor decides the stale
// window of every response it stores, zero included; the Cache's
// herd.Options.StaleFor applies to the Cache's own Get and Fetch calls
// only. The window shows in the stored value's hard TTL in Redis (ttl +
// stale window), so no clock has to pass.
func TestStaleForPrecedence(t *testing.T) {
	const ttl = 10 * time.Second
	for _, tc := range []struct {
		name             string
		cache, mw        time.Duration
		wantMin, wantMax time.Duration // bounds of the value's PTTL
	}{
		{"cache only: no stale window", time.Hour, 0, ttl - time.Second, ttl},
		{"middleware only", 0, time.Minute, ttl + time.Minute - time.Second, ttl + time.Minute},
		{"both: the middleware's", time.Hour, time.Minute, ttl + time.Minute - time.Second, ttl + time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, rdb := newCache(t, &herd.Options{StaleFor: tc.cache})
			h := New(c, &Options{TTL: ttl, StaleFor: tc.mw})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write([]byte("page"))
			}))
			srv := httptest.NewServer(h)
			defer srv.Close()
			if res, body := get(t, srv.URL+"/page"); body != "page" || !sameStatus(res.Header.Get("Cache-Status"), statusStored) {
				t.Fatalf("first GET: %q, Cache-Status %q", body, res.Header.Get("Cache-Status"))
			}
			ctx := context.Background()
			keys, err := rdb.Keys(ctx, "herd:*:v").Result()
			if err != nil || len(keys) != 1 {
				t.Fatalf("stored values %q (%v), want one", keys, err)
			}
			pttl, err := rdb.PTTL(ctx, keys[0]).Result()
			if err != nil || pttl < tc.wantMin || pttl > tc.wantMax {
				t.Errorf("stored for %v (%v), want between %v and %v (ttl %v + StaleFor %v)", pttl, err, tc.wantMin, tc.wantMax, ttl, tc.mw)
			}
		})
	}
}
