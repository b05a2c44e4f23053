package wire

import (
	"bytes"
	"encoding/hex"
	"testing"
	"time"
)

// FuzzDecodeEnvelope: DecodeEnvelope never panics on any bytes and accepts
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
		if e, ok := DecodeEnvelope(raw); ok {
			if !e.StaleExp.Before(e.SoftExp) && !bytes.Equal(e.Encode(), raw) {
				t.Fatalf("decode(%x) re-encodes to %x", raw, e.Encode())
			}
		}

		// Round trip.
		e := Envelope{
			Negative:  negative,
			Fence:     fence,
			WrittenAt: time.UnixMilli(written),
			SoftExp:   time.UnixMilli(soft),
			StaleExp:  time.UnixMilli(stale),
			Delta:     time.Duration(deltaUs) * time.Microsecond,
			Payload:   raw,
		}
		b := e.Encode()
		d, ok := DecodeEnvelope(b)
		if !ok {
			t.Fatalf("decode(encode(%+v)) rejected %x", e, b)
		}
		wantStale := max(stale, soft)
		if d.Negative != negative || d.Fence != fence || d.WrittenAt.UnixMilli() != written ||
			d.SoftExp.UnixMilli() != soft || d.StaleExp.UnixMilli() != wantStale ||
			d.Delta != e.Delta || !bytes.Equal(d.Payload, raw) {
			t.Fatalf("decode(encode(e)) = %+v, want %+v (stale end %d)", d, e, wantStale)
		}

		// One byte changed.
		if mask == 0 {
			mask = 1
		}
		i := int(pos) % len(b)
		c := bytes.Clone(b)
		c[i] ^= mask
		d2, ok := DecodeEnvelope(c)
		if i < 2 || i >= 10 {
			if ok {
				t.Fatalf("byte %d of %x changed by %#x: accepted as %+v", i, b, mask, d2)
			}
			return
		}
		if !ok {
			t.Fatalf("fence byte %d changed: rejected, want it accepted with the new fence", i)
		}
		if d2.Fence == fence || d2.WrittenAt != d.WrittenAt || d2.SoftExp != d.SoftExp || d2.StaleExp != d.StaleExp ||
			d2.Negative != d.Negative || d2.Delta != d.Delta || !bytes.Equal(d2.Payload, d.Payload) {
			t.Fatalf("fence byte %d changed: decoded %+v from %+v", i, d2, d)
		}
	})
}

// One envelope, byte for byte (its checksum computed apart from this
// package): the format every process that shares a Redis must agree on.
func TestEnvelopeBytes(t *testing.T) {
	t.Parallel()
	const want = "0101" + "0000000000000007" + "000001a3185c5000" + "000001a3185d3a60" +
		"000001a3185e24c0" + "000005dc" + "e467a044" + "6869"
	e := Envelope{
		Negative:  true,
		Fence:     7,
		WrittenAt: time.UnixMilli(1_800_000_000_000),
		SoftExp:   time.UnixMilli(1_800_000_060_000),
		StaleExp:  time.UnixMilli(1_800_000_120_000),
		Delta:     1500 * time.Microsecond,
		Payload:   []byte("hi"),
	}
	if got := hex.EncodeToString(e.Encode()); got != want {
		t.Fatalf("Encode() = %s, want %s", got, want)
	}
	b, _ := hex.DecodeString(want)
	d, ok := DecodeEnvelope(b)
	if !ok || !d.Negative || d.Pass || d.Fence != 7 || !d.WrittenAt.Equal(e.WrittenAt) || !d.SoftExp.Equal(e.SoftExp) ||
		!d.StaleExp.Equal(e.StaleExp) || d.Delta != e.Delta || string(d.Payload) != "hi" {
		t.Fatalf("DecodeEnvelope(%s) = %+v, %v; want %+v", want, d, ok, e)
	}
}
