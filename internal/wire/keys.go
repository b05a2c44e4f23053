package wire

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// DefaultPrefix is the namespace of every Redis key herd writes when no
// prefix is configured.
const DefaultPrefix = "herd"

// MaxPrefixLen bounds the configured prefix so every Redis key stays short.
const MaxPrefixLen = 64

// ErrEmptyKey is MakeKeys's error for the empty key, the only invalid one.
var ErrEmptyKey = errors.New("empty key")

// KeyFamily holds the Redis names that belong to one user key. They share
// one hash tag, so in Redis Cluster they sit in one slot and every script
// touches a single slot.
type KeyFamily struct {
	Value   string // P:{T}:v  the value envelope
	Lease   string // P:{T}:l  the lease: "<owner>:<fence>"
	Fence   string // P:{T}:f  hash: n = fence counter, r = last released lease
	Record  string // P:{T}:r  FencedStore record: t = highest token, v = value
	Backoff string // P:{T}:b  refresh backoff marker after failed refreshes
	Failed  string // P:{T}:x  failure marker: "<fence>|<message>" of a failed load, short-lived
	Channel string // P:{T}:n  pub/sub channel for wake-ups
	Writes  string // P:{T}:w: prefix of the markers of Set and Invalidate runs ("<prefix><write id>")
}

// Hash returns T, the key's hash tag: its member in a tag index (see
// herd's tags.go). It is not a field: eight strings keep a KeyFamily
// small enough for a closure to capture by value.
func (k KeyFamily) Hash() string {
	i := strings.IndexByte(k.Value, '{')
	j := strings.IndexByte(k.Value, '}')
	return k.Value[i+1 : j]
}

// MakeKeys maps a user key to its Redis names.
//
// The tag T is the unpadded base64url SHA-256 of the key: fixed length (43
// bytes), no raw user bytes, and no '{' or '}', so no key can choose its
// slot, split its family across slots, or collide with another key through
// a delimiter. Distinct keys map to distinct names unless SHA-256 collides.
// The only invalid key is the empty string: its error is ErrEmptyKey.
func MakeKeys(prefix, key string) (KeyFamily, error) {
	if key == "" {
		return KeyFamily{}, ErrEmptyKey
	}
	sum := sha256.Sum256([]byte(key))
	return FamilyOf(prefix, base64.RawURLEncoding.EncodeToString(sum[:])), nil
}

// FamilyOf returns the names of the key whose hash tag is t.
func FamilyOf(prefix, t string) KeyFamily {
	// The eight names share one allocation: "<base>v<base>l...<base>w:".
	const suffixes = "vlfrbxnw"
	n := len(prefix) + 2 + len(t) + 2
	var b strings.Builder
	b.Grow(len(suffixes)*(n+1) + 1)
	for i := range len(suffixes) {
		b.WriteString(prefix)
		b.WriteString(":{")
		b.WriteString(t)
		b.WriteString("}:")
		b.WriteByte(suffixes[i])
	}
	b.WriteByte(':')
	all := b.String()
	name := func(i, extra int) string { return all[i*(n+1) : (i+1)*(n+1)+extra] }
	return KeyFamily{
		Value:   name(0, 0),
		Lease:   name(1, 0),
		Fence:   name(2, 0),
		Record:  name(3, 0),
		Backoff: name(4, 0),
		Failed:  name(5, 0),
		Channel: name(6, 0),
		Writes:  name(7, 1),
	}
}

// IsHashTag reports whether m is a key's hash tag as MakeKeys makes it:
// 43 bytes of base64url. Anything else in a tag index is not herd's.
func IsHashTag(m string) bool {
	if len(m) != base64.RawURLEncoding.EncodedLen(sha256.Size) {
		return false
	}
	return !strings.ContainsFunc(m, func(r rune) bool {
		return !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	})
}

// CheckPrefix panics when a configured prefix could break the key layout.
// A prefix is static configuration, so a bad one is a programming error.
// The messages are herd's: "herd: ...".
func CheckPrefix(prefix string) {
	if prefix == "" {
		panic("herd: empty key prefix")
	}
	if len(prefix) > MaxPrefixLen {
		panic(fmt.Sprintf("herd: key prefix longer than %d bytes", MaxPrefixLen))
	}
	if strings.ContainsAny(prefix, "{}") {
		panic("herd: key prefix must not contain '{' or '}': they would move the Redis Cluster hash slot")
	}
}

// TagFamily holds the Redis names of one tag, in one slot (their hash tag
// H is that of the tag, not of any key).
type TagFamily struct {
	Index  string // P:{H}:tz  the tag's index: sorted set of the hash tags T of its keys
	Purged string // P:{H}:tp  the generation of the tag's last purge
}

// TagKeys maps a tag to its Redis names. H is the unpadded base64url
// SHA-256 of "tag\x00" and the tag, so no tag's names collide with a key's.
func TagKeys(prefix, tag string) TagFamily {
	h := sha256.New()
	h.Write([]byte("tag\x00"))
	h.Write([]byte(tag))
	base := prefix + ":{" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)) + "}:"
	return TagFamily{Index: base + "tz", Purged: base + "tp"}
}

// GenKey is the name of a prefix's tag purge generation, P:tg.
func GenKey(prefix string) string { return prefix + ":tg" }

// Roles of herd's Redis names, as Role returns them.
const (
	RoleValue     = "v"
	RoleLease     = "l"
	RoleFence     = "f"
	RoleRecord    = "r"
	RoleBackoff   = "b"
	RoleFailed    = "x"
	RoleWrites    = "w"
	RoleTagIndex  = "tz"
	RoleTagPurged = "tp"
	RoleTagGen    = "tg"
)

// Role returns the role of name, a Redis name under prefix: one of the
// Role constants, or "" for a name that is not one herd writes this way.
// (The channel, P:{T}:n, is a pub/sub channel, never a stored name.)
func Role(prefix, name string) string {
	rest, ok := strings.CutPrefix(name, prefix+":")
	if !ok {
		return ""
	}
	if rest == RoleTagGen {
		return RoleTagGen
	}
	i := strings.LastIndexByte(rest, '}')
	if !strings.HasPrefix(rest, "{") || i < 0 {
		return ""
	}
	r, ok := strings.CutPrefix(rest[i+1:], ":")
	if !ok {
		return ""
	}
	switch r {
	case RoleValue, RoleLease, RoleFence, RoleRecord, RoleBackoff, RoleFailed, RoleTagIndex, RoleTagPurged:
		return r
	}
	if strings.HasPrefix(r, RoleWrites+":") {
		return RoleWrites
	}
	return ""
}
