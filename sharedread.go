package herd

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/herdkit/herd/internal/wire"
)

// The shared read. Concurrent hits of one key in one process share their
// GETs, as x/sync's singleflight shares a call, with one difference that
// keeps read-your-writes (see currency): a caller joins only a read that
// has not been sent yet. A key has up to readWires reads on the wire: a
// caller that finds fewer sends its own at once (two callers of a key
// then pay one round trip each, as with plain GETs). One that finds
// readWires of them opens the next read, which every caller after it
// joins, and which is sent when the oldest read on the wire returns (or
// after readStall, so that a stalled reply does not hold the next: while
// replies stall, a key gains one more GET on the wire per readStall, up
// to the client's ReadTimeout). So a key's GETs per process grow with
// round trips, not with callers, and a reply never predates a write that
// returned before its caller started. A Get that reads because the key's
// flight runs here (a cold read that found it running: hit.go) counts one
// read on the wire as all of them: it sends only when none is.
//
// A Get or Peek whose ctx cannot end (or with Options.InlineHits) sends
// its own read from its goroutine. Every other read is sent by a reader: a
// goroutine kept between reads (it leaves after readIdle without one, or
// at Close), so a hit with a ctx that can end costs no goroutine start
// and its caller still leaves as soon as ctx ends.
//
// Each read is decoded, counted as corrupt and reported to the breaker
// once, by whoever sent it.

const (
	readWires = 2                     // reads of one key on the wire at once, per Cache
	readStall = 10 * time.Millisecond // the longest a gathered read waits for the oldest on the wire
	readIdle  = 30 * time.Second      // a reader with no read to send leaves after this
)

// readResult is a value key's GET, decoded.
type readResult struct {
	env   envelope
	found bool  // Redis held bytes there
	ok    bool  // they are an intact envelope
	err   error // the GET's error, or the caller's (ctx.Err(), ErrClosed) when it left
}

// readCall is one GET shared by its owner (the caller that opened it)
// and the callers that joined it.
type readCall struct {
	key, vkey string
	s         *readStripe // vkey's stripe
	prev      *readCall   // the oldest read on the wire when this one opened: sent after it

	// Under the stripe's lock: done is made when someone waits (at open
	// for a handed-off read, by the next read's opener for an inline one),
	// and joined counts the joiners until the read is sent.
	done   chan struct{}
	joined int

	// Written by the sender before done closes.
	res    readResult
	clones [][]byte // a copy of the payload per joiner: the owner's is the original
	lone   bool     // no one but its sender ever waited on it: it can be used again
}

// readCalls keeps the calls of lone inline reads for the next one: a
// call that nobody but its sender saw (no next read waited on it) has no
// other reference once it is retired.
var readCalls = sync.Pool{New: func() any { return new(readCall) }}

// readGroup holds each key's reads in flight, striped by key.
type readGroup struct {
	stripes [64]readStripe
}

type readStripe struct {
	mu sync.Mutex
	m  map[string]readEntry
}

// readEntry is a key's reads: wire are sent (nil: a free slot, the
// oldest first), open gathers callers.
type readEntry struct {
	wire [readWires]*readCall
	open *readCall
}

// sending reports the reads on the wire.
func (e *readEntry) sending() int {
	n := 0
	for _, w := range e.wire {
		if w != nil {
			n++
		}
	}
	return n
}

// send puts rc on the wire, in a free slot, or in the oldest's place
// when a stalled read holds every slot (that one is then not waited for
// again).
func (e *readEntry) send(rc *readCall) {
	for i, w := range e.wire {
		if w == nil {
			e.wire[i] = rc
			return
		}
	}
	copy(e.wire[:], e.wire[1:])
	e.wire[readWires-1] = rc
}

// retire takes rc off the wire, keeping the others oldest first.
func (e *readEntry) retire(rc *readCall) {
	for i, w := range e.wire {
		if w == rc {
			copy(e.wire[i:], e.wire[i+1:])
			e.wire[readWires-1] = nil
			return
		}
	}
}

