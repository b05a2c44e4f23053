// Package observe holds what herd's metric adapters (the prometheus
// package and the otel module) share, so that both name things alike: the
// bounded class label and a load's result label.
package observe

import (
	"errors"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/herdkit/herd"
)

// Classes bounds a class label's values: "" is "default", a class that is
// not valid UTF-8 (a KeyClass that cut a name inside a character, or
// returned raw request bytes) gets U+FFFD for its invalid bytes
// (Prometheus rejects such a label value, and WithLabelValues would panic
// in whatever goroutine reported it), and the classes beyond the first
// Max are "other". The zero value is not usable: call NewClasses.
type Classes struct {
	mu   sync.Mutex
	seen map[string]struct{}
	max  int
}

// NewClasses returns Classes that keep up to max distinct classes.
func NewClasses(max int) *Classes {
	return &Classes{seen: make(map[string]struct{}), max: max}
}

// Name returns the label value for class c.
func (cs *Classes) Name(c string) string {
	if c == "" {
		return "default"
	}
	if !utf8.ValidString(c) {
		c = strings.ToValidUTF8(c, "\uFFFD")
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if _, ok := cs.seen[c]; ok {
		return c
	}
	if len(cs.seen) >= cs.max {
		return "other"
	}
	cs.seen[c] = struct{}{}
	return c
}

// LoadResult is the result label of a load: ok, not_found, not_shared,
// panic or error.
func LoadResult(err error) string {
	var pe *herd.PanicError
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, herd.ErrNotFound):
		return "not_found"
	case errors.Is(err, herd.ErrNotShared):
		return "not_shared"
	case errors.As(err, &pe):
		return "panic"
	}
	return "error"
}
