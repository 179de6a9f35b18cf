package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestSubscriptionFlowCLI: create and set-target take the flow flags and
// get shows them; bad ones are refused naming them; a failing endpoint's
// open breaker shows in get, and subscriptions enable closes it.
func TestSubscriptionFlowCLI(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	var failing atomic.Bool
	failing.Store(true)
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusBadGateway)
		}
	}))
	t.Cleanup(tg.Close)
	out, errOut, code := runCLI(t, s.Base, "subscriptions", "create", "billing", "--source", "webhooks", "--target", tg.URL,
		"--rate", "50/s", "--concurrency", "4", "--breaker-failures", "2", "--breaker-probe", "1h", "--retry-schedule", "1s", "--max-attempts", "50")
	if code != 0 {
		t.Fatalf("subscriptions create: %d %s %s", code, out, errOut)
	}
	out, _, code = runCLI(t, s.Base, "subscriptions", "get", "billing")
	for _, want := range []string{"rate", "50/s", "concurrency", "after 2 consecutive failures, probe every 1h, disable after 24h", "breaker_state", "closed"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("subscriptions get: want %q in\n%s", want, out)
		}
	}
	out, errOut, code = runCLI(t, s.Base, "subscriptions", "set-target", "billing", "--rate", "default", "--breaker-failures", "0")
	if code != 0 {
		t.Fatalf("set-target: %d %s %s", code, out, errOut)
	}
	var sub map[string]any
	out, _, _ = runCLI(t, s.Base, "subscriptions", "get", "billing", "--json")
	if err := json.Unmarshal([]byte(out), &sub); err != nil || sub["rate"] != nil || sub["breaker_failures"] != 0.0 || sub["concurrency"] != 4.0 {
		t.Fatalf("after set-target: %v %s", err, out)
	}
	for _, c := range []struct {
		args     []string
		code     int
		mentions string
	}{
		{[]string{"--concurrency", "0"}, 2, "--concurrency"},
		{[]string{"--breaker-failures", "-1"}, 2, "--breaker-failures"},
		{[]string{"--rate", "fast"}, 2, "--rate"},
		{[]string{"--rate", "0/s"}, 1, "rate"},
		{[]string{"--breaker-probe", "never"}, 2, "--breaker-probe"},
		{[]string{"--disable-after", "-1h"}, 2, "--disable-after"},
	} {
		_, errOut, code := runCLI(t, s.Base, append([]string{"subscriptions", "set-target", "billing"}, c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.mentions) {
			t.Errorf("set-target %v: exit %d %q, want %d naming %s", c.args, code, errOut, c.code, c.mentions)
		}
	}

	if out, errOut, code := runCLI(t, s.Base, "subscriptions", "set-target", "billing", "--breaker-failures", "2"); code != 0 {
		t.Fatalf("set-target: %d %s %s", code, out, errOut)
	}
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodPost, s.Base+"/webhooks", strings.NewReader(`{"n": 1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("cli-breaker-%d", i))
		resp, err := s.HTTP.Do(req)
		if err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST /webhooks: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	testenv.Eventually(t, 20*time.Second, "the breaker open in subscriptions get", func() bool {
		out, _, _ := runCLI(t, s.Base, "subscriptions", "get", "billing")
		return strings.Contains(out, "open since") && strings.Contains(out, "502")
	})
	failing.Store(false)
	out, errOut, code = runCLI(t, s.Base, "subscriptions", "enable", "billing")
	if code != 0 || !strings.Contains(out, "breaker closed") {
		t.Fatalf("subscriptions enable: %d %s %s", code, out, errOut)
	}
	testenv.Eventually(t, 20*time.Second, "the items delivered", func() bool {
		var items []map[string]any
		out, _, _ := runCLI(t, s.Base, "inbox", "list", "billing", "--state", "completed", "--json")
		return json.Unmarshal([]byte(out), &items) == nil && len(items) == 2
	})
	if _, errOut, code := runCLI(t, s.Base, "subscriptions", "enable", "nope"); code != 1 || !strings.Contains(errOut, "nope") {
		t.Errorf("enable nope: exit %d %s", code, errOut)
	}
}
