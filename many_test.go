package herd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// manyLoader is a ManyLoadFunc that records its calls, answers "v-<key>"
// for every key (unless val says otherwise), and, with a gate, blocks each
// call until the gate opens.
type manyLoader struct {
	mu      sync.Mutex
	calls   [][]string
	entered chan []string // receives each call's keys when it starts (if not nil)
	gate    chan struct{} // if not nil, closed to let calls return
	prefix  string        // value prefix, "v-" by default
	answer  func(keys []string) (map[string][]byte, error)
}

func newManyLoader() *manyLoader {
	return &manyLoader{entered: make(chan []string, 100)}
}

func (l *manyLoader) load(ctx context.Context, keys []string) (map[string][]byte, error) {
	l.mu.Lock()
	l.calls = append(l.calls, slices.Clone(keys))
	l.mu.Unlock()
	if l.entered != nil {
		l.entered <- slices.Clone(keys)
	}
	if l.gate != nil {
		select {
		case <-l.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if l.answer != nil {
		return l.answer(keys)
	}
	p := l.prefix
	if p == "" {
		p = "v-"
	}
	out := make(map[string][]byte, len(keys))
	for _, k := range keys {
		out[k] = []byte(p + k)
	}
	return out, nil
}

func (l *manyLoader) got() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

func (l *manyLoader) waitEntered(t *testing.T) []string {
	t.Helper()
	select {
	case keys := <-l.entered:
		return keys
	case <-time.After(10 * time.Second):
		t.Fatal("the loader was not called")
		return nil
	}
}

// manyKeys returns n keys of the running test.
func manyKeys(t *testing.T, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/%d", t.Name(), i)
	}
	return keys
}

// roundTrips is a go-redis hook that records each round trip: a command
// alone, or a pipeline, as the names of its commands joined by '+'.
type roundTrips struct {
	mu    sync.Mutex
	trips []string
	keys  bool // record an MGET as "mget(<number of keys>)"
}

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := cmd.Name()
		if h.keys && name == "mget" {
			name = fmt.Sprintf("mget(%d)", len(cmd.Args())-1)
		}
		h.add(name)
		return next(ctx, cmd)
	}
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		h.add(strings.Join(names, "+"))
		return next(ctx, cmds)
	}
}
func (h *roundTrips) add(s string) {
	switch s {
	case "hello", "client", "client+client":
		return // a new connection's handshake, not the Cache's round trip
	}
	h.mu.Lock()
	h.trips = append(h.trips, s)
	h.mu.Unlock()
}
func (h *roundTrips) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.trips
	h.trips = nil
	return t
}

// repeat returns n copies of name joined by '+'.
func repeat(name string, n int) string {
	return strings.TrimSuffix(strings.Repeat(name+"+", n), "+")
}

// checkValues reports keys whose value in got is not want(key).
func checkValues(t *testing.T, got map[string][]byte, keys []string, want func(string) string) {
	t.Helper()
	for _, k := range keys {
		if v, ok := got[k]; !ok || string(v) != want(k) {
			t.Errorf("value of %q = (%q, present %v), want %q", k, v, ok, want(k))
		}
	}
}

