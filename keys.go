package herd

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
)

// DefaultPrefix is the namespace of every Redis key herd writes when no
// prefix is configured.
const DefaultPrefix = "herd"

// maxPrefixLen bounds the configured prefix so every Redis key stays short.
const maxPrefixLen = 64

// keyFamily holds the Redis names that belong to one user key. They share
// one hash tag, so in Redis Cluster they sit in one slot and every script
// touches a single slot.
type keyFamily struct {
	value   string // P:{T}:v  the value envelope
	lease   string // P:{T}:l  the lease: "<owner>:<fence>"
	fence   string // P:{T}:f  hash: n = fence counter, r = last released lease
	record  string // P:{T}:r  FencedStore record: t = highest token, v = value
	backoff string // P:{T}:b  refresh backoff marker after failed refreshes
	failed  string // P:{T}:x  failure marker: "<fence>|<message>" of a failed load, short-lived
	channel string // P:{T}:n  pub/sub channel for wake-ups
	writes  string // P:{T}:w: prefix of the markers of Set and Invalidate runs ("<prefix><write id>")
}

// hash returns T, the key's hash tag: its member in a tag index (see
// tags.go). It is not a field: eight strings keep a keyFamily small
// enough for a closure to capture by value.
func (k keyFamily) hash() string {
	i := strings.IndexByte(k.value, '{')
	j := strings.IndexByte(k.value, '}')
	return k.value[i+1 : j]
}

// makeKeys maps a user key to its Redis names.
//
// The tag T is the unpadded base64url SHA-256 of the key: fixed length (43
// bytes), no raw user bytes, and no '{' or '}', so no key can choose its
// slot, split its family across slots, or collide with another key through
// a delimiter. Distinct keys map to distinct names unless SHA-256 collides.
// The only invalid key is the empty string.
func makeKeys(prefix, key string) (keyFamily, error) {
	if key == "" {
		return keyFamily{}, fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	sum := sha256.Sum256([]byte(key))
	return familyOf(prefix, base64.RawURLEncoding.EncodeToString(sum[:])), nil
}

// familyOf returns the names of the key whose hash tag is t.
func familyOf(prefix, t string) keyFamily {
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
	return keyFamily{
		value:   name(0, 0),
		lease:   name(1, 0),
		fence:   name(2, 0),
		record:  name(3, 0),
		backoff: name(4, 0),
		failed:  name(5, 0),
		channel: name(6, 0),
		writes:  name(7, 1),
	}
}

// checkPrefix panics when a configured prefix could break the key layout.
// A prefix is static configuration, so a bad one is a programming error.
func checkPrefix(prefix string) {
	if prefix == "" {
		panic("herd: empty key prefix")
	}
	if len(prefix) > maxPrefixLen {
		panic(fmt.Sprintf("herd: key prefix longer than %d bytes", maxPrefixLen))
	}
	if strings.ContainsAny(prefix, "{}") {
		panic("herd: key prefix must not contain '{' or '}': they would move the Redis Cluster hash slot")
	}
}
