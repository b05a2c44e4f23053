package readmecheck

// TestREADMESnippets compiles every ```go block of README.md,
// CONTRIBUTING.md and docs/*.md against this repository and vets it.
//
// Each block is preceded, on the lines just before its fence, by an HTML
// comment (invisible when the README is rendered) that says what it is:
//
//	<!-- snippet file -->
//
// the block is a whole Go file, package clause and imports included (the
// only kind the documentation uses: a reader sees every import and every
// declaration a snippet needs); or
//
//	<!-- snippet func(ctx context.Context) error
//	var db interface{ LoadUser(context.Context, int) (User, error) }
//	type User struct{ Name string }
//	-->
//
// the block is the body of a function with that signature, and the lines
// after the first, up to "-->", are declarations it needs (what the prose
// takes as given: a client, a handler, a database). A declaration line
// "import ..." adds an import. Every body is compiled with the imports in
// snippetImports, so a snippet need not repeat them; an unused one is
// fine. A ```go block without a marker fails the test.
//
// Each snippet becomes a package of a temporary module that requires this
// one through a replace directive, with this module's requirements and
// go.sum, and `go build ./...` and `go vet ./...` must pass. The nested
// modules of the repository (a directory below the root with a go.mod of
// its own, such as lock/postgres) are required the same way, each
// replaced by its directory and with its go.sum, so a snippet may import
// them with an "import ..." declaration line. Errors point at README.md's
// lines (//line directives).

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// snippetImports are the imports every function-body snippet is compiled
// with, each with a use of its own so that none is unused.
var snippetImports = []struct{ name, path, use string }{
	{"", "context", "context.Background"},
	{"", "errors", "errors.New"},
	{"", "fmt", "fmt.Sprint"},
	{"", "log", "log.Printf"},
	{"", "net/http", "http.NewServeMux"},
	{"", "strings", "strings.SplitN"},
	{"", "time", "time.Now"},
	{"", "github.com/herdkit/herd", "herd.New"},
	{"", "github.com/herdkit/herd/middleware", "middleware.New"},
	{"herdprom", "github.com/herdkit/herd/prometheus", "herdprom.NewObserver"},
	{"", "github.com/prometheus/client_golang/prometheus", "prometheus.NewRegistry"},
	{"", "github.com/redis/go-redis/v9", "redis.NewClient"},
	{"", "github.com/go-chi/chi/v5", "chi.NewRouter"},
	{"chimw", "github.com/go-chi/chi/v5/middleware", "chimw.Recoverer"},
}

// snippet is one ```go block of the README.
type snippet struct {
	file  string   // the Markdown file, relative to the repository
	line  int      // line of the block's first code line in file
	code  []string // the block's lines
	kind  string   // "file", or the function signature of a body
	decls []string // the marker's declaration lines
}

var markerStart = regexp.MustCompile(`^<!--\s*snippet\s+(.*?)\s*(-->)?\s*$`)

// parseREADME returns the ```go blocks of the Markdown file at path (name
// is how errors name it), each with its marker.
func parseREADME(path, name string) ([]snippet, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var out []snippet
	var errs []string
	for i := 0; i < len(lines); i++ {
		fence := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(fence, "```") {
			continue
		}
		info := strings.TrimSpace(strings.TrimPrefix(fence, "```"))
		end := i + 1
		for end < len(lines) && strings.TrimSpace(lines[end]) != "```" {
			end++
		}
		if end == len(lines) {
			return nil, fmt.Errorf("%s:%d: unterminated code block", name, i+1)
		}
		if info == "go" {
			s := snippet{file: name, line: i + 2, code: lines[i+1 : end]}
			if err := s.readMarker(lines, i); err != nil {
				errs = append(errs, err.Error())
			} else {
				out = append(out, s)
			}
		}
		i = end
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return out, nil
}

// readMarker reads the marker that ends on the line before the fence at
// lines[fence].
func (s *snippet) readMarker(lines []string, fence int) error {
	last := fence - 1
	if last < 0 || !strings.HasSuffix(strings.TrimSpace(lines[last]), "-->") {
		return fmt.Errorf("%s:%d: a ```go block without a <!-- snippet ... --> marker on the line before it", s.file, fence+1)
	}
	first := last
	for first >= 0 && !strings.HasPrefix(strings.TrimSpace(lines[first]), "<!--") {
		first--
	}
	if first < 0 {
		return fmt.Errorf("%s:%d: a ```go block without a <!-- snippet ... --> marker on the line before it", s.file, fence+1)
	}
	m := markerStart.FindStringSubmatch(strings.TrimSpace(lines[first]))
	if m == nil {
		return fmt.Errorf("%s:%d: the comment before a ```go block is not a <!-- snippet ... --> marker", s.file, first+1)
	}
	s.kind = m[1]
	if first != last {
		if m[2] != "" {
			return fmt.Errorf("%s:%d: the marker ends on its first line, but the comment goes on", s.file, first+1)
		}
		s.decls = lines[first+1 : last]
		if rest := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(lines[last]), "-->")); rest != "" {
			s.decls = append(s.decls, rest)
		}
	}
	switch {
	case s.kind == "file":
		if len(s.decls) > 0 {
			return fmt.Errorf("%s:%d: a file snippet takes no declarations", s.file, first+1)
		}
	case strings.HasPrefix(s.kind, "func("):
	default:
		return fmt.Errorf("%s:%d: snippet kind %q: want file or a function signature func(...)", s.file, first+1, s.kind)
	}
	return nil
}