// A batch of hits and misses: one MGET answers the hits, the loader is
// called once with exactly the misses, in order, and their ACQUIREs and
// COMMITs go in one pipeline each: three round trips in all. The next
// batch is all hits: one MGET, no load.
func TestGetManyMixedHitsAndMisses(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, &Options{ReplicaAcks: -1})
	ctx := context.Background()
	keys := manyKeys(t, 6)
	// Warm the script cache, so that EVALSHA does not fall back to EVAL.
	if _, err := c.GetMany(ctx, []string{"warm"}, time.Minute, newManyLoader().load); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{1, 3} {
		if err := c.Set(ctx, keys[i], []byte("set-"+keys[i]), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	trips := &roundTrips{}
	rdb.AddHook(trips)
	l := newManyLoader()
	got, err := c.GetMany(ctx, keys, time.Minute, l.load)
	if err != nil {
		t.Fatal(err)
	}
	checkValues(t, got, keys, func(k string) string {
		if k == keys[1] || k == keys[3] {
			return "set-" + k
		}
		return "v-" + k
	})
	if len(got) != len(keys) {
		t.Errorf("%d values, want %d", len(got), len(keys))
	}
	misses := []string{keys[0], keys[2], keys[4], keys[5]}
	if calls := l.got(); len(calls) != 1 || !slices.Equal(calls[0], misses) {
		t.Errorf("loader calls %q, want one with the misses %q", calls, misses)
	}
	want := []string{"mget", repeat("evalsha", 4), repeat("evalsha", 4)}
	if tr := trips.take(); !slices.Equal(tr, want) {
		t.Errorf("round trips %q, want %q (one MGET, one pipeline of ACQUIREs, one of COMMITs)", tr, want)
	}

	l2 := newManyLoader()
	got, err = c.GetMany(ctx, keys, time.Minute, l2.load)
	if err != nil || len(got) != len(keys) {
		t.Fatalf("second batch: %d values, %v", len(got), err)
	}
	if calls := l2.got(); len(calls) != 0 {
		t.Errorf("second batch loaded %q, want no load (all hits)", calls)
	}
	if tr := trips.take(); !slices.Equal(tr, []string{"mget"}) {
		t.Errorf("second batch round trips %q, want one MGET", tr)
	}
	if s := c.Stats(); s.Hits != 2+6 || s.Leads != 4+1 || s.Misses != 4+1 {
		t.Errorf("stats hits=%d leads=%d misses=%d, want 8, 5, 5", s.Hits, s.Leads, s.Misses)
	}
}

// The same key in two concurrent batches, and in a Get, is one flight:
// the second batch's loader gets only the key no flight had, and the
// shared key is loaded once.
func TestGetManySameKeyInConcurrentBatches(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), nil)
	ctx := context.Background()
	a, b, cc := t.Name()+"/a", t.Name()+"/b", t.Name()+"/c"

	l1 := newManyLoader()
	l1.gate = make(chan struct{})
	l1.prefix = "one-"
	type res struct {
		vals map[string][]byte
		err  error
	}
	first := make(chan res, 1)
	go func() {
		v, err := c.GetMany(ctx, []string{a, b}, time.Minute, l1.load)
		first <- res{v, err}
	}()
	if keys := l1.waitEntered(t); !slices.Equal(keys, []string{a, b}) {
		t.Fatalf("first loader got %q, want [a b]", keys)
	}

	l2 := newManyLoader()
	l2.prefix = "two-"
	second := make(chan res, 1)
	go func() {
		v, err := c.GetMany(ctx, []string{b, cc}, time.Minute, l2.load)
		second <- res{v, err}
	}()
	if keys := l2.waitEntered(t); !slices.Equal(keys, []string{cc}) {
		t.Fatalf("second loader got %q, want only [c]: b has a flight already", keys)
	}
	var getCalls atomic.Int64
	getDone := make(chan []byte, 1)
	go func() {
		v, _ := c.Get(ctx, b, time.Minute, constLoader(&getCalls, "get-b"))
		getDone <- v
	}()
	// The Get must join b's flight before it ends: wait until it is in.
	waitFor(t, 10*time.Second, "the Get to join b's flight", func() bool {
		c.group.mu.Lock()
		defer c.group.mu.Unlock()
		call := c.group.m[b]
		return call != nil && call.dups == 2
	})
	close(l1.gate)

	r1, r2 := <-first, <-second
	if r1.err != nil || r2.err != nil {
		t.Fatalf("errors: %v, %v", r1.err, r2.err)
	}
	checkValues(t, r1.vals, []string{a, b}, func(k string) string { return "one-" + k })
	checkValues(t, r2.vals, []string{b}, func(k string) string { return "one-" + k })
	checkValues(t, r2.vals, []string{cc}, func(k string) string { return "two-" + k })
	if v := <-getDone; string(v) != "one-"+b {
		t.Errorf("Get(b) = %q, want the first batch's value", v)
	}
	if n1, n2, n3 := len(l1.got()), len(l2.got()), getCalls.Load(); n1 != 1 || n2 != 1 || n3 != 0 {
		t.Errorf("loader calls: first %d, second %d, Get %d; want 1, 1, 0", n1, n2, n3)
	}
}

