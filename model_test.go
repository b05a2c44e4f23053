package herd

// D16: a model-based test of the lease scripts and FencedStore (rapid
// state machine on miniredis, whose clock moves only by FastForward), and
// a conformance table: the same script calls give results of the same
// shape on miniredis, a real redis-server and a real 3-master cluster.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// modelLease is a lease the model handed out, current or not.
type modelLease struct {
	l       *Lease
	client  int
	expires time.Duration // model time at which Redis expires it, as of its last acquire or extend
	release bool          // Release was called (the lease is done locally)
	freed   bool          // a Release of it succeeded: later ones are nil without Redis
}

// leaseModel is the model's state for one run.
type leaseModel struct {
	mr      *miniredis.Miniredis
	clients []*redis.Client
	lockers []*Locker
	store   *FencedStore
	cache   *Cache // shares the lockers' prefix: Invalidate advances the same fence
	key     string
	keys    keyFamily

	now         time.Duration // model time (Redis's FastForward total)
	leases      []*modelLease
	holder      *modelLease // the lease Redis holds, if any (check now < expires)
	fence       uint64      // the fence counter's value: the last token or Invalidate
	maxAccepted uint64      // the highest token FencedStore accepted (0: none)
	released    string      // the lease value of the last release ("r" in the fence hash)
}

func (m *leaseModel) held() bool { return m.holder != nil && m.now < m.holder.expires }

