package herd

import (
	"time"

	"github.com/herdkit/herd/internal/wire"
)

// envelope is the binary value herd stores at a key's value name, decoded.
// Its layout, encoding and checksum are internal/wire's.
type envelope = wire.Envelope

// newEnvelope builds the envelope of a value written now: fresh for ttl,
// then servable stale for staleFor.
func (c *Cache) newEnvelope(fence uint64, val []byte, ttl, staleFor time.Duration, delta time.Duration) *envelope {
	now := c.now()
	return &envelope{
		Fence:     fence,
		WrittenAt: now,
		SoftExp:   now.Add(ttl),
		StaleExp:  now.Add(ttl + staleFor),
		Delta:     delta,
		Payload:   val,
	}
}
