package main

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdkit/herd"
)

// The hotkey scenario: one key, read by every caller of every process in
// a closed loop (as in steady), while one writer in the parent writes a
// new version of it at a set rate through the strategy's own write path
// (herd: Cache.Set; the others: their SET). It measures the read rate,
// the hit latency, how many reads were served from process memory, the
// Redis commands per read, and the staleness of every read.
//
// Staleness. The writer numbers its writes 1, 2, ... and records when
// each one returned (its acknowledgement, wall clock: the processes share
// one host clock). A read that started at s and got version v is stale
// by s − ack(w) when w, the first acknowledged version newer than v, was
// acknowledged before s; otherwise it is fresh. A read that overlapped
// the write it missed is fresh: the write was not acknowledged yet when
// the read began.
//
// The acknowledgements reach the workers over their stdin (not through
// the Redis under test), each followed, every markEvery, by a watermark:
// a time before which every acknowledged write has been announced. A
// worker judges each read once the watermark passes its start, or once a
// newer version's acknowledgement arrived, whichever comes first; until
// then the read waits in its caller's short pending list. So the judgement
// is exact, whatever the delay of the pipe.

// hotKeyName is the one key of the hotkey scenario.
const hotKeyName = scHot + ":0"

// markEvery is how often the writer sends a watermark between writes.
const markEvery = 5 * time.Millisecond

// hotWriteTimeout bounds one write of the writer.
const hotWriteTimeout = 5 * time.Second

// ackLog is what a worker knows of the writer's acknowledgements: acks[v]
// is when version v's write returned (unix ns; 0: failed, or not heard of
// yet), and every write acknowledged before mark has been heard of. A
// published ackLog is never modified.
type ackLog struct {
	acks []int64
	mark int64
}

// judge decides a read that started at start (unix ns) and got version
// got. known is false while the log cannot tell yet. When the read is
// stale, stale > 0 is by how much and missed is the first acknowledged
// version newer than got. Versions are acknowledged in order (one writer,
// one write at a time), so the first newer acknowledged version decides.
func (l *ackLog) judge(start int64, got uint64) (stale int64, missed uint64, known bool) {
	for v := got + 1; v < uint64(len(l.acks)); v++ {
		if a := l.acks[v]; a != 0 {
			if a < start {
				return start - a, v, true
			}
			return 0, 0, true
		}
	}
	if start < l.mark {
		return 0, 0, true // no newer version was acknowledged before the read began
	}
	return 0, 0, false
}

// ackStore is a worker's current ackLog. Only the goroutine that reads the
// worker's stdin updates it; callers read it.
type ackStore struct{ p atomic.Pointer[ackLog] }

func (s *ackStore) load() *ackLog {
	if l := s.p.Load(); l != nil {
		return l
	}
	return &ackLog{}
}

// reset forgets the previous phase's writes.
func (s *ackStore) reset() { s.p.Store(&ackLog{}) }

// ack records that version v was acknowledged at at (unix ns), which is
// also a watermark.
func (s *ackStore) ack(v uint64, at int64) {
	old := s.load()
	acks := old.acks
	if v < uint64(len(acks)) {
		acks = append([]int64(nil), acks...) // never write into a published log
	}
	// Appending past the published length leaves every published log's
	// elements as they were.
	for uint64(len(acks)) <= v {
		acks = append(acks, 0)
	}
	acks[v] = at
	s.p.Store(&ackLog{acks: acks, mark: max(old.mark, at)})
}

// watermark records that every write acknowledged before at was announced.
func (s *ackStore) watermark(at int64) {
	old := s.load()
	if at > old.mark {
		s.p.Store(&ackLog{acks: old.acks, mark: at})
	}
}

// hotRead is one read to judge.
type hotRead struct {
	Start int64  // unix ns
	Ver   uint64 // the version it got
}

// staleTracker holds one caller's reads until they can be judged, in the
// order they started.
type staleTracker struct{ pend []hotRead }