// source is the Go file the snippet compiles as.
func (s snippet) source() string {
	if s.kind == "file" {
		return fmt.Sprintf("//line %s:%d\n%s\n", s.file, s.line, strings.Join(s.code, "\n"))
	}
	var b strings.Builder
	b.WriteString("package snippet\n\nimport (\n")
	var decls []string
	for _, d := range s.decls {
		if imp, ok := strings.CutPrefix(strings.TrimSpace(d), "import "); ok {
			fmt.Fprintf(&b, "\t%s\n", imp)
			continue
		}
		decls = append(decls, d)
	}
	for _, imp := range snippetImports {
		fmt.Fprintf(&b, "\t%s %q\n", imp.name, imp.path)
	}
	b.WriteString(")\n\n")
	for _, imp := range snippetImports {
		fmt.Fprintf(&b, "var _ = %s\n", imp.use)
	}
	b.WriteString("\n")
	b.WriteString(strings.Join(decls, "\n"))
	fmt.Fprintf(&b, "\n\nfunc snippet%s {\n//line %s:%d\n%s\n}\n", strings.TrimPrefix(s.kind, "func"), s.file, s.line, strings.Join(s.code, "\n"))
	return b.String()
}

func TestREADMESnippets(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var snippets []snippet
	for _, path := range append([]string{filepath.Join(root, "README.md"), filepath.Join(root, "CONTRIBUTING.md")}, docs...) {
		name, _ := filepath.Rel(root, path)
		ss, err := parseREADME(path, name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "README.md" && len(ss) == 0 {
			t.Fatal("no ```go block in README.md")
		}
		for _, s := range ss {
			if s.kind != "file" {
				t.Errorf("%s:%d: a snippet marked %q: the documentation's snippets are whole files (<!-- snippet file -->), so that a reader sees their imports and declarations", s.file, s.line, s.kind)
			}
		}
		snippets = append(snippets, ss...)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to build the snippets: %v", err)
	}

	dir := t.TempDir()
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	// This module's go directive and requirements, with it replaced by
	// the working tree.
	body, ok := strings.CutPrefix(string(mod), "module github.com/herdkit/herd\n")
	if !ok {
		t.Fatalf("go.mod does not start with the module line")
	}
	gomod := "module readmecheck\n" + body +
		"\nrequire github.com/herdkit/herd v0.0.0-00010101000000-000000000000\n" +
		"\nreplace github.com/herdkit/herd => " + root + "\n"
	nested, err := nestedModules(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range nested {
		gomod += "\nrequire " + m.path + " v0.0.0-00010101000000-000000000000\n" +
			"\nreplace " + m.path + " => " + m.dir + "\n"
		sum = append(sum, m.sum...)
	}
	writeFile(t, filepath.Join(dir, "go.mod"), gomod)
	writeFile(t, filepath.Join(dir, "go.sum"), string(sum))
	for i, s := range snippets {
		writeFile(t, filepath.Join(dir, fmt.Sprintf("s%02d", i), "snippet.go"), s.source())
	}

	for _, args := range [][]string{{"build", "./..."}, {"vet", "./..."}} {
		cmd := exec.Command(goBin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("go %s of the %d documentation snippets: %v\n%s", strings.Join(args, " "), len(snippets), err, out)
		}
	}
	if t.Failed() {
		for i, s := range snippets {
			t.Logf("s%02d (%s:%d):\n%s", i, s.file, s.line, s.source())
		}
	}
}

// module is a nested module of the repository.
type module struct {
	path string // its module path
	dir  string // its directory
	sum  []byte // its go.sum
}

// nestedModules returns the modules in directories below root, skipping
// hidden directories and testdata.
func nestedModules(root string) ([]module, error) {
	var mods []module
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || d.Name() != "go.mod" || filepath.Dir(path) == root {
			return nil
		}
		mod, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		first, _, _ := strings.Cut(string(mod), "\n")
		modPath, ok := strings.CutPrefix(strings.TrimSpace(first), "module ")
		if !ok {
			return fmt.Errorf("%s does not start with the module line", path)
		}
		sum, err := os.ReadFile(filepath.Join(filepath.Dir(path), "go.sum"))
		if err != nil && !os.IsNotExist(err) {
			return err
		}
		mods = append(mods, module{path: strings.TrimSpace(modPath), dir: filepath.Dir(path), sum: sum})
		return nil
	})
	return mods, err
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestREADMEGivesCITestCommand: the test command the README gives is the
// one .ci/run runs (the line after its "the README's test command" step).
func TestREADMEGivesCITestCommand(t *testing.T) {
	root := filepath.Join("..", "..")
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(ci), "step \"tests (the README's test command)\"\n")
	if !ok {
		t.Fatal(".ci/run has no step \"tests (the README's test command)\"")
	}
	cmd, _, _ := strings.Cut(after, "\n")
	cmd, _, _ = strings.Cut(cmd, " || ") // .ci/run keeps the exit code
	cmd = strings.TrimSpace(cmd)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "\n"+cmd+" ") && !strings.Contains(string(readme), "\n"+cmd+"\n") {
		t.Errorf("README.md does not give .ci/run's test command %q on a line of its own", cmd)
	}
}
