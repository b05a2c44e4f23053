package herd

// A model-based test of Redlock's quorum fencing tokens and mutual
// exclusion (rapid state machine). The real scripts run on N miniredis
// masters (N = 3 or 5) through the real attempt code, but the model
// decides the interleaving: each attempt's round-one and round-two calls
// are separate steps that rapid orders against other attempts' steps,
// against time (FastForward: a holder can stall between any two steps),
// against lost replies (the script ran, the reply never came) and dropped
// calls, and against masters that go down (a partition) or restart empty.
// Every master has its own clock, up to 20ms off, which floors its counter.
// The model keeps the documented restart rule: a master that lost its
// data rejoins only after one maximum lease length.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

const (
	rlModelMaxTTL = 30 * time.Second
	rlModelSkew   = 20 * time.Millisecond
)

var errModelDown = errors.New("model: master down")

// rlModel is the state of one run.
type rlModel struct {
	mrs     []*miniredis.Miniredis
	clients []*redis.Client
	r       *Redlock
	keys    keyFamily

	mu      sync.Mutex // guards now, down and offset: read by the hooks' goroutines
	now     time.Duration
	down    []bool
	offset  []time.Duration // each master's clock error
	upAfter []time.Duration // a master restarted empty may rejoin from then

	seq      int // action counter: the model's real-time order
	attempts []*rlModelAttempt
}

var rlModelEpoch = time.Unix(1_800_000_000, 0)

func (m *rlModel) clock() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return rlModelEpoch.Add(m.now)
}

// rlModelAttempt is one attempt and, once won, its lease.
type rlModelAttempt struct {
	a        *rlAttempt
	phase    int   // 0 round one, 1 round two, 2 done
	pending  []int // masters not yet stepped in this round
	raised   []nodeReply
	startSeq int

	won      bool
	lease    *RedlockLease
	wonSeq   int
	wonAt    time.Duration
	end      time.Duration // end of validity as the holder knows it (deadline, or release)
	endSeq   int           // 0 for a deadline (no action at that time is valid), the release's seq
	released bool
}

// before orders two instants of the model, (time, seq), lexicographically.
func before(at1 time.Duration, seq1 int, at2 time.Duration, seq2 int) bool {
	return at1 < at2 || (at1 == at2 && seq1 < seq2)
}

// nodeHook makes a master unreachable while the model says it is down, and
// sets the master's clock before every command.
type nodeHook struct {
	m *rlModel
	i int
}

func (h nodeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h nodeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h nodeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.m.mu.Lock()
		down, at := h.m.down[h.i], rlModelEpoch.Add(h.m.now+h.m.offset[h.i])
		h.m.mu.Unlock()
		if down {
			cmd.SetErr(errModelDown)
			return errModelDown
		}
		h.m.mrs[h.i].SetTime(at)
		return next(ctx, cmd)
	}
}

