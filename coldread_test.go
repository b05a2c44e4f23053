package herd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// countCommands counts the commands in log by name, ACQUIREs apart from the
// other scripts.
type commandCount struct{ gets, acquires, other int }

func countCommands(log *cmdLog, acq *acquireCounter) commandCount {
	n := commandCount{acquires: int(acq.n.Swap(0))}
	for _, name := range log.take() {
		switch name {
		case "get":
			n.gets++
		case "evalsha", "eval", "hello", "client":
		default:
			n.other++
		}
	}
	return n
}

// missOnce has c miss a key of its own, read by GET: a new Cache's
// first unknown key is, and its miss turns cold reads on.
func missOnce(t *testing.T, c *Cache, key string) {
	t.Helper()
	if _, err := c.Get(context.Background(), key, time.Hour, constLoader(new(atomic.Int64), "x")); err != nil {
		t.Fatal(err)
	}
	if !c.warm.cold() {
		t.Fatal("a miss of an unknown key did not turn cold reads on")
	}
}

// A cold wave across processes: the Get that starts a process's flight
// of a missing key sends no GET, only the ACQUIRE, which reads the value
// with the lease: the leading process loads after one round trip, and a
// following process's looks (its first, and the one after it subscribes)
// are ACQUIREs too. The loader runs once in all. On one server and on a
// 3-master Cluster.
func TestColdWaveLeadsAfterOneRoundTrip(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		testColdWave(t, func() redis.UniversalClient { return srv.Client(t) })
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.StartCluster(t, 3)
		testColdWave(t, func() redis.UniversalClient { return cl.Client(t) })
	})
}

// testColdWave is TestColdWaveLeadsAfterOneRoundTrip with two processes'
// clients from client.
func testColdWave(t *testing.T, client func() redis.UniversalClient) {
	caches := make([]*Cache, 2)
	logs := make([]*cmdLog, 2)
	acqs := make([]*acquireCounter, 2)
	for i := range caches {
		rdb := client()
		logs[i], acqs[i] = &cmdLog{}, &acquireCounter{}
		rdb.AddHook(logs[i])
		rdb.AddHook(acqs[i])
		caches[i] = newTestCache(t, rdb, nil)
		missOnce(t, caches[i], "first-miss-"+strconv.Itoa(i)) // as a process that has seen misses of new keys
		countCommands(logs[i], acqs[i])
	}
	g := newGatedLoader("value")
	errs := make(chan error, 2)
	get := func(c *Cache) {
		v, err := c.Get(context.Background(), "wave", time.Hour, g.load)
		if err == nil && string(v) != "value" {
			t.Errorf("got %q", v)
		}
		errs <- err
	}
	go get(caches[0])
	g.waitEntered(t) // process 0 leads
	if n := countCommands(logs[0], acqs[0]); n.gets != 0 || n.acquires != 1 {
		t.Errorf("the leading process sent %d GETs and %d ACQUIREs before its load, want 0 and 1", n.gets, n.acquires)
	}
	go get(caches[1])
	waitFor(t, 10*time.Second, "process 1 to subscribe and look again", func() bool {
		return acqs[1].n.Load() >= 2 && notifierSettled(caches[1].notify)
	})
	close(g.gate)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := g.calls.Load(); n != 1 {
		t.Fatalf("the loader ran %d times, want 1", n)
	}
	if n := countCommands(logs[1], acqs[1]); n.gets != 0 || n.acquires < 2 {
		t.Errorf("the following process sent %d GETs and %d ACQUIREs, want none, and its looks (the first, and the one after it subscribed) as ACQUIREs", n.gets, n.acquires)
	}
	// The key is known now: the next Get of each process is a GET.
	for i, c := range caches {
		countCommands(logs[i], acqs[i])
		if _, err := c.Get(context.Background(), "wave", time.Hour, noLoad(t)); err != nil {
			t.Fatal(err)
		}
		if n := countCommands(logs[i], acqs[i]); n.gets != 1 || n.acquires != 0 {
			t.Errorf("process %d: a Get of a key it has read sent %d GETs and %d ACQUIREs, want 1 and 0", i, n.gets, n.acquires)
		}
	}
}

