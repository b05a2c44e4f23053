package herd

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
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
// are ACQUIREs too. The loader runs once in all.
func TestColdWaveLeadsAfterOneRoundTrip(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	caches := make([]*Cache, 2)
	logs := make([]*cmdLog, 2)
	acqs := make([]*acquireCounter, 2)
	for i := range caches {
		rdb := srv.Client(t)
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
