package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdkit/herd"
	"github.com/redis/go-redis/v9"
)

// A worker is one instance process: it runs C concurrent callers against
// one strategy at a time, as the parent tells it, and reports what its
// callers saw.

// workerMain runs the worker role until stdin closes (the parent is gone
// or done) or the deadline in the environment passes.
func workerMain(in io.Reader, out io.Writer) int {
	idx, _ := strconv.Atoi(os.Getenv(indexEnv))
	deadline := time.Now().Add(30 * time.Minute)
	if d, err := strconv.ParseInt(os.Getenv(deadlineEnv), 10, 64); err == nil {
		deadline = time.Unix(0, d)
	}
	time.AfterFunc(time.Until(deadline), func() {
		fmt.Fprintf(os.Stderr, "bench worker %d (pid %d): deadline reached, exiting\n", idx, os.Getpid())
		os.Exit(3)
	})
	w := &worker{idx: idx, pid: os.Getpid(), hic: startHiccups()}
	defer w.teardown()
	// Commands are read in their own goroutine, so that the end of stdin
	// (the parent is gone, or done) ends the process at once, even in the
	// middle of a wave or a load run.
	cmds := make(chan command)
	go func() {
		dec := json.NewDecoder(bufio.NewReader(in))
		for {
			var cmd command
			if err := dec.Decode(&cmd); err != nil {
				os.Exit(0)
			}
			switch cmd.Op {
			case "ack":
				w.acks.ack(cmd.Version, cmd.At)
				continue
			case "mark":
				w.acks.watermark(cmd.At)
				continue
			case "load":
				// Before the load starts, and before the writer's first
				// acknowledgement, which comes after it on stdin.
				w.acks.reset()
			}
			cmds <- cmd
		}
	}()
	enc := json.NewEncoder(out)
	for cmd := range cmds {
		r := w.handle(cmd)
		r.Worker, r.Pid = idx, w.pid
		if err := enc.Encode(r); err != nil {
			return 1
		}
	}
	return 0
}

type worker struct {
	idx, pid int
	hic      *hiccups
	acks     ackStore // the hotkey writer's acknowledgements

	// The current phase.
	strategy string
	rdb      redis.UniversalClient
	cnt      *counter
	strat    strategy
	client   *http.Client
	origin   string
	phase    string
	callers  int
	timeout  time.Duration
	think    time.Duration
	herdBase *herd.Stats // herd's counters after the warm-up wave (nil: none ran)
}

func (w *worker) handle(cmd command) reply {
	var err error
	var r reply
	switch cmd.Op {
	case "setup":
		err = w.setup(cmd)
		r.Op = "ready"
	case "wave":
		r.Op, r.Samples = "samples", w.wave(cmd)
	case "warm-wave":
		// A wave that is not measured: it warms what a service that has
		// been running has warm (see bench.warmWave). herd's counters,
		// which count from the Cache's start, are reported from here.
		w.wave(cmd)
		w.resetCounts()
		w.herdBase = w.strat.HerdStats()
		r.Op = "ready"
	case "load":
		if cmd.Hot {
			r.Op, r.Samples = "samples", w.hotLoad(cmd)
		} else {
			r.Op, r.Samples = "samples", w.load(cmd)
		}
	case "teardown":
		r.Op, r.Stats = "stats", w.teardown()
	default:
		err = fmt.Errorf("unknown op %q", cmd.Op)
	}
	if err == nil && cmd.Op != "setup" && cmd.Op != "teardown" && w.strat == nil {
		err = errors.New("no phase set up")
	}
	if err != nil {
		return reply{Op: "error", Error: fmt.Sprintf("worker %d: %s: %v", w.idx, cmd.Op, err)}
	}
	return r
}