// A cold read never joins a flight it did not see start: that flight may
// answer from a read older than a write the caller saw return. Here
// this process's flight of a key loads, another process Sets the key,
// and a cold read of the key begins: it reads instead, and gets the
// Set's value at once.
func TestColdReadDoesNotJoinAnOlderFlight(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), nil)
	w := newTestCache(t, srv.Client(t), nil)
	missOnce(t, c, "first-miss")
	g := newGatedLoader("old")
	go c.Get(context.Background(), "k", time.Hour, g.load)
	g.waitEntered(t)
	defer close(g.gate)
	if err := w.Set(context.Background(), "k", []byte("set"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if !c.warm.cold() || c.warm.known(warmID(mustKeys(t, "k").Value)) {
		t.Fatal("the test needs a cold read of k")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if v, err := c.Get(ctx, "k", time.Hour, noLoad(t)); err != nil || string(v) != "set" {
		t.Fatalf("a cold read begun after the Set returned: (%q, %v), want the Set's value at once", v, err)
	}
}

// A cold read of a key another process filled answers from the value the
// ACQUIRE returned: no load, no lease taken, counted as a hit.
func TestColdReadOfAFilledKeyIsAHit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	other := newTestCache(t, srv.Client(t), nil)
	if err := other.Set(context.Background(), "filled", []byte("there"), time.Hour); err != nil {
		t.Fatal(err)
	}
	rdb := srv.Client(t)
	acq := &acquireCounter{}
	rdb.AddHook(acq)
	c := newTestCache(t, rdb, nil)
	missOnce(t, c, "first-miss")
	before := c.Stats()
	acq.n.Store(0)
	var o Outcome
	v, err := c.Get(WithOutcome(context.Background(), &o), "filled", time.Hour, noLoad(t))
	if err != nil || string(v) != "there" {
		t.Fatalf("Get = (%q, %v)", v, err)
	}
	if acq.n.Load() != 1 || o != OutcomeHit {
		t.Errorf("the cold read sent %d ACQUIREs with outcome %v, want 1 and hit", acq.n.Load(), o)
	}
	if s := c.Stats(); s.Hits-before.Hits != 1 || s.Misses != before.Misses || s.Leads != before.Leads {
		t.Errorf("Stats: hits +%d, misses +%d, leads +%d; want 1, 0, 0", s.Hits-before.Hits, s.Misses-before.Misses, s.Leads-before.Leads)
	}
	if pttl := srv.Client(t).PTTL(context.Background(), mustKeys(t, "filled").Lease).Val(); pttl > 0 {
		t.Errorf("the cold read left a lease of %v", pttl)
	}
}

// Cold reads follow what unknown keys turn out to be. A new Cache reads
// them with GETs; three misses in a row turn cold reads on, so the next
// unknown key is read by its ACQUIRE alone; a long tail of keys that
// others filled turns them off again after a few (each found key lowers
// the score by one).
func TestColdReadsFollowWhatUnknownKeysAre(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	other := newTestCache(t, srv.Client(t), nil)
	const keys = 20
	for i := range keys {
		if err := other.Set(context.Background(), "tail"+strconv.Itoa(i), []byte("v"), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	rdb := srv.Client(t)
	log, acq := &cmdLog{}, &acquireCounter{}
	rdb.AddHook(log)
	rdb.AddHook(acq)
	c := newTestCache(t, rdb, nil)
	get := func(key string) commandCount {
		t.Helper()
		if _, err := c.Get(context.Background(), key, time.Hour, constLoader(new(atomic.Int64), "v")); err != nil {
			t.Fatal(err)
		}
		return countCommands(log, acq)
	}
	for i := range keys / 2 {
		if n := get("tail" + strconv.Itoa(i)); n.gets != 1 || n.acquires != 0 {
			t.Errorf("a new Cache's Get of unknown key %d, in Redis, sent %d GETs and %d ACQUIREs, want 1 and 0", i, n.gets, n.acquires)
		}
	}
	// The found keys took the score down to its floor, -coldMax: three
	// misses in a row bring it back above 0.
	for i := range 3 {
		if n := get("gone" + strconv.Itoa(i)); n.gets != 1 {
			t.Errorf("missing key %d: its Get sent %d GETs, want 1 (cold reads still off)", i, n.gets)
		}
	}
	if n := get("new"); n.gets != 0 || n.acquires != 1 {
		t.Errorf("after three misses, an unknown missing key's Get sent %d GETs and %d ACQUIREs, want 0 and 1", n.gets, n.acquires)
	}
	// Score 8 now: eight found keys in a row are read cold (each answered
	// by its ACQUIRE's value), and the next one by GET again.
	for i := keys / 2; i < keys; i++ {
		want := 1 // ACQUIREs
		if i >= keys/2+coldMax {
			want = 0
		}
		if n := get("tail" + strconv.Itoa(i)); n.acquires != want || n.gets != 1-want {
			t.Errorf("unknown key %d, in Redis: %d GETs and %d ACQUIREs, want %d and %d", i, n.gets, n.acquires, 1-want, want)
		}
	}
	if s := c.Stats(); s.Loads != 4 {
		t.Errorf("Stats.Loads = %d, want 4 (the missing keys only)", s.Loads)
	}
}

// The callers that come while a cold read's flight of a key runs read
// first (they may not join a flight they did not see start), but share
// their reads behind one GET at a time: 30 of them send 2 GETs (the
// first one's, held here, and the one the others gather on), and all of
// them get the one load's value.
func TestCallersBehindAColdFlightShareTheirGETs(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, nil)
	c.readStall = time.Minute // the gathered read waits for the held one
	missOnce(t, c, "first-miss")
	g := newGatedLoader("value")
	const callers = 30
	vals := make([][]byte, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	wg.Go(func() { vals[0], errs[0] = c.Get(context.Background(), "k", time.Hour, g.load) })
	g.waitEntered(t) // the cold read leads: no GET
	vkey := mustKeys(t, "k").Value
	hold := newHoldHook(t, rdb, vkey, 1, false)
	log := &cmdLog{}
	rdb.AddHook(log)
	for i := 1; i < callers; i++ {
		wg.Go(func() { vals[i], errs[i] = c.Get(context.Background(), "k", time.Hour, g.load) })
	}
	<-hold.held // one caller's GET is on the wire
	waitFor(t, 10*time.Second, "the other callers to gather behind it", func() bool {
		return gathering(c, vkey) == callers-2
	})
	hold.release()
	waitFlightJoiners(t, c, "k", callers-1)
	close(g.gate)
	wg.Wait()
	gets := 0
	for _, name := range log.take() {
		if name == "get" {
			gets++
		}
	}
	if gets != 2 {
		t.Errorf("%d callers behind a running flight sent %d GETs, want 2", callers-1, gets)
	}
	for i := range callers {
		if errs[i] != nil || string(vals[i]) != "value" {
			t.Fatalf("caller %d: (%q, %v)", i, vals[i], errs[i])
		}
	}
	if n := g.calls.Load(); n != 1 {
		t.Errorf("the loader ran %d times, want 1", n)
	}
}

// injectedFault fails the commands fail picks with an infrastructure error
// (not sent to Redis), alone or in a pipeline.
type injectedFault struct {
	fail atomic.Pointer[func(redis.Cmder) bool]
}

var errInjectedNetwork = errors.New("injected network error")

func (h *injectedFault) set(f func(redis.Cmder) bool) {
	if f == nil {
		h.fail.Store(nil)
		return
	}
	h.fail.Store(&f)
}

func (h *injectedFault) picks(cmd redis.Cmder) bool {
	f := h.fail.Load()
	return f != nil && (*f)(cmd)
}

func (h *injectedFault) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *injectedFault) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.picks(cmd) {
			cmd.SetErr(errInjectedNetwork)
			return errInjectedNetwork
		}
		return next(ctx, cmd)
	}
}
func (h *injectedFault) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if h.picks(cmd) {
				for _, c := range cmds {
					c.SetErr(errInjectedNetwork)
				}
				return errInjectedNetwork
			}
		}
		return next(ctx, cmds)
	}
}

