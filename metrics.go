package herd

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// Observer receives herd's signals: the lock-health signals an operator
// needs to tell whether leases, waits and rebuilds are healthy. Every
// field is optional; a nil Observer, or a nil field, costs nothing (no
// call, no allocation). Functions are called synchronously on herd's hot
// paths, concurrently: they must be fast and safe for concurrent use.
//
// class is [Options.KeyClass] of the key (or [LockerOptions.KeyClass]),
// or "" when none is configured: herd never passes a raw key, so labels
// stay bounded. The adapter in github.com/herdkit/herd/prometheus turns
// these into Prometheus metrics.
type Observer struct {
	// Lookup reports how each Get, Fetch or Begin call was served, once
	// per call (a Begin that waited on a failed rebuild and calls again
	// looks up twice). Of the callers of one rebuild in a process, one
	// reports OutcomeLeader and the others OutcomeFollower (for Get, the
	// callers that shared the flight; for Begin, those that waited on the
	// Fill, whatever its end), so that leaders match loads; [WithOutcome]
	// still gives every Get caller the flight's outcome. A Begin that
	// finds a pass mark ([Fill.Pass]) reports OutcomePass.
	Lookup func(class string, outcome Outcome)

	// Load reports one run of a loader (or one Fill, however it ended
	// but by Handover): its duration, its error (nil on success, possibly
	// ErrNotFound, a *PanicError, or an error wrapping [ErrNotShared] for
	// a value that was not for sharing, which is no failure) and whether
	// it ran under the key's lease (false: fail-open or fallback).
	Load func(class string, d time.Duration, err error, leased bool)

	// LoadRetry reports a follower that, its leader's load having failed,
	// looks again to take the key's lease and load, or to follow whoever
	// took it ([Options.RetryFailedLoad], or a [NoShare] error): once per
	// retried flight, in each process whose callers waited (as
	// Stats.LoadRetries counts). The retry's own load, if this process
	// runs it, is reported to Load like any other.
	LoadRetry func(class string)

	// Lease reports lease events: acquired (each lease won), contended
	// (a call found the lease held and waits, once per wait), taken over
	// (a waiting follower won a lease its leader released or let lapse),
	// lost, extended, extend failed.
	Lease func(class string, ev LeaseEvent)

	// Wait reports a follower's wait for another process's rebuild, and
	// how it ended.
	Wait func(class string, d time.Duration, end WaitEnd)

	// Commit reports a leader's write: stored, fenced (a newer lease, Set
	// or Invalidate came first: the duplicate-rebuild signal) or failed.
	Commit func(class string, result CommitResult)

	// Circuit reports the Redis circuit breaker opening (true) and
	// closing (false).
	Circuit func(open bool)

	// FailOpen reports a call served by a local load because Redis was
	// unreachable or the circuit was open.
	FailOpen func(class string)

	// Corrupt reports bytes at a value key that are not an intact
	// envelope (read as a miss).
	Corrupt func(class string)

	// Refresh reports background refreshes: started, dropped (the pool
	// was full), failed (stale-if-error) and skipped (another process
	// refreshed first, or refreshes are backing off).
	Refresh func(class string, ev RefreshEvent)

	// StartLoad, StartWait and StartCommit, when set, bracket a leader's
	// or a fail-open caller's loader run, a follower's wait for another
	// process's rebuild, and a leader's commit, for tracing. Each is
	// called as the step begins, with the context of the Get, Fetch or
	// Begin that started the flight (for its values only: it may have
	// ended since; GetMany's flights and background refreshes get
	// context.Background()) and the step's [Step], and returns the
	// function herd calls once when the step ends, with what Load, Wait
	// or Commit get then (nil: none). The context StartLoad returns
	// lends its values, never its deadline or cancellation, to the
	// loader's context, so spans the loader starts nest in the one
	// StartLoad started; nil lends nothing. The loads of GetMany's batch
	// loaders and of Begin's Fills are not bracketed (Load reports them
	// as usual); their commits are. The adapter in
	// github.com/herdkit/herd/otel turns these into spans.
	StartLoad   func(ctx context.Context, st Step) (context.Context, func(err error))
	StartWait   func(ctx context.Context, st Step) func(end WaitEnd)
	StartCommit func(ctx context.Context, st Step) func(r CommitResult)
}

