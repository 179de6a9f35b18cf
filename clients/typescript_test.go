package clients_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/testenv"
)

// TestTypeScript runs the TypeScript client's own tests (npm test in
// clients/typescript: tsc over its types, then node --test) from go test,
// with the environment passed through: POSTBOX_TEST_POSTGRES for the
// tests that need PostgreSQL, POSTBOX_REQUIRE_SERVICES to forbid their
// skipping, and POSTBOX_BIN, the postbox binary built here once when it
// is not set. It runs npm ci first when node_modules is missing.
func TestTypeScript(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Skip(t, "node is not installed; the TypeScript client's tests need Node.js 20 or later and npm")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		testenv.Skip(t, "npm is not installed; the TypeScript client's tests need Node.js 20 or later and npm")
	}
	if v, err := exec.Command(node, "--version").Output(); err != nil || tsNodeMajor(string(v)) < 20 {
		testenv.Skip(t, "the TypeScript client's tests need Node.js 20 or later, not "+strings.TrimSpace(string(v)))
	}
	dir, err := filepath.Abs("typescript")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund", "--prefer-offline")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(filepath.Join(dir, "node_modules")) // a half install would be taken for a whole one next time
			testenv.Skip(t, "npm ci in clients/typescript failed (is the npm registry reachable?): "+err.Error()+"\n"+tsTail(out))
		}
	}
	bin := os.Getenv("POSTBOX_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "postbox")
		build := exec.Command("go", "build", "-o", bin, "./cmd/postbox")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/postbox: %v\n%s", err, out)
		}
	}
	cmd := exec.Command(npm, "test")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "POSTBOX_BIN="+bin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("npm test in clients/typescript: %v\n%s", err, out)
	}
	if testing.Verbose() {
		t.Logf("npm test:\n%s", out)
	}
	if m := regexp.MustCompile(`(?m)^# skipped (\d+)`).FindSubmatch(out); m != nil && string(m[1]) != "0" {
		t.Logf("npm test skipped %s tests (POSTBOX_TEST_POSTGRES unset?):\n%s", m[1], tsSkips(out))
	}
}

// tsNodeMajor is the major version of node --version's "v20.11.0".
func tsNodeMajor(v string) int {
	major, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(v), "v"), ".")
	n, _ := strconv.Atoi(major)
	return n
}

// tsTail is the end of a command's output.
func tsTail(out []byte) string {
	if len(out) > 2000 {
		out = out[len(out)-2000:]
	}
	return string(out)
}

// tsSkips is the lines of node --test's output that say why a test skipped.
func tsSkips(out []byte) string {
	var b strings.Builder
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "# SKIP") {
			b.WriteString(strings.TrimSpace(l) + "\n")
		}
	}
	return b.String()
}