func TestModelRedlock(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ctx := context.Background()
		n := rapid.SampledFrom([]int{3, 5}).Draw(t, "masters")
		m := &rlModel{down: make([]bool, n), upAfter: make([]time.Duration, n)}
		var clients []redis.UniversalClient
		for i := range n {
			mr := miniredis.NewMiniRedis()
			if err := mr.Start(); err != nil {
				t.Fatal(err)
			}
			c := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
			c.AddHook(nodeHook{m: m, i: i})
			m.mrs = append(m.mrs, mr)
			m.clients = append(m.clients, c)
			clients = append(clients, c)
			off := time.Duration(rapid.IntRange(-int(rlModelSkew/time.Microsecond), int(rlModelSkew/time.Microsecond)).Draw(t, "clock_offset_us")) * time.Microsecond
			m.offset = append(m.offset, off)
		}
		m.r = NewRedlock(clients, &RedlockOptions{NodeTimeout: 10 * time.Second})
		m.r.now = m.clock
		m.keys, _ = makeKeys(DefaultPrefix, "model")
		defer func() {
			for _, at := range m.attempts {
				if at.lease != nil {
					at.lease.finish()
				}
			}
			m.r.Close()
			for i := range n {
				m.clients[i].Close()
				m.mrs[i].Close()
			}
		}()

		active := func(t *rapid.T) *rlModelAttempt {
			var open []*rlModelAttempt
			for _, at := range m.attempts {
				if at.phase < 2 {
					open = append(open, at)
				}
			}
			if len(open) == 0 {
				return nil
			}
			return open[rapid.IntRange(0, len(open)-1).Draw(t, "attempt")]
		}
		holding := func(t *rapid.T) *rlModelAttempt {
			var held []*rlModelAttempt
			for _, at := range m.attempts {
				if at.won && !at.released && m.now < at.end {
					held = append(held, at)
				}
			}
			if len(held) == 0 {
				return nil
			}
			return held[rapid.IntRange(0, len(held)-1).Draw(t, "holder")]
		}
		// fail ends an attempt that did not win: release everywhere, as try does.
		fail := func(at *rlModelAttempt) {
			at.phase = 2
			for i := range n {
				m.r.releaseMarked(ctx, i, m.keys, at.a.owner, at.a.releaseMark(i))
			}
		}

		// endRound decides the attempt's round, as try does.
		endRound := func(at *rlModelAttempt) {
			at.pending = nil // what did not answer timed out
			m.seq++
			if at.phase == 0 {
				if err := at.a.afterAcquire(); err != nil {
					fail(at)
					return
				}
				at.phase = 1
				at.pending = slices.Clone(at.a.won)
				at.raised = make([]nodeReply, n)
				for i := range at.raised {
					at.raised[i].err = errNotAsked
				}
				for _, i := range at.a.won {
					at.raised[i].err = errors.New("model: no reply yet")
				}
				return
			}
			lease, err := at.a.afterRaise(at.raised)
			if err != nil {
				fail(at)
				return
			}
			at.phase, at.won, at.lease = 2, true, lease
			at.wonSeq, at.wonAt = m.seq, m.now
			at.end = lease.Deadline().Sub(rlModelEpoch)
		}

		actions := map[string]func(*rapid.T){
			"Begin": func(t *rapid.T) {
				open := 0
				for _, at := range m.attempts {
					if at.phase < 2 {
						open++
					}
				}
				if open >= 3 {
					return
				}
				ttl := time.Duration(rapid.IntRange(10, 30).Draw(t, "ttl_s")) * time.Second
				a := m.r.newAttempt("model", m.keys, ttl)
				a.acq = make([]nodeReply, n)
				for i := range a.acq {
					a.acq[i].err = errors.New("model: no reply yet")
				}
				m.seq++
				m.attempts = append(m.attempts, &rlModelAttempt{a: a, pending: slices.Clone(m.r.all), startSeq: m.seq})
			},
			"Step": func(t *rapid.T) {
				// Some of the attempt's calls of this round reach their master.
				at := active(t)
				if at == nil {
					return
				}
				for range rapid.IntRange(1, len(at.pending)).Draw(t, "calls") {
					k := rapid.IntRange(0, len(at.pending)-1).Draw(t, "pending")
					i := at.pending[k]
					at.pending = slices.Delete(at.pending, k, k+1)
					outcome := rapid.SampledFrom([]string{"reply", "reply", "reply", "reply", "reply", "reply", "lost reply", "dropped"}).Draw(t, "outcome")
					var rep nodeReply
					switch {
					case outcome == "dropped":
						rep = nodeReply{err: errors.New("model: dropped")}
					case at.phase == 0:
						rep = m.r.acquireNode(ctx, i, m.keys, at.a.owner, at.a.ttl)
					default:
						rep = m.r.raiseNode(ctx, i, m.keys, at.a.owner, at.a.token, at.a.ttl)
					}
					if outcome == "lost reply" {
						rep = nodeReply{err: errors.New("model: reply lost")}
					}
					if at.phase == 0 {
						at.a.acq[i] = rep
					} else {
						at.raised[i] = rep
					}
				}
				if len(at.pending) == 0 {
					endRound(at)
				}
			},
			"Timeout": func(t *rapid.T) {
				// The round's deadline passes with masters still to answer.
				at := active(t)
				if at == nil {
					return
				}
				if len(at.pending) == n || rapid.IntRange(0, 5).Draw(t, "timeout") != 0 {
					return
				}
				endRound(at)
			},
			"Extend": func(t *rapid.T) {
				at := holding(t)
				if at == nil {
					return
				}
				ttl := time.Duration(rapid.IntRange(10, 30).Draw(t, "ttl_s")) * time.Second
				if err := at.lease.Extend(ctx, ttl); err == nil {
					at.end = at.lease.Deadline().Sub(rlModelEpoch)
				}
			},
			"Release": func(t *rapid.T) {
				at := holding(t)
				if at == nil {
					return
				}
				m.seq++
				at.released = true
				at.end, at.endSeq = m.now, m.seq
				_ = at.lease.Release(ctx)
			},
			"Advance": func(t *rapid.T) {
				// Short steps (within the clocks' skew) and long ones (leases expire).
				d := time.Duration(rapid.IntRange(1, 40_000).Draw(t, "us")) * time.Microsecond
				if rapid.Bool().Draw(t, "long") {
					d = time.Duration(rapid.IntRange(1, 15_000).Draw(t, "ms")) * time.Millisecond
				}
				m.mu.Lock()
				m.now += d
				m.mu.Unlock()
				for _, mr := range m.mrs {
					mr.FastForward(d)
				}
			},
			"Partition": func(t *rapid.T) {
				i := rapid.IntRange(0, n-1).Draw(t, "master")
				if !m.down[i] && rapid.IntRange(0, 3).Draw(t, "rare") != 0 {
					return
				}
				m.mu.Lock()
				if m.now >= m.upAfter[i] {
					m.down[i] = !m.down[i] // down, or back with its data
				}
				m.mu.Unlock()
			},
			"RestartEmpty": func(t *rapid.T) {
				i := rapid.IntRange(0, n-1).Draw(t, "master")
				if rapid.IntRange(0, 3).Draw(t, "rare") != 0 {
					return
				}
				m.mrs[i].FlushAll()
				m.mu.Lock()
				m.down[i] = true
				m.upAfter[i] = m.now + rlModelMaxTTL // the restart rule
				m.mu.Unlock()
			},
		}
		names := slices.Sorted(maps.Keys(actions))
		names = append(names, "Step", "Step", "Step") // calls are the common event
		for range rapid.IntRange(50, 400).Draw(t, "steps") {
			actions[rapid.SampledFrom(names).Draw(t, "action")](t)
			m.check(t)
		}
	})
}

