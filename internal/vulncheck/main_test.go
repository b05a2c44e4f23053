package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestJudge(t *testing.T) {
	const dep = `{"osv":{"id":"GO-1","summary":"bad"}}
{"finding":{"osv":"GO-1","fixed_version":"v1.2.0","trace":[{"module":"example.com/m","version":"v1.1.0","package":"example.com/m/p","function":"F"},{"module":"github.com/herdkit/herd","package":"github.com/herdkit/herd","function":"G"}]}}`
	const std = `{"finding":{"osv":"GO-2","fixed_version":"v1.26.9","trace":[{"module":"stdlib","version":"v1.26.8","package":"net/http","function":"Get"}]}}`
	const imported = `{"finding":{"osv":"GO-3","trace":[{"module":"example.com/m","version":"v1.1.0","package":"example.com/m/p"}]}}`
	for _, tc := range []struct {
		name, in string
		failed   bool
		says     string
	}{
		{"called dependency", dep + "\n" + std, true, "VULNERABLE: GO-1 in example.com/m@v1.1.0"},
		{"standard library only", std, false, "GO-2 (net/http.Get, fixed in v1.26.9)"},
		{"imported, not called", imported, false, "no called vulnerability"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			failed, err := judge(strings.NewReader(tc.in), &out)
			if err != nil || failed != tc.failed || !strings.Contains(out.String(), tc.says) {
				t.Fatalf("judge = %v, %v; output %q; want failed %v and %q", failed, err, out.String(), tc.failed, tc.says)
			}
		})
	}
	if _, err := judge(strings.NewReader(""), &strings.Builder{}); err == nil {
		t.Error("judge of an empty stream: no error (a govulncheck that printed nothing must not pass)")
	}
}

func TestIndex(t *testing.T) {
	osv, out := t.TempDir(), t.TempDir()
	rec := `{"id":"GO-2026-0001","modified":"2026-11-01T00:00:00Z","affected":[{"package":{"name":"example.com/m"},"ranges":[{"type":"SEMVER","events":[{"introduced":"0"},{"fixed":"1.2.0"}]}]}]}`
	if err := os.WriteFile(filepath.Join(osv, "GO-2026-0001.json"), []byte(rec), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := index(osv, out); err != nil {
		t.Fatal(err)
	}
	var mods []moduleEntry
	b, err := os.ReadFile(filepath.Join(out, "index", "modules.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &mods); err != nil {
		t.Fatal(err)
	}
	if len(mods) != 1 || mods[0].Path != "example.com/m" || len(mods[0].Vulns) != 1 || mods[0].Vulns[0].Fixed != "1.2.0" {
		t.Fatalf("modules.json = %s", b)
	}
	if got, err := os.ReadFile(filepath.Join(out, "ID", "GO-2026-0001.json")); err != nil || string(got) != rec {
		t.Fatalf("ID file = %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(out, "index", "db.json")); err != nil {
		t.Fatal(err)
	}
	if err := index(t.TempDir(), t.TempDir()); err == nil {
		t.Error("index of an empty directory: no error")
	}
}
