package herd

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/fencedset.lua
	fencedSetLua    string
	fencedSetScript = redis.NewScript(fencedSetLua)
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
// Equal tokens are accepted, so a holder may write more than once and a
// retried write is idempotent. The highest token lives with the record:
// when the record expires or is deleted, the history goes with it.
//
// A FencedStore is safe for concurrent use.
type FencedStore struct {
	rdb    redis.UniversalClient
	prefix string
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
	checkPrefix(prefix)
	return &FencedStore{rdb: rdb, prefix: prefix}
}

// Set stores val under key if token is at least the highest token seen for
// key, in one round trip. It returns an error wrapping [ErrFenced] when a
// higher token has written. A ttl of zero keeps the record until it is
// overwritten; a negative ttl is [ErrInvalidTTL]; an empty key is
// [ErrInvalidKey].
func (s *FencedStore) Set(ctx context.Context, key string, token uint64, val []byte, ttl time.Duration) error {
	if ttl < 0 || (ttl > 0 && ttl < time.Millisecond) {
		return fmt.Errorf("%w: %v (must be 0 or at least 1ms)", ErrInvalidTTL, ttl)
	}
	keys, err := makeKeys(s.prefix, key)
	if err != nil {
		return err
	}
	res, err := fencedSetScript.Run(ctx, s.rdb, []string{keys.record},
		strconv.FormatUint(token, 10), val, ttl.Milliseconds()).Slice()
	if err != nil {
		return fmt.Errorf("herd: fenced set %q: %w", key, err)
	}
	ok, top, err := parsePair(res)
	if err != nil {
		return fmt.Errorf("herd: fenced set %q: %w", key, err)
	}
	if ok != 1 {
		return fmt.Errorf("%w: %q: token %d is below %s", ErrFenced, key, token, top)
	}
	return nil
}

// Get returns the value stored under key and the token that wrote it, or
// an error wrapping [ErrNotFound] when there is none.
func (s *FencedStore) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	keys, err := makeKeys(s.prefix, key)
	if err != nil {
		return nil, 0, err
	}
	res, err := s.rdb.HMGet(ctx, keys.record, "t", "v").Result()
	if err != nil {
		return nil, 0, fmt.Errorf("herd: fenced get %q: %w", key, err)
	}
	t, tok := res[0].(string)
	v, val := res[1].(string)
	if !tok || !val {
		return nil, 0, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	token, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("herd: fenced get %q: %w", key, errors.Join(ErrNotFound, err))
	}
	return []byte(v), token, nil
}
