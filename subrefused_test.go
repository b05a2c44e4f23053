package herd

import (
	"context"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A follower whose SUBSCRIBE the server refuses (an ACL user without
// rights on pub/sub channels) gets no confirmation: the refusal itself
// starts its look. Here the value lands after the follower's ACQUIRE
// found the lease held and before it subscribes, so only a look finds
// it: at once, not at the first poll (the lease and PollMax are a
// minute).
func TestFollowerLooksWhenItsSubscribeIsRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()
	if err := srv.Client(t).Do(ctx, "ACL", "SETUSER", "nochan", "on", ">pw", "~*", "resetchannels", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	const lease = time.Minute
	opt := func() *Options {
		return &Options{Prefix: "sr", MinLease: lease, MaxLease: lease, DefaultLease: lease, PollMin: lease, PollMax: lease, WaitTimeout: 2 * lease}
	}
	leader := newTestCache(t, srv.Client(t), opt())
	frdb := srv.Client(t, func(o *redis.Options) { o.Username, o.Password = "nochan", "pw" })
	follower := newTestCache(t, frdb, opt())
	h := newHoldAcquireReply()
	frdb.AddHook(h)
	release := make(chan struct{})
	l, f := leadAndFollow(t, leader, follower, "k", release, []byte("v"))
	<-h.held // the follower's ACQUIRE found the lease held; its reply waits
	close(release)
	if r := receive(t, l, "the leader"); r.err != nil {
		t.Fatalf("leader: %v", r.err)
	}
	close(h.release)
	select {
	case r := <-f:
		if r.err != nil || string(r.val) != "v" {
			t.Fatalf("follower: %q, %v", r.val, r.err)
		}
		if s := follower.Stats(); s.Waits != 1 || s.Polled != 0 {
			t.Errorf("follower stats %+v: want one wait, ended by a look, not a poll", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the follower did not get the value within 5s: it waits for a poll (stats %+v)", follower.Stats())
	}
}
