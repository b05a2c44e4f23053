package herd

import (
	"hash/maphash"
	"sync/atomic"
)

// The cold read. A Get of a key this process has not seen in Redis lately
// skips the hit path's GET when recent such keys were mostly missing: its
// flight starts at the ACQUIRE, which returns the value when there is one
// and takes the lease when there is none. A cold wave's leader then loads
// after one round trip, not two (GET, then ACQUIRE), and a follower
// process sends one ACQUIRE for all its callers instead of a GET first:
// the cold reads that come while it is on the wire join its flight (see
// "Cold joins" in flight.go).
//
// Which reads go cold is decided per Cache from what unknown keys were
// found to be: each one found in Redis lowers a score by 1, each one
// missing raises it by 4 (both bounded by ±8), and a read goes cold while
// the score is above 0. A new Cache starts at 0: its first unknown key
// is read with a GET, and a miss turns cold reads on. So the ACQUIRE (a short script, dearer for Redis
// than a GET) replaces the GET only while at least about one unknown key
// in five is missing; a long tail of keys that other processes have
// filled keeps plain GETs. A key is known once a read of it found a value
// or a flight of it ended: known keys (a bounded table, two slots per
// key, 64 KiB per Cache) always take the hit path, so a hot key's hits
// are GETs shared per process (sharedread.go).

const (
	warmSlots = 1 << 13
	coldMiss  = 4            // what an unknown key found missing adds to the score
	coldMax   = 2 * coldMiss // the score's bound either way: 3 misses in a row turn cold reads back on
)

// warmKeys is the table of known keys and the cold score.
type warmKeys struct {
	score atomic.Int32
	slots [warmSlots]atomic.Uint64
}

var warmSeed = maphash.MakeSeed()

// warmID is vkey's fingerprint in the table (never 0, an empty slot).
func warmID(vkey string) uint64 {
	return maphash.String(warmSeed, vkey) | 1
}

func (w *warmKeys) slotsOf(id uint64) (a, b *atomic.Uint64) {
	return &w.slots[id%warmSlots], &w.slots[(id>>32)%warmSlots]
}

// known reports whether id is in the table.
func (w *warmKeys) known(id uint64) bool {
	a, b := w.slotsOf(id)
	return a.Load() == id || b.Load() == id
}

// mark puts id in the table: in a free slot of its two, else in the
// first one's place. It reports whether id was not there (of callers
// marking one id at once, one is told so).
func (w *warmKeys) mark(id uint64) bool {
	a, b := w.slotsOf(id)
	for {
		va, vb := a.Load(), b.Load()
		switch {
		case va == id || vb == id:
			return false
		case va == 0 || vb != 0:
			if a.CompareAndSwap(va, id) {
				return true
			}
		default:
			if b.CompareAndSwap(vb, id) {
				return true
			}
		}
	}
}

// cold reports whether a read of an unknown key should go cold.
func (w *warmKeys) cold() bool { return w.score.Load() > 0 }

// found records what the first read of an unknown key found.
func (w *warmKeys) found(present bool) {
	d := int32(-1)
	if !present {
		d = coldMiss
	}
	for {
		s := w.score.Load()
		n := min(max(s+d, -coldMax), coldMax)
		if n == s || w.score.CompareAndSwap(s, n) {
			return
		}
	}
}