func (w *worker) setup(cmd command) error {
	w.teardown()
	w.rdb = newClient(cmd.Redis)
	w.cnt = &counter{}
	w.rdb.AddHook(w.cnt)
	strat, err := newStrategy(strategyParams{
		Name: cmd.Strategy, Prefix: cmd.Prefix,
		TTL: time.Duration(cmd.TTL), StaleFor: time.Duration(cmd.StaleFor),
	}, w.rdb)
	if err != nil {
		return err
	}
	w.strat, w.strategy, w.phase = strat, cmd.Strategy, cmd.Phase
	w.origin, w.callers = cmd.Origin, cmd.Callers
	w.timeout, w.think = time.Duration(cmd.Timeout), time.Duration(cmd.Think)
	w.client = &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: w.callers + 8,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}

	// Warm up, the same for every strategy: open the Redis pool's
	// connections and one HTTP connection per caller, so that no strategy
	// pays for dialing inside its measurements.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2*w.callers)
	for range w.callers {
		wg.Go(func() {
			if err := w.rdb.Ping(ctx).Err(); err != nil {
				errs <- fmt.Errorf("redis: %w", err)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, w.origin+"/ping", nil)
			resp, err := w.client.Do(req)
			if err != nil {
				errs <- fmt.Errorf("origin: %w", err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	w.resetCounts()
	return nil
}

// resetCounts zeroes the Redis command and error counts: what came before
// (the warm-up) is not measured.
func (w *worker) resetCounts() {
	w.cnt.cmds.Store(0)
	w.cnt.errs.Store(0)
	w.cnt.canceled.Store(0)
	w.cnt.mu.Lock()
	w.cnt.byErr = nil
	w.cnt.mu.Unlock()
}

func (w *worker) teardown() *workerStat {
	if w.strat == nil {
		return &workerStat{}
	}
	hs := w.strat.HerdStats()
	if hs != nil && w.herdBase != nil {
		subStats(hs, w.herdBase)
	}
	w.herdBase = nil
	st := &workerStat{RedisCmds: w.cnt.cmds.Load(), RedisErrors: w.cnt.errs.Load(), RedisErrs: w.cnt.errorKinds(),
		Canceled: w.cnt.canceled.Load(),
		Herd:     hs}
	_ = w.strat.Close()
	_ = w.rdb.Close()
	w.client.CloseIdleConnections()
	w.strat, w.rdb, w.client = nil, nil, nil
	return st
}

// fetch calls the origin for key.
func (w *worker) fetch(ctx context.Context, key string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.origin+"/load?k="+url.QueryEscape(key), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(hdrStrategy, w.strategy)
	req.Header.Set(hdrPhase, w.phase)
	req.Header.Set(hdrPid, strconv.Itoa(w.pid))
	resp, err := w.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("origin: %s", resp.Status)
	}
	return b, nil
}

// Call classes.
const (
	classError = iota
	classOrigin
	classFollower
	classHit
)

type callResult struct {
	start   time.Time
	lat     time.Duration
	class   int
	added   time.Duration // followers only
	ver     uint64        // the version of the data it got
	outcome herd.Outcome
	err     error
}

// call makes one request for key and classifies it. A caller whose own
// loader's origin call produced the value it got is an origin caller. One
// that got a value whose origin call ended after it started waited for a
// rebuild: a follower, whose added latency is its latency minus the part
// of that origin call it was waiting through (for a cold wave, where all
// start together: latency minus the origin latency). Anything else was
// built before the call started: a hit (or herd's stale value), as is a
// value the hotkey writer wrote (no origin call to wait for).
func (w *worker) call(key string) callResult {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	var mine atomic.Uint64
	load := func(ctx context.Context) ([]byte, error) {
		b, err := w.fetch(ctx, key)
		if err == nil {
			if m, perr := parseValue(b); perr == nil {
				mine.Store(m.ID)
			}
		}
		return b, err
	}
	var oc herd.Outcome
	ctx = herd.WithOutcome(ctx, &oc)
	t0 := time.Now()
	v, err := w.strat.Get(ctx, key, load)
	r := callResult{start: t0, lat: time.Since(t0), outcome: oc, err: err}
	if err != nil {
		return r
	}
	m, err := parseValue(v)
	if err != nil {
		r.err = err
		return r
	}
	r.ver = m.Ver
	switch {
	case m.ID == 0:
		r.class = classHit // written by the hotkey writer, before or during the call
	case m.ID == mine.Load():
		r.class = classOrigin
	case m.End >= t0.UnixNano():
		r.class = classFollower
		overlap := time.Duration(m.End - max(m.Start, t0.UnixNano()))
		r.added = max(r.lat-overlap, 0)
	default:
		r.class = classHit
	}
	return r
}

func (w *worker) record(s *sampleSet, r callResult) {
	if isHerd(w.strategy) {
		if s.Outcomes == nil {
			s.Outcomes = map[string]int{}
		}
		s.Outcomes[r.outcome.String()]++
	}
	if r.err != nil {
		s.Errors++
		if s.ErrSample == "" {
			s.ErrSample = r.err.Error()
		}
		return
	}
	s.Lat = append(s.Lat, r.lat.Microseconds())
	switch r.class {
	case classOrigin:
		s.Origin++
	case classFollower:
		s.Follower++
		s.Added = append(s.Added, r.added.Microseconds())
	case classHit:
		s.Hit++
		if r.outcome == herd.OutcomeStale {
			s.Stale++
		}
	}
}

// wave releases every caller at cmd.Start on the same key.
func (w *worker) wave(cmd command) *sampleSet {
	if w.strat == nil {
		return nil
	}
	w.hic.take()
	gate := make(chan struct{})
	res := make([]callResult, w.callers)
	var wg sync.WaitGroup
	for i := range w.callers {
		wg.Go(func() {
			<-gate
			res[i] = w.call(cmd.Key)
		})
	}
	start := time.Unix(0, cmd.Start)
	time.Sleep(time.Until(start))
	late := time.Since(start)
	close(gate)
	wg.Wait()
	s := &sampleSet{Calls: len(res), LateMax: late.Nanoseconds(), Hiccup: int64(w.hic.take())}
	for _, r := range res {
		w.record(s, r)
	}
	return s
}

// load runs every caller in a closed loop over a Zipf-distributed key set
// from cmd.Start to cmd.Stop, recording the calls that start from
// cmd.MeasureFrom.
func (w *worker) load(cmd command) *sampleSet {
	if w.strat == nil {
		return nil
	}
	start, stop := time.Unix(0, cmd.Start), time.Unix(0, cmd.Stop)
	from := cmd.MeasureFrom
	w.hic.take()
	gate := make(chan struct{})
	parts := make([]*sampleSet, w.callers)
	var wg sync.WaitGroup
	for i := range w.callers {
		wg.Go(func() {
			// The same key sequence per (worker, caller) for every strategy.
			r := rand.New(rand.NewPCG(cmd.Seed, uint64(w.idx)<<32|uint64(i)))
			z := rand.NewZipf(r, cmd.Zipf, 1, uint64(cmd.Keys-1))
			s := &sampleSet{Seg: make([]segment, max(len(cmd.Bounds)-1, 0))}
			parts[i] = s
			<-gate
			for time.Now().Before(stop) {
				key := cmd.KeyBase + ":" + strconv.FormatUint(z.Uint64(), 10)
				res := w.call(key)
				s.Calls++
				at := res.start.UnixNano()
				if at >= from && at < cmd.Stop {
					w.record(s, res)
					for j := range s.Seg {
						if at >= cmd.Bounds[j] && at < cmd.Bounds[j+1] {
							s.Seg[j].Calls++
							if res.err != nil {
								s.Seg[j].Errors++
							} else if res.outcome == herd.OutcomeStale {
								s.Seg[j].Stale++
							}
						}
					}
				}
				if w.think > 0 {
					time.Sleep(w.think)
				}
			}
		})
	}
	time.Sleep(time.Until(start))
	late := time.Since(start)
	close(gate)
	wg.Wait()
	total := &sampleSet{LateMax: late.Nanoseconds(), Hiccup: int64(w.hic.take())}
	for _, p := range parts {
		total.merge(p)
	}
	return total
}