// mustReadCold fails t unless a Get of key by c would be a cold read.
func mustReadCold(t *testing.T, c *Cache, key string) {
	t.Helper()
	if !c.warm.cold() || c.warm.known(warmID(mustKeys(t, key).Value)) {
		t.Fatalf("the test needs a cold read of %q (score %d)", key, c.warm.score.Load())
	}
}

// A follower's looks are ACQUIREs alone, and each reply counts as Redis
// answering: the breaker opens after BreakerThreshold consecutive
// infrastructure errors (breaker.go), and here every other ACQUIRE of the
// follower's looks fails, each one between them succeeds, so no two
// errors are consecutive and the breaker stays closed.
func TestFollowerLooksCountAsAnswersForTheBreaker(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	rdb := srv.Client(t)
	fault := &injectedFault{}
	acq := &acquireCounter{}
	rdb.AddHook(acq)
	rdb.AddHook(fault)
	b := newTestCache(t, rdb, &Options{PollMin: 2 * time.Millisecond, PollMax: 4 * time.Millisecond, BreakerThreshold: 3, WaitTimeout: 30 * time.Second})
	if err := a.Set(context.Background(), "present", []byte("in-redis"), time.Hour); err != nil {
		t.Fatal(err)
	}
	g := newGatedLoader("value")
	go a.Get(context.Background(), "k", time.Hour, g.load)
	g.waitEntered(t)
	var n atomic.Int64
	fault.set(func(cmd redis.Cmder) bool {
		// The first ACQUIRE (the follower's first look) passes, then
		// every other one fails.
		return isAcquireCmd(cmd) && n.Add(1)%2 == 0
	})
	done := make(chan error, 1)
	go func() {
		v, err := b.Get(context.Background(), "k", time.Hour, noLoad(t))
		if err == nil && string(v) != "value" {
			err = errors.New("got " + string(v))
		}
		done <- err
	}()
	waitFor(t, 10*time.Second, "the follower to look 12 times", func() bool { return n.Load() >= 12 })
	fault.set(nil)
	opens := b.Stats().BreakerOpens
	// What an open breaker costs: a Get of a key that is in Redis runs
	// its loader locally instead of reading it.
	var local atomic.Int64
	v, err := b.Get(context.Background(), "present", time.Hour, constLoader(&local, "local"))
	close(g.gate)
	if err := <-done; err != nil {
		t.Errorf("follower: %v", err)
	}
	if opens != 0 {
		t.Errorf("Stats.BreakerOpens = %d after alternating failed and answered ACQUIREs, want 0 (never %d consecutive errors)", opens, 3)
	}
	if err != nil || string(v) != "in-redis" || local.Load() != 0 {
		t.Errorf("Get of a key in Redis = (%q, %v), local loads %d; want the Redis value", v, err, local.Load())
	}
}

// Cold read + StaleFor: the ACQUIRE finds a stale value within StaleFor:
// it is served at once (OutcomeStale) and one refresh runs, counted as a
// normal Get's (cold reads off) are.
func TestColdReadServesStale(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	run := func(cold bool, key string) (string, Outcome, Stats, int64) {
		clk := newFakeClock()
		w := withClock(newTestCache(t, srv.Client(t), &Options{StaleFor: time.Hour}), clk)
		c := withClock(newTestCache(t, srv.Client(t), &Options{StaleFor: time.Hour}), clk)
		missOnce(t, c, "first-miss-"+key)
		if !cold {
			c.warm.score.Store(-coldMax)
		}
		if err := w.Set(context.Background(), key, []byte("old"), time.Minute); err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * time.Minute)
		before := c.Stats()
		var loads atomic.Int64
		gate := make(chan struct{})
		load := func(context.Context) ([]byte, error) {
			loads.Add(1)
			<-gate
			return []byte("new"), nil
		}
		var o Outcome
		v, err := c.Get(WithOutcome(context.Background(), &o), key, time.Minute, load)
		close(gate)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the refresh to load and commit", func() bool {
			s := c.Stats()
			return s.Refreshes == before.Refreshes+1 && s.Loads == before.Loads+1
		})
		return string(v), o, lookupDelta(c.Stats(), before), loads.Load()
	}
	v1, o1, s1, l1 := run(false, "k-normal")
	v2, o2, s2, l2 := run(true, "k-cold")
	if v1 != v2 || o1 != o2 || s1 != s2 || l1 != l2 {
		t.Errorf("stale key: normal Get (%q, %v, loads %d) %+v\ncold Get (%q, %v, loads %d) %+v", v1, o1, l1, s1, v2, o2, l2, s2)
	}
	if v2 != "old" || o2 != OutcomeStale {
		t.Errorf("cold Get of a stale key = (%q, %v), want old, stale", v2, o2)
	}
}

// lookupDelta is the lookup and load counters of s since b.
func lookupDelta(s, b Stats) Stats {
	return Stats{
		Hits: s.Hits - b.Hits, NegativeHits: s.NegativeHits - b.NegativeHits, Misses: s.Misses - b.Misses,
		Corrupt: s.Corrupt - b.Corrupt, Loads: s.Loads - b.Loads, LocalLoads: s.LocalLoads - b.LocalLoads,
		LoadErrors: s.LoadErrors - b.LoadErrors, Leads: s.Leads - b.Leads, Follows: s.Follows - b.Follows,
		Waits: s.Waits - b.Waits, Takeovers: s.Takeovers - b.Takeovers, LoadRetries: s.LoadRetries - b.LoadRetries,
		StaleServed: s.StaleServed - b.StaleServed, Refreshes: s.Refreshes - b.Refreshes,
		EarlyRefreshes: s.EarlyRefreshes - b.EarlyRefreshes, BreakerOpens: s.BreakerOpens - b.BreakerOpens,
	}
}

