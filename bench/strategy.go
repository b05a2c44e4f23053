package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/bsm/redislock"
	gocache "github.com/go-redis/cache/v9"
	"github.com/herdkit/herd"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// loadFunc calls the origin.
type loadFunc = func(ctx context.Context) ([]byte, error)

// strategy is one way of reading a cached key and rebuilding it on a miss.
type strategy interface {
	Get(ctx context.Context, key string, load loadFunc) ([]byte, error)
	// Set writes a new value of key, the way a user of the strategy
	// updates the cache after writing to the database (the hotkey
	// scenario's writer).
	Set(ctx context.Context, key string, val []byte) error
	Close() error
	// HerdStats returns herd's counters, or nil for the other strategies.
	HerdStats() *herd.Stats
}

// strategyParams is what every strategy of a phase is built from.
type strategyParams struct {
	Name     string
	Prefix   string // every Redis key of the phase starts with Prefix + ":"
	TTL      time.Duration
	StaleFor time.Duration // herd-swr only
}

func newStrategy(p strategyParams, rdb redis.UniversalClient) (strategy, error) {
	switch p.Name {
	case stNone:
		return &plain{rdb: rdb, prefix: p.Prefix, ttl: p.TTL}, nil
	case stSingle:
		return &plain{rdb: rdb, prefix: p.Prefix, ttl: p.TTL, sf: new(singleflight.Group)}, nil
	case stGoCache:
		return &goCache{c: gocache.New(&gocache.Options{Redis: rdb}), prefix: p.Prefix, ttl: p.TTL}, nil
	case stRedisLock:
		return &lockPoller{rdb: rdb, locks: redislock.New(rdb), prefix: p.Prefix, ttl: p.TTL, lockTTL: stallLease}, nil
	case stHerdPoll:
		np := newNoPubSub(rdb)
		c := herd.New(np, &herd.Options{Prefix: p.Prefix, PollMin: herdPollEvery, PollMax: herdPollEvery})
		return &herdCache{c: c, ttl: p.TTL, closeAlso: np.dead}, nil
	case stHerdNotify:
		return &herdCache{c: herd.New(rdb, &herd.Options{Prefix: p.Prefix}), ttl: p.TTL}, nil
	case stHerdSWR:
		return &herdCache{c: herd.New(rdb, &herd.Options{Prefix: p.Prefix, StaleFor: p.StaleFor}), ttl: p.TTL}, nil
	case stHerdNear:
		opt := &herd.Options{Prefix: p.Prefix, Near: herd.NearOptions{MaxEntries: nearEntries}}
		return &herdCache{c: herd.New(rdb, opt), ttl: p.TTL}, nil
	}
	return nil, fmt.Errorf("unknown strategy %q", p.Name)
}

// plain is the unprotected cache-aside: GET; on a miss call the origin and
// SET. With sf set, callers of a key in one process share one such
// sequence (golang.org/x/sync/singleflight), but processes do not
// coordinate.
type plain struct {
	rdb    redis.UniversalClient
	prefix string
	ttl    time.Duration
	sf     *singleflight.Group
}

func (p *plain) Get(ctx context.Context, key string, load loadFunc) ([]byte, error) {
	k := p.prefix + ":" + key
	if p.sf == nil {
		return p.getOrLoad(ctx, k, load)
	}
	v, err, shared := p.sf.Do(k, func() (any, error) { return p.getOrLoad(ctx, k, load) })
	if err != nil {
		return nil, err
	}
	b := v.([]byte)
	if shared {
		b = bytes.Clone(b)
	}
	return b, nil
}

func (p *plain) getOrLoad(ctx context.Context, k string, load loadFunc) ([]byte, error) {
	b, err := p.rdb.Get(ctx, k).Bytes()
	if err == nil {
		return b, nil
	}
	if !errors.Is(err, redis.Nil) {
		return nil, err
	}
	b, err = load(ctx)
	if err != nil {
		return nil, err
	}
	if err := p.rdb.Set(ctx, k, b, p.ttl).Err(); err != nil {
		return nil, err
	}
	return b, nil
}

// Set is the write-through of a cache-aside: SET with the TTL.
func (p *plain) Set(ctx context.Context, key string, val []byte) error {
	return p.rdb.Set(ctx, p.prefix+":"+key, val, p.ttl).Err()
}

func (p *plain) Close() error           { return nil }
func (p *plain) HerdStats() *herd.Stats { return nil }

// goCache is github.com/go-redis/cache's Once: a local single-flight
// around GET, and on a miss the loader and SET. No local (in-process)
// cache tier, so every read goes to Redis as with the other strategies.
type goCache struct {
	c      *gocache.Cache
	prefix string
	ttl    time.Duration
}

func (g *goCache) Get(ctx context.Context, key string, load loadFunc) ([]byte, error) {
	var out []byte
	err := g.c.Once(&gocache.Item{
		Ctx:   ctx,
		Key:   g.prefix + ":" + key,
		Value: &out,
		TTL:   g.ttl,
		Do:    func(*gocache.Item) (any, error) { return load(ctx) },
	})
	return out, err
}

