// Package herd stops cache stampedes across a whole fleet of service
// instances that share a Redis.
//
// When a hot key is missing or expiring, every instance of a service sees
// the miss at once and, unprotected, every one of them rebuilds it from
// the database. herd makes one request in the whole cluster rebuild the
// value, with two tiers: a local single-flight, so each process sends at
// most one request per key to Redis, and a short lease in Redis per key,
// so one process in the cluster rebuilds.
//
// # The short lease
//
// [Locker] is the lease primitive, usable on its own, for example for a
// scheduled job that must not run twice at the same time:
//
//	locker := herd.NewLocker(rdb, nil)
//	defer locker.Close()
//	lease, err := locker.TryAcquire(ctx, "nightly-report", 30*time.Second)
//	if errors.Is(err, herd.ErrLeaseHeld) {
//		return nil // another instance runs it
//	}
//	if err != nil {
//		return err
//	}
//	defer lease.Release(context.WithoutCancel(ctx))
//	lease.KeepAlive(10 * time.Minute) // renew until done, at most 10 minutes
//	select {
//	case <-lease.Lost():
//		return errors.New("lease lost; stopping")
//	case err := <-runJob(ctx, lease.Token()):
//		return err
//	}
//
// A lease is one Redis key set with SET NX PX to a random 128-bit owner id.
// The acquiring script also increments the key's fence counter and returns
// it as the lease's fencing token ([Lease.Token]); the counter is seeded
// from the Redis clock when absent, so tokens of a key keep increasing
// across counter expiry and Redis restarts. Extend and Release compare the
// owner id inside a script: a holder whose lease lapsed can never extend
// or delete the next holder's lease. [Lease.KeepAlive] renews at a random
// point between a third and a half of the lease length, up to an absolute
// cap, and [Lease.Lost] is closed when the lease is known lost.
//
// # Fencing
//
// A lease alone cannot stop a holder that paused past its lease (a GC
// pause, a stalled VM) from writing after the next holder did. The
// protected resource must check the token: [FencedStore] is such a
// resource in Redis, accepting a write only when its token is at least the
// highest token it has seen.
//
// # Keys
//
// Any string except the empty one is a valid key ([ErrInvalidKey]),
// including '{', '}', ':', newlines and binary. A key's Redis names are
// PREFIX:{T}:ROLE, where T is the base64url SHA-256 of the key: fixed
// length, no raw user bytes, and one hash tag for all of a key's names, so
// in Redis Cluster they share a slot and no key can pick or split it.
//
// # Failure behaviour
//
//   - Redis unreachable: TryAcquire, Acquire, Extend and Release return the
//     wrapped Redis error; a watchdog retries renewals until the lease's
//     validity runs out, then closes Lost.
//   - A holder dies or stalls: its lease expires after its length; waiters
//     in Acquire poll for the holder's remaining time and take over.
//   - A reply lost after the server ran the command: go-redis re-sends it,
//     and the scripts recognise their own earlier run (an acquire reports
//     the lease acquired, a release reports it released).
//   - Every wait is bounded by the caller's context and by a limit derived
//     from the lease length.
//
// Errors are sentinels compared with [errors.Is]: [ErrInvalidKey],
// [ErrInvalidTTL], [ErrLeaseHeld], [ErrLeaseLost], [ErrFenced],
// [ErrWaitTimeout], [ErrNotFound] and [ErrClosed].
package herd
