package main_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/internal/webhooksig"
)

// TestSourcesCLI: sources create with a preset and a secret file, list,
// get (the secret only as a fingerprint, an empty checkpoint), a
// subscription on the new source, a GitHub delivery to it accepted and a
// wrongly signed one refused naming the header, delete refused while the
// subscription reads it, then done; and --help on every command.
func TestSourcesCLI(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	const secret = "the gh secret"
	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, s.Base, "sources", "create", "gh", "--kind", "webhook", "--preset", "github", "--secret-file", file)
	if code != 0 || !strings.HasPrefix(out, "created source gh (webhook) → stream gh; webhooks: POST /webhooks/gh (signature: github)") {
		t.Fatalf("sources create: %d %s %s", code, out, errOut)
	}
	out, _, code = runCLI(t, s.Base, "sources", "create", "gh", "--preset", "github", "--secret", secret)
	if code != 0 || !strings.HasPrefix(out, "exists: source gh") {
		t.Fatalf("sources create again: %d %s", code, out)
	}
	out, _, code = runCLI(t, s.Base, "sources", "create", "gh-short", "--preset", "github", "--secret", secret, "--replay-window", "2h")
	if code != 0 {
		t.Fatalf("sources create --replay-window 2h: %d %s", code, out)
	}
	if out, _, _ = runCLI(t, s.Base, "sources", "get", "gh-short"); !regexp.MustCompile(`replay window:\s+2h`).MatchString(out) {
		t.Fatalf("sources get gh-short: want its replay window 2h in\n%s", out)
	}
	if out, _, _ = runCLI(t, s.Base, "sources", "get", "gh"); !regexp.MustCompile(`handles:\s+into https://api.github.com\n`).MatchString(out) {
		t.Fatalf("sources get gh: want its handles into the default API in\n%s", out)
	}
	if out, _, code = runCLI(t, s.Base, "sources", "create", "relay", "--handle-pointer", "/reply/url"); code != 0 {
		t.Fatalf("sources create --handle-pointer: %d %s", code, out)
	}
	if out, _, _ = runCLI(t, s.Base, "sources", "get", "relay"); !regexp.MustCompile(`handles:\s+body /reply/url\n`).MatchString(out) {
		t.Fatalf("sources get relay: want its handle pointer in\n%s", out)
	}
	if out, _, code = runCLI(t, s.Base, "sources", "delete", "relay"); code != 0 {
		t.Fatalf("sources delete relay: %d %s", code, out)
	}
	if _, errOut, code := runCLI(t, s.Base, "sources", "create", "bad", "--handle-header", "X-A", "--handle-pointer", "/a"); code == 0 ||
		!strings.Contains(errOut, "settings.handle_header and settings.handle_pointer") {
		t.Fatalf("--handle-header and --handle-pointer: %d %s, want an error naming them", code, errOut)
	}
	if out, _, code = runCLI(t, s.Base, "sources", "delete", "gh-short"); code != 0 {
		t.Fatalf("sources delete gh-short: %d %s", code, out)
	}
	if _, errOut, code := runCLI(t, s.Base, "sources", "create", "st", "--preset", "stripe", "--secret", secret, "--replay-window", "2h"); code == 0 ||
		!strings.Contains(errOut, "replay_window") {
		t.Fatalf("--replay-window on a stripe source: %d %s, want an error naming it", code, errOut)
	}
	out, _, code = runCLI(t, s.Base, "sources", "create", "shop", "--key-header", "X-Shop-Delivery", "--type-field", "topic")
	if code != 0 || !strings.Contains(out, "signature: none") {
		t.Fatalf("sources create shop: %d %s", code, out)
	}
	out, _, code = runCLI(t, s.Base, "sources", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 5 || !strings.HasPrefix(lines[0], "NAME") || !strings.HasPrefix(lines[1], "devices ") ||
		!strings.HasPrefix(lines[2], "gh ") || !strings.Contains(lines[2], "/webhooks/gh") || !strings.HasPrefix(lines[4], "webhooks ") {
		t.Fatalf("sources list: %d\n%s", code, out)
	}
	out, _, code = runCLI(t, s.Base, "sources", "get", "gh")
	for _, want := range []string{"kind:", "webhook", "signature:", "github", "hmac:", "header X-GitHub-Delivery", "header X-GitHub-Event", "replay window:", "24h", "checkpoint:"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("sources get: want %q in\n%s", want, out)
		}
	}
	out, _, _ = runCLI(t, s.Base, "sources", "get", "gh", "--json")
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || got["kind"] != "webhook" || got["stream"] != "gh" || strings.Contains(out, secret) {
		t.Fatalf("sources get --json: %v %s", err, out)
	}
	if cp, ok := got["checkpoint"].(map[string]any); !ok || len(cp) != 0 {
		t.Fatalf("sources get --json: checkpoint %v, want {}", got["checkpoint"])
	}
	var list []map[string]any
	out, _, _ = runCLI(t, s.Base, "sources", "list", "--json")
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 4 {
		t.Fatalf("sources list --json: %v %s", err, out)
	}

	out, errOut, code = runCLI(t, s.Base, "subscriptions", "create", "gh-all", "--source", "gh", "--start", "earliest")
	if code != 0 {
		t.Fatalf("a subscription on gh: %d %s %s", code, out, errOut)
	}
	body := "{\n  \"zen\": \"Keep it logically awesome.\"\n}\n"
	hook := func(sig string) int {
		req, _ := http.NewRequest(http.MethodPost, s.Base+"/webhooks/gh", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-GitHub-Delivery", "cli-1")
		req.Header.Set("X-GitHub-Event", "ping")
		req.Header.Set("X-Hub-Signature-256", sig)
		resp, err := s.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		msg, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusUnauthorized && !strings.Contains(string(msg), "X-Hub-Signature-256") {
			t.Errorf("401 not naming the header: %s", msg)
		}
		return resp.StatusCode
	}
	if st := hook(webhooksig.SignGitHub("wrong", []byte(body))); st != http.StatusUnauthorized {
		t.Fatalf("a wrongly signed delivery: %d, want 401", st)
	}
	if st := hook(webhooksig.SignGitHub(secret, []byte(body))); st != http.StatusAccepted {
		t.Fatalf("a signed delivery: %d, want 202", st)
	}
	var items []map[string]any
	testenv.Eventually(t, 10*time.Second, "the item in gh-all", func() bool {
		out, _, _ := runCLI(t, s.Base, "inbox", "list", "gh-all", "--json")
		return json.Unmarshal([]byte(out), &items) == nil && len(items) == 1
	})
	if p, _ := items[0]["payload"].(map[string]any); p["zen"] != "Keep it logically awesome." || items[0]["type"] != "ping" {
		t.Fatalf("the item: %v", items[0])
	}

	_, errOut, code = runCLI(t, s.Base, "sources", "delete", "gh")
	if code != 1 || !strings.Contains(errOut, "409") || !strings.Contains(errOut, "gh-all") {
		t.Fatalf("sources delete while gh-all reads it: %d %s, want a 409 naming gh-all", code, errOut)
	}
	if _, _, code := runCLI(t, s.Base, "subscriptions", "delete", "gh-all"); code != 0 {
		t.Fatal("subscriptions delete gh-all")
	}
	out, _, code = runCLI(t, s.Base, "sources", "delete", "gh", "--json")
	if code != 0 || !strings.Contains(out, `"deleted": true`) {
		t.Fatalf("sources delete --json: %d %s", code, out)
	}
	if st := hook(webhooksig.SignGitHub(secret, []byte(body))); st != http.StatusNotFound {
		t.Fatalf("a delivery to the deleted source: %d, want 404", st)
	}

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"sources", "get", "gh"}, 1, "404"},
		{[]string{"sources", "create", "x", "--preset", "github"}, 2, "--secret"},
		{[]string{"sources", "create", "x", "--preset", "gitlab", "--secret", "s"}, 2, "--preset"},
		{[]string{"sources", "create", "x", "--kind", "poll"}, 2, "--kind"},
		{[]string{"sources", "create", "x", "--secret", "not-whsec"}, 1, "settings.secrets[0]"},
		{[]string{"sources", "create", "x", "--key-header", "Bad Header"}, 1, "settings.key_header"},
		{[]string{"sources", "create", "shop", "--preset", "stripe", "--secret", "whsec_x"}, 1, "conflict"},
		{[]string{"sources", "create"}, 2, "NAME"},
		{[]string{"sources", "get", "a/b"}, 2, "NAME"},
		{[]string{"sources", "frob"}, 2, "unknown command"},
	} {
		out, errOut, code := runCLI(t, s.Base, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, want %d naming %q: %s%s", c.args, code, c.code, c.want, out, errOut)
		}
	}
	for _, args := range [][]string{{"sources", "--help"}, {"sources", "create", "--help"}, {"sources", "list", "--help"},
		{"sources", "get", "--help"}, {"sources", "delete", "--help"}} {
		out, code := run(t, args...)
		if code != 0 || !strings.Contains(out, "Usage: postbox sources") {
			t.Errorf("postbox %s: exit %d\n%s", strings.Join(args, " "), code, out)
		}
	}
}