// check states the invariants over every pair of won attempts A, B:
// distinct tokens; if A won before B began, a < b; their validity
// intervals [won, end) do not overlap (one holder at a time); and the one
// whose interval comes first has the smaller token, which is what a
// fenced resource needs.
func (m *rlModel) check(t *rapid.T) {
	var won []*rlModelAttempt
	for _, at := range m.attempts {
		if at.won {
			won = append(won, at)
		}
	}
	for x, a := range won {
		for _, b := range won[x+1:] {
			ta, tb := a.a.token, b.a.token
			desc := fmt.Sprintf("A (token %d, won at %v, valid to %v) and B (token %d, won at %v, valid to %v)",
				ta, a.wonAt, a.end, tb, b.wonAt, b.end)
			if ta == tb {
				t.Fatalf("two acquisitions with one token: %s", desc)
			}
			if a.wonSeq < b.startSeq && ta >= tb {
				t.Fatalf("B began after A won but got a lower token: %s", desc)
			}
			if b.wonSeq < a.startSeq && tb >= ta {
				t.Fatalf("A began after B won but got a lower token: %s", desc)
			}
			aFirst := !before(b.wonAt, b.wonSeq, a.end, a.endSeq) // A's validity ended before B's began
			bFirst := !before(a.wonAt, a.wonSeq, b.end, b.endSeq)
			if !aFirst && !bFirst {
				t.Fatalf("two holders at once: %s", desc)
			}
			if aFirst && ta > tb || bFirst && tb > ta {
				t.Fatalf("tokens out of the holders' order: %s", desc)
			}
		}
	}
}