// Set is go-redis/cache's Cache.Set (its SET with the TTL).
func (g *goCache) Set(ctx context.Context, key string, val []byte) error {
	return g.c.Set(&gocache.Item{Ctx: ctx, Key: g.prefix + ":" + key, Value: val, TTL: g.ttl})
}

func (g *goCache) Close() error           { return nil }
func (g *goCache) HerdStats() *herd.Stats { return nil }

// lockPoller is a hand-rolled distributed lock with polling, as commonly
// written with github.com/bsm/redislock: GET; on a miss try the lock
// (SET NX PX, no retry); the holder GETs once more, loads, SETs and
// releases; the others sleep 10 ms and start again (GET, then try the
// lock: a holder that died is replaced once its lock expires). There is
// no local single-flight: every caller polls on its own.
type lockPoller struct {
	rdb     redis.UniversalClient
	locks   *redislock.Client
	prefix  string
	ttl     time.Duration
	lockTTL time.Duration
}

func (l *lockPoller) Get(ctx context.Context, key string, load loadFunc) ([]byte, error) {
	k := l.prefix + ":" + key
	for {
		b, err := l.rdb.Get(ctx, k).Bytes()
		if err == nil {
			return b, nil
		}
		if !errors.Is(err, redis.Nil) {
			return nil, err
		}
		lock, err := l.locks.Obtain(ctx, l.prefix+":lock:"+key, l.lockTTL, nil)
		switch {
		case err == nil:
			return l.lead(ctx, k, lock, load)
		case !errors.Is(err, redislock.ErrNotObtained):
			return nil, err
		}
		t := time.NewTimer(lockPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func (l *lockPoller) lead(ctx context.Context, k string, lock *redislock.Lock, load loadFunc) ([]byte, error) {
	defer func() { _ = lock.Release(context.WithoutCancel(ctx)) }()
	if b, err := l.rdb.Get(ctx, k).Bytes(); err == nil {
		return b, nil // written between our GET and our lock
	}
	b, err := load(ctx)
	if err != nil {
		return nil, err
	}
	if err := l.rdb.Set(ctx, k, b, l.ttl).Err(); err != nil {
		return nil, err
	}
	return b, nil
}

// Set is a plain SET with the TTL: the lock guards rebuilds, not writes.
func (l *lockPoller) Set(ctx context.Context, key string, val []byte) error {
	return l.rdb.Set(ctx, l.prefix+":"+key, val, l.ttl).Err()
}

func (l *lockPoller) Close() error           { return nil }
func (l *lockPoller) HerdStats() *herd.Stats { return nil }

// herdCache is herd's Cache.Get.
type herdCache struct {
	c         *herd.Cache
	ttl       time.Duration
	closeAlso *redis.Client
}

func (h *herdCache) Get(ctx context.Context, key string, load loadFunc) ([]byte, error) {
	return h.c.Get(ctx, key, h.ttl, load)
}

// Set is herd's Cache.Set: it advances the key's fence, so no rebuild that
// started before it lands after it.
func (h *herdCache) Set(ctx context.Context, key string, val []byte) error {
	return h.c.Set(ctx, key, val, h.ttl)
}

func (h *herdCache) Close() error {
	err := h.c.Close()
	if h.closeAlso != nil {
		_ = h.closeAlso.Close()
	}
	return err
}

func (h *herdCache) HerdStats() *herd.Stats {
	s := h.c.Stats()
	return &s
}

// noPubSub is how "herd-poll" takes pub/sub away from herd, which has no
// option to turn notifications off: every command goes to the real client,
// but Subscribe and SSubscribe return a PubSub of a client whose dialer
// always fails. herd's followers then see the SUBSCRIBE fail and take
// their documented no-pub/sub path: they poll, from about PollMin, with
// the interval doubling (±25% jitter) up to PollMax, and earlier when the
// holder's lease is about to run out. With PollMin = PollMax = 10 ms that
// is a poll every 7.5-12.5 ms. Leaders still PUBLISH their wake-ups (no
// one listens), so the commands per request include those.
type noPubSub struct {
	redis.UniversalClient
	dead *redis.Client
}

var errPubSubOff = errors.New("bench: pub/sub disabled for herd-poll")

func newNoPubSub(rdb redis.UniversalClient) *noPubSub {
	dead := redis.NewClient(&redis.Options{
		Addr:       "pubsub.disabled.invalid:0",
		MaxRetries: -1,
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			return nil, errPubSubOff
		},
	})
	return &noPubSub{UniversalClient: rdb, dead: dead}
}

func (n *noPubSub) Subscribe(ctx context.Context, channels ...string) *redis.PubSub {
	return n.dead.Subscribe(ctx, channels...)
}

func (n *noPubSub) SSubscribe(ctx context.Context, channels ...string) *redis.PubSub {
	return n.dead.SSubscribe(ctx, channels...)
}

func (n *noPubSub) PSubscribe(ctx context.Context, channels ...string) *redis.PubSub {
	return n.dead.PSubscribe(ctx, channels...)
}
