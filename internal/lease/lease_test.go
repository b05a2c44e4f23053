package lease

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

var errLost = errors.New("lost")

// recorder is a fake server: it records the renewals asked for and fails
// them as told.
type recorder struct {
	mu    sync.Mutex
	asked []time.Duration
	fail  func(n int) error
	got   chan struct{}
}

func newRecorder(fail func(n int) error) *recorder {
	return &recorder{fail: fail, got: make(chan struct{}, 64)}
}

func (r *recorder) extend(_ context.Context, d time.Duration) error {
	r.mu.Lock()
	r.asked = append(r.asked, d)
	n := len(r.asked)
	r.mu.Unlock()
	r.got <- struct{}{}
	if r.fail != nil {
		return r.fail(n)
	}
	return nil
}

func (r *recorder) renewals() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.asked...)
}

// newState returns a State valid for valid, renewed for length, whose
// expiry closes Lost.
func newState(length, valid time.Duration) *State {
	s := &State{}
	now := time.Now()
	s.Init(length, now, now.Add(valid), nil, func() { s.Lose() })
	return s
}

// renew runs Renew in a goroutine; the channel it returns carries its
// result.
func renew(ctx context.Context, s *State, capAt time.Time, r Renewal) chan bool {
	done := make(chan bool, 1)
	go func() { done <- s.Renew(ctx, capAt, r) }()
	return done
}

func returned(t *testing.T, done chan bool, what string) bool {
	t.Helper()
	select {
	case capped := <-done:
		return capped
	case <-time.After(10 * time.Second):
		t.Fatalf("Renew did not return after %s", what)
		return false
	}
}

func final(err error) bool { return errors.Is(err, errLost) }

