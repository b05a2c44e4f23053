// Package leasewatch is the KeepAlive loop that herd's lock backends
// share: it renews a lease at a random point between a third and a half
// of its length, retries a failed renewal until the lease's deadline,
// and shortens the last renewal so that the lease ends at an absolute
// cap (see herd.LeaseHandle's KeepAlive). It is exported so that the
// backends in nested modules (github.com/herdkit/herd/lock/...) use the
// one loop; a program using herd has no need for it.
package leasewatch

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/herdkit/herd"
)

// Renew runs until ctx ends, lost is closed, the cap is reached or extend
// reports the lease lost. It calls extend(ctx, d) to renew the lease for
// d: ttl each time, less before capAt (a zero capAt: no cap), the last
// renewal then ending the lease at capAt. A renewal that fails with an
// error other than one wrapping [herd.ErrLeaseLost] is retried, after a
// jittered pause of a twentieth of ttl (1ms to 50ms), until deadline()
// has passed.
func Renew(ctx context.Context, lost <-chan struct{}, ttl time.Duration, capAt time.Time, deadline func() time.Time, extend func(ctx context.Context, d time.Duration) error) {
	timer := time.NewTimer(ttl)
	defer timer.Stop()
	wait := func(d time.Duration) bool {
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return false
		case <-lost:
			return false
		case <-timer.C:
			return true
		}
	}
	retry := min(max(ttl/20, time.Millisecond), 50*time.Millisecond)
	for {
		if !wait(ttl/3 + rand.N(ttl/6+1)) {
			return
		}
		ext := ttl
		if !capAt.IsZero() {
			ext = min(ext, time.Until(capAt))
			if ext < time.Millisecond {
				return // at the cap: the lease runs out by itself
			}
		}
		for {
			err := extend(ctx, ext)
			if err == nil {
				break
			}
			if errors.Is(err, herd.ErrLeaseLost) || ctx.Err() != nil || time.Until(deadline()) <= 0 {
				return
			}
			if !wait(retry*3/4 + rand.N(retry/2+1)) {
				return
			}
		}
		if ext < ttl {
			return // the capped, final renewal
		}
	}
}
