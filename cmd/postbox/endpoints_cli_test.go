package main_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/stdwebhook"
	"github.com/postbox-events/postbox/internal/testenv"
)

const (
	cliSecretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	cliSecretB = "whsec_dGhpcyBpcyBhIHRlc3Qgc2VjcmV0IG9mIDMyIGJ5dGVzIQ=="
)

// runCLI runs the binary against the server at base and returns its
// stdout, stderr and exit code.
func runCLI(t *testing.T, base string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, append(args, "--server", base)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

// TestSubscriptionEndpointCLI: a subscription created with endpoint flags
// signs, sends its headers and retries on its schedule; get shows its
// settings and only the fingerprint of its secret; inbox attempts shows
// each attempt; set-target rotates the secret and resets a setting; bad
// settings are refused naming them.
func TestSubscriptionEndpointCLI(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	var mu sync.Mutex
	var got []http.Header
	var bodies [][]byte
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Header.Clone())
		bodies = append(bodies, body)
		n := len(got)
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, "not yet")
			return
		}
		io.WriteString(w, "done")
	}))
	t.Cleanup(tg.Close)

	out, errOut, code := runCLI(t, s.Base, "subscriptions", "create", "billing", "--source", "webhooks", "--target", tg.URL+"/in",
		"--secret", cliSecretA, "--retry-schedule", "1s,1m", "--max-attempts", "8", "--timeout", "10s", "--header", "X-Team: billing")
	if code != 0 || !strings.HasPrefix(out, "created subscription billing on webhooks") {
		t.Fatalf("subscriptions create: %d %s %s", code, out, errOut)
	}
	out, _, code = runCLI(t, s.Base, "subscriptions", "get", "billing")
	fpA := regexp.MustCompile(`hmac:[0-9a-f]{16}`).FindString(out)
	if fpA == "" || strings.Contains(out, cliSecretA[6:12]) {
		t.Fatalf("subscriptions get: want the secret's fingerprint, not any of it, in\n%s", out)
	}
	for _, want := range []string{"X-Team: billing", "schedule 1s,1m", "10s"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("subscriptions get: want %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, cliSecretA[6:]) {
		t.Fatalf("subscriptions get shows the secret:\n%s", out)
	}
	var sub map[string]any
	out, _, _ = runCLI(t, s.Base, "subscriptions", "get", "billing", "--json")
	if err := json.Unmarshal([]byte(out), &sub); err != nil || sub["max_attempts"] != 8.0 || sub["retry_schedule"] != "1s,1m" ||
		strings.Contains(out, cliSecretA[6:]) {
		t.Fatalf("subscriptions get --json: %v %s", err, out)
	}

	req, _ := http.NewRequest(http.MethodPost, s.Base+"/webhooks", strings.NewReader(`{"amount": 5}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "cli-endpoint-1")
	resp, err := s.HTTP.Do(req)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /webhooks: %v %v", resp, err)
	}
	resp.Body.Close()
	testenv.Eventually(t, 20*time.Second, "two attempts at the target", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 2
	})
	key, _ := stdwebhook.ParseSecret(cliSecretA)
	for i, h := range got {
		if h.Get("X-Team") != "billing" {
			t.Fatalf("request %d: headers %v", i+1, h)
		}
		if err := stdwebhook.Verify([][]byte{key}, h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature"), bodies[i], time.Now()); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
	}

	var items []map[string]any
	testenv.Eventually(t, 10*time.Second, "the item completed", func() bool {
		out, _, _ := runCLI(t, s.Base, "inbox", "list", "billing", "--state", "completed", "--json")
		return json.Unmarshal([]byte(out), &items) == nil && len(items) == 1
	})
	id := strconv.FormatFloat(items[0]["id"].(float64), 'f', -1, 64)
	out, errOut, code = runCLI(t, s.Base, "inbox", "attempts", "billing", id)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "ATTEMPT") || !strings.Contains(lines[1], " 500 ") ||
		!strings.Contains(lines[1], "not yet") || !strings.Contains(lines[2], " 200 ") || !strings.Contains(lines[2], "done") {
		t.Fatalf("inbox attempts: %d\n%s%s", code, out, errOut)
	}
	var log []map[string]any
	out, _, _ = runCLI(t, s.Base, "inbox", "attempts", "billing", id, "--json")
	if err := json.Unmarshal([]byte(out), &log); err != nil || len(log) != 2 || log[0]["status_code"] != 500.0 || log[1]["response_excerpt"] != "done" {
		t.Fatalf("inbox attempts --json: %v %s", err, out)
	}

	// Rotation from a file, and a setting back to the server's.
	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte(cliSecretB+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runCLI(t, s.Base, "subscriptions", "set-target", "billing", "--secret-file", file, "--secret-overlap", "1h", "--timeout", "default")
	if code != 0 || !regexp.MustCompile(`hmac:[0-9a-f]{16}, `+fpA+` \(signs until`).MatchString(out) || !strings.Contains(out, "timeout: default") {
		t.Fatalf("set-target --secret-file: %d %s %s", code, out, errOut)
	}
	out, _, _ = runCLI(t, s.Base, "subscriptions", "get", "billing", "--json")
	if err := json.Unmarshal([]byte(out), &sub); err != nil || sub["timeout"] != nil || len(sub["secrets"].([]any)) != 2 || sub["target"] != tg.URL+"/in" {
		t.Fatalf("after set-target: %v %s", err, out)
	}

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"subscriptions", "set-target", "billing", "--header", "Connection: close"}, 1, "Connection"},
		{[]string{"subscriptions", "set-target", "billing", "--secret", "whsec_%%%"}, 1, "secret"},
		{[]string{"subscriptions", "set-target", "billing", "--retry-schedule", "5s,soon"}, 2, "--retry-schedule"},
		{[]string{"subscriptions", "set-target", "billing", "--max-attempts", "0"}, 2, "--max-attempts"},
		{[]string{"subscriptions", "set-target", "billing", "--timeout", "-1s"}, 2, "--timeout"},
		{[]string{"subscriptions", "set-target", "billing", "--secret", cliSecretA, "--no-secret"}, 2, "--no-secret"},
		{[]string{"subscriptions", "set-target", "billing", "--secret-overlap", "1h"}, 2, "--secret-overlap"},
		{[]string{"subscriptions", "set-target", "billing", "--header", "no colon"}, 2, "Name: value"},
		{[]string{"subscriptions", "create", "x", "--source", "webhooks", "--secret", cliSecretA}, 2, "--target"},
		{[]string{"inbox", "attempts", "billing"}, 2, "INBOX and one item ID"},
		{[]string{"inbox", "attempts", "billing", "999999"}, 1, "404"},
	} {
		out, errOut, code := runCLI(t, s.Base, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, want %d naming %q: %s%s", c.args, code, c.code, c.want, out, errOut)
		}
	}
}