// add queues r and judges what the log can judge.
func (t *staleTracker) add(r hotRead, l *ackLog, out *hotSamples) {
	t.pend = append(t.pend, r)
	t.resolve(l, out)
}

// resolve judges the queued reads from the oldest, up to the first that
// the log cannot judge yet.
func (t *staleTracker) resolve(l *ackLog, out *hotSamples) {
	i := 0
	for ; i < len(t.pend); i++ {
		d, missed, ok := l.judge(t.pend[i].Start, t.pend[i].Ver)
		if !ok {
			break
		}
		out.judged(d, missed)
	}
	t.pend = t.pend[i:]
}

// finish waits, until deadline, for a watermark past the last queued read,
// judges every read, and counts the ones still undecided.
func (t *staleTracker) finish(s *ackStore, out *hotSamples, deadline time.Time) {
	if len(t.pend) > 0 {
		last := t.pend[len(t.pend)-1].Start
		for s.load().mark <= last && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	t.resolve(s.load(), out)
	out.Unjudged += len(t.pend)
	t.pend = nil
}

// hotSamples is what a worker measured in a hotkey run, for the reads
// that started in the measured window.
type hotSamples struct {
	Reads     int    `json:"reads"` // errors included
	Errors    int    `json:"errors"`
	ErrSample string `json:"err_sample,omitempty"`
	Hits      int    `json:"hits"`    // got a value that was there before they began (no origin call waited for)
	Lat       hist   `json:"lat"`     // ns, successful reads
	HitLat    hist   `json:"hit_lat"` // ns, hits
	Stale     hist   `json:"stale"`   // ns, the staleness of the stale reads
	Judged    int    `json:"judged"`
	Unjudged  int    `json:"unjudged"` // no watermark came past them: not judged
	// MissedBy is, per version some read missed, its longest staleness.
	MissedBy map[uint64]int64 `json:"missed_by,omitempty"`
	Newest   uint64           `json:"newest"` // the newest version a read got
	Heard    int              `json:"heard"`  // acknowledgements the worker received in the phase

	// Counted by the worker from the window's start to its end.
	Cmds int64       `json:"cmds"`           // Redis commands its client sent
	Herd *herd.Stats `json:"herd,omitempty"` // herd's counters
}

func (h *hotSamples) record(r callResult) {
	h.Reads++
	if r.err != nil {
		h.Errors++
		if h.ErrSample == "" {
			h.ErrSample = r.err.Error()
		}
		return
	}
	h.Lat.add(r.lat.Nanoseconds())
	if r.class == classHit {
		h.Hits++
		h.HitLat.add(r.lat.Nanoseconds())
	}
	h.Newest = max(h.Newest, r.ver)
}

func (h *hotSamples) judged(stale int64, missed uint64) {
	h.Judged++
	if stale <= 0 {
		return
	}
	h.Stale.add(stale)
	if h.MissedBy == nil {
		h.MissedBy = map[uint64]int64{}
	}
	h.MissedBy[missed] = max(h.MissedBy[missed], stale)
}

func (h *hotSamples) merge(o *hotSamples) {
	h.Reads += o.Reads
	h.Errors += o.Errors
	if h.ErrSample == "" {
		h.ErrSample = o.ErrSample
	}
	h.Hits += o.Hits
	h.Lat.merge(&o.Lat)
	h.HitLat.merge(&o.HitLat)
	h.Stale.merge(&o.Stale)
	h.Judged += o.Judged
	h.Unjudged += o.Unjudged
	for v, d := range o.MissedBy {
		if h.MissedBy == nil {
			h.MissedBy = map[uint64]int64{}
		}
		h.MissedBy[v] = max(h.MissedBy[v], d)
	}
	h.Newest = max(h.Newest, o.Newest)
	h.Heard += o.Heard
	h.Cmds += o.Cmds
	if o.Herd != nil {
		if h.Herd == nil {
			h.Herd = &herd.Stats{}
		}
		addStats(h.Herd, o.Herd)
	}
}

// hotLoad runs every caller in a closed loop on the one key from
// cmd.Start to cmd.Stop, recording the reads that start from
// cmd.MeasureFrom, and judges their staleness against the writer's
// acknowledgements.
func (w *worker) hotLoad(cmd command) *sampleSet {
	if w.strat == nil {
		return nil
	}
	start, stop := time.Unix(0, cmd.Start), time.Unix(0, cmd.Stop)
	from := cmd.MeasureFrom
	judgeBy := stop.Add(w.timeout + 10*time.Second) // the writer's last watermark comes soon after stop
	w.hic.take()
	gate := make(chan struct{})
	parts := make([]*hotSamples, w.callers)
	calls := make([]int, w.callers)
	var wg sync.WaitGroup
	for i := range w.callers {
		wg.Go(func() {
			hs := &hotSamples{}
			parts[i] = hs
			var tr staleTracker
			<-gate
			for time.Now().Before(stop) {
				res := w.call(cmd.Key)
				calls[i]++
				if at := res.start.UnixNano(); at >= from && at < cmd.Stop {
					hs.record(res)
					if res.err == nil {
						tr.add(hotRead{Start: at, Ver: res.ver}, w.acks.load(), hs)
					}
				}
				if w.think > 0 {
					time.Sleep(w.think)
				}
			}
			tr.finish(&w.acks, hs, judgeBy)
		})
	}
	// The window's own counts: commands sent and herd's counters from
	// MeasureFrom to Stop.
	var cmds int64
	var hstats *herd.Stats
	wg.Go(func() {
		time.Sleep(time.Until(time.Unix(0, from)))
		c0, h0 := w.cnt.cmds.Load(), w.strat.HerdStats()
		time.Sleep(time.Until(stop))
		cmds = w.cnt.cmds.Load() - c0
		if h1 := w.strat.HerdStats(); h1 != nil && h0 != nil {
			subStats(h1, h0)
			hstats = h1
		}
	})
	time.Sleep(time.Until(start))
	late := time.Since(start)
	close(gate)
	wg.Wait()
	// The writer's last watermark, after stop, follows every
	// acknowledgement of the phase.
	for w.acks.load().mark < cmd.Stop && time.Now().Before(judgeBy) {
		time.Sleep(time.Millisecond)
	}
	total := &hotSamples{}
	for _, a := range w.acks.load().acks {
		if a != 0 {
			total.Heard++
		}
	}
	n := 0
	for i, p := range parts {
		total.merge(p)
		n += calls[i]
	}
	total.Cmds, total.Herd = cmds, hstats
	return &sampleSet{Calls: n, LateMax: late.Nanoseconds(), Hiccup: int64(w.hic.take()), Hot: total}
}

// subStats subtracts every counter of b from a.
func subStats(a, b *herd.Stats) {
	va, vb := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	for i := range va.NumField() {
		if f := va.Field(i); f.Kind() == reflect.Uint64 {
			f.SetUint(f.Uint() - vb.Field(i).Uint())
		}
	}
}

// hotWrite is one write of the hotkey writer.
type hotWrite struct {
	Version uint64 `json:"version"`
	Start   int64  `json:"start"` // unix ns
	Ack     int64  `json:"ack"`   // unix ns the write returned; 0: it failed
}

// hotResult is the hotkey scenario's part of a phaseResult.
type hotResult struct {
	Key       string  `json:"key"`
	WriteRate float64 `json:"write_rate_per_s"` // asked for

	Reads       int     `json:"reads"` // started in the window
	ReadsPerSec float64 `json:"reads_per_s"`
	Hits        int     `json:"hits"`
	HitP50Us    float64 `json:"hit_p50_us"`
	HitP99Us    float64 `json:"hit_p99_us"`
	HitP999Us   float64 `json:"hit_p999_us"`
	HitMaxUs    float64 `json:"hit_max_us"`
	// FromMemory is the share of the reads served from process memory;
	// 0 for a strategy without a copy there (see fromMemory).
	FromMemory float64 `json:"from_memory"`

	// Herd is herd's counters over the window, summed over the workers.
	Herd *herd.Stats `json:"herd_stats_window,omitempty"`

	ReaderCmds     int64   `json:"reader_redis_cmds"` // sent by the workers' clients in the window
	CmdsPerRead    float64 `json:"redis_cmds_per_read"`
	ServerCmds     int64   `json:"server_cmds"` // processed by the server in the window, writer's included; -1: unknown
	SrvCmdsPerRead float64 `json:"server_cmds_per_read"`

	OriginCallsAll int `json:"origin_calls_phase"` // the whole phase's, warm-up included
	AckedAll       int `json:"acked_phase"`        // acknowledged writes of the whole phase
	Heard          int `json:"acks_heard"`         // acknowledgements the workers received, summed

	Writes      int     `json:"writes"` // acknowledged in the window
	WriteErrors int     `json:"write_errors"`
	WriteP50Ms  float64 `json:"write_p50_ms"`
	WriteP99Ms  float64 `json:"write_p99_ms"`
	WriterCmds  int64   `json:"writer_redis_cmds"` // the whole phase, seed write included
	Newest      uint64  `json:"newest_version_read"`

	StaleReads int     `json:"stale_reads"`
	Judged     int     `json:"judged_reads"`
	Unjudged   int     `json:"unjudged_reads"`
	StaleP50Ms float64 `json:"stale_p50_ms"` // among the stale reads
	StaleP99Ms float64 `json:"stale_p99_ms"` // among the stale reads
	StaleMaxMs float64 `json:"stale_max_ms"`
	// StaleP99AllMs is the 99th percentile over every judged read (a fresh
	// read counts 0).
	StaleP99AllMs float64 `json:"stale_p99_all_ms"`
	// Per write: the longest staleness of a read that missed it.
	WritesMissed int        `json:"writes_missed"` // writes of the window some read missed
	WindowP99Ms  float64    `json:"write_stale_window_p99_ms"`
	WindowMaxMs  float64    `json:"write_stale_window_max_ms"`
	WriteLog     []hotWrite `json:"write_log,omitempty"`

	acked  []uint64 // the versions acknowledged in the window
	window [2]int64 // the measured window, unix ns
}

// hotRun runs the hotkey scenario: the workers' closed loop on the key and,
// in this process, the writer and the count of the server's commands
// over the window.
func (b *bench) hotRun(ctx context.Context, pr *phaseResult, per []*sampleSet, params strategyParams) (*hotResult, error) {
	cfg := b.cfg
	rdb := newClient(b.redis.spec)
	cnt := &counter{}
	rdb.AddHook(cnt)
	defer rdb.Close()
	st, err := newStrategy(params, rdb)
	if err != nil {
		return nil, err
	}
	defer st.Close()

	start := time.Now().Add(barrierLead)
	from := start.Add(cfg.Warmup)
	stop := from.Add(cfg.HotDuration)
	if err := b.fleet.broadcast(command{Op: "load", Hot: true, Key: hotKeyName,
		Start: start.UnixNano(), MeasureFrom: from.UnixNano(), Stop: stop.UnixNano()}); err != nil {
		return nil, err
	}
	wr := &hotWriter{b: b, st: st, size: cfg.ValueSize}
	// The first version is there before the first read.
	if err := wr.write(ctx); err != nil {
		return nil, err
	}
	if len(wr.log) == 0 || wr.log[0].Ack == 0 {
		return nil, fmt.Errorf("the writer's first write failed: %v", wr.lastErr)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var werr error
	wg.Go(func() { werr = wr.run(wctx, cfg.WriteRate, stop) })
	srv := [2]int64{-1, -1}
	wg.Go(func() {
		for i, at := range []time.Time{from, stop} {
			t := time.NewTimer(time.Until(at))
			select {
			case <-wctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			srv[i] = b.redis.serverCommands(wctx)
		}
	})
	total := stop.Sub(start)
	tick := func() {
		el := min(time.Since(start), total)
		state := ""
		if time.Now().Before(from) {
			state = " (warm-up)"
		}
		b.prog.set(false, "[%d/%d] %s × %s: %.1f/%.1fs%s, writes %d",
			b.step, b.steps, pr.Scenario, pr.Strategy, el.Seconds(), total.Seconds(), state, wr.count())
	}
	tick()
	rs, err := b.fleet.await(ctx, total+cfg.CallTimeout+20*time.Second, tick)
	if err != nil {
		cancel()
		wg.Wait()
		return nil, err
	}
	wg.Wait()
	if werr != nil {
		return nil, werr
	}
	for i, r := range rs {
		per[i].merge(r.Samples)
	}

	hr := &hotResult{Key: hotKeyName, WriteRate: cfg.WriteRate, WriterCmds: cnt.cmds.Load(), ServerCmds: -1,
		window: [2]int64{from.UnixNano(), stop.UnixNano()}}
	var wlat hist
	fromNs, stopNs := from.UnixNano(), stop.UnixNano()
	for _, w := range wr.log {
		if w.Ack != 0 {
			hr.AckedAll++
		}
		if w.Start < fromNs || w.Start >= stopNs {
			continue
		}
		if w.Ack == 0 {
			hr.WriteErrors++
			continue
		}
		hr.Writes++
		wlat.add(w.Ack - w.Start)
		hr.acked = append(hr.acked, w.Version)
	}
	hr.WriteP50Ms, hr.WriteP99Ms = ms(time.Duration(wlat.quantile(0.50))), ms(time.Duration(wlat.quantile(0.99)))
	hr.WriteLog = wr.log
	if srv[0] >= 0 && srv[1] >= srv[0] {
		hr.ServerCmds = srv[1] - srv[0]
	}
	return hr, nil
}

// summarize fills in what the readers measured (hs, every worker's
// samples merged) over a window of d.
func (hr *hotResult) summarize(hs *hotSamples, d time.Duration) {
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	msOf := func(ns int64) float64 { return float64(ns) / 1e6 }
	hr.Reads, hr.Hits, hr.Newest, hr.Heard = hs.Reads, hs.Hits, hs.Newest, hs.Heard
	hr.ReadsPerSec = float64(hs.Reads) / d.Seconds()
	hr.HitP50Us, hr.HitP99Us = us(hs.HitLat.quantile(0.50)), us(hs.HitLat.quantile(0.99))
	hr.HitP999Us, hr.HitMaxUs = us(hs.HitLat.quantile(0.999)), us(hs.HitLat.Max)
	hr.FromMemory, hr.Herd = fromMemory(hs.Herd), hs.Herd
	hr.ReaderCmds = hs.Cmds
	if hs.Reads > 0 {
		hr.CmdsPerRead = float64(hs.Cmds) / float64(hs.Reads)
		hr.SrvCmdsPerRead = -1
		if hr.ServerCmds >= 0 {
			hr.SrvCmdsPerRead = float64(hr.ServerCmds) / float64(hs.Reads)
		}
	}
	hr.StaleReads, hr.Judged, hr.Unjudged = int(hs.Stale.N), hs.Judged, hs.Unjudged
	hr.StaleP50Ms, hr.StaleP99Ms = msOf(hs.Stale.quantile(0.50)), msOf(hs.Stale.quantile(0.99))
	hr.StaleMaxMs = msOf(hs.Stale.Max)
	// Over every judged read: the fresh ones are the lowest ranks, at 0.
	if n := uint64(hs.Judged); n > 0 {
		rank := min(max(uint64(0.99*float64(n)+0.999999), 1), n)
		if fresh := n - hs.Stale.N; rank > fresh {
			q := float64(rank-fresh) / float64(hs.Stale.N)
			hr.StaleP99AllMs = msOf(hs.Stale.quantile(q))
		}
	}
	var win hist
	for _, v := range hr.acked {
		d := hs.MissedBy[v]
		if d > 0 {
			hr.WritesMissed++
		}
		win.add(d)
	}
	hr.WindowP99Ms, hr.WindowMaxMs = msOf(win.quantile(0.99)), msOf(win.Max)
}

// fromMemory is the share of reads answered from process memory: from
// herd's counters, the near cache's hits over its lookups (herd-near); 0
// for a strategy without a near cache.
func fromMemory(s *herd.Stats) float64 {
	if s == nil {
		return 0
	}
	lookups := s.NearHits + s.NearMisses + s.NearBypassed
	if lookups == 0 {
		return 0
	}
	return float64(s.NearHits) / float64(lookups)
}

// hotWriter is the hotkey scenario's one writer, in the parent.
type hotWriter struct {
	b    *bench
	st   strategy
	size int

	mu      sync.Mutex
	log     []hotWrite
	lastErr error
}

func (wr *hotWriter) count() int {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	return len(wr.log)
}

// write writes the next version: first the origin's (the database), then
// the cache, through the strategy; an acknowledged write is announced to
// every worker.
func (wr *hotWriter) write(ctx context.Context) error {
	wr.mu.Lock()
	v := uint64(len(wr.log) + 1)
	wr.mu.Unlock()
	wr.b.origin.setVersion(v)
	t0 := time.Now()
	wctx, cancel := context.WithTimeout(ctx, hotWriteTimeout)
	err := wr.st.Set(wctx, hotKeyName, makeValue(0, t0, t0, v, wr.size))
	cancel()
	ack := time.Now()
	w := hotWrite{Version: v, Start: t0.UnixNano()}
	if err == nil {
		w.Ack = ack.UnixNano()
	}
	wr.mu.Lock()
	wr.log = append(wr.log, w)
	if err != nil {
		wr.lastErr = err
	}
	wr.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fmt.Fprintf(os.Stderr, "bench: hotkey write %d: %v\n", v, err)
		return wr.b.fleet.broadcast(command{Op: "mark", At: ack.UnixNano()})
	}
	return wr.b.fleet.broadcast(command{Op: "ack", Version: v, At: w.Ack})
}

// run writes at rate per second until stop, sends a watermark every
// markEvery in between, and a last one after stop.
func (wr *hotWriter) run(ctx context.Context, rate float64, stop time.Time) error {
	marks := time.NewTicker(markEvery)
	defer marks.Stop()
	end := time.NewTimer(time.Until(stop))
	defer end.Stop()
	var next <-chan time.Time
	var interval time.Duration
	var due time.Time
	var wt *time.Timer
	if rate > 0 {
		interval = time.Duration(float64(time.Second) / rate)
		due = time.Now().Add(interval)
		wt = time.NewTimer(interval)
		defer wt.Stop()
		next = wt.C
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-end.C:
			return wr.b.fleet.broadcast(command{Op: "mark", At: time.Now().UnixNano()})
		case <-marks.C:
			if err := wr.b.fleet.broadcast(command{Op: "mark", At: time.Now().UnixNano()}); err != nil {
				return err
			}
		case <-next:
			if time.Now().After(stop) {
				continue
			}
			if err := wr.write(ctx); err != nil {
				return err
			}
			// A fixed schedule; a write late by more than one interval
			// does not make the next ones come in a burst.
			due = due.Add(interval)
			if now := time.Now(); due.Before(now) {
				due = now
			}
			wt.Reset(time.Until(due))
		}
	}
}