// TestModelLease (D16): 3 clients, each with its own Locker, on one
// miniredis, and actions Acquire, Extend, Release, Advance (FastForward),
// Write (FencedStore with any lease's token) and Invalidate (a Cache on
// the same prefix). Lease lengths are 10-30s, so the leases' local timers
// never fire during a run: Redis's expiry, moved by Advance, decides.
// Invariants after every action: at most one holder (the lease key holds
// exactly the model's holder's value, or is absent); tokens strictly
// increase, across acquires and Invalidates; the stored fence is the
// highest accepted token; a release never deletes a foreign lease.
func TestModelLease(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ctx := context.Background()
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			t.Fatal(err)
		}
		m := &leaseModel{mr: mr, key: "model"}
		m.keys, _ = makeKeys(DefaultPrefix, m.key)
		for range 3 {
			c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			m.clients = append(m.clients, c)
			m.lockers = append(m.lockers, NewLocker(c, nil))
		}
		m.store = NewFencedStore(m.clients[0], "")
		m.cache = New(m.clients[1], nil)
		defer func() {
			for _, ml := range m.leases {
				ml.l.finish() // stop the local expiry timers
			}
			m.cache.Close()
			for i, l := range m.lockers {
				l.Close()
				m.clients[i].Close()
			}
			mr.Close()
		}()

		pick := func(t *rapid.T) *modelLease {
			if len(m.leases) == 0 {
				t.Skip("no lease yet")
			}
			return m.leases[rapid.IntRange(0, len(m.leases)-1).Draw(t, "lease")]
		}
		t.Repeat(map[string]func(*rapid.T){
			"Acquire": func(t *rapid.T) {
				i := rapid.IntRange(0, 2).Draw(t, "client")
				ttl := time.Duration(rapid.IntRange(10, 30).Draw(t, "ttl_s")) * time.Second
				l, err := m.lockers[i].TryAcquire(ctx, m.key, ttl)
				if m.held() {
					if !errors.Is(err, ErrLeaseHeld) {
						t.Fatalf("client %d acquired a held lease: %v, %v", i, l, err)
					}
					return
				}
				if err != nil {
					t.Fatalf("client %d could not acquire a free lease: %v", i, err)
				}
				if l.Token() <= m.fence {
					t.Fatalf("token %d after fence %d: tokens must strictly increase", l.Token(), m.fence)
				}
				m.fence = l.Token()
				ml := &modelLease{l: l, client: i, expires: m.now + ttl}
				m.leases = append(m.leases, ml)
				m.holder = ml
			},
			"Extend": func(t *rapid.T) {
				ml := pick(t)
				ttl := time.Duration(rapid.IntRange(10, 30).Draw(t, "ttl_s")) * time.Second
				err := ml.l.Extend(ctx, ttl)
				if ml == m.holder && m.held() && !ml.release {
					if err != nil {
						t.Fatalf("the holder could not extend: %v", err)
					}
					ml.expires = m.now + ttl
					return
				}
				if !errors.Is(err, ErrLeaseLost) {
					t.Fatalf("extend of a lease that is not held (token %d): %v, want ErrLeaseLost", ml.l.Token(), err)
				}
			},
			"Release": func(t *rapid.T) {
				ml := pick(t)
				err := ml.l.Release(ctx)
				ml.release = true
				switch {
				case ml == m.holder && m.held():
					if err != nil {
						t.Fatalf("the holder's release: %v", err)
					}
					m.holder, m.released = nil, ml.l.value
					ml.freed = true
				case ml.freed || m.released == ml.l.value:
					if err != nil {
						t.Fatalf("a repeated release: %v, want nil (recognised as released)", err)
					}
					ml.freed = true
				default:
					if !errors.Is(err, ErrLeaseLost) {
						t.Fatalf("release of a lease that is not held (token %d): %v, want ErrLeaseLost", ml.l.Token(), err)
					}
				}
			},
			"Advance": func(t *rapid.T) {
				d := time.Duration(rapid.IntRange(1, 40_000).Draw(t, "ms")) * time.Millisecond
				if m.now+d > 12*time.Hour {
					t.Skip("enough model time")
				}
				m.mr.FastForward(d)
				m.now += d
			},
			"Write": func(t *rapid.T) {
				ml := pick(t)
				val := "by-" + strconv.FormatUint(ml.l.Token(), 10)
				err := m.store.Set(ctx, m.key, ml.l.Token(), []byte(val), 0)
				if ml.l.Token() >= m.maxAccepted {
					if err != nil {
						t.Fatalf("write with token %d ≥ highest %d: %v", ml.l.Token(), m.maxAccepted, err)
					}
					m.maxAccepted = ml.l.Token()
					return
				}
				if !errors.Is(err, ErrFenced) {
					t.Fatalf("write with token %d < highest %d: %v, want ErrFenced", ml.l.Token(), m.maxAccepted, err)
				}
			},
			"Invalidate": func(t *rapid.T) {
				if err := m.cache.Invalidate(ctx, m.key); err != nil {
					t.Fatal(err)
				}
				n, err := m.clients[0].HGet(ctx, m.keys.Fence, "n").Uint64()
				if err != nil {
					t.Fatal(err)
				}
				if n <= m.fence {
					t.Fatalf("Invalidate left the fence at %d after %d: it must advance", n, m.fence)
				}
				m.fence = n
			},
			"": func(t *rapid.T) {
				rdb := m.clients[2]
				cur, err := rdb.Get(ctx, m.keys.Lease).Result()
				switch {
				case m.held():
					if err != nil || cur != m.holder.l.value {
						t.Fatalf("lease key = %q (%v), want the holder's %q: a release or extend touched a foreign lease, or two holders", cur, err, m.holder.l.value)
					}
				case !errors.Is(err, redis.Nil):
					t.Fatalf("lease key = %q (%v) while the model holds none", cur, err)
				}
				if n, err := rdb.HGet(ctx, m.keys.Fence, "n").Uint64(); m.fence != 0 && (err != nil || n != m.fence) {
					t.Fatalf("fence counter = %d (%v), want %d", n, err, m.fence)
				}
				_, tok, err := m.store.Get(ctx, m.key)
				switch {
				case m.maxAccepted == 0 && !errors.Is(err, ErrNotFound):
					t.Fatalf("FencedStore before any write: token %d, %v", tok, err)
				case m.maxAccepted != 0 && (err != nil || tok != m.maxAccepted):
					t.Fatalf("FencedStore token = %d (%v), want the highest accepted %d", tok, err, m.maxAccepted)
				}
			},
		})
	})
}

