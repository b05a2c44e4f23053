package wire

import (
	"errors"
	"strings"
	"testing"
)

// hostileKeys are user keys that a naive layout would collide, split
// across slots, or let choose a slot (the same list as herd's tests).
func hostileKeys() []string {
	return []string{
		"{", "}", "{}", "a}{b}", "b", "x{}{y}", "{user1}", "user1", ":", "a:b", "a", "b:",
		"\x00", "\r\n", "herd:{abc}:l", strings.Repeat("k", 64<<10), "é🙂", "\xff\xfe",
	}
}

func FuzzMakeKeys(f *testing.F) {
	for _, k := range hostileKeys() {
		f.Add(k, k+"x")
	}
	f.Add("a}{b}", "b")
	f.Add("x{}{y}", "x{}{y}:")
	f.Fuzz(func(t *testing.T, a, b string) {
		ka, errA := MakeKeys(DefaultPrefix, a)
		kb, errB := MakeKeys(DefaultPrefix, b)
		if (a == "") != errors.Is(errA, ErrEmptyKey) || (b == "") != errors.Is(errB, ErrEmptyKey) {
			t.Fatalf("MakeKeys(%q), MakeKeys(%q): errors %v, %v; want ErrEmptyKey exactly for empty keys", a, b, errA, errB)
		}
		if errA != nil || errB != nil {
			return
		}
		if (a == b) != (ka == kb) {
			t.Fatalf("keys %q and %q: families equal = %v, want %v", a, b, ka == kb, a == b)
		}
		again, _ := MakeKeys(DefaultPrefix, a)
		if again != ka {
			t.Fatalf("MakeKeys(%q) is not deterministic", a)
		}
		for _, name := range []string{ka.Value, ka.Lease, ka.Fence, ka.Record, ka.Channel} {
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
		tag := ka.Value[:strings.IndexByte(ka.Value, '}')+1]
		for _, name := range []string{ka.Lease, ka.Fence, ka.Record, ka.Channel} {
			if !strings.HasPrefix(name, tag) {
				t.Fatalf("name %q does not share the tag %q", name, tag)
			}
		}
	})
}

// A key family's hash tag is T, the part between the braces of every
// name: the member a tag index records.
func TestKeyFamilyHash(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"a", "{x}", "}{", "\x00\xff"} {
		keys, err := MakeKeys("p", key)
		if err != nil {
			t.Fatal(err)
		}
		if h := keys.Hash(); !IsHashTag(h) || FamilyOf("p", h) != keys {
			t.Fatalf("hash of %q = %q: not the family's tag", key, h)
		}
	}
}

// The names of one key, byte for byte: the format every process that
// shares a Redis must agree on.
func TestKeyFamilyNames(t *testing.T) {
	t.Parallel()
	k, err := MakeKeys("app", "user:1")
	if err != nil {
		t.Fatal(err)
	}
	const tag = "{q8Oke4rRi4VcaH2cosYJHucxLbVWMCGUKletqInIezQ}"
	want := KeyFamily{
		Value:   "app:" + tag + ":v",
		Lease:   "app:" + tag + ":l",
		Fence:   "app:" + tag + ":f",
		Record:  "app:" + tag + ":r",
		Backoff: "app:" + tag + ":b",
		Failed:  "app:" + tag + ":x",
		Channel: "app:" + tag + ":n",
		Writes:  "app:" + tag + ":w:",
	}
	if k != want {
		t.Fatalf("MakeKeys(app, user:1) = %+v, want %+v", k, want)
	}
}

func TestCheckPrefix(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"", "a{b", "a}", strings.Repeat("p", MaxPrefixLen+1)} {
		func() {
			defer func() {
				msg, _ := recover().(string)
				if !strings.HasPrefix(msg, "herd: ") {
					t.Errorf("CheckPrefix(%q): panic %q, want a message prefixed \"herd: \"", p, msg)
				}
			}()
			CheckPrefix(p)
		}()
	}
	CheckPrefix(DefaultPrefix)
	CheckPrefix(strings.Repeat("p", MaxPrefixLen))
}

func TestRoleOfEveryName(t *testing.T) {
	k, err := MakeKeys("p", "user:42")
	if err != nil {
		t.Fatal(err)
	}
	tk := TagKeys("p", "team:7")
	for name, want := range map[string]string{
		k.Value: RoleValue, k.Lease: RoleLease, k.Fence: RoleFence, k.Record: RoleRecord,
		k.Backoff: RoleBackoff, k.Failed: RoleFailed, k.Writes + "abc": RoleWrites,
		tk.Index: RoleTagIndex, tk.Purged: RoleTagPurged, GenKey("p"): RoleTagGen,
		k.Channel:              "", // a channel, not a stored name
		"p:near":               "",
		"other:" + k.Value[2:]: "", // another prefix
		"p:{abc}":              "",
		"p:{abc}:zz":           "",
		"p:nobrace}:v":         "",
	} {
		if got := Role("p", name); got != want {
			t.Errorf("Role(%q) = %q, want %q", name, got, want)
		}
	}
	if tk.Index[:len("p:{")] != "p:{" || TagKeys("p", "team:7") != tk || TagKeys("p", "team:8") == tk {
		t.Errorf("TagKeys is not a function of its tag: %+v", tk)
	}
}