// Cold read + negative entries: a negative entry found by the ACQUIRE
// answers ErrNotFound, OutcomeNegative, NegativeHits +1, no miss, no load.
func TestColdReadNegativeEntry(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	w := newTestCache(t, srv.Client(t), nil)
	c := newTestCache(t, srv.Client(t), nil)
	missOnce(t, c, "first-miss")
	if _, err := w.Get(context.Background(), "k", time.Hour, func(context.Context) ([]byte, error) { return nil, ErrNotFound }); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	mustReadCold(t, c, "k")
	before := c.Stats()
	var o Outcome
	_, err := c.Get(WithOutcome(context.Background(), &o), "k", time.Hour, noLoad(t))
	if !errors.Is(err, ErrNotFound) || o != OutcomeNegative {
		t.Fatalf("cold Get of a negative entry = (%v, %v), want ErrNotFound, negative", err, o)
	}
	s := c.Stats()
	if s.NegativeHits-before.NegativeHits != 1 || s.Misses != before.Misses || s.Leads != before.Leads || s.Hits != before.Hits {
		t.Errorf("Stats: neg +%d misses +%d leads +%d hits +%d; want 1,0,0,0", s.NegativeHits-before.NegativeHits, s.Misses-before.Misses, s.Leads-before.Leads, s.Hits-before.Hits)
	}
	if !c.warm.known(warmID(mustKeys(t, "k").Value)) {
		t.Errorf("a negative entry found by a cold read left the key unknown")
	}
}

// Cold read + corrupt bytes: counted once as corrupt, one miss, one
// lead, one load; the value is rebuilt.
func TestColdReadCorruptCountedOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, nil)
	missOnce(t, c, "first-miss")
	if err := rdb.Set(context.Background(), mustKeys(t, "k").Value, "garbage-not-an-envelope", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	mustReadCold(t, c, "k")
	before := c.Stats()
	var loads atomic.Int64
	var o Outcome
	v, err := c.Get(WithOutcome(context.Background(), &o), "k", time.Hour, constLoader(&loads, "fixed"))
	if err != nil || string(v) != "fixed" || o != OutcomeLeader {
		t.Fatalf("cold Get over corrupt bytes = (%q, %v, %v)", v, err, o)
	}
	s := c.Stats()
	if s.Corrupt-before.Corrupt != 1 || s.Misses-before.Misses != 1 || s.Leads-before.Leads != 1 || loads.Load() != 1 {
		t.Errorf("Stats: corrupt +%d misses +%d leads +%d loads %d; want 1,1,1,1", s.Corrupt-before.Corrupt, s.Misses-before.Misses, s.Leads-before.Leads, loads.Load())
	}
}

