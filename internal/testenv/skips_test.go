package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestSummary(t *testing.T) {
	for state, want := range map[string]string{
		"":                     "",
		"POSTBOX_TEST_REDIS\n": "postbox: 1 test skipped for want of a service; set POSTBOX_TEST_REDIS (1) to run them (README, Development)",
		"POSTBOX_TEST_REDIS\nPOSTBOX_TEST_POSTGRES\nPOSTBOX_TEST_REDIS\n": "postbox: 3 tests skipped for want of a service; " +
			"set POSTBOX_TEST_POSTGRES (1), POSTBOX_TEST_REDIS (2) to run them (README, Development)",
	} {
		if got := summary(state); got != want {
			t.Errorf("summary(%q) = %q, want %q", state, got, want)
		}
	}
}

// TestGoTestPrintsOneSkipLine runs go test on two packages whose tests
// need services, without them: its output ends with one line counting
// the skips of both and naming the variables, and go test -json gets no
// such line.
func TestGoTestPrintsOneSkipLine(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test")
	}
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	run := func(args ...string) string {
		cmd := exec.Command(gotool, append([]string{"test", "-count=1"}, args...)...)
		cmd.Dir = filepath.Join("testdata", "skipper")
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "POSTBOX_TEST_") && !strings.HasPrefix(kv, "POSTBOX_REQUIRE_SERVICES=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go test %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	out := run("./a", "./b")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := "postbox: 5 tests skipped for want of a service; set POSTBOX_TEST_NATS (1), POSTBOX_TEST_POSTGRES (3), POSTBOX_TEST_REDIS (1) to run them (README, Development)"
	if last := lines[len(lines)-1]; last != want || strings.Count(out, "postbox: ") != 1 {
		t.Errorf("go test output:\n%s\nwant it to end with the one line\n%s", out, want)
	}
	if out := run("-json", "./a"); strings.Contains(out, "for want of a service;") {
		t.Errorf("go test -json got the line:\n%s", out)
	}
}
