package main_test

import (
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// run runs the binary and returns its combined output and exit code.
func run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(binary, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatal(err)
	return "", -1
}

func TestHelpOnEveryCommand(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"serve", "--help"}, {"agent", "--help"}, {"send", "--help"},
		{"outbox", "--help"}, {"outbox", "list", "--help"}, {"outbox", "requeue", "--help"}, {"bench", "--help"},
	} {
		out, code := run(t, args...)
		if code != 0 || !strings.Contains(out, "Usage: postbox") {
			t.Errorf("postbox %s: exit %d, output:\n%s", strings.Join(args, " "), code, out)
		}
	}
}

func TestBadInvocations(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "no command"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"serve", "--max-batch", "0"}, 2, "max-batch"},
		{[]string{"serve", "--log-format", "xml"}, 2, "log format"},
		{[]string{"agent", "--outbox", filepath.Join(dir, "o.db")}, 2, "--server and --device-id are required"},
		{[]string{"send", "--type", "t", "--payload", "[1]"}, 2, "--payload must be a JSON object"},
		{[]string{"send", "--type", "t", "--payload", "{}", "--agent", "http://127.0.0.1:1"}, 1, "is the agent running?"},
		{[]string{"outbox", "list", "--outbox", filepath.Join(dir, "missing.db")}, 1, "no such file"},
		{[]string{"outbox", "list", "--state", "odd", "--outbox", "x"}, 2, "--state must be"},
		{[]string{"outbox", "requeue", "--outbox", "x"}, 2, "name event ids or pass --all"},
	} {
		out, code := run(t, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("postbox %s: exit %d (want %d), output %q (want it to contain %q)", strings.Join(tc.args, " "), code, tc.code, out, tc.want)
		}
	}
}

func TestEnvironmentErrorNamesVariable(t *testing.T) {
	cmd := exec.Command(binary, "serve", "--addr", "127.0.0.1:0")
	cmd.Env = append(cmd.Environ(), "QUEUE_MAXSIZE=lots")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "QUEUE_MAXSIZE") {
		t.Fatalf("want a startup error naming QUEUE_MAXSIZE, got %v: %s", err, out)
	}
}

func TestBenchJSONLastLine(t *testing.T) {
	cmd := exec.Command(binary, "bench", "--devices", "4", "--events", "4000", "--json")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var res map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("last line is not JSON: %q", lines[len(lines)-1])
	}
	for _, k := range []string{"events", "acked", "stored", "duration_s", "events_per_s", "ack_p50_ms", "ack_p99_ms"} {
		if _, ok := res[k]; !ok {
			t.Errorf("result lacks %q: %v", k, res)
		}
	}
	if res["events"] != 4000.0 || res["acked"] != 4000.0 || res["stored"] != 4000.0 {
		t.Errorf("want 4000 events acked and stored once, got %v", res)
	}
}
