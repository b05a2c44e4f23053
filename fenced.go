package herd

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

// FencedStore is a Redis-backed resource that enforces fencing tokens: a
// write is accepted only when its token is at least the highest token the
// record has seen. It closes the classic hole of lease-based mutual
// exclusion: holder A takes token 33, pauses past its lease (a GC pause, a
// stalled VM), B takes token 34 and writes; when A wakes and writes with
// 33, the write is rejected with [ErrFenced] instead of overwriting B.
//
// The token may come from any lock backend ([LeaseHandle.Token]:
// [Lease], [RedlockLease], or a nested module's lease, such as
// github.com/herdkit/herd/lock/postgres), as long as one record is written
// with the tokens of one lock name.
//
// Equal tokens are accepted: tokens are unique per acquisition, so an
// equal token is the same holding writing again; a holder may write more
// than once, and a retried write is idempotent. The FencedTable of
// lock/postgres and lock/mysql follow the same rule; docs/locks.md
// ("Fencing tokens") explains it, and the tokens' values. The highest
// token lives with the record: when the record expires or is deleted,
// the history goes with it.
//
// A write waits for the master's replicas, as the Locker's fence-advancing
// writes do by default (see [LockerOptions].ReplicaAcks 0: every replica
// the master had attached in the last minute): Set returns nil only once
// they have it, so a failover cannot undo an accepted write and let a
// deposed holder's older token in after it.
//
// A FencedStore is safe for concurrent use.
type FencedStore struct {
	rdb    redis.UniversalClient
	prefix string
	writes *replicaWait
}

// NewFencedStore returns a FencedStore in rdb under prefix (empty means
// [DefaultPrefix]). It panics on a nil client or a prefix that contains
// '{' or '}'.
func NewFencedStore(rdb redis.UniversalClient, prefix string) *FencedStore {
	if rdb == nil {
		panic("herd: NewFencedStore with a nil Redis client")
	}
	if prefix == "" {
		prefix = DefaultPrefix
	}
	wire.CheckPrefix(prefix)
	w := resolveReplicaWait("FencedStore", 0, 0)
	w.fitReadTimeout(rdb)
	return &FencedStore{rdb: rdb, prefix: prefix, writes: w}
}

// WithReplicaWait returns a copy of s whose writes wait for acks replicas,
// each wait for at most timeout, as [LockerOptions].ReplicaAcks and
// ReplicaTimeout do for the Locker: 0 (the default) waits for every
// replica the process saw attached to the master in the last minute,
// which needs the Redis user to be allowed INFO (without it every write
// is reported not replicated, with an error that says so); a positive
// acks waits for that many; -1 never waits. A timeout of 0 is the
// default, 250ms; it is cut to half the client's ReadTimeout. It panics
// on an acks below -1 or a negative timeout.
func (s *FencedStore) WithReplicaWait(acks int, timeout time.Duration) *FencedStore {
	w := resolveReplicaWait("FencedStore", acks, timeout)
	w.fitReadTimeout(s.rdb)
	c := *s
	c.writes = w
	return &c
}

// fencedKeyQuote is how much of a key a FencedStore's error quotes.
const fencedKeyQuote = 64

// keyText is key as a FencedStore's errors quote it: whole up to
// fencedKeyQuote bytes, else its start and its length.
func keyText(key string) string {
	if len(key) <= fencedKeyQuote {
		return strconv.Quote(key)
	}
	return fmt.Sprintf("%q… (%d bytes)", cutText(key, fencedKeyQuote), len(key))
}

// Set stores val under key if token is at least the highest token seen for
// key, in one round trip (with the replica wait). It returns an error
// wrapping [ErrFenced], with the record's fence and token, when a higher
// token has written, and one wrapping
// [ErrNotReplicated] when the master stored val but too few replicas
// acknowledged it in time: a failover may still undo that write, so treat
// it as not done (a retry with the same token is idempotent). A ttl of zero keeps the record until it is
// overwritten; a negative ttl is [ErrInvalidTTL]; an empty key is
// [ErrInvalidKey]. When ctx ends first, Set returns ctx's error at once
// (wrapped); the write may still land, so treat it as not known.
func (s *FencedStore) Set(ctx context.Context, key string, token uint64, val []byte, ttl time.Duration) error {
	if ttl < 0 || (ttl > 0 && ttl < time.Millisecond) {
		return fmt.Errorf("%w: %v (must be 0 or at least 1ms)", ErrInvalidTTL, ttl)
	}
	_, err := s.write(ctx, "fenced set", key, token, fencedSetScript, val, ttl.Milliseconds())
	return err
}

