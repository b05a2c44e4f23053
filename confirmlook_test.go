package herd

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/faultproxy"
)

// A follower looks when its subscription is confirmed, not before. Its
// SUBSCRIBE is on the wire (a slow link upstream) when the leader
// commits, so the message misses it; then every connection of the
// follower is cut before the server has the SUBSCRIBE. go-redis redials
// and resubscribes; the confirmation then starts the look that finds the
// value, long before any poll (the lease and PollMax are 10s). For a
// follower whose first look was a GET and one whose was a cold read.
func TestFollowerLooksAtTheConfirmationAfterAConnectionCut(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	bg := context.Background()
	const lease = 10 * time.Second
	quiet := func() *Options {
		return &Options{MinLease: lease, MaxLease: lease, DefaultLease: lease, PollMin: 10 * time.Second, PollMax: 10 * time.Second, WaitTimeout: time.Minute}
	}
	l := r.cache(r.direct, quiet())
	slow := r.client(timeouts{dial: 5 * time.Second, read: 10 * time.Second, write: 10 * time.Second})
	a := r.cache(slow, quiet())
	warm, _, err := a.notify.Subscribe(bg, "warm-channel")
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Release()
	waitFor(t, 10*time.Second, "the warm subscription", func() bool { return notifierSettled(a.notify) })
	for _, cold := range []bool{false, true} {
		key := testKey(t) + map[bool]string{false: "warm", true: "cold"}[cold]
		if cold && !a.warm.cold() {
			missOnce(t, a, "first-miss")
		}
		g := newGatedLoader("v")
		lDone := make(chan error, 1)
		go func() { _, err := l.Get(bg, key, time.Hour, g.load); lDone <- err }()
		g.waitEntered(t)
		waits, notified := a.Stats().Waits, a.Stats().Notified
		r.proxy.SetLatency(faultproxy.Upstream, 500*time.Millisecond) // A's ACQUIRE and SUBSCRIBE reach the server late
		fDone := make(chan error, 1)
		var fv atomic.Value
		go func() {
			v, err := a.Get(bg, key, time.Hour, noLoad(t))
			fv.Store(string(v))
			fDone <- err
		}()
		waitFor(t, 10*time.Second, "A to follow", func() bool { return a.Stats().Waits == waits+1 })
		waitFor(t, 10*time.Second, "A's SUBSCRIBE to be sent", func() bool { return notifierSettled(a.notify) })
		close(g.gate)
		if err := <-lDone; err != nil {
			t.Fatal(err)
		}
		cutAt := time.Now()
		r.proxy.Cut()
		r.proxy.SetLatency(faultproxy.Upstream, 0)
		if n := r.direct.PubSubNumSub(bg, mustKeys(t, key).Channel).Val()[mustKeys(t, key).Channel]; n != 0 {
			t.Fatalf("cold=%v: the server had A's SUBSCRIBE before the commit and cut: the test did not set up its case", cold)
		}
		start := cutAt
		select {
		case err := <-fDone:
			if err != nil || fv.Load() != "v" {
				t.Fatalf("cold=%v: follower: (%v, %v)", cold, fv.Load(), err)
			}
			t.Logf("cold=%v: the follower got the value %v after the cut; notified +%d", cold, time.Since(start).Round(time.Millisecond), a.Stats().Notified-notified)
		case <-time.After(4 * time.Second):
			t.Fatalf("cold=%v: the follower did not get the value within 4s of the cut (its wake-up was lost; stats %+v)", cold, a.Stats())
		}
	}
}
