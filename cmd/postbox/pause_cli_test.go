package main_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
)

// TestPauseResumeTestCLI: subscriptions pause, resume and test, their
// output, exit codes and refusals.
func TestPauseResumeTestCLI(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	var down atomic.Bool
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "not now", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("thanks"))
	}))
	t.Cleanup(tg.Close)
	if out, errOut, code := runCLI(t, s.Base, "subscriptions", "create", "billing", "--source", "webhooks", "--target", tg.URL); code != 0 {
		t.Fatalf("create: %d %s %s", code, out, errOut)
	}

	out, errOut, code := runCLI(t, s.Base, "subscriptions", "pause", "billing", "--reason", "billing deploy")
	if code != 0 || !strings.Contains(out, "subscription billing: paused since") || !strings.Contains(out, "billing deploy") {
		t.Fatalf("pause: %d %q %q", code, out, errOut)
	}
	out, _, _ = runCLI(t, s.Base, "subscriptions", "get", "billing")
	if !strings.Contains(out, "paused since") || !strings.Contains(out, "billing deploy") {
		t.Errorf("get of a paused subscription:\n%s", out)
	}
	var sub map[string]any
	out, _, _ = runCLI(t, s.Base, "subscriptions", "resume", "billing", "--json")
	if err := json.Unmarshal([]byte(out), &sub); err != nil || sub["paused"] != false {
		t.Fatalf("resume --json: %v %s", err, out)
	}

	out, errOut, code = runCLI(t, s.Base, "subscriptions", "test", "billing")
	if code != 0 || !strings.Contains(out, ": 200 in ") || !strings.Contains(out, "answer: thanks") {
		t.Fatalf("test: %d %q %q", code, out, errOut)
	}
	down.Store(true)
	out, errOut, code = runCLI(t, s.Base, "subscriptions", "test", "billing")
	if code != 1 || !strings.Contains(out, ": 503 in ") || !strings.Contains(errOut, "did not answer 2xx") {
		t.Fatalf("test of a failing endpoint: %d %q %q", code, out, errOut)
	}

	for _, c := range []struct {
		args     []string
		code     int
		mentions string
	}{
		{[]string{"pause"}, 2, "NAME"},
		{[]string{"pause", "nope"}, 1, "nope"},
		{[]string{"resume", "nope"}, 1, "nope"},
		{[]string{"pause", "billing", "--reason", strings.Repeat("x", 501)}, 1, "reason"},
		{[]string{"test", "nope"}, 1, "nope"},
	} {
		_, errOut, code := runCLI(t, s.Base, append([]string{"subscriptions"}, c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.mentions) {
			t.Errorf("subscriptions %v: exit %d %q, want %d naming %s", c.args, code, errOut, c.code, c.mentions)
		}
	}
}