// Step describes a step of a rebuild to [Observer.StartLoad],
// [Observer.StartWait] and [Observer.StartCommit].
type Step struct {
	// Class is the key's class, as the other fields of Observer get it.
	Class string

	// Leased is false for a load without the key's lease (fail-open, or
	// a fallback after the wait budget); true for the other steps.
	Leased bool

	// Rebuild names the rebuild: the key's hash tag (the one in its
	// Redis key names, never the raw key) and the leader's fencing
	// token, the same in every process. A wait's Rebuild is that of the
	// leader it waits for, so an adapter can tie the wait to that load;
	// it is "" for a load without a lease, and for a wait when Redis did
	// not name the holder. It is unbounded: never a metric label.
	Rebuild string
}

// LeaseEvent is a lease event reported to [Observer.Lease].
type LeaseEvent uint8

const (
	LeaseAcquired     LeaseEvent = iota // a lease was won
	LeaseContended                      // a call found the lease held and waits
	LeaseTakenOver                      // a waiting follower won the lease
	LeaseLost                           // a held lease is known lost
	LeaseExtended                       // a renewal succeeded
	LeaseExtendFailed                   // a renewal failed (Redis error, or the lease is gone)
)

// String returns the event's metric label, such as "taken_over".
func (e LeaseEvent) String() string {
	return [...]string{"acquired", "contended", "taken_over", "lost", "extended", "extend_failed"}[e]
}

// WaitEnd is how a follower's wait ended, reported to [Observer.Wait].
type WaitEnd uint8

const (
	WaitNotified  WaitEnd = iota // woken by the leader's message
	WaitPolled                   // found the value by polling
	WaitTakeover                 // took the lease over and rebuilt
	WaitTimeout                  // spent its budget; Fallback applied
	WaitCancelled                // the caller left, or the Cache closed
)

// String returns the wait end's metric label, such as "notified".
func (e WaitEnd) String() string {
	return [...]string{"notified", "polled", "takeover", "timeout", "cancelled"}[e]
}

// CommitResult is the result of a leader's write, reported to
// [Observer.Commit].
type CommitResult uint8

const (
	CommitStored       CommitResult = iota // the value was written
	CommitFenced                           // not written: a newer lease, Set or Invalidate came first
	CommitError                            // not written: Redis failed
	CommitUnreplicated                     // written on the master, not confirmed on its replicas in time: a failover may lose it
)

// String returns the result's metric label, such as "fenced".
func (r CommitResult) String() string {
	return [...]string{"stored", "fenced", "error", "unreplicated"}[r]
}

// RefreshEvent is a background refresh event, reported to
// [Observer.Refresh].
type RefreshEvent uint8

const (
	RefreshStarted RefreshEvent = iota // this process won the lease and refreshes
	RefreshDropped                     // the pool of MaxRefreshes was full
	RefreshFailed                      // the loader failed; the stale value stays (stale-if-error)
	RefreshSkipped                     // refreshed elsewhere already, or refreshes back off
)

// String returns the event's metric label, such as "dropped".
func (e RefreshEvent) String() string {
	return [...]string{"started", "dropped", "failed", "skipped"}[e]
}

// signals is how the Cache and the Locker emit: the observer, the class
// mapping and a rate-limited logger.
type signals struct {
	obs      *Observer
	classOf  func(key string) string // nil: ""
	logger   *slog.Logger
	limitMu  sync.Mutex
	lastLog  map[string]time.Time
	dropped  map[string]int
	logEvery time.Duration
}

func newSignals(obs *Observer, classOf func(string) string, logger *slog.Logger) *signals {
	return &signals{obs: obs, classOf: classOf, logger: logger,
		lastLog: make(map[string]time.Time), dropped: make(map[string]int), logEvery: time.Second}
}

func (s *signals) class(key string) string {
	if s.classOf == nil {
		return ""
	}
	return s.classOf(key)
}

func (s *signals) lease(key string, ev LeaseEvent) {
	if s.obs != nil && s.obs.Lease != nil {
		s.obs.Lease(s.class(key), ev)
	}
}