// Cold read + corrupt bytes while another process holds the lease: the
// read follows and gets the holder's value, with no load of its own and
// the bytes counted as corrupt, as a normal Get (cold reads off) does.
// How many looks saw the bytes, and so the exact counts, depends on when
// the holder commits: the lost race of that commit is
// TestRebuildOverUnreadableBytesYieldsToAValueCommittedMeanwhile.
func TestColdReadCorruptWhileHeld(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	run := func(cold bool, key string) Stats {
		rdb := srv.Client(t)
		a := newTestCache(t, srv.Client(t), nil)
		c := newTestCache(t, rdb, &Options{PollMax: time.Hour})
		missOnce(t, c, "first-miss-"+key)
		if !cold {
			c.warm.score.Store(-coldMax)
		}
		if err := rdb.Set(context.Background(), mustKeys(t, key).Value, "garbage", time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		g := newGatedLoader("value")
		go a.Get(context.Background(), key, time.Hour, g.load)
		g.waitEntered(t)
		acq := &acquireCounter{}
		rdb.AddHook(acq)
		before := c.Stats()
		done := make(chan error, 1)
		go func() {
			v, err := c.Get(context.Background(), key, time.Hour, noLoad(t))
			if err == nil && string(v) != "value" {
				err = errors.New("got " + string(v))
			}
			done <- err
		}()
		// Each look is an ACQUIRE that finds the bytes and a plain one that
		// finds the lease held: the first look, then the one after subscribing.
		waitFor(t, 10*time.Second, "the read to follow, subscribe and look again", func() bool {
			return acq.n.Load() >= 4 && notifierSettled(c.notify)
		})
		close(g.gate)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		return lookupDelta(c.Stats(), before)
	}
	for _, cold := range []bool{false, true} {
		s := run(cold, "k-"+strconv.FormatBool(cold))
		if s.Loads != 0 || s.Leads != 0 || s.Corrupt == 0 || s.Waits != 1 {
			t.Errorf("cold=%v: corrupt value, lease held elsewhere: Loads %d, Leads %d, Corrupt %d, Waits %d; want 0, 0, at least 1, 1", cold, s.Loads, s.Leads, s.Corrupt, s.Waits)
		}
	}
}

// Cold read + Redis down (breaker closed, not yet troubled): a cold Get
// fails open exactly as a normal Get: a local load, Stats.LocalLoads +1,
// the breaker hears the error; with FailClosed, ErrUnavailable.
func TestColdReadRedisDown(t *testing.T) {
	t.Parallel()
	for _, failClosed := range []bool{false, true} {
		t.Run("FailClosed="+strconv.FormatBool(failClosed), func(t *testing.T) {
			srv := redistest.Start(t)
			type result struct {
				val  string
				err  error
				o    Outcome
				s    Stats
				trbl bool
			}
			run := func(cold bool) result {
				rdb := srv.Client(t)
				fault := &injectedFault{}
				rdb.AddHook(fault)
				c := newTestCache(t, rdb, &Options{FailClosed: failClosed, BreakerThreshold: 5})
				if cold {
					missOnce(t, c, "first-miss-cold")
					mustReadCold(t, c, "k")
				} else {
					c.warm.score.Store(-coldMax)
				}
				before := c.Stats()
				fault.set(func(redis.Cmder) bool { return true })
				var loads atomic.Int64
				var o Outcome
				v, err := c.Get(WithOutcome(context.Background(), &o), "k", time.Hour, constLoader(&loads, "local"))
				s := c.Stats()
				s.Misses -= before.Misses
				s.LocalLoads -= before.LocalLoads
				s.Loads -= before.Loads
				s.Leads -= before.Leads
				s.Hits -= before.Hits
				return result{string(v), err, o, Stats{Misses: s.Misses, LocalLoads: s.LocalLoads, Loads: s.Loads, Leads: s.Leads, Hits: s.Hits}, c.brk.troubled.Load()}
			}
			warm, cold := run(false), run(true)
			if warm.val != cold.val || errors.Is(warm.err, ErrUnavailable) != errors.Is(cold.err, ErrUnavailable) || (warm.err == nil) != (cold.err == nil) || warm.o != cold.o || warm.s != cold.s || warm.trbl != cold.trbl {
				t.Errorf("Redis down: normal Get = %+v\ncold Get = %+v", warm, cold)
			}
		})
	}
}

// Cold reads + breaker open: no Redis command at all, the same local
// fallback as a normal Get.
func TestColdReadBreakerOpen(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	fault := &injectedFault{}
	rdb.AddHook(fault)
	log := &cmdLog{}
	rdb.AddHook(log)
	c := newTestCache(t, rdb, &Options{BreakerThreshold: 2, BreakerCooldown: time.Hour})
	missOnce(t, c, "first-miss")
	fault.set(func(redis.Cmder) bool { return true })
	var loads atomic.Int64
	for i := range 2 {
		c.Get(context.Background(), "down"+strconv.Itoa(i), time.Hour, constLoader(&loads, "x"))
	}
	if c.Stats().BreakerOpens != 1 {
		t.Fatalf("breaker opens = %d", c.Stats().BreakerOpens)
	}
	fault.set(nil)
	log.take()
	v, err := c.Get(context.Background(), "fresh-key", time.Hour, constLoader(&loads, "local"))
	if err != nil || string(v) != "local" {
		t.Fatalf("Get with the breaker open = (%q, %v)", v, err)
	}
	if names := log.take(); len(names) != 0 {
		t.Errorf("a Get with the breaker open sent %v", names)
	}
}

// Cold read + Close: a cold read's flight (leading, its load held) ends
// at Close with ErrClosed at once.
func TestColdReadClose(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := New(srv.Client(t), nil)
	missOnce(t, c, "first-miss")
	g := newGatedLoader("v")
	done := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), "k", time.Hour, g.load)
		done <- err
	}()
	g.waitEntered(t)
	// A second cold caller reading behind the running flight.
	done2 := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), "k", time.Hour, g.load)
		done2 <- err
	}()
	waitFlightJoiners(t, c, "k", 1)
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	for i, ch := range []chan error{done, done2} {
		select {
		case err := <-ch:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("caller %d after Close: %v, want ErrClosed", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("caller %d did not return at Close", i)
		}
	}
	close(g.gate)
	<-closed
}

// Cold read + ctx: a cold read that follows another process's leader
// leaves at once when its ctx ends.
func TestColdReadCtxCancel(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	c := newTestCache(t, srv.Client(t), nil)
	missOnce(t, c, "first-miss")
	g := newGatedLoader("v")
	defer close(g.gate)
	go a.Get(context.Background(), "k", time.Hour, g.load)
	g.waitEntered(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "k", time.Hour, noLoad(t))
		done <- err
	}()
	waitFor(t, 10*time.Second, "the cold read to follow", func() bool { return c.Stats().Misses >= 2 })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a cold read did not leave at its ctx's end")
	}
}

// Misses count per flight: a cold leader and 20 callers that came while
// it ran (read behind, then join): one miss, one lead, one load.
func TestColdWaveCountsOneMiss(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), nil)
	missOnce(t, c, "first-miss")
	before := c.Stats()
	g := newGatedLoader("value")
	const callers = 21
	var wg sync.WaitGroup
	errs := make([]error, callers)
	wg.Go(func() { _, errs[0] = c.Get(context.Background(), "k", time.Hour, g.load) })
	g.waitEntered(t)
	for i := 1; i < callers; i++ {
		wg.Go(func() { _, errs[i] = c.Get(context.Background(), "k", time.Hour, g.load) })
	}
	waitFlightJoiners(t, c, "k", callers-1)
	close(g.gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("caller %d: %v", i, err)
		}
	}
	s := c.Stats()
	if s.Misses-before.Misses != 1 || s.Leads-before.Leads != 1 || s.Loads-before.Loads != 1 || s.Follows-before.Follows != callers-1 {
		t.Errorf("Stats: misses +%d leads +%d loads +%d follows +%d; want 1,1,1,%d", s.Misses-before.Misses, s.Leads-before.Leads, s.Loads-before.Loads, s.Follows-before.Follows, callers-1)
	}
}

