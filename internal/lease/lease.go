// Package lease is the lifecycle that every herd lease shares: the Redis
// Locker's, the Redlock's and each lock backend's under lock/. A lease is
// valid until a local deadline; Lost closes once, when the deadline passes
// without a renewal or the lease is found lost; Release ends the holding;
// KeepAlive starts one watchdog that renews the lease until an absolute
// cap. What differs between backends (how a renewal or a release reaches
// the server, and what a server can do at the cap) is passed in: State
// holds the rest, so that a rule of the lifecycle is written once.
//
// The package has no dependency on herd: the herd package itself uses it.
package lease

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// State is one lease's lifecycle. Its zero value is not usable: call
// [State.Init] before sharing it. Its methods are safe for concurrent use.
//
// The lease type that holds a State may guard fields of its own with the
// State's mutex ([State.Lock]); the methods whose names end in Locked are
// for callers that hold it.
type State struct {
	// Set by Init, then read-only.
	now      func() time.Time
	acquired time.Time
	lost     chan struct{}

	mu       sync.Mutex
	length   time.Duration // what a renewal asks for: the acquire's length, or a later one
	deadline time.Time     // the local end of validity; Lost closes then
	expiry   *time.Timer   // fires expire at deadline
	isLost   bool          // Lost is closed
	released bool          // Release (or Finish) was called
	freed    bool          // a release succeeded: later ones need not reach the server
	watch    *watchdog     // the KeepAlive goroutine, while it runs
	capAt    time.Time     // KeepAlive's cap on the whole holding (zero: none); no renewal passes it
}

type watchdog struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Init sets the lease up: valid until deadline, acquired (the acquire's
// start) at acquired, renewed for length. expire runs, in a goroutine of
// its own, when the deadline passes without a renewal: it usually calls
// [State.Lose] and then whatever else the backend does for a lost lease.
// now is the clock deadlines are read on (time.Now when nil).
func (s *State) Init(length time.Duration, acquired, deadline time.Time, now func() time.Time, expire func()) {
	if now == nil {
		now = time.Now
	}
	s.now, s.acquired, s.lost = now, acquired, make(chan struct{})
	s.mu.Lock() // the timer may fire before the assignment is done
	defer s.mu.Unlock()
	s.length, s.deadline = length, deadline
	s.expiry = time.AfterFunc(deadline.Sub(now()), expire)
}

// Lock locks the State's mutex, which the lease type may use for fields
// of its own.
func (s *State) Lock() { s.mu.Lock() }

// Unlock unlocks the State's mutex.
func (s *State) Unlock() { s.mu.Unlock() }

// Now reads the lease's clock.
func (s *State) Now() time.Time { return s.now() }

// Acquired returns the acquire's start, from which KeepAlive's cap counts.
func (s *State) Acquired() time.Time { return s.acquired }

// Lost returns the channel closed when the lease is known lost.
func (s *State) Lost() <-chan struct{} { return s.lost }

// Deadline returns the local end of the lease's validity.
func (s *State) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// DeadlineLocked is Deadline for a caller holding the lock.
func (s *State) DeadlineLocked() time.Time { return s.deadline }

// Length returns what a renewal asks for.
func (s *State) Length() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.length
}

// Gone reports whether the lease is lost or released: nothing may renew
// it then.
func (s *State) Gone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.GoneLocked()
}

// GoneLocked is Gone for a caller holding the lock.
func (s *State) GoneLocked() bool { return s.isLost || s.released }

// Lose closes Lost, once, and stops the expiry timer. It reports whether
// this call closed it with the lease not released: the caller then owns
// the loss (a signal, a log line, freeing the lock early).
func (s *State) Lose() (first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.LoseLocked()
}

// LoseLocked is Lose for a caller holding the lock.
func (s *State) LoseLocked() (first bool) {
	if s.isLost {
		return false
	}
	s.isLost = true
	close(s.lost)
	s.stopExpiry()
	return !s.released
}

// Renewed moves the deadline to next after a successful renewal, and
// reports whether it did: not when the lease was lost or released while
// the renewal ran (the caller reports the lease lost then).
func (s *State) Renewed(next time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.RenewedLocked(next, 0)
}

// RenewedLocked is Renewed for a caller holding the lock; a length above
// zero also becomes what later renewals ask for. A deadline past
// KeepAlive's cap is the cap.
func (s *State) RenewedLocked(next time.Time, length time.Duration) bool {
	if s.GoneLocked() {
		return false
	}
	if length > 0 {
		s.length = length
	}
	if !s.capAt.IsZero() && next.After(s.capAt) {
		next = s.capAt
	}
	s.deadline = next
	s.expiry.Reset(next.Sub(s.now()))
	return true
}

// Release marks the lease released and stops its expiry timer; it reports
// whether an earlier release succeeded (freed: the key may belong to
// someone else now, so the caller must not touch it), whether the lease
// was lost, and whether this is the first call that released it. The
// caller then stops the watchdog ([State.StopWatchdog]) and releases on
// its server.
func (s *State) Release() (freed, lost, first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	first = !s.released
	s.released = true
	s.stopExpiry()
	return s.freed, s.isLost, first
}

// Released reports whether Release (or Finish) was called.
func (s *State) Released() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.released
}

// Freed records a successful release, or a server-side end of the
// holding that leaves nothing to release.
func (s *State) Freed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.freed = true
}

// Finish ends the lease locally, without its server: the watchdog stops
// and the lease counts as released.
func (s *State) Finish() {
	s.StopWatchdog()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = true
	s.stopExpiry()
}

func (s *State) stopExpiry() {
	if s.expiry != nil {
		s.expiry.Stop()
	}
}