// A loader that fails some keys: each error reaches only its key, the
// other keys are stored, and an omitted key or ErrNotFound is a negative
// entry. The next batch loads only the failed key.
func TestGetManyPartialLoaderErrors(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), &Options{NegativeTTL: time.Minute})
	ctx := context.Background()
	keys := manyKeys(t, 4) // 0: value, 1: fails, 2: omitted, 3: ErrNotFound
	boom := errors.New("boom")
	l := newManyLoader()
	l.answer = func(ks []string) (map[string][]byte, error) {
		return map[string][]byte{keys[0]: []byte("a"), keys[1]: []byte("ignored")},
			fmt.Errorf("db: %w", &ManyError{Errs: map[string]error{keys[1]: boom, keys[3]: ErrNotFound}})
	}
	got, err := c.GetMany(ctx, keys, time.Minute, l.load)
	var me *ManyError
	if !errors.As(err, &me) {
		t.Fatalf("err = %v, want a *ManyError", err)
	}
	if len(me.Errs) != 1 || !errors.Is(me.Errs[keys[1]], boom) || !errors.Is(me.Errs[keys[1]], ErrLoadFailed) {
		t.Errorf("per-key errors %v, want only key 1's, wrapping boom and ErrLoadFailed", me.Errs)
	}
	if !errors.Is(err, boom) || !errors.Is(err, ErrLoadFailed) || errors.Is(err, ErrNotFound) {
		t.Errorf("errors.Is(err, boom/ErrLoadFailed/ErrNotFound) = %v/%v/%v, want true/true/false",
			errors.Is(err, boom), errors.Is(err, ErrLoadFailed), errors.Is(err, ErrNotFound))
	}
	if len(got) != 1 || string(got[keys[0]]) != "a" {
		t.Errorf("values %q, want only key 0's", got)
	}

	l2 := newManyLoader()
	got, err = c.GetMany(ctx, keys, time.Minute, l2.load)
	if err != nil {
		t.Fatal(err)
	}
	if calls := l2.got(); len(calls) != 1 || !slices.Equal(calls[0], []string{keys[1]}) {
		t.Errorf("second batch loaded %q, want only the failed key", calls)
	}
	if len(got) != 2 || string(got[keys[0]]) != "a" || string(got[keys[1]]) != "v-"+keys[1] {
		t.Errorf("second batch values %q", got)
	}
	if s := c.Stats(); s.NegativeHits != 2 || s.LoadErrors != 1 {
		t.Errorf("stats negativeHits=%d loadErrors=%d, want 2, 1", s.NegativeHits, s.LoadErrors)
	}
}

