package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The origin is the "database" every strategy rebuilds from: a loopback
// HTTP server in the parent process with a configurable latency. It
// records every call (key, start, end, caller pid, success) of the
// current phase, so the stampede factor and the origin concurrency are
// measured where the load lands, not reported by the strategies.

// Request headers of a load call.
const (
	hdrStrategy = "X-Bench-Strategy"
	hdrPhase    = "X-Bench-Phase"
	hdrPid      = "X-Bench-Pid"
)

// originEvent is one origin call.
type originEvent struct {
	Key   string `json:"key"`
	Start int64  `json:"start"` // unix ns
	End   int64  `json:"end"`   // unix ns
	Pid   int    `json:"pid"`
	OK    bool   `json:"ok"`
}

type origin struct {
	lat       latencyDist
	valueSize int
	srv       *http.Server
	url       string

	mu       sync.Mutex
	phase    string
	strategy string
	events   []originEvent
	inflight int
	peak     int
	stray    int // calls tagged with another phase (a late loader of an earlier phase)
	nextID   uint64
	failFrom time.Time // the origin answers 503 to calls that start in [failFrom, failTo)
	failTo   time.Time
	stallKey string         // the first call for this key triggers onStall
	onStall  func(pid int)  // runs synchronously, before the call's latency
	first    map[string]int // key -> pid of its first caller in this phase

	// version is the data's current version (the hotkey scenario's writer
	// raises it before each write, as a write to the database would): a
	// value built by a call carries the version of when the call started.
	version atomic.Uint64
}

func startOrigin(lat latencyDist, valueSize int) (*origin, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("origin: %w", err)
	}
	o := &origin{lat: lat, valueSize: valueSize, first: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /load", o.load)
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	o.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	o.url = "http://" + ln.Addr().String()
	go func() { _ = o.srv.Serve(ln) }()
	return o, nil
}

func (o *origin) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := o.srv.Shutdown(ctx); err != nil {
		_ = o.srv.Close()
	}
}

// begin starts recording a phase.
func (o *origin) begin(phase, strategy string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.phase, o.strategy = phase, strategy
	o.events, o.inflight, o.peak, o.stray = nil, 0, 0, 0
	o.failFrom, o.failTo = time.Time{}, time.Time{}
	o.stallKey, o.onStall = "", nil
	o.first = map[string]int{}
	o.version.Store(0)
}

// setVersion makes the calls that start from now on build version v.
func (o *origin) setVersion(v uint64) { o.version.Store(v) }

// end stops recording and returns the phase's calls (complete ones).
func (o *origin) end() (events []originEvent, stray int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	events, stray = o.events, o.stray
	o.phase, o.events = "", nil
	o.stallKey, o.onStall = "", nil
	return events, stray
}

// setFailure makes calls that start within [from, to) fail.
func (o *origin) setFailure(from, to time.Time) {
	o.mu.Lock()
	o.failFrom, o.failTo = from, to
	o.mu.Unlock()
}

// armStall makes the first call for key run fn with the caller's pid.
func (o *origin) armStall(key string, fn func(pid int)) {
	o.mu.Lock()
	o.stallKey, o.onStall = key, fn
	o.mu.Unlock()
}

// calls returns the number of calls of the current phase so far.
func (o *origin) calls() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.events) + o.inflight
}

func (o *origin) load(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("k")
	pid, _ := strconv.Atoi(r.Header.Get(hdrPid))
	start := time.Now()
	o.mu.Lock()
	if r.Header.Get(hdrPhase) != o.phase || o.phase == "" || r.Header.Get(hdrStrategy) != o.strategy {
		o.stray++
		o.mu.Unlock()
		http.Error(w, "stray call: no such phase", http.StatusGone)
		return
	}
	fail := !start.Before(o.failFrom) && start.Before(o.failTo)
	var stall func(int)
	if _, seen := o.first[key]; !seen {
		o.first[key] = pid
		if key == o.stallKey {
			stall = o.onStall
		}
	}
	o.nextID++
	id := o.nextID
	ver := o.version.Load()
	o.inflight++
	o.peak = max(o.peak, o.inflight)
	phase := o.phase
	o.mu.Unlock()

	if stall != nil {
		stall(pid) // the caller is stopped before its answer comes
	}
	t := time.NewTimer(o.lat.sample())
	select {
	case <-t.C:
	case <-r.Context().Done():
		t.Stop()
	}
	end := time.Now()
	o.mu.Lock()
	o.inflight--
	if o.phase == phase {
		o.events = append(o.events, originEvent{Key: key, Start: start.UnixNano(), End: end.UnixNano(), Pid: pid, OK: !fail && r.Context().Err() == nil})
	}
	o.mu.Unlock()
	if fail {
		http.Error(w, "origin failing (failure scenario)", http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write(makeValue(id, start, end, ver, o.valueSize))
}

// A value is "hb|<call id>|<origin start ns>|<origin end ns>|<version>|"
// padded to the value size: whoever receives it knows which origin call
// built it, how long that call took, and which version of the data it
// holds. The hotkey scenario's writer writes values with call id 0 (no
// origin call) and start = end = the time it began the write.
func makeValue(id uint64, start, end time.Time, ver uint64, size int) []byte {
	b := fmt.Appendf(nil, "hb|%d|%d|%d|%d|", id, start.UnixNano(), end.UnixNano(), ver)
	if len(b) < size {
		b = append(b, bytes.Repeat([]byte{'.'}, size-len(b))...)
	}
	return b
}

type valueMeta struct {
	ID         uint64 // the origin call that built it; 0: the hotkey writer
	Start, End int64  // unix ns
	Ver        uint64 // the data's version
}

var errBadValue = errors.New("value not built by this benchmark's origin")

// parseValue reads a value's fields without allocating: the hotkey
// scenario parses every read, at up to memory speed.
func parseValue(b []byte) (valueMeta, error) {
	rest, ok := bytes.CutPrefix(b, []byte("hb|"))
	if !ok {
		return valueMeta{}, errBadValue
	}
	var f [4]uint64
	for i := range f {
		j := bytes.IndexByte(rest, '|')
		if j < 0 {
			return valueMeta{}, errBadValue
		}
		n, ok := parseDigits(rest[:j])
		if !ok || (i == 1 || i == 2) && n > math.MaxInt64 {
			return valueMeta{}, errBadValue
		}
		f[i], rest = n, rest[j+1:]
	}
	return valueMeta{ID: f[0], Start: int64(f[1]), End: int64(f[2]), Ver: f[3]}, nil
}

// parseDigits parses a non-empty decimal uint64.
func parseDigits(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}