// StopExpiry disarms the expiry timer and nothing else, as if the
// holder's process had died: tests use it to leave a lease behind in its
// server with no local bookkeeping running.
func (s *State) StopExpiry() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopExpiry()
}

// KeepAlive starts the watchdog: run(ctx, capAt) in a goroutine of its
// own, with ctx derived from parent and ended by [State.StopWatchdog].
// capAt is maxHold after the acquire (zero when maxHold ≤ 0: no cap); a
// cap before the deadline becomes the deadline at once, so that Lost
// closes at the cap even before any renewal. It reports whether it
// started one: not when the lease is gone or a watchdog already runs.
func (s *State) KeepAlive(parent context.Context, maxHold time.Duration, run func(ctx context.Context, capAt time.Time)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.GoneLocked() || s.watch != nil {
		return false
	}
	ctx, cancel := context.WithCancel(parent)
	w := &watchdog{cancel: cancel, done: make(chan struct{})}
	s.watch = w
	var capAt time.Time
	if maxHold > 0 {
		capAt = s.acquired.Add(maxHold)
		s.capAt = capAt
		if capAt.Before(s.deadline) {
			s.deadline = capAt
			s.expiry.Reset(capAt.Sub(s.now()))
		}
	}
	go func() {
		defer close(w.done)
		run(ctx, capAt)
	}()
	return true
}

// Clamp returns d, or less so that a renewal for it ends at KeepAlive's
// cap, and whether anything at least least long is left before the cap:
// an Extend after KeepAlive is held to the cap as the watchdog's renewals
// are.
func (s *State) Clamp(d, least time.Duration) (time.Duration, bool) {
	s.mu.Lock()
	capAt := s.capAt
	s.mu.Unlock()
	if capAt.IsZero() {
		return d, true
	}
	d = min(d, capAt.Sub(s.now()))
	return d, d >= least
}

// Cap returns KeepAlive's cap on the holding, or the zero time.
func (s *State) Cap() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.capAt
}

// StopWatchdog ends the KeepAlive goroutine, if one runs, and waits for
// it.
func (s *State) StopWatchdog() {
	s.mu.Lock()
	w := s.watch
	s.watch = nil
	s.mu.Unlock()
	if w != nil {
		w.cancel()
		<-w.done
	}
}

// Renewal says how a watchdog renews its lease.
type Renewal struct {
	// Extend renews the lease for d. Its ctx ends at the lease's
	// deadline, or when the watchdog stops.
	Extend func(ctx context.Context, d time.Duration) error
	// Final reports whether an error of Extend ends the loop (the lease
	// is lost, or its locker closed); any other error is retried, after
	// a jittered twentieth of the lease (1ms to 50ms), until the
	// deadline has passed.
	Final func(err error) bool
	// Min is the shortest renewal worth sending (1ms when zero): with
	// less left before the cap, the loop ends and the lease runs out at
	// the cap by itself.
	Min time.Duration
	// Uncut is for a server that cannot shorten a lease: renewals are
	// sent for the full length, Extend keeps the deadline at or before
	// the cap, and the loop ends once the deadline has reached it.
	// Otherwise the last renewal before the cap is shortened to end
	// there.
	Uncut bool
	// Prompt sends the first renewal at once, shortened to the cap, when
	// the lease as acquired would outlive the cap.
	Prompt bool
	// Valid, when set, is the end of validity that failing renewals are
	// retried until, instead of the State's deadline (a backend whose
	// validity is less than the lease's own end).
	Valid func() time.Time
}

// Renew is the watchdog loop: it renews the lease at a random point
// between a third and a half of its length, until ctx ends, Lost closes,
// the cap is reached, an Extend error is final or the deadline passes
// with renewals failing. It reports whether it ended with the shortened
// renewal that ends the lease at the cap on its server.
func (s *State) Renew(ctx context.Context, capAt time.Time, r Renewal) (capped bool) {
	least := r.Min
	if least <= 0 {
		least = time.Millisecond
	}
	valid := r.Valid
	if valid == nil {
		valid = s.Deadline
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	wait := func(d time.Duration) bool {
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return false
		case <-s.lost:
			return false
		case <-timer.C:
			return true
		}
	}
	for first := true; ; first = false {
		length := s.Length()
		interval := length/3 + rand.N(length/6+1)
		if first && r.Prompt && !capAt.IsZero() && capAt.Before(s.acquired.Add(length)) {
			interval = 0
		}
		if !wait(interval) {
			return false
		}
		ext := length
		if !capAt.IsZero() && !r.Uncut {
			ext = min(ext, capAt.Sub(s.now()))
			if ext < least {
				return false // at the cap: the lease runs out by itself
			}
		}
		retry := min(max(length/20, time.Millisecond), 50*time.Millisecond)
		for {
			rctx, cancel := context.WithDeadline(ctx, valid())
			err := r.Extend(rctx, ext)
			cancel()
			if err == nil {
				break
			}
			if (r.Final != nil && r.Final(err)) || ctx.Err() != nil || !s.now().Before(valid()) {
				return false
			}
			if !wait(Jitter(retry)) {
				return false
			}
		}
		switch {
		case r.Uncut:
			if !capAt.IsZero() && !s.Deadline().Before(capAt) {
				return false // renewed up to the cap: the expiry ends it there
			}
		case ext < length:
			return true // the shortened, final renewal
		}
	}
}

// Jitter returns d scaled by a random factor in [0.75, 1.25).
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d*3/4 + rand.N(d/2+1)
}

// Drift is the allowance for the difference between the local clock and
// the server's: 1% of the lease plus 2ms. A lease's deadline is its
// length, less Drift, after the request that granted or renewed it was
// sent.
func Drift(length time.Duration) time.Duration {
	return length/100 + 2*time.Millisecond
}
