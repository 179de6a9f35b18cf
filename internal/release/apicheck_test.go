package release_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/testenv"
)

const (
	apicheck  = "../../.ci/apicheck"
	retryPath = "github.com/postbox-events/postbox/retry"
)

// apidiff returns an apidiff binary: APIDIFF (.ci/run sets it), else the
// one .ci/apicheck installs from the Go module proxy.
func apidiff(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("APIDIFF"); bin != "" {
		return bin
	}
	out, err := exec.Command("bash", apicheck, "--install", t.TempDir()).Output()
	if err != nil {
		testenv.Skip(t, "no apidiff: set APIDIFF, or let .ci/apicheck --install get it from the Go module proxy: "+err.Error())
	}
	return strings.TrimSpace(string(out))
}

// brokenRetry writes the export data of a retry package that had three
// declarations today's lacks: a function, a type and a method.
func brokenRetry(t *testing.T, apidiff, file string) {
	t.Helper()
	mod := t.TempDir()
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte("module github.com/postbox-events/postbox\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := filepath.Glob("../../retry/*.go")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(mod, "retry"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range src {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f) == "outcome.go" {
			b = append(b, "\nfunc Gone() {}\n\ntype Shape struct{ Old int }\n\nfunc (e *PermanentError) Old() {}\n"...)
		}
		if err := os.WriteFile(filepath.Join(mod, "retry", filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(apidiff, "-w", file, retryPath)
	cmd.Dir = mod
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("apidiff -w: %v\n%s", err, out)
	}
}

// TestAPICheck runs .ci/apicheck on the retry package against a release
// whose retry had a function, a type and a method since removed: it fails
// naming each, unless CHANGELOG's Unreleased Breaking names them; against
// the committed 0.1.0 it passes.
func TestAPICheck(t *testing.T) {
	bin := apidiff(t)
	broken := t.TempDir()
	brokenRetry(t, bin, filepath.Join(broken, "retry.export"))
	released := t.TempDir()
	b, err := os.ReadFile("../../testdata/apidiff/0.1.0/retry.export")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{broken, released} {
		if err := os.WriteFile(filepath.Join(dir, "packages"), []byte(retryPath+" retry\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(released, "retry.export"), b, 0o644); err != nil {
		t.Fatal(err)
	}

	const (
		header   = "# Changelog\n\n## Unreleased\n\n"
		allNamed = "### Breaking\n- `retry.Gone`, `retry.Shape` and `retry.PermanentError.Old` are gone.\n"
	)
	for _, tc := range []struct {
		name, base, changelog string
		ok                    bool
		want                  []string // in the output
	}{
		{"the release", released, header, true, []string{"ok: 1 packages compatible"}},
		{"broken, nothing named", broken, header, false, []string{"retry.Gone: removed", "retry.Shape: removed", "retry.PermanentError.Old: removed", "does not name retry.Gone"}},
		{"broken, all named", broken, header + allNamed, true, []string{"retry.Gone: removed (named under Breaking)", "but for 3 change(s) named"}},
		{"a method named by its type", broken, header + "### Breaking\n- `retry.Gone` and `retry.Shape` are gone; `retry.PermanentError` lost Old.\n", true, nil},
		{"one not named", broken, header + "### Breaking\n- `retry.Gone` and `retry.PermanentError.Old` are gone.\n", false, []string{"does not name retry.Shape"}},
		{"a longer name is not the name", broken, header + "### Breaking\n- `retry.GoneAway`, `retry.Shapes`, `retry.PermanentError.Older`.\n", false, []string{"does not name retry.Gone", "does not name retry.Shape", "does not name retry.PermanentError.Old"}},
		{"named under Added", broken, header + "### Added\n" + allNamed[len("### Breaking\n"):], false, []string{"does not name retry.Gone"}},
		{"named under a released version", broken, header + "## 0.1.0 - 2026-11-29\n\n" + allNamed, false, []string{"does not name retry.Gone"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changelog := filepath.Join(t.TempDir(), "CHANGELOG.md")
			if err := os.WriteFile(changelog, []byte(tc.changelog), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("bash", apicheck)
			cmd.Env = append(os.Environ(), "APIDIFF="+bin, "APICHECK_BASE="+tc.base, "APICHECK_CHANGELOG="+changelog)
			out, err := cmd.CombinedOutput()
			if (err == nil) != tc.ok {
				t.Errorf("apicheck: %v, want ok %v:\n%s", err, tc.ok, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("apicheck's output does not say %q:\n%s", w, out)
				}
			}
		})
	}
}