// TestModelScriptConformance: one sequence of raw script calls (the
// acquire modes and retries, extend, commit current/retried/fenced,
// release own/retried/foreign, Set, Invalidate, fenced set, fence) on miniredis,
// a real redis-server and a real 3-master cluster. Each result is reduced
// to its shape (status codes kept, tokens and times abstracted): every
// backend must give the same shapes, and the ones listed.
func TestModelScriptConformance(t *testing.T) {
	t.Parallel()
	want := []string{
		"acquire: [1 num]",
		"acquire retried: [1 num]",
		"acquire by another: [0 int num num]",
		"acquire miss mode, lease held, no value: [0 int num num]",
		"extend own: 1",
		"extend foreign: 0",
		"commit: 1",
		"commit retried: 1",
		"acquire miss mode, value present: [2 str]",
		"release after commit: 1",
		"release foreign: 0",
		"set: num",
		"set retried: num",
		"commit with an old token: 0",
		"acquire refresh mode, envelope changed: [2 str]",
		"invalidate: num",
		"invalidate retried: num",
		"acquire after invalidate: [1 num]",
		"release: 2",
		"release retried: 1",
		"acquire, then a failed load's release: 1",
		"acquire miss mode, the awaited leader failed: [4 str]",
		"acquire miss mode, a newer leader's failure: [4 str]",
		"acquire miss mode, an older leader's failure: [1 num]",
		"fenced set: [1 num]",
		"fenced set lower: [0 num]",
		"fence: [1 str]",
		"fence lower: [0 num]",
		"fenced set after a fence, lower: [0 num]",
		"get missing: redis.Nil",
	}
	var first []string
	var firstName string
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			got := scriptShapes(t, b.rdb)
			if !slices.Equal(got, want) {
				t.Errorf("shapes on %s:\n%s\nwant:\n%s", b.name, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if first == nil {
				first, firstName = got, b.name
			} else if !slices.Equal(got, first) {
				t.Errorf("shapes differ between %s and %s", firstName, b.name)
			}
		})
	}
}

