package middleware

import (
	"hash/maphash"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func storedEntry(t *testing.T, status int, header http.Header, body string) []byte {
	t.Helper()
	return (&entry{status: status, header: header, body: []byte(body)}).encode()
}

// TestEntryMemoServesOnlyTheBlockItDecoded: the memo gives a key's hit the
// parsed header only when the stored bytes begin with the very header
// block it decoded; any other block, of the key or of another key in the
// same slot, is decoded afresh, and the body is always this value's.
func TestEntryMemoServesOnlyTheBlockItDecoded(t *testing.T) {
	t.Parallel()
	m := newEntryMemo()
	a := storedEntry(t, 200, http.Header{"X-V": {"1"}, "Content-Type": {"text/plain"}}, "first")
	e1, err := m.decode("k", a)
	if err != nil || e1.owned || e1.status != 200 || e1.header.Get("X-V") != "1" || string(e1.body) != "first" {
		t.Fatalf("first decode: %+v, %v", e1, err)
	}
	e2, err := m.decode("k", a)
	if err != nil || reflect.ValueOf(e2.header).UnsafePointer() != reflect.ValueOf(e1.header).UnsafePointer() {
		t.Fatalf("the same bytes again were decoded afresh (%v): the memo was not used", err)
	}
	// The same header block with another body: the memo's header, this body.
	same := storedEntry(t, 200, http.Header{"X-V": {"1"}, "Content-Type": {"text/plain"}}, "second, longer")
	if e, err := m.decode("k", same); err != nil || string(e.body) != "second, longer" || e.header.Get("X-V") != "1" {
		t.Fatalf("same block, new body: %+v, %v", e, err)
	}
	// Another block for the key: its own fields and status, never the memo's.
	b := storedEntry(t, 404, http.Header{"X-V": {"2"}}, "other")
	if e, err := m.decode("k", b); err != nil || e.status != 404 || e.header.Get("X-V") != "2" || e.header.Get("Content-Type") != "" || string(e.body) != "other" {
		t.Fatalf("a new block for the key: %+v, %v", e, err)
	}
	// Another key in the same slot never takes this key's block.
	other := "k2"
	for i := 0; maphash.String(m.seed, other)%memoSlots != maphash.String(m.seed, "k")%memoSlots; i++ {
		other = "k2-" + time.Duration(i).String()
	}
	if e, err := m.decode(other, a); err != nil || reflect.ValueOf(e.header).UnsafePointer() == reflect.ValueOf(e1.header).UnsafePointer() {
		t.Fatalf("key %q in the slot of k took k's memo (%v)", other, err)
	}
	// A block over the bound is decoded for its request alone.
	big := storedEntry(t, 200, http.Header{"X-Big": {strings.Repeat("b", memoMaxHead)}}, "big")
	for range 2 {
		if e, err := m.decode("big", big); err != nil || !e.owned || string(e.body) != "big" {
			t.Fatalf("a header block over %d bytes: %+v, %v; want it decoded, not memoized", memoMaxHead, e, err)
		}
	}
	// Bytes that are not an entry are an error, memoized or not.
	if _, err := m.decode("k", []byte("not an entry")); err == nil {
		t.Fatal("garbage decoded without an error")
	}
	if _, err := m.decode("k", a[:3]); err == nil {
		t.Fatal("a truncated entry decoded without an error")
	}
}

// TestMemoizedHeaderSurvivesAnOuterHandlerWritingToIt: a hit's response
// header is the response's own, even when it comes from the memo: an
// outer handler that rewrites or appends to a field after the middleware
// changes nothing the next hit serves.
func TestMemoizedHeaderSurvivesAnOuterHandlerWritingToIt(t *testing.T) {
	t.Parallel()
	c, _ := newCache(t, nil)
	mw := New(c, &Options{TTL: time.Hour})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["X-Kind"] = []string{"origin", "second"}
		_, _ = w.Write([]byte("body"))
	}))
	var sent []string // X-Kind as the middleware sent it
	outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mw.ServeHTTP(w, r)
		h := w.Header()
		sent = slices.Clone(h["X-Kind"])
		if vs := h["X-Kind"]; len(vs) > 0 {
			vs[0] = "rewritten"
			h["X-Kind"] = append(vs, "appended")
		}
	})
	for i := range 4 {
		rec := httptest.NewRecorder()
		// The recorder keeps its header map after the response: it is
		// what the outer handler wrote to.
		outer.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://catalog.example/memo", nil))
		if want := []string{"origin", "second"}; !reflect.DeepEqual(sent, want) {
			t.Fatalf("request %d: the middleware sent X-Kind %q, want the stored %q", i, sent, want)
		}
		if cs := rec.Result().Header.Get("Cache-Status"); i > 0 && !strings.HasPrefix(cs, statusHit) {
			t.Fatalf("request %d: Cache-Status %q, want a hit", i, cs)
		}
		if rec.Body.String() != "body" {
			t.Fatalf("request %d: body %q", i, rec.Body.String())
		}
	}
}
