package etcd_test

import (
	"context"
	"errors"
	"time"

	herdetcd "github.com/herdkit/herd/lock/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The README's example: a job that runs on one instance at a time, and
// stops when its lock is lost. (Compiled, not run: it needs an etcd.)
func Example() {
	_ = func(ctx context.Context, cli *clientv3.Client, work func(context.Context, uint64) <-chan error) error {
		locks := herdetcd.New(cli, nil) // a herd.Lock[*herdetcd.Lease]; the client stays yours
		defer locks.Close()
		lease, err := locks.Acquire(ctx, "nightly-report", 30*time.Second)
		if err != nil {
			return err // errors.Is(err, herd.ErrLeaseHeld): still held when ctx or MaxWait ran out
		}
		defer lease.Release(ctx)
		lease.KeepAlive(10 * time.Minute) // renew until Release; 10 minutes caps the whole holding (not an interval)
		select {
		case <-lease.Lost():
			return errors.New("lost the lock") // stop the work
		case err := <-work(ctx, lease.Token()): // pass the token to the resource, which fences on it
			return err
		}
	}
}