// RYW: another process Invalidates a key while this process's cold
// flight follows that process's leader (its load began before); then
// another process Sets it. A cold Get begun after the Set returned gets
// the Set's value at once.
func TestColdReadAfterInvalidateThenSet(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	w := newTestCache(t, srv.Client(t), nil)
	c := newTestCache(t, srv.Client(t), &Options{PollMax: time.Hour})
	missOnce(t, c, "first-miss")
	g := newGatedLoader("old")
	defer close(g.gate)
	go a.Get(context.Background(), "k", time.Hour, g.load)
	g.waitEntered(t)
	go c.Get(context.Background(), "k", time.Hour, noLoad(t))
	waitFor(t, 10*time.Second, "c to follow", func() bool { return c.Stats().Misses >= 2 })
	if err := w.Invalidate(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	if err := w.Set(context.Background(), "k", []byte("set"), time.Hour); err != nil {
		t.Fatal(err)
	}
	t.Logf("cold read: %v", c.warm.cold() && !c.warm.known(warmID(mustKeys(t, "k").Value)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if v, err := c.Get(ctx, "k", time.Hour, noLoad(t)); err != nil || string(v) != "set" {
		t.Fatalf("a Get after the Set: (%q, %v)", v, err)
	}
}

// RYW within the process: a Set returns, then a Get (the key known by the
// Set) gets it, while an older cold flight of the key still loads.
func TestColdFlightThenLocalSet(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), nil)
	missOnce(t, c, "first-miss")
	g := newGatedLoader("old")
	defer close(g.gate)
	go c.Get(context.Background(), "k", time.Hour, g.load)
	g.waitEntered(t)
	if err := c.Set(context.Background(), "k", []byte("set"), time.Hour); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if v, err := c.Get(ctx, "k", time.Hour, noLoad(t)); err != nil || string(v) != "set" {
		t.Fatalf("a Get after this process's Set: (%q, %v)", v, err)
	}
}

// RYW within the process with Invalidate: this process's cold flight
// loads "old" (began before); Invalidate returns; a Get then must not get
// "old".
func TestColdFlightThenLocalInvalidate(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newTestCache(t, srv.Client(t), nil)
	missOnce(t, c, "first-miss")
	g := newGatedLoader("old")
	go c.Get(context.Background(), "k", time.Hour, g.load)
	g.waitEntered(t)
	if err := c.Invalidate(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	done := make(chan struct{})
	var v []byte
	var err error
	go func() {
		defer close(done)
		v, err = c.Get(context.Background(), "k", time.Hour, constLoader(&calls, "new"))
	}()
	waitFlightJoiners(t, c, "k", 1)
	close(g.gate)
	<-done
	if err != nil || string(v) != "new" {
		t.Fatalf("a Get after Invalidate returned: (%q, %v), want new", v, err)
	}
}

// Follower retry: with RetryFailedLoad, a cold read that follows a
// leader whose load fails retries once: its looks (ACQUIREs alone) take
// the free lease and load; two loads in all.
func TestColdFollowerRetriesFailedLoad(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	c := newTestCache(t, srv.Client(t), &Options{RetryFailedLoad: true})
	missOnce(t, c, "first-miss")
	g := newGatedLoader("")
	g.err = errors.New("source down")
	go a.Get(context.Background(), "k", time.Hour, g.load)
	g.waitEntered(t)
	before := c.Stats()
	var calls atomic.Int64
	done := make(chan struct{})
	var v []byte
	var err error
	go func() {
		defer close(done)
		v, err = c.Get(context.Background(), "k", time.Hour, constLoader(&calls, "retried"))
	}()
	waitFor(t, 10*time.Second, "c to follow and subscribe", func() bool {
		return c.Stats().Misses > before.Misses && notifierSettled(c.notify)
	})
	close(g.gate)
	<-done
	if err != nil || string(v) != "retried" || calls.Load() != 1 {
		t.Fatalf("follower with RetryFailedLoad = (%q, %v), its loads %d; want retried, 1", v, err, calls.Load())
	}
	s := c.Stats()
	if s.LoadRetries-before.LoadRetries != 1 || s.Misses-before.Misses != 1 {
		t.Errorf("Stats: retries +%d misses +%d; want 1, 1", s.LoadRetries-before.LoadRetries, s.Misses-before.Misses)
	}
}

// The score: each found unknown key -1, each missing +4, ±8 bounds,
// under concurrency (CAS).
func TestColdScoreBoundsUnderConcurrency(t *testing.T) {
	t.Parallel()
	var w warmKeys
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 1000 {
				w.found(i%5 == 0)
				if s := w.score.Load(); s > coldMax || s < -coldMax {
					t.Errorf("score %d out of bounds", s)
				}
			}
		})
	}
	wg.Wait()
	w.score.Store(0)
	var wg2 sync.WaitGroup
	for range 3 {
		wg2.Go(func() { w.found(false) })
	}
	wg2.Wait()
	if s := w.score.Load(); s != coldMax {
		t.Errorf("three concurrent misses from 0: score %d, want %d", s, coldMax)
	}
}

// Warm table after errors: a flight that ended in an error (Redis down,
// a failed load) still marks the key (a flight of it ended); a cold Get
// whose ctx ended does not.
func TestAGetThatLeftOnItsContextDoesNotMarkTheKeyKnown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	c := newTestCache(t, srv.Client(t), nil)
	missOnce(t, c, "first-miss")
	g := newGatedLoader("v")
	defer close(g.gate)
	go a.Get(context.Background(), "k", time.Hour, g.load)
	g.waitEntered(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, "k", time.Hour, noLoad(t)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if c.warm.known(warmID(mustKeys(t, "k").Value)) {
		t.Errorf("a Get that left on its ctx marked the key known")
	}
}