// A whole-batch loader error fails only the keys it led; a panic reaches
// every led key as a *PanicError, releases their leases at once and does
// not crash the process.
func TestGetManyLoaderPanicAndError(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const lease = 5 * time.Second
	c := newTestCache(t, rdb, &Options{MinLease: lease, MaxLease: lease, DefaultLease: lease})
	ctx := context.Background()
	keys := manyKeys(t, 3)
	if err := c.Set(ctx, keys[0], []byte("hit"), time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetMany(ctx, keys, time.Minute, func(context.Context, []string) (map[string][]byte, error) {
		panic("kaboom")
	})
	var me *ManyError
	if !errors.As(err, &me) || len(me.Errs) != 2 {
		t.Fatalf("err = %v, want a *ManyError for the two misses", err)
	}
	for _, k := range keys[1:] {
		var pe *PanicError
		if kerr := me.Errs[k]; !errors.As(kerr, &pe) || pe.Value != "kaboom" || !errors.Is(kerr, ErrLoadFailed) {
			t.Errorf("key %q: %v, want ErrLoadFailed with the *PanicError", k, kerr)
		}
		lk := mustKeys(t, k).Lease
		if n := rdb.Exists(ctx, lk).Val(); n != 0 {
			t.Errorf("key %q: lease still held after the panic", k)
		}
	}
	if string(got[keys[0]]) != "hit" || len(got) != 1 {
		t.Errorf("values %q, want the hit only", got)
	}

	boom := errors.New("source down")
	_, err = c.GetMany(ctx, keys, time.Minute, func(context.Context, []string) (map[string][]byte, error) {
		return map[string][]byte{keys[1]: []byte("x")}, boom
	})
	if !errors.As(err, &me) || len(me.Errs) != 2 || !errors.Is(me.Errs[keys[1]], boom) || !errors.Is(me.Errs[keys[2]], boom) {
		t.Errorf("whole-batch error: %v, want boom for both led keys and none for the hit", err)
	}
}

// The caller leaves when its ctx ends, with what it has: the hits, and
// ctx.Err() for the keys still loading. The load goes on and is stored.
func TestGetManyCallerCancelled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), nil)
	keys := manyKeys(t, 3)
	if err := c.Set(context.Background(), keys[0], []byte("hit"), time.Minute); err != nil {
		t.Fatal(err)
	}
	l := newManyLoader()
	l.gate = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	type res struct {
		vals map[string][]byte
		err  error
	}
	done := make(chan res, 1)
	go func() {
		v, err := c.GetMany(ctx, keys, time.Minute, l.load)
		done <- res{v, err}
	}()
	l.waitEntered(t)
	cancel()
	r := <-done
	var me *ManyError
	if !errors.As(r.err, &me) || len(me.Errs) != 2 || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled for the two keys loading", r.err)
	}
	if string(r.vals[keys[0]]) != "hit" {
		t.Errorf("values %q, want the hit", r.vals)
	}
	close(l.gate)
	l2 := newManyLoader()
	l2.answer = func([]string) (map[string][]byte, error) { return nil, errors.New("not stored") }
	waitFor(t, 10*time.Second, "the abandoned load to be stored", func() bool {
		got, err := c.GetMany(context.Background(), keys, time.Minute, l2.load)
		return err == nil && len(got) == 3
	})
	if calls := l2.got(); len(calls) != 0 {
		t.Errorf("loads after the caller left: %q (the abandoned flight's values were not stored)", calls)
	}
	if calls := l.got(); len(calls) != 1 {
		t.Errorf("loader calls %q, want 1 (the flight went on)", calls)
	}
}

// Bad input: errors at once for the call (nil loader, bad ttl), per key
// for an empty key; duplicates are read and loaded once; no keys is an
// empty result without a round trip.
func TestGetManyBadInput(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, nil)
	ctx := context.Background()
	l := newManyLoader()
	if _, err := c.GetMany(ctx, []string{"a"}, time.Minute, nil); !errors.Is(err, ErrNilLoader) {
		t.Errorf("nil loader: %v", err)
	}
	if _, err := FetchMany[int](ctx, c, []string{"a"}, time.Minute, nil); !errors.Is(err, ErrNilLoader) {
		t.Errorf("FetchMany nil loader: %v", err)
	}
	for _, ttl := range []time.Duration{0, -time.Second, 51 * 365 * 24 * time.Hour} {
		if _, err := c.GetMany(ctx, []string{"a"}, ttl, l.load); !errors.Is(err, ErrInvalidTTL) {
			t.Errorf("ttl %v: %v", ttl, err)
		}
	}
	trips := &roundTrips{keys: true}
	rdb.AddHook(trips)
	for _, keys := range [][]string{nil, {}} {
		got, err := c.GetMany(ctx, keys, time.Minute, l.load)
		if err != nil || got == nil || len(got) != 0 {
			t.Errorf("GetMany(%v) = %v, %v, want an empty result", keys, got, err)
		}
	}
	if tr := trips.take(); len(tr) != 0 {
		t.Errorf("no keys sent %q", tr)
	}
	k := t.Name()
	got, err := c.GetMany(ctx, []string{"", k, k, ""}, time.Minute, l.load)
	var me *ManyError
	if !errors.As(err, &me) || len(me.Errs) != 1 || !errors.Is(me.Errs[""], ErrInvalidKey) {
		t.Errorf("err = %v, want ErrInvalidKey for the empty key only", err)
	}
	if len(got) != 1 || string(got[k]) != "v-"+k {
		t.Errorf("values %q", got)
	}
	if calls := l.got(); len(calls) != 1 || !slices.Equal(calls[0], []string{k}) {
		t.Errorf("loader calls %q, want one with the key once", calls)
	}
	if tr := trips.take(); len(tr) == 0 || tr[0] != "mget(1)" {
		t.Errorf("round trips %q, want an MGET of one key first", tr)
	}
}

