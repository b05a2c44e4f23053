package observe

import (
	"errors"
	"fmt"
	"testing"

	"github.com/herdkit/herd"
)

func TestClassesAreBoundedAndValidUTF8(t *testing.T) {
	cs := NewClasses(2)
	for _, c := range []struct{ in, want string }{
		{"", "default"},
		{"users", "users"},
		{"a\xffb", "a\uFFFDb"},
		{"orders", "other"}, // the third distinct class
		{"users", "users"},  // a class seen before keeps its name
	} {
		if got := cs.Name(c.in); got != c.want {
			t.Errorf("Name(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestLoadResultNamesEachKindOfLoad(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{fmt.Errorf("user 7: %w", herd.ErrNotFound), "not_found"},
		{herd.ErrNotShared, "not_shared"},
		{&herd.LoadError{Err: &herd.PanicError{Value: "boom"}}, "panic"},
		{errors.New("db down"), "error"},
	} {
		if got := LoadResult(c.err); got != c.want {
			t.Errorf("LoadResult(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