// Early refresh (XFetch) found by a cold read's ACQUIRE: one draw, one
// early refresh, the fresh value served, counted as a normal Get is.
func TestColdReadEarlyRefresh(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	run := func(cold bool, key string) (string, Outcome, Stats) {
		rdb := srv.Client(t)
		c := newTestCache(t, rdb, &Options{EarlyRefresh: 1})
		missOnce(t, c, "first-miss-"+key)
		if !cold {
			c.warm.score.Store(-coldMax)
		}
		var draws atomic.Int64
		c.rand = func() float64 { draws.Add(1); return 0.999999 } // always due
		env := c.newEnvelope(1, []byte("v"), time.Minute, 0, time.Minute)
		if err := rdb.Set(context.Background(), mustKeys(t, key).Value, env.Encode(), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		before := c.Stats()
		gate := make(chan struct{})
		var o Outcome
		v, err := c.Get(WithOutcome(context.Background(), &o), key, time.Minute, func(context.Context) ([]byte, error) {
			<-gate
			return []byte("refreshed"), nil
		})
		close(gate)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the refresh", func() bool {
			s := c.Stats()
			return s.Refreshes+s.RefreshErrors+s.RefreshesDropped > before.Refreshes+before.RefreshErrors+before.RefreshesDropped
		})
		waitFor(t, 10*time.Second, "the refresh's load to be counted", func() bool { return c.Stats().Loads > before.Loads })
		d := lookupDelta(c.Stats(), before)
		if draws.Load() != 1 {
			t.Errorf("cold=%v: %d XFetch draws, want 1", cold, draws.Load())
		}
		return string(v), o, d
	}
	v1, o1, s1 := run(false, "k-normal")
	v2, o2, s2 := run(true, "k-cold")
	if v1 != v2 || o1 != o2 || s1 != s2 {
		t.Errorf("early refresh: normal (%q, %v) %+v\ncold (%q, %v) %+v", v1, o1, s1, v2, o2, s2)
	}
}

// holdAcquire holds the first ACQUIRE its client sends (with plain, the
// first plain one), alone or in a pipeline, before it is sent, until
// release closes.
type holdAcquire struct {
	plain   bool // only a plain ACQUIRE (two keys, no mode: a rebuild over unusable bytes)
	once    atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func newHoldAcquire(plain bool) *holdAcquire {
	return &holdAcquire{plain: plain, held: make(chan struct{}), release: make(chan struct{})}
}

func (h *holdAcquire) hold(cmd redis.Cmder) {
	if !isAcquireCmd(cmd) {
		return
	}
	if a := cmd.Args(); h.plain && (len(a) < 3 || fmt.Sprint(a[2]) != "2") {
		return
	}
	if h.once.CompareAndSwap(false, true) {
		close(h.held)
		<-h.release
	}
}

func (h *holdAcquire) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdAcquire) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.hold(cmd)
		return next(ctx, cmd)
	}
}
func (h *holdAcquire) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.hold(cmd)
		}
		return next(ctx, cmds)
	}
}

// The score counts unknown keys, not callers. One key another process
// filled, read by a burst of 30 callers while the cold read's ACQUIRE is
// on the wire, is one found key: the score goes from +8 to +7, and cold
// reads stay on. The 29 join the cold read's flight; its ACQUIRE was
// sent before they began, so its value is not current for them, and
// they read the key (behind the flight, sharing their GETs) instead of
// starting cold reads of their own.
func TestColdScoreCountsKeysNotCallers(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	w := newTestCache(t, srv.Client(t), nil)
	if err := w.Set(context.Background(), "filled", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, nil)
	missOnce(t, c, "first-miss")
	c.warm.score.Store(coldMax)
	c.readStall = time.Minute // a gathered read waits for the one on the wire
	h := newHoldAcquire(false)
	rdb.AddHook(h)
	log, acq := &cmdLog{}, &acquireCounter{}
	rdb.AddHook(log)
	rdb.AddHook(acq)
	const callers = 30
	vals := make([][]byte, callers)
	var wg sync.WaitGroup
	wg.Go(func() { vals[0], _ = c.Get(context.Background(), "filled", time.Hour, noLoad(t)) })
	<-h.held // the cold read's ACQUIRE is on the wire
	for i := 1; i < callers; i++ {
		wg.Go(func() { vals[i], _ = c.Get(context.Background(), "filled", time.Hour, noLoad(t)) })
	}
	waitFlightJoiners(t, c, "filled", callers-1)
	countCommands(log, acq)
	close(h.release)
	wg.Wait()
	for i, v := range vals {
		if string(v) != "v" {
			t.Fatalf("caller %d got %q, want the stored value", i, v)
		}
	}
	if s := c.warm.score.Load(); s != coldMax-1 {
		t.Errorf("one found unknown key (30 callers) took the score from %d to %d, want %d; cold reads on: %v", coldMax, s, coldMax-1, c.warm.cold())
	}
	// How many GETs the 29 share depends on how far apart they wake (a
	// gathered read waits for the one on the wire): at least one, and no
	// cold read of their own.
	if n := countCommands(log, acq); n.acquires != 1 || n.gets < 1 {
		t.Errorf("30 callers of a found unknown key sent %d ACQUIREs and %d GETs, want 1 and at least 1", n.acquires, n.gets)
	}
}