// Redis unreachable: the batch fails open (one local load of every key,
// not stored), or with FailClosed fails each key with ErrUnavailable
// without calling the loader.
func TestGetManyRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) {
		o.MaxRetries = -1
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	})
	open := newTestCache(t, rdb, nil)
	closed := newTestCache(t, rdb, &Options{FailClosed: true})
	keys := manyKeys(t, 3)
	srv.Stop(t)
	ctx := context.Background()

	l := newManyLoader()
	got, err := open.GetMany(ctx, keys, time.Minute, l.load)
	if err != nil {
		t.Fatalf("fail-open: %v", err)
	}
	checkValues(t, got, keys, func(k string) string { return "v-" + k })
	if calls := l.got(); len(calls) != 1 || !slices.Equal(calls[0], keys) {
		t.Errorf("fail-open loader calls %q, want one with every key", calls)
	}
	if s := open.Stats(); s.FailOpen != 3 || s.LocalLoads != 3 || s.Loads != 0 {
		t.Errorf("stats failOpen=%d localLoads=%d loads=%d, want 3, 3, 0", s.FailOpen, s.LocalLoads, s.Loads)
	}

	l2 := newManyLoader()
	_, err = closed.GetMany(ctx, keys, time.Minute, l2.load)
	var me *ManyError
	if !errors.As(err, &me) || len(me.Errs) != 3 || !errors.Is(err, ErrUnavailable) {
		t.Errorf("FailClosed: %v, want ErrUnavailable for every key", err)
	}
	if calls := l2.got(); len(calls) != 0 {
		t.Errorf("FailClosed loaded %q", calls)
	}
}

// Read-your-writes: a GetMany that starts after an Invalidate returned
// never gets the value of a flight that began before it (it joins that
// flight, finds its answer older than the write, and takes the next one).
func TestGetManyReadYourWrites(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), nil)
	ctx := context.Background()
	k := t.Name()
	l := newManyLoader()
	l.gate = make(chan struct{})
	l.prefix = "old-"
	first := make(chan map[string][]byte, 1)
	go func() {
		v, _ := c.GetMany(ctx, []string{k}, time.Minute, l.load)
		first <- v
	}()
	l.waitEntered(t)
	if err := c.Invalidate(ctx, k); err != nil {
		t.Fatal(err)
	}
	second := make(chan map[string][]byte, 1)
	l2 := newManyLoader()
	l2.prefix = "new-"
	go func() {
		v, _ := c.GetMany(ctx, []string{k}, time.Minute, l2.load)
		second <- v
	}()
	waitFor(t, 10*time.Second, "the second batch to join the flight", func() bool {
		c.group.mu.Lock()
		defer c.group.mu.Unlock()
		call := c.group.m[k]
		return call != nil && call.dups == 1
	})
	close(l.gate)
	<-first
	if v := <-second; string(v[k]) != "new-"+k {
		t.Errorf("GetMany after Invalidate returned %q, want a new load %q", v[k], "new-"+k)
	}
}

