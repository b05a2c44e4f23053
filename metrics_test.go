package herd

import (
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkSignals shows what the signals cost on the hit path: nothing
// with no Observer (a nil check, no allocation), a function call with one.
func BenchmarkSignals(b *testing.B) {
	b.Run("NilObserver", func(b *testing.B) {
		s := newSignals(nil, nil, nil)
		b.ReportAllocs()
		for b.Loop() {
			s.lookup("user:42", OutcomeHit)
		}
	})
	b.Run("Observer", func(b *testing.B) {
		var n atomic.Int64
		s := newSignals(&Observer{Lookup: func(string, Outcome) { n.Add(1) }}, func(string) string { return "user" }, nil)
		b.ReportAllocs()
		for b.Loop() {
			s.lookup("user:42", OutcomeHit)
		}
	})
}

func TestSignalsNilObserverAllocatesNothing(t *testing.T) {
	s := newSignals(nil, nil, nil)
	allocs := testing.AllocsPerRun(1000, func() {
		s.lookup("k", OutcomeHit)
		s.load("k", time.Millisecond, nil, true)
		s.wait("k", time.Millisecond, WaitNotified)
		s.lease("k", LeaseExtended)
		s.commit("k", CommitStored)
	})
	if allocs != 0 {
		t.Errorf("signals with a nil Observer allocate %v per call, want 0", allocs)
	}
}

// Rare events are logged at most once per second per message, with the
// number suppressed.
func TestLogRareIsRateLimited(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	s := newSignals(nil, nil, slog.New(slog.NewTextHandler(&out, nil)))
	for range 100 {
		s.logRare(slog.LevelWarn, "herd: circuit breaker opened")
	}
	if n := strings.Count(out.String(), "circuit breaker opened"); n != 1 {
		t.Fatalf("100 events logged %d lines within a second, want 1", n)
	}
	s.limitMu.Lock()
	s.lastLog["herd: circuit breaker opened"] = time.Now().Add(-2 * time.Second)
	s.limitMu.Unlock()
	s.logRare(slog.LevelWarn, "herd: circuit breaker opened")
	if !strings.Contains(out.String(), "suppressed=99") {
		t.Errorf("the next line does not report 99 suppressed:\n%s", out.String())
	}
}

func TestEventNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ got, want string }{
		{LeaseTakenOver.String(), "taken_over"}, {LeaseExtendFailed.String(), "extend_failed"},
		{WaitTakeover.String(), "takeover"}, {WaitCancelled.String(), "cancelled"},
		{CommitFenced.String(), "fenced"}, {RefreshDropped.String(), "dropped"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