// Concurrent callers of a key that another process is rebuilding, started
// while this process's cold read's ACQUIRE is on the wire, join its
// flight: the process sends that ACQUIRE and the one its subscription's
// confirmation starts, and no GET, and every caller gets the value the
// other process commits. (In the leader's process, the callers that
// joined while its ACQUIRE was on the wire read the key behind the load:
// TestCallersBehindAColdFlightShareTheirGETs.)
func TestCallersOfAColdMissJoinItsFlight(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	leader := newTestCache(t, srv.Client(t), psOptions("cj"))
	g := newGatedLoader("value")
	lead := make(chan error, 1)
	go func() {
		_, err := leader.Get(context.Background(), "k", time.Hour, g.load)
		lead <- err
	}()
	g.waitEntered(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, psOptions("cj"))
	missOnce(t, c, "first-miss")
	h := newHoldAcquire(false)
	rdb.AddHook(h)
	log, acq := &cmdLog{}, &acquireCounter{}
	rdb.AddHook(log)
	rdb.AddHook(acq)
	const callers = 30
	vals := make([][]byte, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	wg.Go(func() { vals[0], errs[0] = c.Get(context.Background(), "k", time.Hour, noLoad(t)) })
	<-h.held
	for i := 1; i < callers; i++ {
		wg.Go(func() { vals[i], errs[i] = c.Get(context.Background(), "k", time.Hour, noLoad(t)) })
	}
	waitFlightJoiners(t, c, "k", callers-1)
	countCommands(log, acq)
	close(h.release)
	waitFor(t, 10*time.Second, "the follower's look after the confirmation", func() bool { return acq.n.Load() >= 2 })
	close(g.gate)
	if err := <-lead; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := range callers {
		if errs[i] != nil || string(vals[i]) != "value" {
			t.Fatalf("caller %d: (%q, %v)", i, vals[i], errs[i])
		}
	}
	if n := g.calls.Load(); n != 1 {
		t.Errorf("the loader ran %d times, want 1", n)
	}
	if n := countCommands(log, acq); n.acquires != 2 || n.gets != 0 {
		t.Errorf("%d callers of a key another process rebuilds sent %d ACQUIREs and %d GETs, want 2 and 0", callers, n.acquires, n.gets)
	}
}

// Near cache + cold reads: the near cache's fill counts a miss of an
// unknown key as the hit path's read does, so misses turn cold reads on
// with the near cache serving too, and a cold read then skips the fill's
// GET as it skips the hit path's (it failed CI when the near cache was
// serving at the first Get: the fill's miss was not counted). Once another
// process's Set (or Invalidate) has reached this process's near cache
// (within Staleness, its documented bound), a Get never gets the older
// value, from Redis or from process memory.
func TestColdReadWithNearCache(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	w := newTestCache(t, srv.Client(t), nil)
	rdb := srv.Client(t)
	log, acq := &cmdLog{}, &acquireCounter{}
	rdb.AddHook(log)
	rdb.AddHook(acq)
	c := newTestCache(t, rdb, &Options{Near: NearOptions{MaxEntries: 100}})
	waitServing(t, c) // the near cache's fill reads a near miss
	missOnce(t, c, "first-miss")
	// A cold read skips the fill's GET too: the ACQUIRE reads.
	countCommands(log, acq)
	if _, err := c.Get(context.Background(), "second-miss", time.Hour, constLoader(new(atomic.Int64), "x")); err != nil {
		t.Fatal(err)
	}
	if n := countCommands(log, acq); n.gets != 0 || n.acquires != 1 {
		t.Errorf("a cold read through the near cache sent %d GETs and %d ACQUIREs, want 0 and 1", n.gets, n.acquires)
	}
	ctx := context.Background()
	for i := range 5 {
		key := "nk" + strconv.Itoa(i)
		if err := w.Set(ctx, key, []byte("v1"), time.Hour); err != nil {
			t.Fatal(err)
		}
		if v, err := c.Get(ctx, key, time.Hour, noLoad(t)); err != nil || string(v) != "v1" {
			t.Fatalf("Get %s = (%q, %v)", key, v, err)
		}
		if err := w.Set(ctx, key, []byte("v2"), time.Hour); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the Set's message to drop the near copy", func() bool { return !nearHas(c, key) })
		if v, err := c.Get(ctx, key, time.Hour, noLoad(t)); err != nil || string(v) != "v2" {
			t.Fatalf("Get %s after the Set = (%q, %v), want v2", key, v, err)
		}
		if err := w.Invalidate(ctx, key); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the Invalidate's message to drop the near copy", func() bool { return !nearHas(c, key) })
		var calls atomic.Int64
		if v, err := c.Get(ctx, key, time.Hour, constLoader(&calls, "v3")); err != nil || string(v) != "v3" {
			t.Fatalf("Get %s after the Invalidate = (%q, %v), want v3", key, v, err)
		}
	}
}

// A Get that finds unreadable bytes while another process holds the
// lease rebuilds over them with a plain ACQUIRE, which does not look at
// the value. When the holder commits between the two, that ACQUIRE wins
// the freed lease: the Get then finds the committed value, gives the
// lease back and answers with it, and does not load again. Here the plain
// ACQUIRE is held until the holder's Get returned.
func TestRebuildOverUnreadableBytesYieldsToAValueCommittedMeanwhile(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newTestCache(t, srv.Client(t), nil)
	rdb := srv.Client(t)
	h := newHoldAcquire(true)
	rdb.AddHook(h)
	c := newTestCache(t, rdb, nil)
	keys := mustKeys(t, "k")
	if err := rdb.Set(context.Background(), keys.Value, "garbage", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	g := newGatedLoader("value")
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Get(context.Background(), "k", time.Hour, g.load)
		aDone <- err
	}()
	g.waitEntered(t) // a holds the lease over the garbage
	type result struct {
		v   []byte
		err error
	}
	cDone := make(chan result, 1)
	go func() {
		v, err := c.Get(context.Background(), "k", time.Hour, noLoad(t))
		cDone <- result{v, err}
	}()
	select {
	case <-h.held: // c found the garbage, and its plain ACQUIRE waits
	case <-time.After(10 * time.Second):
		t.Fatal("no plain ACQUIRE from the Get that found the garbage")
	}
	close(g.gate)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	close(h.release) // the lease is free now: this ACQUIRE wins it
	r := <-cDone
	if r.err != nil || string(r.v) != "value" {
		t.Fatalf("Get = (%q, %v), want the value committed meanwhile", r.v, r.err)
	}
	if pttl := srv.Client(t).PTTL(context.Background(), keys.Lease).Val(); pttl > 0 {
		t.Errorf("the lease won over the committed value is still held (PTTL %v)", pttl)
	}
	if s := c.Stats(); s.Loads != 0 || s.Leads != 0 {
		t.Errorf("Stats: Loads %d, Leads %d; want 0 and 0", s.Loads, s.Leads)
	}
}