// A stale value within StaleFor is served by the batch at once and
// refreshed in the background, by a call of the loader with that key.
func TestGetManyStaleServedAndRefreshed(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), &Options{StaleFor: time.Hour})
	var skew atomic.Int64
	c.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	ctx := context.Background()
	keys := manyKeys(t, 2)
	for _, k := range keys {
		if err := c.Set(ctx, k, []byte("old-"+k), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	skew.Store(int64(2 * time.Minute)) // past the fresh minute, within StaleFor
	l := newManyLoader()
	got, err := c.GetMany(ctx, keys, time.Minute, l.load)
	if err != nil {
		t.Fatal(err)
	}
	checkValues(t, got, keys, func(k string) string { return "old-" + k })
	waitFor(t, 10*time.Second, "both refreshes", func() bool { return c.Stats().Refreshes == 2 && len(l.got()) == 2 })
	for _, call := range l.got() {
		if len(call) != 1 {
			t.Errorf("refresh loaded %q, want one key", call)
		}
	}
	waitFor(t, 10*time.Second, "the refreshed values", func() bool {
		got, err := c.GetMany(ctx, keys, time.Minute, l.load)
		return err == nil && string(got[keys[0]]) == "v-"+keys[0] && string(got[keys[1]]) == "v-"+keys[1]
	})
	if s := c.Stats(); s.StaleServed < 2 {
		t.Errorf("staleServed=%d, want 2", s.StaleServed)
	}
}

// More than 1000 keys to rebuild: one loader call per 1000, every value
// stored; the hits after are read in pipelined MGETs of 1000.
func TestGetManyLarge(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	// A minute's lease: under load the batch's ACQUIRE replies may come back
	// after a short lease, and each late key would be loaded alone (the
	// takeover path, tested in TestGetManyAcquireRepliesAfterLease),
	// not in the chunks this test counts.
	c := newTestCache(t, rdb, atkLeaseOpts(time.Minute))
	ctx := context.Background()
	keys := manyKeys(t, 2500)
	l := newManyLoader()
	got, err := c.GetMany(ctx, keys, time.Minute, l.load)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(keys) {
		t.Fatalf("%d values, want %d", len(got), len(keys))
	}
	sizes := []int{}
	for _, call := range l.got() {
		sizes = append(sizes, len(call))
	}
	slices.Sort(sizes)
	if !slices.Equal(sizes, []int{500, 1000, 1000}) {
		t.Errorf("loader call sizes %v, want 1000, 1000, 500", sizes)
	}
	trips := &roundTrips{}
	rdb.AddHook(trips)
	got, err = c.GetMany(ctx, keys, time.Minute, l.load)
	if err != nil || len(got) != len(keys) {
		t.Fatalf("hits: %d values, %v", len(got), err)
	}
	if tr := trips.take(); len(tr) != 1 || tr[0] != "mget+mget+mget" {
		t.Errorf("hits sent %d round trips, first %.40q, want one pipeline of 3 MGETs", len(tr), tr)
	}
	checkValues(t, got, keys[:3], func(k string) string { return "v-" + k })
}

type manyItem struct {
	N    int    `json:"n"`
	Name string `json:"name"`
}

// FetchMany encodes and decodes each value; a key the loader fails, and
// stored bytes that do not decode, fail that key only.
func TestFetchMany(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), nil)
	ctx := context.Background()
	keys := manyKeys(t, 3)
	if err := c.Set(ctx, keys[2], []byte("not json"), time.Minute); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	got, err := FetchMany(ctx, c, keys, time.Minute, func(ctx context.Context, ks []string) (map[string]manyItem, error) {
		return map[string]manyItem{keys[0]: {N: 1, Name: "one"}}, &ManyError{Errs: map[string]error{keys[1]: boom}}
	})
	var me *ManyError
	if !errors.As(err, &me) || len(me.Errs) != 2 || !errors.Is(me.Errs[keys[1]], boom) || me.Errs[keys[2]] == nil {
		t.Fatalf("err = %v, want boom for key 1 and a decode error for key 2", err)
	}
	if len(got) != 1 || got[keys[0]] != (manyItem{N: 1, Name: "one"}) {
		t.Errorf("values %v", got)
	}
	got, err = FetchMany(ctx, c, keys[:1], time.Minute, func(ctx context.Context, ks []string) (map[string]manyItem, error) {
		return nil, errors.New("not called: a hit")
	})
	if err != nil || got[keys[0]].Name != "one" {
		t.Errorf("hit: %v, %v", got, err)
	}
}

