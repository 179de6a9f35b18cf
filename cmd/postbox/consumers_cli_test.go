package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestConsumersCLI: consumers list|get|reset|history against a server:
// the default webhooks subscription reads three webhooks, a reset to
// offset 2 shows where it was and is, the history shows the reset and the
// commits; reset takes exactly one position, and every command has --help.
func TestConsumersCLI(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	for i := 1; i <= 3; i++ {
		req, _ := http.NewRequest("POST", s.Base+"/webhooks", strings.NewReader(fmt.Sprintf(`{"n": %d}`, i)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("k%d", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			t.Fatalf("POST /webhooks: %s", resp.Status)
		}
	}
	testenv.Eventually(t, 10*time.Second, "consumer webhooks at 4", func() bool {
		out, _, code := runCLI(t, s.Base, "consumers", "get", "webhooks", "--json")
		var c map[string]any
		return code == 0 && json.Unmarshal([]byte(out), &c) == nil && c["next_offset"] == 4.0
	})
	out, errOut, code := runCLI(t, s.Base, "consumers", "get", "webhooks")
	if code != 0 || !strings.Contains(out, "next_offset:") || !strings.Contains(out, "lag:") {
		t.Fatalf("consumers get: %d %s %s", code, out, errOut)
	}
	for _, args := range [][]string{{"consumers"}, {"consumers", "list"}} {
		out, _, code = runCLI(t, s.Base, args...)
		if code != 0 || !strings.Contains(out, "SUBSCRIPTION") || !strings.Contains(out, "webhooks") {
			t.Fatalf("%v: %d %s", args, code, out)
		}
	}
	out, errOut, code = runCLI(t, s.Base, "consumers", "reset", "webhooks", "--to-offset", "2")
	if code != 0 || !strings.Contains(out, "consumer webhooks reset to offset 2: next offset 2 (was 4)") {
		t.Fatalf("consumers reset: %d %s %s", code, out, errOut)
	}
	testenv.Eventually(t, 10*time.Second, "a commit after the reset", func() bool {
		out, _, code = runCLI(t, s.Base, "consumers", "history", "webhooks", "--json")
		var h struct{ Commits []map[string]any }
		return code == 0 && json.Unmarshal([]byte(out), &h) == nil && len(h.Commits) > 1 && h.Commits[0]["kind"] == "commit" && h.Commits[0]["next_offset"] == 4.0
	})
	out, _, code = runCLI(t, s.Base, "consumers", "history", "webhooks")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || !strings.HasPrefix(lines[0], "AT") || !strings.Contains(out, "reset") || !strings.Contains(out, "offset 2") {
		t.Fatalf("consumers history: %d\n%s", code, out)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"consumers", "reset", "webhooks"}, "give one of --to-offset N, --to-time T, --earliest or --latest"},
		{[]string{"consumers", "reset", "webhooks", "--earliest", "--latest"}, "--earliest, --latest: give only one"},
		{[]string{"consumers", "reset", "webhooks", "--to-offset", "0"}, "--to-offset 0"},
		{[]string{"consumers", "reset", "webhooks", "--to-time", "noon"}, "--to-time \"noon\""},
		{[]string{"consumers", "reset"}, "NAME is required"},
		{[]string{"consumers", "frobnicate"}, "unknown command \"frobnicate\""},
	} {
		_, errOut, code := runCLI(t, s.Base, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut, c.want)
		}
	}
	_, errOut, code = runCLI(t, s.Base, "consumers", "reset", "webhooks", "--to-offset", "99")
	if code != 1 || !strings.Contains(errOut, "to_offset 99") {
		t.Errorf("reset past the end: exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = runCLI(t, s.Base, "consumers", "reset", "nope", "--latest")
	if code != 1 || !strings.Contains(errOut, `no consumer "nope"`) {
		t.Errorf("reset unknown: exit %d, stderr %q", code, errOut)
	}
	for _, sub := range []string{"get", "reset", "history", "list"} {
		out, _, code := runCLI(t, s.Base, "consumers", sub, "--help")
		if code != 0 || !strings.Contains(out, "Usage: postbox consumers") {
			t.Errorf("consumers %s --help: %d %s", sub, code, out)
		}
	}
	if out, _, code := runCLI(t, s.Base, "consumers", "--help"); code != 0 || !strings.Contains(out, "history") {
		t.Errorf("consumers --help: %d %s", code, out)
	}
}