// logRare logs a rare event at most once per second per message; the
// next log line of that message says how many were suppressed, so a
// failing Redis cannot flood the logs.
func (s *signals) logRare(level slog.Level, msg string, args ...any) {
	if s.logger == nil {
		return
	}
	now := time.Now()
	s.limitMu.Lock()
	if last, ok := s.lastLog[msg]; ok && now.Sub(last) < s.logEvery {
		s.dropped[msg]++
		s.limitMu.Unlock()
		return
	}
	s.lastLog[msg] = now
	n := s.dropped[msg]
	delete(s.dropped, msg)
	if len(s.lastLog) > 1024 { // messages are constants; this only bounds a misuse
		clear(s.lastLog)
	}
	s.limitMu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	s.logger.Log(context.Background(), level, msg, args...)
}

// The emitters: each is a nil check when no Observer is set.

func (s *signals) lookup(key string, o Outcome) {
	if s.obs != nil && s.obs.Lookup != nil {
		s.obs.Lookup(s.class(key), o)
	}
}

func (s *signals) load(key string, d time.Duration, err error, leased bool) {
	if s.obs != nil && s.obs.Load != nil {
		s.obs.Load(s.class(key), d, err, leased)
	}
}

func (s *signals) loadRetry(key string) {
	if s.obs != nil && s.obs.LoadRetry != nil {
		s.obs.LoadRetry(s.class(key))
	}
}

func (s *signals) wait(key string, d time.Duration, end WaitEnd) {
	if s.obs != nil && s.obs.Wait != nil {
		s.obs.Wait(s.class(key), d, end)
	}
}

func (s *signals) commit(key string, r CommitResult) {
	if s.obs != nil && s.obs.Commit != nil {
		s.obs.Commit(s.class(key), r)
	}
}

// rebuildName is [Step.Rebuild] for the rebuild of keys under fence.
func rebuildName(keys keyFamily, fence string) string {
	if fence == "" {
		return ""
	}
	return keys.Hash() + ":" + fence
}

// tracesLoads reports whether StartLoad is set: callers check it before
// they build a Step.
func (s *signals) tracesLoads() bool { return s.obs != nil && s.obs.StartLoad != nil }

// startLoad calls StartLoad for f's load (leased under lease, or
// without one when lease is nil). It returns nil, nil when StartLoad is
// unset. values, if not nil, is what the loader's context takes values
// from.
func (s *signals) startLoad(f *flight, lease *Lease) (values context.Context, end func(error)) {
	if !s.tracesLoads() {
		return nil, nil
	}
	st := Step{Class: s.class(f.key), Leased: lease != nil}
	if lease != nil {
		st.Rebuild = rebuildName(f.keys, strconv.FormatUint(lease.token, 10))
	}
	return s.obs.StartLoad(f.origin(), st)
}

// startWait calls StartWait for f's wait; nil when it is unset.
func (s *signals) startWait(f *flight) func(WaitEnd) {
	if s.obs == nil || s.obs.StartWait == nil {
		return nil
	}
	return s.obs.StartWait(f.origin(), Step{Class: s.class(f.key), Leased: true, Rebuild: rebuildName(f.keys, f.awaited)})
}

// startCommit calls StartCommit for f's commit under lease; nil when it
// is unset.
func (s *signals) startCommit(f *flight, lease *Lease) func(CommitResult) {
	if s.obs == nil || s.obs.StartCommit == nil {
		return nil
	}
	return s.obs.StartCommit(f.origin(), Step{Class: s.class(f.key), Leased: true,
		Rebuild: rebuildName(f.keys, strconv.FormatUint(lease.token, 10))})
}

func (s *signals) circuit(open bool) {
	if s.obs != nil && s.obs.Circuit != nil {
		s.obs.Circuit(open)
	}
}

func (s *signals) failOpen(key string) {
	if s.obs != nil && s.obs.FailOpen != nil {
		s.obs.FailOpen(s.class(key))
	}
}

func (s *signals) corrupt(key string) {
	if s.obs != nil && s.obs.Corrupt != nil {
		s.obs.Corrupt(s.class(key))
	}
}

func (s *signals) refresh(key string, ev RefreshEvent) {
	if s.obs != nil && s.obs.Refresh != nil {
		s.obs.Refresh(s.class(key), ev)
	}
}
