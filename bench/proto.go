package main

import (
	"github.com/herdkit/herd"
)

// The parent drives each worker process over its stdin and reads its
// replies on its stdout, one JSON object per line. Every command gets one
// reply; "error" replies abort the run.

// Environment of a worker process.
const (
	roleEnv     = "HERD_BENCH_ROLE" // "worker" makes the program a worker
	roleWorker  = "worker"
	deadlineEnv = "HERD_BENCH_DEADLINE" // unix ns after which a worker exits by itself
	indexEnv    = "HERD_BENCH_INDEX"    // the worker's index, 0..P-1
)

type command struct {
	Op string `json:"op"` // setup, wave, load, teardown; ack, mark (no reply)

	// setup
	Phase    string    `json:"phase,omitempty"`
	Strategy string    `json:"strategy,omitempty"`
	Prefix   string    `json:"prefix,omitempty"`
	Redis    redisSpec `json:"redis"`
	Origin   string    `json:"origin,omitempty"`
	Callers  int       `json:"callers,omitempty"`
	TTL      int64     `json:"ttl,omitempty"`       // ns
	StaleFor int64     `json:"stale_for,omitempty"` // ns
	Timeout  int64     `json:"timeout,omitempty"`   // ns, per request
	Think    int64     `json:"think,omitempty"`     // ns
	Keys     int       `json:"keys,omitempty"`
	Zipf     float64   `json:"zipf,omitempty"`
	Seed     uint64    `json:"seed,omitempty"`

	// wave: every caller gets Key at Start
	Key   string `json:"key,omitempty"`
	Start int64  `json:"start,omitempty"` // unix ns: the barrier

	// load: closed loop from Start to Stop; calls that start before
	// MeasureFrom are not recorded; Bounds split the recorded calls into
	// segments [Bounds[i], Bounds[i+1]).
	Stop        int64   `json:"stop,omitempty"`
	MeasureFrom int64   `json:"measure_from,omitempty"`
	Bounds      []int64 `json:"bounds,omitempty"`
	KeyBase     string  `json:"key_base,omitempty"`
	// Hot makes the load the hotkey scenario's: every caller reads Key.
	Hot bool `json:"hot,omitempty"`

	// ack: the hotkey writer's write of Version returned at At (unix ns);
	// mark: every write that returned before At was announced. The worker
	// handles both as they arrive, even during a load, and answers
	// neither.
	Version uint64 `json:"version,omitempty"`
	At      int64  `json:"at,omitempty"`
}

type reply struct {
	Op      string      `json:"op"` // ready, samples, stats, error
	Worker  int         `json:"worker"`
	Pid     int         `json:"pid"`
	Error   string      `json:"error,omitempty"`
	Samples *sampleSet  `json:"samples,omitempty"`
	Stats   *workerStat `json:"stats,omitempty"`
}

// sampleSet is what a worker measured in one wave or load run.
type sampleSet struct {
	Calls     int            `json:"calls"`    // every call, recorded or not (warm-up)
	Lat       []int64        `json:"lat"`      // µs, recorded calls that succeeded
	Added     []int64        `json:"added"`    // µs, followers' latency beyond the rebuild they waited for
	Origin    int            `json:"origin"`   // calls whose own loader's origin call answered them
	Follower  int            `json:"follower"` // calls that waited for a rebuild done by another call
	Hit       int            `json:"hit"`      // calls served a value built before they started
	Stale     int            `json:"stale"`    // of those, herd's stale-while-revalidate
	Errors    int            `json:"errors"`   // calls that returned an error
	ErrSample string         `json:"err_sample,omitempty"`
	Outcomes  map[string]int `json:"outcomes,omitempty"` // herd's Outcome per call
	LateMax   int64          `json:"late_max"`           // ns the barrier was released late, at most
	Hiccup    int64          `json:"hiccup"`             // ns, the longest pause of the worker process
	Seg       []segment      `json:"seg,omitempty"`
	Hot       *hotSamples    `json:"hot,omitempty"` // the hotkey scenario
}

type segment struct {
	Calls  int `json:"calls"`
	Errors int `json:"errors"`
	Stale  int `json:"stale"`
}

// workerStat is a worker's count for a whole phase.
type workerStat struct {
	RedisCmds   int64            `json:"redis_cmds"`
	RedisErrors int64            `json:"redis_errors"`
	Canceled    int64            `json:"redis_canceled"`
	RedisErrs   map[string]int64 `json:"redis_errs,omitempty"` // count per error text
	Herd        *herd.Stats      `json:"herd,omitempty"`
}

func (s *sampleSet) merge(o *sampleSet) {
	s.Calls += o.Calls
	s.Lat = append(s.Lat, o.Lat...)
	s.Added = append(s.Added, o.Added...)
	s.Origin += o.Origin
	s.Follower += o.Follower
	s.Hit += o.Hit
	s.Stale += o.Stale
	s.Errors += o.Errors
	if s.ErrSample == "" {
		s.ErrSample = o.ErrSample
	}
	for k, v := range o.Outcomes {
		if s.Outcomes == nil {
			s.Outcomes = map[string]int{}
		}
		s.Outcomes[k] += v
	}
	s.LateMax = max(s.LateMax, o.LateMax)
	s.Hiccup = max(s.Hiccup, o.Hiccup)
	for i, g := range o.Seg {
		if i >= len(s.Seg) {
			s.Seg = append(s.Seg, segment{})
		}
		s.Seg[i].Calls += g.Calls
		s.Seg[i].Errors += g.Errors
		s.Seg[i].Stale += g.Stale
	}
	if o.Hot != nil {
		if s.Hot == nil {
			s.Hot = &hotSamples{}
		}
		s.Hot.merge(o.Hot)
	}
}