// On a Cluster, with keys in many slots: the hits of a batch are read in
// one pipeline per master, the misses' ACQUIREs and COMMITs likewise, and
// the loader is called once.
func TestGetManyCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	var mu sync.Mutex
	byNode := make(map[string]*roundTrips)
	cc := cl.Client(t)
	cc.OnNewNode(func(n *redis.Client) {
		h := &roundTrips{}
		mu.Lock()
		byNode[n.Options().Addr] = h
		mu.Unlock()
		n.AddHook(h)
	})
	c := newTestCache(t, cc, &Options{ReplicaAcks: -1})
	ctx := context.Background()
	keys := manyKeys(t, 60)
	// Warm the scripts on every master and the client's view of the slots.
	warm := make([]string, 30)
	for i := range warm {
		warm[i] = fmt.Sprintf("warm/%d", i)
	}
	if _, err := c.GetMany(ctx, warm, time.Minute, newManyLoader().load); err != nil {
		t.Fatal(err)
	}
	perNode := func() map[string][]string {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string][]string)
		for addr, h := range byNode {
			var pipes []string
			for _, tr := range h.take() {
				if strings.Contains(tr, "+") || tr == "get" || tr == "evalsha" {
					pipes = append(pipes, tr)
				}
			}
			if len(pipes) > 0 {
				out[addr] = pipes
			}
		}
		return out
	}
	masters := make(map[string]int) // keys per master
	for _, k := range keys {
		m, err := cc.MasterForKey(ctx, mustKeys(t, k).Value)
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr]++
	}
	if len(masters) != 3 {
		t.Fatalf("the keys are on %d masters, want 3", len(masters))
	}
	perNode()

	l := newManyLoader()
	got, err := c.GetMany(ctx, keys, time.Minute, l.load)
	if err != nil || len(got) != len(keys) {
		t.Fatalf("%d values, %v", len(got), err)
	}
	if calls := l.got(); len(calls) != 1 || len(calls[0]) != len(keys) {
		t.Errorf("loader calls: %d, want one with all %d keys", len(calls), len(keys))
	}
	trips := perNode()
	for addr, n := range masters {
		want := []string{repeat("get", n), repeat("evalsha", n), repeat("evalsha", n)}
		if !slices.Equal(trips[addr], want) {
			t.Errorf("master %s (%d keys): round trips %.200q, want one pipeline each of GETs, ACQUIREs and COMMITs", addr, n, trips[addr])
		}
	}

	got, err = c.GetMany(ctx, keys, time.Minute, l.load)
	if err != nil || len(got) != len(keys) {
		t.Fatalf("hits: %d values, %v", len(got), err)
	}
	checkValues(t, got, keys, func(k string) string { return "v-" + k })
	trips = perNode()
	for addr, n := range masters {
		if want := []string{repeat("get", n)}; !slices.Equal(trips[addr], want) {
			t.Errorf("hits, master %s: round trips %.200q, want one pipeline of %d GETs", addr, trips[addr], n)
		}
	}
	if len(trips) != len(masters) {
		t.Errorf("hits reached %d nodes, want the %d masters", len(trips), len(masters))
	}
}