// sharedRead GETs vkey (the value of key) for a hit or a Peek, sharing the
// read with concurrent callers of the key.
//
// inline allows the caller to send a read itself when its ctx cannot end
// (or with InlineHits); Begin, which leaves at Close whatever its ctx,
// never does. wires (1 to readWires) is how many reads of the key may be
// on the wire for this caller to send one rather than gather.
func (c *Cache) sharedRead(ctx context.Context, key, vkey string, inline bool, wires int) readResult {
	s := &c.reads.stripes[stripe(vkey)]
	s.mu.Lock()
	e := s.m[vkey]
	if e.open != nil {
		rc := e.open
		rc.joined++
		i := rc.joined - 1
		s.mu.Unlock()
		return c.awaitRead(ctx, rc, i)
	}
	if s.m == nil {
		s.m = make(map[string]readEntry)
	}
	if inline && e.sending() < wires && (ctx.Done() == nil || c.cfg.InlineHits) {
		// A free slot: this caller sends the GET itself.
		rc := readCalls.Get().(*readCall)
		rc.key, rc.vkey, rc.s = key, vkey, s
		e.send(rc)
		s.m[vkey] = e
		s.mu.Unlock()
		if ctx.Done() != nil {
			ctx = context.WithoutCancel(ctx) // InlineHits: its values, not its end
		}
		c.sendRead(ctx, rc)
		r := rc.res
		if rc.lone {
			*rc = readCall{}
			readCalls.Put(rc)
		}
		return r
	}
	rc := &readCall{key: key, vkey: vkey, s: s, done: make(chan struct{})}
	if e.sending() < wires {
		e.send(rc) // a free slot: a reader sends it at once
	} else {
		rc.prev = e.wire[0]
		if rc.prev.done == nil {
			rc.prev.done = make(chan struct{})
		}
		e.open = rc
	}
	s.m[vkey] = e
	s.mu.Unlock()
	c.handRead(rc)
	return c.awaitRead(ctx, rc, -1)
}

// awaitRead waits for rc's reply as its owner (i < 0) or its i-th joiner.
func (c *Cache) awaitRead(ctx context.Context, rc *readCall, i int) readResult {
	select {
	case <-rc.done:
	case <-ctx.Done():
		return readResult{err: ctx.Err()}
	case <-c.ctx.Done():
		return readResult{err: ErrClosed}
	}
	r := rc.res
	if i >= 0 && r.ok {
		r.env.Payload = rc.clones[i]
	}
	return r
}

// handRead gives rc to an idle reader, or to a new one.
func (c *Cache) handRead(rc *readCall) {
	select {
	case c.readJobs <- rc:
		return
	default:
	}
	done, ok := c.track()
	if !ok {
		c.finishRead(rc, readResult{err: ErrClosed})
		return
	}
	go c.reader(rc, done)
}

// reader sends rc, then each read handed to it, until it has been idle
// for readIdle or Close begins.
func (c *Cache) reader(rc *readCall, done func()) {
	defer done()
	idle := time.NewTimer(readIdle)
	defer idle.Stop()
	for {
		if p := rc.prev; p != nil {
			c.waitPrev(p)
		}
		c.sendRead(c.ctx, rc)
		idle.Reset(readIdle)
		select {
		case rc = <-c.readJobs:
		case <-idle.C:
			return
		case <-c.ctx.Done():
			return
		}
	}
}

// waitPrev waits for the read on the wire before a gathered one, for at
// most readStall (c.readStall, which tests may lengthen).
func (c *Cache) waitPrev(p *readCall) {
	select {
	case <-p.done:
		return
	default:
	}
	t := time.NewTimer(c.readStall)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	case <-c.ctx.Done():
	}
}

// sendRead sends rc's GET under ctx (c.ctx from a reader, the caller's
// otherwise), decodes it and gives it to rc's callers.
func (c *Cache) sendRead(ctx context.Context, rc *readCall) {
	s := rc.s
	if rc.prev != nil { // a gathered read: no one joins it from now on
		s.mu.Lock()
		e := s.m[rc.vkey]
		e.open = nil
		e.send(rc)
		s.m[rc.vkey] = e
		s.mu.Unlock()
	}
	b, err := c.readValue(ctx, rc.vkey)
	c.account(err) // the breaker hears of each read once
	r := readResult{err: err, found: err == nil}
	if r.found {
		if r.env, r.ok = wire.DecodeEnvelope(b); !r.ok {
			c.countCorrupt(rc.key, len(b))
		}
	}
	c.finishRead(rc, r)
}

// finishRead records r as rc's reply, retires rc and wakes its callers.
func (c *Cache) finishRead(rc *readCall, r readResult) {
	s := rc.s
	s.mu.Lock()
	e := s.m[rc.vkey]
	e.retire(rc)
	if e.open == rc { // never sent (Close)
		e.open = nil
	}
	if e.sending() == 0 && e.open == nil {
		delete(s.m, rc.vkey)
	} else {
		s.m[rc.vkey] = e
	}
	n, done := rc.joined, rc.done
	rc.lone = done == nil
	s.mu.Unlock()
	rc.res = r
	if n > 0 && r.ok {
		rc.clones = make([][]byte, n)
		for i := range rc.clones {
			rc.clones[i] = bytes.Clone(r.env.Payload)
		}
	}
	if done != nil {
		close(done)
	}
}
