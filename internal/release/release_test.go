// Package release holds the tests of .ci/release, the script that tags
// the core module and the nested modules (RELEASING.md). Each test runs
// the script in a repository of its own in a temporary directory: none
// depends on a tag of this repository, and none can push anywhere.
package release

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// script is the release script, from this package's directory.
const script = "../../.ci/release"

// gitEnv makes git in the test repositories independent of the user's
// configuration, with an identity for the commits and annotated tags.
var gitEnv = []string{
	"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
	"GIT_AUTHOR_NAME=release test", "GIT_AUTHOR_EMAIL=test@example.invalid",
	"GIT_COMMITTER_NAME=release test", "GIT_COMMITTER_EMAIL=test@example.invalid",
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), gitEnv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// release runs the repository's copy of the script in dir with args, and
// returns its output (stdout and stderr) and exit status.
func release(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(dir, ".ci", "release"), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), gitEnv...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), 0
}

// writeFiles writes files (path: content) under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeRepo makes a committed repository shaped like herd's: a core
// module, nested modules a and lock/b (b requires a and the core, at
// version), and lock/bench, which is not released and requires a version
// that exists nowhere. It has the script and no tag.
func fakeRepo(t *testing.T, version string) string {
	t.Helper()
	dir := t.TempDir()
	src, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	const core = "github.com/herdkit/herd"
	writeFiles(t, dir, map[string]string{
		"go.mod":   "module " + core + "\n\ngo 1.26.0\n",
		"a/go.mod": "module " + core + "/a\n\ngo 1.26.0\n\nrequire " + core + " " + version + "\n\nreplace " + core + " => ..\n",
		"lock/b/go.mod": "module " + core + "/lock/b\n\ngo 1.26.0\n\nrequire (\n\t" + core + " " + version + "\n\t" + core + "/a " + version +
			"\n\texample.com/other v1.2.3\n)\n\nreplace " + core + " => ../..\n",
		"lock/bench/go.mod": "module " + core + "/lock/bench\n\ngo 1.26.0\n\nrequire " + core + "/lock/b v9.9.9\n",
	})
	if err := os.MkdirAll(filepath.Join(dir, ".ci"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".ci", "release"), src, 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "init", "-q", "-b", "main")
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "fake herd")
	return dir
}

// planned returns the tags a run's output says it makes, in its order.
func planned(out string) []string {
	var tags []string
	for _, m := range regexp.MustCompile(`git tag -a (\S+)`).FindAllStringSubmatch(out, -1) {
		tags = append(tags, m[1])
	}
	return tags
}

// TestDryRunPlansEveryModuleInOrder: a dry run of a clean repository
// whose nested modules require the version being released lists one tag
// per released module, the core first and each module after those it
// requires, skips lock/bench, creates no tag and pushes nothing.
func TestDryRunPlansEveryModuleInOrder(t *testing.T) {
	dir := fakeRepo(t, "v1.4.0")
	out, code := release(t, dir, "--dry-run", "v1.4.0")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if got, want := strings.Join(planned(out), " "), "v1.4.0 a/v1.4.0 lock/b/v1.4.0"; got != want {
		t.Errorf("planned tags %q, want %q\n%s", got, want, out)
	}
	if !strings.Contains(out, "not pushed") || strings.Contains(out, "would run: git push") {
		t.Errorf("a dry run without --push must say it does not push:\n%s", out)
	}
	if tags := git(t, dir, "tag", "-l"); tags != "" {
		t.Errorf("a dry run created tags: %q", tags)
	}
}

// TestReleaseTagsWithoutPushing: a real run makes annotated tags at HEAD
// in the planned order and, without --push, pushes nothing (the
// repository has no remote: a push would fail the run).
func TestReleaseTagsWithoutPushing(t *testing.T) {
	dir := fakeRepo(t, "v0.3.0")
	out, code := release(t, dir, "v0.3.0")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	head := strings.TrimSpace(git(t, dir, "rev-parse", "HEAD"))
	for _, tag := range []string{"v0.3.0", "a/v0.3.0", "lock/b/v0.3.0"} {
		if got := strings.TrimSpace(git(t, dir, "rev-parse", tag+"^{commit}")); got != head {
			t.Errorf("%s is at %s, want HEAD %s", tag, got, head)
		}
		if kind := strings.TrimSpace(git(t, dir, "cat-file", "-t", tag)); kind != "tag" {
			t.Errorf("%s is a %s, want an annotated tag", tag, kind)
		}
	}
	if !strings.Contains(out, "git push --atomic origin v0.3.0 a/v0.3.0 lock/b/v0.3.0") {
		t.Errorf("the output does not give the push command:\n%s", out)
	}
	// Releasing the same version again is refused: its tags exist.
	if out, code := release(t, dir, "--dry-run", "v0.3.0"); code != 1 || !strings.Contains(out, "tag v0.3.0 exists already") {
		t.Errorf("a second release of v0.3.0: exit %d:\n%s", code, out)
	}
}

