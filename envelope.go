package herd

import (
	"encoding/binary"
	"hash/crc32"
	"time"
)

// The envelope is the binary value herd stores at a key's value name. A
// hit costs one GET because everything needed to decide fresh, stale or
// early refresh is in it.
//
//	offset size field
//	0      1    version (envelopeVersion)
//	1      1    flags (flagNegative, flagPass)
//	2      8    fence token of the writer, big-endian
//	10     8    written at, Unix milliseconds
//	18     8    soft expiry (fresh until), Unix milliseconds
//	26     8    stale until (servable stale until), Unix milliseconds
//	34     4    rebuild duration Δ, microseconds (saturating)
//	38     4    CRC-32C of every other byte except the fence
//	42     -    payload
//
// The writer decides how long its value may be served stale, so readers
// with other settings (another service, the HTTP middleware) agree.
//
// The fence is left out of the checksum so that a script can stamp the
// token it issues into an envelope built by the client (Set does). Any
// other change of a byte, a truncation or a foreign value is caught by the
// version and the checksum and read as a miss.
const (
	envelopeVersion = 1
	envelopeHeader  = 42

	flagNegative = 1 << 0
	flagPass     = 1 << 1 // a pass mark (Fill.Pass): no value, build your own
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// envelope is the decoded form.
type envelope struct {
	negative  bool
	pass      bool // a pass mark: its payload is the reason, never a value
	fence     uint64
	writtenAt time.Time
	softExp   time.Time
	staleExp  time.Time // equal to softExp when no stale serving
	delta     time.Duration
	payload   []byte // aliases the decoded buffer
}

// encode returns the stored form of e.
func (e *envelope) encode() []byte {
	b := make([]byte, envelopeHeader+len(e.payload))
	b[0] = envelopeVersion
	if e.negative {
		b[1] = flagNegative
	}
	if e.pass {
		b[1] |= flagPass
	}
	binary.BigEndian.PutUint64(b[2:], e.fence)
	binary.BigEndian.PutUint64(b[10:], uint64(e.writtenAt.UnixMilli()))
	binary.BigEndian.PutUint64(b[18:], uint64(e.softExp.UnixMilli()))
	stale := e.staleExp
	if stale.Before(e.softExp) {
		stale = e.softExp
	}
	binary.BigEndian.PutUint64(b[26:], uint64(stale.UnixMilli()))
	binary.BigEndian.PutUint32(b[34:], uint32(min(max(e.delta.Microseconds(), 0), 1<<32-1)))
	copy(b[envelopeHeader:], e.payload)
	binary.BigEndian.PutUint32(b[38:], envelopeSum(b))
	return b
}

// envelopeSum is the checksum of b, an envelope, skipping the fence and the
// checksum itself.
func envelopeSum(b []byte) uint32 {
	sum := crc32.Update(0, castagnoli, b[0:2])
	sum = crc32.Update(sum, castagnoli, b[10:38])
	return crc32.Update(sum, castagnoli, b[envelopeHeader:])
}

// decodeEnvelope parses b. It reports false for anything that is not an
// intact envelope of this version: such a value is a miss, never a panic.
func decodeEnvelope(b []byte) (envelope, bool) {
	if len(b) < envelopeHeader || b[0] != envelopeVersion || b[1]&^(flagNegative|flagPass) != 0 {
		return envelope{}, false
	}
	if binary.BigEndian.Uint32(b[38:]) != envelopeSum(b) {
		return envelope{}, false
	}
	return envelope{
		negative:  b[1]&flagNegative != 0,
		pass:      b[1]&flagPass != 0,
		fence:     binary.BigEndian.Uint64(b[2:]),
		writtenAt: time.UnixMilli(int64(binary.BigEndian.Uint64(b[10:]))),
		softExp:   time.UnixMilli(int64(binary.BigEndian.Uint64(b[18:]))),
		staleExp:  time.UnixMilli(int64(binary.BigEndian.Uint64(b[26:]))),
		delta:     time.Duration(binary.BigEndian.Uint32(b[34:])) * time.Microsecond,
		payload:   b[envelopeHeader:],
	}, true
}

// newEnvelope builds the envelope of a value written now: fresh for ttl,
// then servable stale for staleFor.
func (c *Cache) newEnvelope(fence uint64, val []byte, ttl, staleFor time.Duration, delta time.Duration) *envelope {
	now := c.now()
	return &envelope{
		fence:     fence,
		writtenAt: now,
		softExp:   now.Add(ttl),
		staleExp:  now.Add(ttl + staleFor),
		delta:     delta,
		payload:   val,
	}
}