func TestRenewAsksForTheFullLengthUntilStopped(t *testing.T) {
	t.Parallel()
	const length = 300 * time.Millisecond
	s := newState(length, time.Hour)
	r := newRecorder(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := renew(ctx, s, time.Time{}, Renewal{Extend: r.extend, Final: final})
	<-r.got
	<-r.got
	cancel()
	if returned(t, done, "ctx ended") {
		t.Error("Renew reported a capped renewal with no cap")
	}
	for _, d := range r.renewals() {
		if d != length {
			t.Errorf("renewal for %v, want the lease's %v", d, length)
		}
	}
}

func TestRenewShortensTheLastRenewalToTheCap(t *testing.T) {
	t.Parallel()
	const length = 300 * time.Millisecond
	s := newState(length, time.Hour)
	r := newRecorder(nil)
	done := renew(context.Background(), s, time.Now().Add(length*3/4), Renewal{Extend: r.extend, Final: final})
	if !returned(t, done, "the cap") {
		t.Error("Renew did not report its capped, final renewal")
	}
	if got := r.renewals(); len(got) != 1 || got[0] >= length {
		t.Fatalf("renewals %v, want one shorter than %v", got, length)
	}
}

func TestRenewPromptShortensAtOnceWhenTheLeaseOutlivesTheCap(t *testing.T) {
	t.Parallel()
	const length = time.Hour // the first regular renewal would come after 20 minutes
	s := newState(length, length)
	r := newRecorder(nil)
	done := renew(context.Background(), s, time.Now().Add(time.Minute), Renewal{Extend: r.extend, Final: final, Prompt: true})
	if !returned(t, done, "a prompt capped renewal") {
		t.Error("Renew did not report its capped renewal")
	}
	if got := r.renewals(); len(got) != 1 || got[0] > time.Minute {
		t.Fatalf("renewals %v, want one of at most the minute to the cap", got)
	}
}

func TestRenewSendsNothingShorterThanMin(t *testing.T) {
	t.Parallel()
	const length = 300 * time.Millisecond
	s := newState(length, time.Hour)
	r := newRecorder(nil)
	// The cap comes before the first renewal is due: less than Min is
	// left then, so the lease runs out at the cap by itself.
	done := renew(context.Background(), s, time.Now().Add(length/4), Renewal{Extend: r.extend, Final: final, Min: length})
	if returned(t, done, "the cap") {
		t.Error("Renew reported a capped renewal it did not send")
	}
	if got := r.renewals(); len(got) != 0 {
		t.Fatalf("renewals %v, want none below Min", got)
	}
}

func TestRenewUncutSendsFullRenewalsUntilTheDeadlineReachesTheCap(t *testing.T) {
	t.Parallel()
	const length = 300 * time.Millisecond
	s := newState(length, length)
	capAt := time.Now().Add(length)
	r := newRecorder(nil)
	extend := func(ctx context.Context, d time.Duration) error {
		if err := r.extend(ctx, d); err != nil {
			return err
		}
		end := time.Now().Add(d)
		if end.After(capAt) {
			end = capAt // what an uncut backend's extend does
		}
		s.Renewed(end)
		return nil
	}
	done := renew(context.Background(), s, capAt, Renewal{Extend: extend, Final: final, Uncut: true})
	if returned(t, done, "the deadline reached the cap") {
		t.Error("an uncut Renew reported a shortened renewal")
	}
	got := r.renewals()
	if len(got) == 0 {
		t.Fatal("no renewal before the cap")
	}
	for _, d := range got {
		if d != length {
			t.Errorf("renewal for %v, want the full %v", d, length)
		}
	}
	if !s.Deadline().Equal(capAt) {
		t.Errorf("deadline %v, want the cap %v", s.Deadline(), capAt)
	}
}

func TestRenewEndsOnLossAndRetriesOtherErrorsWhileValid(t *testing.T) {
	t.Parallel()
	const length = 300 * time.Millisecond
	t.Run("Lost closed", func(t *testing.T) {
		t.Parallel()
		s := newState(length, time.Hour)
		r := newRecorder(nil)
		done := renew(context.Background(), s, time.Time{}, Renewal{Extend: r.extend, Final: final})
		<-r.got
		s.Lose()
		returned(t, done, "Lost closed")
	})
	t.Run("final error", func(t *testing.T) {
		t.Parallel()
		s := newState(length, time.Hour)
		r := newRecorder(func(int) error { return errLost })
		done := renew(context.Background(), s, time.Time{}, Renewal{Extend: r.extend, Final: final})
		returned(t, done, "a final error")
		if n := len(r.renewals()); n != 1 {
			t.Errorf("%d renewals after a final error, want 1", n)
		}
	})
	t.Run("transient error retried", func(t *testing.T) {
		t.Parallel()
		s := newState(length, time.Hour)
		r := newRecorder(func(n int) error {
			if n < 3 {
				return errors.New("connection reset")
			}
			return nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := renew(ctx, s, time.Time{}, Renewal{Extend: r.extend, Final: final})
		for range 4 {
			<-r.got
		}
		cancel()
		returned(t, done, "ctx ended")
	})
	t.Run("error past the deadline", func(t *testing.T) {
		t.Parallel()
		// The deadline passes before the first renewal is due; nothing
		// closes Lost, so only the deadline can end the retries.
		s := &State{}
		now := time.Now()
		s.Init(length, now, now.Add(time.Millisecond), nil, func() {})
		r := newRecorder(func(int) error { return errors.New("connection reset") })
		done := renew(context.Background(), s, time.Time{}, Renewal{Extend: r.extend, Final: final})
		returned(t, done, "the deadline passed")
		if n := len(r.renewals()); n != 1 {
			t.Errorf("%d renewals past the deadline, want 1", n)
		}
	})
	t.Run("error past Valid", func(t *testing.T) {
		t.Parallel()
		s := newState(length, time.Hour)
		r := newRecorder(func(int) error { return errors.New("connection reset") })
		past := func() time.Time { return time.Now().Add(-time.Millisecond) }
		done := renew(context.Background(), s, time.Time{}, Renewal{Extend: r.extend, Final: final, Valid: past})
		returned(t, done, "Valid passed")
		if n := len(r.renewals()); n != 1 {
			t.Errorf("%d renewals past Valid, want 1", n)
		}
	})
}

func TestLostClosesOnceAtTheDeadline(t *testing.T) {
	t.Parallel()
	s := newState(time.Hour, 20*time.Millisecond)
	select {
	case <-s.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("Lost still open long after the deadline")
	}
	if s.Lose() {
		t.Error("a second Lose reported itself the first")
	}
	if s.Renewed(time.Now().Add(time.Hour)) {
		t.Error("a lost lease was renewed")
	}
}

func TestReleaseReportsWhatCameBefore(t *testing.T) {
	t.Parallel()
	s := newState(time.Hour, time.Hour)
	if freed, lost, first := s.Release(); freed || lost || !first {
		t.Errorf("first Release: freed %v lost %v first %v, want false false true", freed, lost, first)
	}
	s.Freed()
	if freed, _, first := s.Release(); !freed || first {
		t.Errorf("Release after Freed: freed %v first %v, want true false", freed, first)
	}
	if s.Lose() {
		t.Error("losing a released lease reported a first loss")
	}
	if _, lost, _ := s.Release(); !lost {
		t.Error("Release after Lose did not report the loss")
	}
	if !s.Released() || !s.Gone() {
		t.Error("a released lease is not Released and Gone")
	}
}

func TestKeepAliveCapBecomesTheDeadlineAndStartsOneWatchdog(t *testing.T) {
	t.Parallel()
	s := newState(time.Hour, time.Hour)
	capAt := s.Acquired().Add(time.Minute)
	gate := make(chan struct{})
	ran := make(chan time.Time, 2)
	run := func(ctx context.Context, c time.Time) {
		ran <- c
		select {
		case <-ctx.Done():
		case <-gate:
		}
	}
	if !s.KeepAlive(context.Background(), time.Minute, run) {
		t.Fatal("KeepAlive did not start a watchdog")
	}
	if s.KeepAlive(context.Background(), time.Minute, run) {
		t.Error("a second KeepAlive started another watchdog")
	}
	if got := <-ran; !got.Equal(capAt) {
		t.Errorf("watchdog's cap %v, want %v", got, capAt)
	}
	if !s.Deadline().Equal(capAt) {
		t.Errorf("deadline %v, want the cap %v", s.Deadline(), capAt)
	}
	s.StopWatchdog() // returns only once run has returned
	select {
	case <-ran:
		t.Error("the watchdog ran twice")
	default:
	}
	s.Finish()
	if s.KeepAlive(context.Background(), 0, run) {
		t.Error("KeepAlive started a watchdog on a finished lease")
	}
}

func TestRenewalsNeverPassTheKeepAliveCap(t *testing.T) {
	t.Parallel()
	s := newState(time.Hour, time.Hour)
	capAt := s.Acquired().Add(time.Minute)
	if !s.KeepAlive(context.Background(), time.Minute, func(ctx context.Context, _ time.Time) { <-ctx.Done() }) {
		t.Fatal("KeepAlive did not start")
	}
	defer s.StopWatchdog()
	if !s.Cap().Equal(capAt) {
		t.Errorf("Cap %v, want %v", s.Cap(), capAt)
	}
	if d, left := s.Clamp(time.Hour, time.Millisecond); !left || d > time.Minute {
		t.Errorf("Clamp(1h) = %v, %v; want at most the minute to the cap", d, left)
	}
	if !s.Renewed(time.Now().Add(time.Hour)) {
		t.Fatal("Renewed refused a renewal of a held lease")
	}
	if !s.Deadline().Equal(capAt) {
		t.Errorf("a renewal for an hour moved the deadline to %v, want the cap %v", s.Deadline(), capAt)
	}
	past := &State{}
	now := time.Now()
	past.Init(time.Hour, now.Add(-time.Hour), now.Add(time.Hour), nil, func() {})
	past.KeepAlive(context.Background(), time.Minute, func(context.Context, time.Time) {})
	if _, left := past.Clamp(time.Hour, time.Millisecond); left {
		t.Error("Clamp left time for a renewal of a lease whose cap has passed")
	}
	past.StopWatchdog()
}
