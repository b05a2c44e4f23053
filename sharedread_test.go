package herd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// gathering reports how many callers wait on vkey's next read, the one
// not sent yet (its owner and its joiners), or 0 when there is none.
func gathering(c *Cache, vkey string) int {
	s := &c.reads.stripes[stripe(vkey)]
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[vkey]
	if !ok || e.open == nil {
		return 0
	}
	return 1 + e.open.joined
}

// hitGETs counts the GETs in log, the commands that hits sent, and
// fails t for any other command but a new connection's.
func hitGETs(t *testing.T, log *cmdLog) int {
	t.Helper()
	gets := 0
	for _, name := range log.take() {
		switch name {
		case "get":
			gets++
		case "hello", "client": // new pooled connections
		default:
			t.Errorf("a hit sent %s", name)
		}
	}
	return gets
}

// holdHook holds the first n GETs of one key until gate opens, each
// before it is sent, or after its reply came when afterReply is set (the
// reply is then older than anything written meanwhile); held reports
// each one it holds.
type holdHook struct {
	key        string
	n          int32
	afterReply bool
	held       chan struct{}
	gate       chan struct{}
	seen       atomic.Int32
	once       sync.Once
}

func newHoldHook(t *testing.T, rdb *redis.Client, vkey string, n int, afterReply bool) *holdHook {
	h := &holdHook{key: vkey, n: int32(n), afterReply: afterReply, held: make(chan struct{}, n), gate: make(chan struct{})}
	rdb.AddHook(h)
	t.Cleanup(h.release) // before the Cache's Close, which waits for held GETs
	return h
}

func (h *holdHook) release() { h.once.Do(func() { close(h.gate) }) }

func (h *holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		mine := cmd.Name() == "get" && len(cmd.Args()) == 2 && cmd.Args()[1] == h.key && h.seen.Add(1) <= h.n
		if mine && !h.afterReply {
			h.held <- struct{}{}
			<-h.gate
		}
		err := next(ctx, cmd)
		if mine && h.afterReply {
			h.held <- struct{}{}
			<-h.gate
		}
		return err
	}
}

// Concurrent hits of one key in one process share their GETs: while
// readWires reads are on the wire, every caller that comes gathers on
// the next one, so 50 callers send 3 GETs (the first two callers' own,
// and the one the 48 others share), whatever their contexts and whether
// they call Get, Begin (the HTTP middleware's entry) or Peek, and each
// gets its own copy.
func TestConcurrentHitsOfOneKeyShareOneGET(t *testing.T) {
	t.Parallel()
	for _, api := range []string{"Get", "Begin", "Peek"} {
		t.Run(api, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			rdb := srv.Client(t)
			c := newTestCache(t, rdb, nil)
			c.readStall = time.Minute // the gathered read waits for the held one
			bg := context.Background()
			if err := c.Set(bg, "hot", []byte("value"), time.Hour); err != nil {
				t.Fatal(err)
			}
			vkey, _ := valueKey(DefaultPrefix, "hot")
			hold := newHoldHook(t, rdb, vkey, readWires, false)
			log := &cmdLog{}
			rdb.AddHook(log)

			const callers = 50
			vals := make([][]byte, callers)
			errs := make([]error, callers)
			var wg sync.WaitGroup
			get := func(i int) {
				ctx := bg
				if i%2 == 1 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(bg)
					defer cancel()
				}
				switch api {
				case "Get":
					vals[i], errs[i] = c.Get(ctx, "hot", time.Hour, noLoad(t))
				case "Begin":
					hit, fill, err := c.Begin(ctx, "hot", time.Hour, nil)
					if fill != nil {
						fill.Abort(errors.New("test"))
						err = errors.New("a Begin of a fresh key got a Fill")
					}
					if hit != nil {
						vals[i] = hit.Value
					}
					errs[i] = err
				case "Peek":
					vals[i], _, errs[i] = c.Peek(ctx, "hot")
				}
			}
			wg.Go(func() { get(0) })
			<-hold.held // the first caller's GET is held
			for i := 1; i < callers; i++ {
				wg.Go(func() { get(i) })
			}
			<-hold.held // and the next one's
			waitFor(t, 10*time.Second, "the other callers to gather on the next read", func() bool {
				return gathering(c, vkey) == callers-readWires
			})
			hold.release()
			wg.Wait()
			gets := hitGETs(t, log)
			if gets != readWires+1 {
				t.Errorf("%d concurrent %ss of one key sent %d GETs, want %d", callers, api, gets, readWires+1)
			}
			for i := range callers {
				if errs[i] != nil || string(vals[i]) != "value" {
					t.Fatalf("caller %d: (%q, %v)", i, vals[i], errs[i])
				}
			}
			vals[1][0] = 'X' // a joiner's copy is its own
			for i := range callers {
				if i != 1 && string(vals[i]) != "value" {
					t.Fatalf("caller %d sees another caller's write to its slice: %q", i, vals[i])
				}
			}
			if s := c.Stats(); api != "Peek" && s.Hits != callers {
				t.Errorf("Stats.Hits = %d, want %d (one per caller)", s.Hits, callers)
			}
		})
	}
}

