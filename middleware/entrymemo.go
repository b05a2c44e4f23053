package middleware

import (
	"bytes"
	"hash/maphash"
	"net/http"
	"sync/atomic"
)

// The entry memo. Every hit decodes the stored entry it serves, and for a
// hot URL that is the same header block again and again: the memo keeps,
// per key, the last header block decoded and its parsed form, so that a
// hit whose stored bytes begin with that very block takes the parsed
// header instead of parsing it again, and its body is the rest of the
// bytes. The stored form is prefix-free (a field count, then
// length-prefixed fields), so bytes that begin with a block parse to that
// block's fields and status exactly: the memo can serve no header another
// value would not have had.
//
// The memo is memoSlots slots, a key's slot chosen by its hash; a key
// whose slot another key took decodes as before and takes the slot. A
// block over memoMaxHead bytes is not kept. So the memo holds at most
// memoSlots × memoMaxHead bytes of header blocks (never a body) and needs
// no eviction. The parsed header is shared by every hit that takes it:
// nothing writes to it (write copies what it hands to a response).
const (
	memoSlots   = 256
	memoMaxHead = 16 << 10
)

type entryMemo struct {
	seed  maphash.Seed
	slots [memoSlots]atomic.Pointer[memoized]
}

// memoized is one key's last decoded header block.
type memoized struct {
	key    string
	head   []byte // the stored form up to the body
	status int
	header http.Header // shared: read only
	facts  *headerFacts
}

func newEntryMemo() *entryMemo { return &entryMemo{seed: maphash.MakeSeed()} }

// decode is decodeEntry(p) for the entry stored at key, taking the parsed
// header from the memo when p begins with the header block memoized for
// key. The entry it returns is not owned (see entry.owned): its header
// may be shared.
func (m *entryMemo) decode(key string, p []byte) (*entry, error) {
	slot := &m.slots[maphash.String(m.seed, key)%memoSlots]
	if d := slot.Load(); d != nil && d.key == key && bytes.HasPrefix(p, d.head) {
		return &entry{status: d.status, header: d.header, body: p[len(d.head):], facts: d.facts}, nil
	}
	e, err := decodeEntry(p)
	if err != nil {
		return nil, err
	}
	n := len(p) - len(e.body)
	if n > memoMaxHead {
		return e, nil // owned: decoded for this request alone
	}
	head := bytes.Clone(p[:n])
	e.facts = factsOf(e.header)
	slot.Store(&memoized{key: key, head: head, status: e.status, header: e.header, facts: e.facts})
	e.owned = false // the memo holds its header now
	return e, nil
}
