package main_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
)

// TestSubscriptionFormatCLI: set-target --format cloudevents asks for
// CloudEvents deliveries, get shows it, default resets it, and another
// format is refused naming the flag.
func TestSubscriptionFormatCLI(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	if out, errOut, code := runCLI(t, s.Base, "subscriptions", "create", "ce", "--source", "webhooks", "--target", "http://127.0.0.1:9/x",
		"--format", "cloudevents"); code != 0 {
		t.Fatalf("subscriptions create: %d %s %s", code, out, errOut)
	}
	out, _, code := runCLI(t, s.Base, "subscriptions", "get", "ce")
	if code != 0 || !strings.Contains(out, "cloudevents") {
		t.Fatalf("subscriptions get: want the format cloudevents in\n%s", out)
	}
	if out, errOut, code := runCLI(t, s.Base, "subscriptions", "set-target", "ce", "--format", "default"); code != 0 {
		t.Fatalf("set-target --format default: %d %s %s", code, out, errOut)
	}
	var sub map[string]any
	out, _, _ = runCLI(t, s.Base, "subscriptions", "get", "ce", "--json")
	if err := json.Unmarshal([]byte(out), &sub); err != nil || sub["format"] != "postbox" {
		t.Fatalf("after --format default: %v %s", err, out)
	}
	if _, errOut, code := runCLI(t, s.Base, "subscriptions", "set-target", "ce", "--format", "xml"); code != 2 || !strings.Contains(errOut, "--format") {
		t.Errorf("--format xml: exit %d %q, want 2 naming --format", code, errOut)
	}
}
