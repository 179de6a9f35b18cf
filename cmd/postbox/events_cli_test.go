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

// TestEventsCLI: events get by offset, id and key shows the event and its
// deliveries, events search and inbox search find by key, type and time,
// in tables and in JSON; bad input exits 2 naming the flag, and every
// command has --help.
func TestEventsCLI(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	for i := 1; i <= 3; i++ {
		req, _ := http.NewRequest("POST", s.Base+"/webhooks", strings.NewReader(fmt.Sprintf(`{"n": %d}`, i)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("order-%d", i))
		req.Header.Set("X-Event-Type", []string{"", "order.created", "order.paid", "order.created"}[i])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			t.Fatalf("POST /webhooks: %s", resp.Status)
		}
	}
	testenv.Eventually(t, 10*time.Second, "the item of order-2", func() bool {
		out, _, code := runCLI(t, s.Base, "events", "get", "webhooks", "--key", "order-2", "--json")
		var ev struct{ Deliveries []map[string]any }
		return code == 0 && json.Unmarshal([]byte(out), &ev) == nil && len(ev.Deliveries) == 1 && ev.Deliveries[0]["status"] == "item"
	})
	for _, args := range [][]string{
		{"events", "get", "webhooks", "2"},
		{"events", "get", "webhooks", "--id", "order-2"},
		{"events", "get", "webhooks", "--key", "order-2"},
	} {
		out, errOut, code := runCLI(t, s.Base, args...)
		if code != 0 || !strings.Contains(out, "event_id:") || !strings.Contains(out, "order-2") || !strings.Contains(out, "webhook_id:") ||
			!strings.Contains(out, "SUBSCRIPTION") || !strings.Contains(out, "pending") {
			t.Fatalf("%v: %d\n%s%s", args, code, out, errOut)
		}
	}
	out, errOut, code := runCLI(t, s.Base, "events", "search", "webhooks", "--type", "order.created", "--since", "1h")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "OFFSET") || !strings.Contains(lines[1], "order-3") || !strings.Contains(lines[2], "order-1") {
		t.Fatalf("events search --type: %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = runCLI(t, s.Base, "events", "search", "webhooks", "--limit", "1")
	if code != 0 || !strings.Contains(out, "order-3") || !strings.Contains(errOut, "--before 3") {
		t.Fatalf("events search --limit 1: %d\n%s%s", code, out, errOut)
	}
	out, _, code = runCLI(t, s.Base, "events", "search", "webhooks", "--limit", "1", "--all-pages", "--json")
	var evs []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &evs) != nil || len(evs) != 3 {
		t.Fatalf("events search --all-pages --json: %d %s", code, out)
	}
	out, errOut, code = runCLI(t, s.Base, "inbox", "search", "webhooks", "--key", "order-3", "--state", "pending")
	if code != 0 || !strings.Contains(out, "order-3") || strings.Contains(out, "order-1") {
		t.Fatalf("inbox search --key: %d\n%s%s", code, out, errOut)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"events", "get", "webhooks"}, "name the event"},
		{[]string{"events", "get", "webhooks", "0"}, "OFFSET \"0\""},
		{[]string{"events", "get", "webhooks", "2", "--id", "x"}, "not both"},
		{[]string{"events", "get", "webhooks", "--id", "a", "--key", "b"}, "--id or --key"},
		{[]string{"events", "search", "webhooks", "--since", "noon"}, "--since"},
		{[]string{"events", "search", "webhooks", "--since", "1h", "--until", "2h"}, "is not before --until"},
		{[]string{"events", "search"}, "STREAM is required"},
		{[]string{"inbox", "search", "webhooks", "--state", "lost"}, "--state"},
		{[]string{"inbox", "search", "webhooks", "--limit", "5000"}, "--limit"},
	} {
		_, errOut, code := runCLI(t, s.Base, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut, c.want)
		}
	}
	if _, errOut, code := runCLI(t, s.Base, "events", "get", "webhooks", "999"); code != 1 || !strings.Contains(errOut, "no event at offset 999") {
		t.Errorf("events get of no event: exit %d, %q", code, errOut)
	}
	for _, args := range [][]string{{"events", "--help"}, {"events", "get", "--help"}, {"events", "search", "--help"}, {"inbox", "search", "--help"}} {
		if out, errOut, code := runCLI(t, s.Base, args...); code != 0 || !strings.Contains(out+errOut, "events") && !strings.Contains(out+errOut, "search") {
			t.Errorf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
}