// TestDirtyTreeRefused: a changed or untracked file stops the release,
// in a dry run too, and no tag is made.
func TestDirtyTreeRefused(t *testing.T) {
	for name, change := range map[string]func(dir string){
		"changed": func(dir string) {
			writeFiles(t, dir, map[string]string{"go.mod": "module github.com/herdkit/herd\n\ngo 1.26.1\n"})
		},
		"untracked": func(dir string) { writeFiles(t, dir, map[string]string{"notes.txt": "x"}) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := fakeRepo(t, "v0.3.0")
			change(dir)
			for _, args := range [][]string{{"--dry-run", "v0.3.0"}, {"v0.3.0"}} {
				out, code := release(t, dir, args...)
				if code != 1 || !strings.Contains(out, "the working tree is not clean") {
					t.Errorf("release %q: exit %d, want 1 naming the dirty tree:\n%s", args, code, out)
				}
			}
			if tags := git(t, dir, "tag", "-l"); tags != "" {
				t.Errorf("tags made from a dirty tree: %q", tags)
			}
		})
	}
}

// TestRequirementOfAMissingVersionRefused: a nested module that requires
// a herd version with no tag (and not the one being released) stops the
// release with the command that fixes it; once that version's tag exists,
// the release goes ahead.
func TestRequirementOfAMissingVersionRefused(t *testing.T) {
	dir := fakeRepo(t, "v0.3.0")
	out, code := release(t, dir, "--dry-run", "v0.4.0")
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	for _, want := range []string{
		"a requires github.com/herdkit/herd v0.3.0, which has no tag v0.3.0 here",
		"lock/b requires github.com/herdkit/herd/a v0.3.0, which has no tag a/v0.3.0 here",
		"go mod edit -require=github.com/herdkit/herd@v0.4.0",
		"nothing tagged",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "lock/bench") {
		t.Errorf("lock/bench is not released, and its requirements are not checked:\n%s", out)
	}
	git(t, dir, "tag", "v0.3.0")
	git(t, dir, "tag", "a/v0.3.0")
	if out, code := release(t, dir, "--dry-run", "v0.4.0"); code != 0 {
		t.Errorf("with v0.3.0 tagged: exit %d:\n%s", code, out)
	}
}

// TestBadArguments: no version, a version that is not vX.Y.Z, a major
// version of 2 (which needs /v2 module paths), and --dry-run with --push
// are usage errors (exit 2); -h prints the script's help.
func TestBadArguments(t *testing.T) {
	dir := fakeRepo(t, "v0.3.0")
	for _, args := range [][]string{nil, {"0.3.0"}, {"v0.3"}, {"v2.0.0"}, {"--dry-run", "--push", "v0.3.0"}, {"--bogus", "v0.3.0"}} {
		if out, code := release(t, dir, args...); code != 2 {
			t.Errorf("release %q: exit %d, want 2:\n%s", args, code, out)
		}
	}
	if out, code := release(t, dir, "-h"); code != 0 || !strings.Contains(out, "--dry-run") {
		t.Errorf("release -h: exit %d:\n%s", code, out)
	}
}

// TestThisRepositoryIsReleasable: in a clone of this repository's HEAD,
// with every tag removed, a dry run of the version the nested modules
// require of the core succeeds and plans a tag for the core and for each
// nested module but lock/bench, the core first and lock/postgres before
// the modules that require it (lock/etcd, lock/zookeeper).
func TestThisRepositoryIsReleasable(t *testing.T) {
	root := strings.TrimSpace(git(t, ".", "rev-parse", "--show-toplevel"))
	dir := filepath.Join(t.TempDir(), "clone")
	git(t, ".", "clone", "-q", "--no-checkout", root, dir)
	git(t, dir, "checkout", "-q", strings.TrimSpace(git(t, root, "rev-parse", "HEAD")))
	if tags := strings.Fields(git(t, dir, "tag", "-l")); len(tags) > 0 {
		git(t, dir, append([]string{"tag", "-d"}, tags...)...)
	}
	mod, err := os.ReadFile(filepath.Join(dir, "otel", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?github\.com/herdkit/herd (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatalf("otel/go.mod names no version of the core:\n%s", mod)
	}
	version := string(m[1])
	out, code := release(t, dir, "--dry-run", version)
	if code != 0 {
		t.Fatalf("dry run of %s: exit %d:\n%s", version, code, out)
	}
	tags := planned(out)
	pos := map[string]int{}
	for i, tag := range tags {
		pos[strings.TrimSuffix(tag, version)] = i + 1
	}
	var mods []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "go.mod" {
			if rel, _ := filepath.Rel(dir, filepath.Dir(p)); rel != "." {
				mods = append(mods, rel+"/")
			}
		}
		return nil
	})
	for _, m := range mods {
		if (pos[m] != 0) == (m == "lock/bench/") {
			t.Errorf("nested module %s: planned %v, want every nested module but lock/bench\n%s", m, pos[m] != 0, out)
		}
	}
	if pos[""] != 1 {
		t.Errorf("the core's tag %s is not first: %v", version, tags)
	}
	for _, m := range []string{"lock/etcd/", "lock/zookeeper/"} {
		if pos[m] != 0 && pos[m] < pos["lock/postgres/"] {
			t.Errorf("%s is tagged before lock/postgres, which it requires: %v", m, tags)
		}
	}
}
