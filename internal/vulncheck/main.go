// Command vulncheck runs govulncheck offline for herd's CI. The machines
// CI runs on reach the Go module proxy but not the vulnerability
// database's web server, so the database is built from the OSV files of
// the golang.org/x/vulndb module (served by the proxy like any module):
//
//	vulncheck index -osv $(go env GOMODCACHE)/golang.org/x/vulndb@V/data/osv -out DIR
//	govulncheck -db file://DIR -format json ./... | vulncheck judge
//
// index writes the database layout govulncheck reads (index/db.json,
// index/modules.json, ID/<id>.json). judge reads govulncheck's JSON
// stream and fails when code of this module calls a vulnerable function
// of a dependency; advisories of the standard library come with the Go
// toolchain that runs the checks, not with the repository, and are
// listed with the Go version that fixes them, without failing.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: vulncheck index -osv DIR -out DIR | vulncheck judge < govulncheck.json")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "index":
		fs := flag.NewFlagSet("index", flag.ExitOnError)
		osv := fs.String("osv", "", "directory of the OSV files (GO-*.json)")
		out := fs.String("out", "", "directory to write the database to")
		fs.Parse(os.Args[2:])
		if *osv == "" || *out == "" {
			err = errors.New("index needs -osv and -out")
			break
		}
		err = index(*osv, *out)
	case "judge":
		var failed bool
		failed, err = judge(os.Stdin, os.Stdout)
		if err == nil && failed {
			os.Exit(3)
		}
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "vulncheck:", err)
		os.Exit(1)
	}
}

// entry is the part of an OSV record the index needs.
type entry struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	Affected []struct {
		Package struct {
			Name string `json:"name"`
		} `json:"package"`
		Ranges []struct {
			Events []struct {
				Fixed string `json:"fixed"`
			} `json:"events"`
		} `json:"ranges"`
	} `json:"affected"`
}

type moduleVuln struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	Fixed    string    `json:"fixed,omitempty"`
}

type moduleEntry struct {
	Path  string       `json:"path"`
	Vulns []moduleVuln `json:"vulns"`
}

// index builds the database in out from the OSV files in osvDir.
func index(osvDir, out string) error {
	files, err := filepath.Glob(filepath.Join(osvDir, "GO-*.json"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no GO-*.json in %s", osvDir)
	}
	for _, d := range []string{"index", "ID"} {
		if err := os.MkdirAll(filepath.Join(out, d), 0o755); err != nil {
			return err
		}
	}
	mods := map[string][]moduleVuln{}
	var newest time.Time
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var e entry
		if err := json.Unmarshal(b, &e); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if e.ID == "" {
			return fmt.Errorf("%s: no id", f)
		}
		if e.Modified.After(newest) {
			newest = e.Modified
		}
		for _, a := range e.Affected {
			v := moduleVuln{ID: e.ID, Modified: e.Modified}
			for _, r := range a.Ranges {
				for _, ev := range r.Events {
					if ev.Fixed != "" {
						v.Fixed = ev.Fixed // the last fixed event is the newest
					}
				}
			}
			mods[a.Package.Name] = append(mods[a.Package.Name], v)
		}
		if err := os.WriteFile(filepath.Join(out, "ID", e.ID+".json"), b, 0o644); err != nil {
			return err
		}
	}
	list := make([]moduleEntry, 0, len(mods))
	for p, vs := range mods {
		list = append(list, moduleEntry{Path: p, Vulns: vs})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Path < list[j].Path })
	if err := writeJSON(filepath.Join(out, "index", "modules.json"), list); err != nil {
		return err
	}
	return writeJSON(filepath.Join(out, "index", "db.json"), map[string]time.Time{"modified": newest})
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// message is one value of govulncheck's JSON stream (the parts judge
// reads).
type message struct {
	OSV *struct {
		ID      string `json:"id"`
		Summary string `json:"summary"`
	} `json:"osv"`
	Finding *struct {
		OSV          string `json:"osv"`
		FixedVersion string `json:"fixed_version"`
		Trace        []struct {
			Module   string `json:"module"`
			Version  string `json:"version"`
			Package  string `json:"package"`
			Function string `json:"function"`
		} `json:"trace"`
	} `json:"finding"`
}

// judge reads govulncheck's JSON output and reports the findings whose
// vulnerable function is called. failed is true when one of them is in a
// module other than the standard library.
func judge(r io.Reader, w io.Writer) (failed bool, err error) {
	dec := json.NewDecoder(bufio.NewReader(r))
	summary := map[string]string{}
	type called struct{ module, version, fixed, symbol string }
	found := map[string]called{}
	messages := 0
	for {
		var m message
		if err := dec.Decode(&m); err == io.EOF {
			break
		} else if err != nil {
			return false, fmt.Errorf("reading govulncheck's output: %w", err)
		}
		messages++
		if m.OSV != nil {
			summary[m.OSV.ID] = m.OSV.Summary
		}
		f := m.Finding
		if f == nil || len(f.Trace) == 0 || f.Trace[0].Function == "" {
			continue // imported or required, not called
		}
		t := f.Trace[0]
		found[f.OSV] = called{t.Module, t.Version, f.FixedVersion, t.Package + "." + t.Function}
	}
	if messages == 0 {
		return false, errors.New("govulncheck printed nothing")
	}
	ids := make([]string, 0, len(found))
	for id := range found {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var std []string
	for _, id := range ids {
		c := found[id]
		if c.module == "stdlib" || c.module == "toolchain" {
			std = append(std, fmt.Sprintf("%s (%s, fixed in %s)", id, c.symbol, c.fixed))
			continue
		}
		failed = true
		fmt.Fprintf(w, "VULNERABLE: %s in %s@%s, called: %s; fixed in %s: %s\n", id, c.module, c.version, c.symbol, c.fixed, summary[id])
	}
	if len(std) > 0 {
		fmt.Fprintf(w, "note: %d advisories of the Go standard library of this toolchain are reachable; they are fixed by a newer Go, not by this repository:\n  %s\n",
			len(std), strings.Join(std, "\n  "))
	}
	if !failed {
		fmt.Fprintln(w, "vulncheck: no called vulnerability in any dependency")
	}
	return failed, nil
}