// Fence raises key's fence to token, without changing its value, and
// returns that value, in one round trip (with the replica wait): from
// then on every write of a lower token is refused. It is the claim of a
// new holder that must know what its predecessors wrote: a Get and then
// a Set with the new token could overwrite a write of an older token that
// landed between them. A missing record is created, with an empty value
// and no expiry; an existing one keeps its expiry, and its fence goes
// with it when it expires (as for [FencedStore.Set]: the history lives
// with the record; a Job's records never expire). The errors are Set's:
// [ErrFenced] when a higher token has written (nothing changed),
// [ErrNotReplicated] when the replicas did not confirm the raised fence,
// [ErrInvalidKey] for an empty key, and ctx's error when ctx ends first.
func (s *FencedStore) Fence(ctx context.Context, key string, token uint64) ([]byte, error) {
	v, err := s.write(ctx, "fence", key, token, fencedSetScript, "", 0, "1")
	if err != nil {
		return nil, err
	}
	return []byte(v), nil
}

// write runs sc, a fenced write ({1, reply} when token was accepted, {0,
// the highest token} when fenced), on key's record with token and args,
// and returns its reply; op names it in errors.
func (s *FencedStore) write(ctx context.Context, op, key string, token uint64, sc *script, args ...any) (string, error) {
	keys, err := makeKeys(s.prefix, key)
	if err != nil {
		return "", err
	}
	type sent struct {
		cmd  *redis.Cmd
		werr error
	}
	// The caller leaves when ctx ends; the round trip goes on (go-redis
	// waits for a reply it was sent, up to the client's ReadTimeout), so
	// the write may still land, as a Cache's Set may.
	r, err := leaveOnDone(ctx, untracked, func() (sent, error) {
		cmd, werr := s.writes.run(ctx, s.rdb, keys.Record, sc, []string{keys.Record},
			append([]any{strconv.FormatUint(token, 10)}, args...)...)
		return sent{cmd, werr}, nil
	}, nil)
	if err != nil {
		return "", fmt.Errorf("herd: %s %s: %w", op, keyText(key), err)
	}
	res, err := r.cmd.Slice()
	if err != nil {
		return "", fmt.Errorf("herd: %s %s: %w", op, keyText(key), err)
	}
	ok, reply, err := parsePair(res)
	if err != nil {
		return "", fmt.Errorf("herd: %s %s: %w", op, keyText(key), err)
	}
	if ok != 1 {
		return "", fmt.Errorf("%w: %s: the record's fence is %s, above the write's token %d", ErrFenced, keyText(key), reply, token)
	}
	if r.werr != nil {
		return "", fmt.Errorf("herd: %s %s: stored on the master, not confirmed on its replicas: %w", op, keyText(key), r.werr)
	}
	return reply, nil
}

// Get returns the value stored under key and the token that wrote it, or
// an error wrapping [ErrNotFound] when there is none. It is a plain read
// and follows the client's routing (see [New] on clients that read
// replicas).
func (s *FencedStore) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	keys, err := makeKeys(s.prefix, key)
	if err != nil {
		return nil, 0, err
	}
	res, err := leaveOnDone(ctx, untracked, func() ([]any, error) {
		return s.rdb.HMGet(ctx, keys.Record, "t", "v").Result()
	}, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("herd: fenced get %s: %w", keyText(key), err)
	}
	t, tok := res[0].(string)
	v, val := res[1].(string)
	if !tok || !val {
		return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, keyText(key))
	}
	token, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("herd: fenced get %s: %w", keyText(key), errors.Join(ErrNotFound, err))
	}
	return []byte(v), token, nil
}
