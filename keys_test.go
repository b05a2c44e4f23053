package herd

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func FuzzMakeKeys(f *testing.F) {
	for _, k := range hostileKeys() {
		f.Add(k, k+"x")
	}
	f.Add("a}{b}", "b")
	f.Add("x{}{y}", "x{}{y}:")
	f.Fuzz(func(t *testing.T, a, b string) {
		ka, errA := makeKeys(DefaultPrefix, a)
		kb, errB := makeKeys(DefaultPrefix, b)
		if (a == "") != errors.Is(errA, ErrInvalidKey) || (b == "") != errors.Is(errB, ErrInvalidKey) {
			t.Fatalf("makeKeys(%q), makeKeys(%q): errors %v, %v; want ErrInvalidKey exactly for empty keys", a, b, errA, errB)
		}
		if errA != nil || errB != nil {
			return
		}
		if (a == b) != (ka == kb) {
			t.Fatalf("keys %q and %q: families equal = %v, want %v", a, b, ka == kb, a == b)
		}
		again, _ := makeKeys(DefaultPrefix, a)
		if again != ka {
			t.Fatalf("makeKeys(%q) is not deterministic", a)
		}
		for _, name := range []string{ka.value, ka.lease, ka.fence, ka.record, ka.channel} {
			// herd:{<43 bytes>}:<role>
			if len(name) != len(DefaultPrefix)+2+43+2+1 {
				t.Fatalf("name %q has length %d, want a fixed length", name, len(name))
			}
			if !strings.HasPrefix(name, DefaultPrefix+":{") || strings.Count(name, "{") != 1 || strings.Count(name, "}") != 1 {
				t.Fatalf("name %q: want exactly the library's one hash tag", name)
			}
			if len(a) >= 8 && strings.Contains(name, a) {
				t.Fatalf("name %q contains the raw key %q", name, a)
			}
		}
		tag := ka.value[:strings.IndexByte(ka.value, '}')+1]
		for _, name := range []string{ka.lease, ka.fence, ka.record, ka.channel} {
			if !strings.HasPrefix(name, tag) {
				t.Fatalf("name %q does not share the tag %q", name, tag)
			}
		}
	})
}

func TestOptionsPanic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opt  LockerOptions
	}{
		{"prefix with {", LockerOptions{Prefix: "a{b"}},
		{"prefix with }", LockerOptions{Prefix: "a}"}},
		{"long prefix", LockerOptions{Prefix: strings.Repeat("p", 65)}},
		{"negative MaxWait", LockerOptions{MaxWait: -time.Second}},
		{"negative PollMin", LockerOptions{PollMin: -time.Second}},
		{"PollMax below PollMin", LockerOptions{PollMin: time.Second, PollMax: time.Millisecond}},
		{"negative FenceTTL", LockerOptions{FenceTTL: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil {
					t.Fatal("no panic")
				}
				if msg, _ := r.(string); !strings.HasPrefix(msg, "herd: ") {
					t.Errorf("panic %v, want a message prefixed \"herd: \"", r)
				}
			}()
			tc.opt.resolve()
		})
	}
	var nilOpt *LockerOptions
	if c := nilOpt.resolve(); c.prefix != DefaultPrefix || c.pollMin <= 0 || c.fenceTTL <= 0 {
		t.Errorf("nil options resolved to %+v, want the defaults", c)
	}
}

// A key family's hash tag is T, the part between the braces of every
// name: the member a tag index records.
func TestKeyFamilyHash(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"a", "{x}", "}{", "\x00\xff"} {
		keys, err := makeKeys("p", key)
		if err != nil {
			t.Fatal(err)
		}
		if h := keys.hash(); !isHashTag(h) || familyOf("p", h) != keys {
			t.Fatalf("hash of %q = %q: not the family's tag", key, h)
		}
	}
}