// scriptShapes runs the conformance sequence on rdb and returns the shapes.
func scriptShapes(t *testing.T, rdb redis.UniversalClient) []string {
	t.Helper()
	ctx := context.Background()
	k := mustKeys(t, "conformance-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	var out []string
	run := func(what string, s *script, keys []string, args ...any) any {
		v, err := s.rs.Run(ctx, rdb, keys, args...).Result()
		out = append(out, what+": "+shape(v, err))
		return v
	}
	own, other := newOwner(), newOwner()
	acq := func(owner string, extra ...any) []string {
		names := []string{k.Lease, k.Fence}
		if len(extra) > 0 {
			names = append(names, k.Value, k.Backoff, k.Failed)
		}
		return names
	}
	r := run("acquire", acquireScript, acq(own), own, 5000, 60000)
	token := fmt.Sprint(r.([]any)[1])
	value := own + ":" + token
	run("acquire retried", acquireScript, acq(own), own, 5000, 60000)
	run("acquire by another", acquireScript, acq(other), other, 5000, 60000)
	run("acquire miss mode, lease held, no value", acquireScript, acq(other, 1), other, 5000, 60000, modeMiss, "", "")
	run("extend own", extendScript, []string{k.Lease, k.Fence}, value, 5000, 60000)
	run("extend foreign", extendScript, []string{k.Lease, k.Fence}, other+":1", 5000, 60000)
	now := time.Now()
	env := (&envelope{Fence: mustUint(t, token), WrittenAt: now, SoftExp: now.Add(time.Minute), StaleExp: now.Add(time.Minute), Payload: []byte("v")}).Encode()
	commit := func(what, tok string) {
		run(what, commitScript, []string{k.Value, k.Lease, k.Fence, k.Backoff}, tok, env, 60000, value, "PUBLISH", k.Channel, msgWritten, msgReleased)
	}
	commit("commit", token)
	commit("commit retried", token)
	run("acquire miss mode, value present", acquireScript, acq(other, 1), other, 5000, 60000, modeMiss, "", "")
	rel := func(what, v string) {
		run(what, releaseScript, []string{k.Lease, k.Fence}, v, "PUBLISH", k.Channel, msgReleased)
	}
	rel("release after commit", value)
	rel("release foreign", other+":"+token)
	set := []string{k.Value, k.Fence, k.Writes + "set-1"}
	run("set", setScript, set, env, 60000, 60000, "PUBLISH", k.Channel, 1<<14, 60000)
	run("set retried", setScript, set, env, 60000, 60000, "PUBLISH", k.Channel, 1<<14, 60000)
	commit("commit with an old token", token)
	run("acquire refresh mode, envelope changed", acquireScript, acq(other, 1), other, 5000, 60000, modeRefresh, string(env[2:10]), "")
	inv := []string{k.Value, k.Fence, k.Writes + "inv-1"}
	run("invalidate", invalidateScript, inv, 60000, 60000)
	run("invalidate retried", invalidateScript, inv, 60000, 60000)
	r = run("acquire after invalidate", acquireScript, acq(other), other, 5000, 60000)
	value2 := other + ":" + fmt.Sprint(r.([]any)[1])
	rel("release", value2)
	rel("release retried", value2)
	rdb.Del(ctx, k.Value)
	third := newOwner()
	r = run("acquire, then a failed load's release", acquireScript, acq(third), third, 5000, 60000)
	token3 := fmt.Sprint(r.([]any)[1])
	releaseScript.rs.Run(ctx, rdb, []string{k.Lease, k.Fence, k.Backoff, k.Failed},
		third+":"+token3, "PUBLISH", k.Channel, "Fe"+token3+"|boom", 0, 0, 5000)
	out[len(out)-1] = "acquire, then a failed load's release: " + shape(rdb.Exists(ctx, k.Failed).Val(), nil)
	run("acquire miss mode, the awaited leader failed", acquireScript, acq(other, 1), other, 5000, 60000, modeMiss, "", token3)
	// The lease is free and the marker is of a rebuild newer than the one
	// awaited: that failure is the answer (a follower that missed its
	// message must not call a failing source again); a marker older than
	// the awaited rebuild is not.
	run("acquire miss mode, a newer leader's failure", acquireScript, acq(other, 1), other, 5000, 60000, modeMiss, "", "12345")
	newer := strconv.FormatUint(mustUint(t, token3)+1, 10)
	run("acquire miss mode, an older leader's failure", acquireScript, acq(other, 1), other, 5000, 60000, modeMiss, "", newer)
	rdb.Del(ctx, k.Lease)
	run("fenced set", fencedSetScript, []string{k.Record}, "100", "a", 0)
	run("fenced set lower", fencedSetScript, []string{k.Record}, "99", "b", 0)
	run("fence", fencedSetScript, []string{k.Record}, "101", "", 0, "1")
	run("fence lower", fencedSetScript, []string{k.Record}, "100", "", 0, "1")
	run("fenced set after a fence, lower", fencedSetScript, []string{k.Record}, "100", "c", 0)
	_, err := rdb.Get(ctx, k.Lease).Result()
	out = append(out, "get missing: "+shape(nil, err))
	return out
}

func mustUint(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// shape abstracts a script result: status codes 0-4 are kept, other
// integers are "int", decimal strings "num", other strings "str".
func shape(v any, err error) string {
	switch {
	case errors.Is(err, redis.Nil):
		return "redis.Nil"
	case err != nil:
		return "error " + strings.Fields(err.Error())[0]
	}
	switch x := v.(type) {
	case nil:
		return "nil"
	case int64:
		if x >= 0 && x <= 4 {
			return strconv.FormatInt(x, 10)
		}
		return "int"
	case string:
		if _, err := strconv.ParseUint(x, 10, 64); err == nil {
			return "num"
		}
		return "str"
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = shape(e, nil)
		}
		return "[" + strings.Join(parts, " ") + "]"
	}
	return fmt.Sprintf("%T", v)
}