// Read your writes with shared reads: a caller that starts after a Set
// returned never takes the reply of a GET that was sent before. Here the
// replies of the reads on the wire (the old value) are held, the Set
// returns, and a third caller starts: it gathers on the next read, which
// is sent after the oldest held one returns, and gets the new value.
func TestSharedReadNeverAnswersFromAReadSentBeforeTheCallerStarted(t *testing.T) {
	t.Parallel()
	for name, mk := range hitContexts() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			rdb := srv.Client(t)
			c := newTestCache(t, rdb, nil)
			c.readStall = time.Minute
			w := newTestCache(t, srv.Client(t), nil) // another process
			bg := context.Background()
			if err := w.Set(bg, "k", []byte("old"), time.Hour); err != nil {
				t.Fatal(err)
			}
			vkey, _ := valueKey(DefaultPrefix, "k")
			hold := newHoldHook(t, rdb, vkey, readWires, true)
			get := func() <-chan result {
				ch := make(chan result, 1)
				go func() {
					ctx, cancel := mk()
					defer cancel()
					v, err := c.Get(ctx, "k", time.Hour, noLoad(t))
					ch <- result{val: v, err: err}
				}()
				return ch
			}
			var early []<-chan result
			for range readWires {
				early = append(early, get())
				<-hold.held // "old" is read, its reply held
			}
			if err := w.Set(bg, "k", []byte("new"), time.Hour); err != nil {
				t.Fatal(err)
			}
			late := get()
			waitFor(t, 10*time.Second, "the late caller to open the next read", func() bool { return gathering(c, vkey) == 1 })
			hold.release()
			if r := <-late; r.err != nil || string(r.val) != "new" {
				t.Errorf("a Get that started after Set returned got (%q, %v), want new", r.val, r.err)
			}
			for _, ch := range early {
				if r := <-ch; r.err != nil || string(r.val) != "old" {
					t.Errorf("an early Get: (%q, %v), want old (read before the Set)", r.val, r.err)
				}
			}
		})
	}
}

// A caller whose ctx ends while its shared read waits leaves at once
// with ctx's error; the others on that read still get the value.
func TestSharedReadCallerLeavesOnItsContext(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, nil)
	c.readStall = time.Minute
	bg := context.Background()
	if err := c.Set(bg, "k", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	vkey, _ := valueKey(DefaultPrefix, "k")
	hold := newHoldHook(t, rdb, vkey, readWires, false)
	var early []chan result
	for range readWires {
		ch := make(chan result, 1)
		early = append(early, ch)
		go func() {
			v, err := c.Get(bg, "k", time.Hour, noLoad(t))
			ch <- result{val: v, err: err}
		}()
		<-hold.held
	}
	leaver, leave := context.WithCancel(bg)
	left := make(chan error, 1)
	go func() {
		_, err := c.Get(leaver, "k", time.Hour, noLoad(t))
		left <- err
	}()
	waitFor(t, 10*time.Second, "the leaver to open the next read", func() bool { return gathering(c, vkey) == 1 })
	stayed := make(chan result, 1)
	go func() {
		v, err := c.Get(bg, "k", time.Hour, noLoad(t))
		stayed <- result{val: v, err: err}
	}()
	waitFor(t, 10*time.Second, "a second caller to join the next read", func() bool { return gathering(c, vkey) == 2 })
	leave()
	select {
	case err := <-left:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the caller whose ctx ended: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a caller whose ctx ended did not leave its shared read")
	}
	hold.release()
	for _, ch := range append(early, stayed) {
		if r := <-ch; r.err != nil || string(r.val) != "v" {
			t.Errorf("(%q, %v), want v", r.val, r.err)
		}
	}
}

type beginAnswer struct {
	hit  *Hit
	fill *Fill
	err  error
}

// beginAfterClose calls Begin for a fresh key whose GET is held, calls
// Close, and reports what Begin returned within a few seconds (ok false:
// it did not return). The held GET is then released, and Begin and Close
// are waited for.
func beginAfterClose(t *testing.T, opt *Options, mk func() (context.Context, context.CancelFunc)) (a beginAnswer, ok bool) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	c := newTestCache(t, rdb, opt)
	bg := context.Background()
	if err := c.Set(bg, "k", []byte("v"), time.Hour); err != nil {
		t.Fatal(err)
	}
	vkey, _ := valueKey(DefaultPrefix, "k")
	hold := newHoldHook(t, rdb, vkey, 1, false)
	ch := make(chan beginAnswer, 1)
	go func() {
		ctx, cancel := mk()
		defer cancel()
		h, f, err := c.Begin(ctx, "k", time.Hour, nil)
		if f != nil {
			f.Abort(nil)
		}
		ch <- beginAnswer{h, f, err}
	}()
	<-hold.held // Begin's GET is under way (held before it is sent)
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case a = <-ch:
		ok = true
	case <-time.After(5 * time.Second):
	}
	hold.release()
	if !ok {
		<-ch
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	return a, ok
}
