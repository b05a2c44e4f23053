package herd

import (
	"bytes"
	"testing"
	"time"
)

// FuzzDecodeEnvelope: decodeEnvelope never panics on any bytes and accepts
// only intact envelopes; decode(encode(e)) gives e back (times in whole
// milliseconds, the stale end raised to the fresh end, Δ in saturated
// microseconds); and any single-byte change of an encoded envelope is
// rejected, except in the fence bytes, which the checksum leaves out so
// that a script can stamp them (Set does): such a change decodes with the
// new fence and everything else unchanged.
//
// The seed corpus is in testdata/fuzz/FuzzDecodeEnvelope.
func FuzzDecodeEnvelope(f *testing.F) {
	f.Add([]byte{}, false, uint64(0), int64(0), int64(0), int64(0), uint32(0), uint16(0), byte(1))
	f.Add([]byte("payload"), true, uint64(1<<53+1), int64(1_800_000_000_000), int64(1_800_000_060_000), int64(1_800_000_120_000), uint32(1500), uint16(3), byte(0x80))
	f.Fuzz(func(t *testing.T, raw []byte, negative bool, fence uint64, written, soft, stale int64, deltaUs uint32, pos uint16, mask byte) {
		// Any bytes: no panic; an accepted envelope re-encodes to itself
		// when its stale end is not below its fresh end.
		if e, ok := decodeEnvelope(raw); ok {
			if !e.staleExp.Before(e.softExp) && !bytes.Equal(e.encode(), raw) {
				t.Fatalf("decode(%x) re-encodes to %x", raw, e.encode())
			}
		}

		// Round trip.
		e := envelope{
			negative:  negative,
			fence:     fence,
			writtenAt: time.UnixMilli(written),
			softExp:   time.UnixMilli(soft),
			staleExp:  time.UnixMilli(stale),
			delta:     time.Duration(deltaUs) * time.Microsecond,
			payload:   raw,
		}
		b := e.encode()
		d, ok := decodeEnvelope(b)
		if !ok {
			t.Fatalf("decode(encode(%+v)) rejected %x", e, b)
		}
		wantStale := max(stale, soft)
		if d.negative != negative || d.fence != fence || d.writtenAt.UnixMilli() != written ||
			d.softExp.UnixMilli() != soft || d.staleExp.UnixMilli() != wantStale ||
			d.delta != e.delta || !bytes.Equal(d.payload, raw) {
			t.Fatalf("decode(encode(e)) = %+v, want %+v (stale end %d)", d, e, wantStale)
		}

		// One byte changed.
		if mask == 0 {
			mask = 1
		}
		i := int(pos) % len(b)
		c := bytes.Clone(b)
		c[i] ^= mask
		d2, ok := decodeEnvelope(c)
		if i < 2 || i >= 10 {
			if ok {
				t.Fatalf("byte %d of %x changed by %#x: accepted as %+v", i, b, mask, d2)
			}
			return
		}
		if !ok {
			t.Fatalf("fence byte %d changed: rejected, want it accepted with the new fence", i)
		}
		if d2.fence == fence || d2.writtenAt != d.writtenAt || d2.softExp != d.softExp || d2.staleExp != d.staleExp ||
			d2.negative != d.negative || d2.delta != d.delta || !bytes.Equal(d2.payload, d.payload) {
			t.Fatalf("fence byte %d changed: decoded %+v from %+v", i, d2, d)
		}
	})
}
