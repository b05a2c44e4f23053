package wire

import (
	"encoding/binary"
	"hash/crc32"
	"time"
)

// The envelope's version byte and the size of its header (the offset of
// its payload). The layout is in the package doc.
const (
	EnvelopeVersion = 1
	EnvelopeHeader  = 42
)

// The flags byte.
const (
	flagNegative = 1 << 0
	flagPass     = 1 << 1 // a pass mark (Fill.Pass): no value, build your own
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Envelope is the decoded form of the binary value herd stores at a key's
// value name.
type Envelope struct {
	Negative  bool
	Pass      bool // a pass mark: its payload is the reason, never a value
	Fence     uint64
	WrittenAt time.Time
	SoftExp   time.Time
	StaleExp  time.Time // equal to SoftExp when no stale serving
	Delta     time.Duration
	Payload   []byte // aliases the decoded buffer
}

// Encode returns the stored form of e.
func (e *Envelope) Encode() []byte {
	b := make([]byte, EnvelopeHeader+len(e.Payload))
	b[0] = EnvelopeVersion
	if e.Negative {
		b[1] = flagNegative
	}
	if e.Pass {
		b[1] |= flagPass
	}
	binary.BigEndian.PutUint64(b[2:], e.Fence)
	binary.BigEndian.PutUint64(b[10:], uint64(e.WrittenAt.UnixMilli()))
	binary.BigEndian.PutUint64(b[18:], uint64(e.SoftExp.UnixMilli()))
	stale := e.StaleExp
	if stale.Before(e.SoftExp) {
		stale = e.SoftExp
	}
	binary.BigEndian.PutUint64(b[26:], uint64(stale.UnixMilli()))
	binary.BigEndian.PutUint32(b[34:], uint32(min(max(e.Delta.Microseconds(), 0), 1<<32-1)))
	copy(b[EnvelopeHeader:], e.Payload)
	binary.BigEndian.PutUint32(b[38:], envelopeSum(b))
	return b
}

// envelopeSum is the checksum of b, an envelope, skipping the fence and the
// checksum itself.
func envelopeSum(b []byte) uint32 {
	sum := crc32.Update(0, castagnoli, b[0:2])
	sum = crc32.Update(sum, castagnoli, b[10:38])
	return crc32.Update(sum, castagnoli, b[EnvelopeHeader:])
}

// DecodeEnvelope parses b. It reports false for anything that is not an
// intact envelope of this version: such a value is a miss, never a panic.
func DecodeEnvelope(b []byte) (Envelope, bool) {
	if len(b) < EnvelopeHeader || b[0] != EnvelopeVersion || b[1]&^(flagNegative|flagPass) != 0 {
		return Envelope{}, false
	}
	if binary.BigEndian.Uint32(b[38:]) != envelopeSum(b) {
		return Envelope{}, false
	}
	return Envelope{
		Negative:  b[1]&flagNegative != 0,
		Pass:      b[1]&flagPass != 0,
		Fence:     binary.BigEndian.Uint64(b[2:]),
		WrittenAt: time.UnixMilli(int64(binary.BigEndian.Uint64(b[10:]))),
		SoftExp:   time.UnixMilli(int64(binary.BigEndian.Uint64(b[18:]))),
		StaleExp:  time.UnixMilli(int64(binary.BigEndian.Uint64(b[26:]))),
		Delta:     time.Duration(binary.BigEndian.Uint32(b[34:])) * time.Microsecond,
		Payload:   b[EnvelopeHeader:],
	}, true
}
