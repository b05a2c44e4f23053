// Package wire is herd's format in Redis: the value envelope, the bytes
// stored at a key's value name, and the key family, the Redis names that
// belong to one user key. Every process that shares a Redis reads and
// writes these bytes and names, whatever its version, so a change here is
// a change of the format.
//
// # The envelope
//
// A hit costs one GET because everything needed to decide fresh, stale or
// early refresh is in the envelope:
//
//	offset size field
//	0      1    version (EnvelopeVersion)
//	1      1    flags (bit 0: a negative, bit 1: a pass mark)
//	2      8    fence token of the writer, big-endian
//	10     8    written at, Unix milliseconds
//	18     8    soft expiry (fresh until), Unix milliseconds
//	26     8    stale until (servable stale until), Unix milliseconds
//	34     4    rebuild duration Δ, microseconds (saturating)
//	38     4    CRC-32C of every other byte except the fence
//	42     -    payload (EnvelopeHeader is its offset)
//
// Every integer is big-endian. The writer decides how long its value may
// be served stale, so readers with other settings (another service, the
// HTTP middleware) agree.
//
// The fence is left out of the checksum so that a script can stamp the
// token it issues into an envelope built by the client (Set does). Any
// other change of a byte, a truncation or a foreign value is caught by the
// version and the checksum and read as a miss.
//
// # The key family
//
// A user key maps to names P:{T}:ROLE, where P is the configured prefix
// (DefaultPrefix unless set) and T the key's hash tag: the unpadded
// base64url SHA-256 of the key (43 bytes). The roles are listed at
// KeyFamily. Every name of a key shares one hash tag, so in Redis Cluster
// they sit in one slot and every script touches a single slot.
//
// The package has no dependency on herd: the herd package itself uses it.
package wire
