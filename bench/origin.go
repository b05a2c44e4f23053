package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

func parseValue(b []byte) (valueMeta, error) {
	parts := bytes.SplitN(b, []byte{'|'}, 6)
	if len(parts) != 6 || string(parts[0]) != "hb" {
		return valueMeta{}, errBadValue
	}
	id, err1 := strconv.ParseUint(string(parts[1]), 10, 64)
	s, err2 := strconv.ParseInt(string(parts[2]), 10, 64)
	e, err3 := strconv.ParseInt(string(parts[3]), 10, 64)
	v, err4 := strconv.ParseUint(string(parts[4]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return valueMeta{}, errBadValue
	}
	return valueMeta{ID: id, Start: s, End: e, Ver: v}, nil
}