// On a Cluster client that reads from replicas, GetMany reads every value
// from its master: a replica cut off from its master, still holding an
// older value, is never read (the batch form of TestReplicaReadsNoStaleHit).
func TestGetManyReplicaReadsFromMaster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartClusterReplicas(t, 3, 1)
	ctx := context.Background()
	ro := cl.Client(t, func(o *redis.ClusterOptions) { o.ReadOnly = true })
	c := newTestCache(t, ro, &Options{ReplicaAcks: -1})
	key := "replicated"
	vkey := mustKeys(t, key).Value
	master, replica := slotNodes(t, ro, vkey)
	if err := c.Set(ctx, key, []byte("v1"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if n, err := master.Wait(ctx, 1, 10_000).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}
	for _, kv := range [][2]string{{"masteruser", "herd-test-nobody"}, {"masterauth", "wrong"}} {
		if err := replica.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := replica.Do(ctx, "CLIENT", "KILL", "TYPE", "master").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the replica's master link to go down", func() bool {
		return strings.Contains(replica.Info(ctx, "replication").Val(), "master_link_status:down")
	})
	if err := c.Set(ctx, key, []byte("v2"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if b, _ := ro.Get(ctx, vkey).Bytes(); !bytesHavePayload(b, "v1") {
		t.Fatal("the ReadOnly client's own GET does not reach the stale replica (the test proves nothing)")
	}
	others := manyKeys(t, 20)
	l := newManyLoader()
	got, err := c.GetMany(ctx, append(others, key), time.Hour, l.load)
	if err != nil {
		t.Fatal(err)
	}
	if string(got[key]) != "v2" {
		t.Errorf("GetMany after Set(v2) returned %q, want v2 (not the replica's v1)", got[key])
	}
	checkValues(t, got, others, func(k string) string { return "v-" + k })
}

// On a Ring, the hits of a batch are read with one MGET per shard, and
// the misses are loaded with one loader call.
func TestGetManyRing(t *testing.T) {
	t.Parallel()
	s1, s2 := redistest.Start(t), redistest.Start(t)
	var mu sync.Mutex
	byShard := make(map[string]*roundTrips)
	ring := redis.NewRing(&redis.RingOptions{
		Addrs: map[string]string{"a": s1.Addr(), "b": s2.Addr()},
		NewClient: func(opt *redis.Options) *redis.Client {
			cl := redis.NewClient(opt)
			h := &roundTrips{keys: true}
			mu.Lock()
			byShard[opt.Addr] = h
			mu.Unlock()
			cl.AddHook(h)
			return cl
		},
	})
	t.Cleanup(func() { ring.Close() })
	c := newTestCache(t, ring, &Options{ReplicaAcks: -1})
	ctx := context.Background()
	keys := manyKeys(t, 40)
	perShard := make(map[string]int)
	for _, k := range keys {
		cl, err := ring.GetShardClientForKey(mustKeys(t, k).Value)
		if err != nil {
			t.Fatal(err)
		}
		perShard[cl.Options().Addr]++
	}
	if len(perShard) != 2 {
		t.Fatalf("the keys are on %d shards, want 2", len(perShard))
	}
	l := newManyLoader()
	if got, err := c.GetMany(ctx, keys, time.Minute, l.load); err != nil || len(got) != len(keys) {
		t.Fatalf("%d values, %v", len(got), err)
	}
	if calls := l.got(); len(calls) != 1 || len(calls[0]) != len(keys) {
		t.Errorf("loader calls %d, want one with all %d keys", len(calls), len(keys))
	}
	mu.Lock()
	for _, h := range byShard {
		h.take()
	}
	mu.Unlock()
	got, err := c.GetMany(ctx, keys, time.Minute, l.load)
	if err != nil || len(got) != len(keys) {
		t.Fatalf("hits: %d values, %v", len(got), err)
	}
	checkValues(t, got, keys, func(k string) string { return "v-" + k })
	mu.Lock()
	defer mu.Unlock()
	for addr, n := range perShard {
		if tr, want := byShard[addr].take(), []string{fmt.Sprintf("mget(%d)", n)}; !slices.Equal(tr, want) {
			t.Errorf("hits, shard %s: round trips %q, want %q", addr, tr, want)
		}
	}
}
