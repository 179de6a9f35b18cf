package main_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRelaySource: relays of two services, each under its own device
// source (relay --source), and an agent (agent --source), land their
// events in their sources' streams, not in devices, so a subscription can pick them by origin. A source that is
// not there, or is not a device source, stops the relay at its start
// saying so; --source goes only with a postbox target.
func TestRelaySource(t *testing.T) {
	dir := t.TempDir()
	addr := freePort(t)
	srv := start(t, "serve", "--addr", addr, "--db", filepath.Join(dir, "postbox.db"), "--log-level", "warn")
	waitHTTP(t, "http://"+addr+"/ready", srv)
	api := "http://" + addr
	for _, name := range []string{"billing", "shipping"} {
		if out, code := runScrubbed(t, "sources", "create", name, "--kind", "device", "--server", api); code != 0 {
			t.Fatalf("sources create %s --kind device: exit %d, %s", name, code, out)
		}
	}
	if out, code := runScrubbed(t, "subscriptions", "create", "invoices", "--source", "billing", "--server", api); code != 0 {
		t.Fatalf("subscriptions create --source billing: exit %d, %s", code, out)
	}

	streamEvents := func(name string) float64 {
		t.Helper()
		out, code := runScrubbed(t, "streams", name, "--json", "--server", api)
		var s map[string]any
		if code != 0 || json.Unmarshal([]byte(out), &s) != nil {
			t.Fatalf("streams %s: exit %d, %s", name, code, out)
		}
		return s["events"].(float64)
	}
	for _, svc := range []struct {
		source string
		count  string
	}{{"billing", "3"}, {"shipping", "2"}} {
		db := filepath.Join(dir, svc.source+".db")
		emit(t, "--db", db, "--type", svc.source+".done", "--payload", `{"n":1}`, "--count", svc.count)
		relay := start(t, "relay", "--db", db, "--to", "ws://"+addr, "--source", svc.source, "--listen", "", "--poll", "100ms", "--log-level", "warn")
		waitUntil(t, time.Minute, svc.source+"'s rows still pending", func() bool {
			out, code := runScrubbed(t, "outbox", "list", "--db", db, "--state", "pending", "--json")
			return code == 0 && strings.TrimSpace(out) == "[]"
		}, relay, srv)
		stopRelay(t, relay)
	}
	// An edge agent names its source the same way.
	listen := freePort(t)
	a := start(t, "agent", "--server", "ws://"+addr, "--source", "shipping", "--outbox", filepath.Join(dir, "agent.db"), "--device-id", "van-1", "--listen", listen)
	waitHTTP(t, "http://"+listen+"/health", a)
	if out, code := runScrubbed(t, "send", "--agent", "http://"+listen, "--type", "shipping.scanned", "--payload", `{}`, "--count", "4"); code != 0 {
		t.Fatalf("send: exit %d, %s", code, out)
	}
	drained(t, map[string]*proc{"http://" + listen: a})
	if b, s, d := streamEvents("billing"), streamEvents("shipping"), streamEvents("devices"); b != 3 || s != 6 || d != 0 {
		t.Fatalf("streams: billing %v, shipping %v, devices %v events; want 3, 2 + 4 from the agent, 0", b, s, d)
	}
	out, code := runScrubbed(t, "inbox", "list", "--server", api)
	if code != 0 || !strings.Contains(out, "invoices") {
		t.Fatalf("inbox list: exit %d, %s", code, out)
	}
	waitUntil(t, 30*time.Second, "the subscription on billing to take its 3 events", func() bool {
		out, code := runScrubbed(t, "inbox", "list", "invoices", "--json", "--server", api)
		var items []map[string]any
		return code == 0 && json.Unmarshal([]byte(out), &items) == nil && len(items) == 3 && items[0]["type"] == "billing.done"
	}, srv)

	db := filepath.Join(dir, "billing.db")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--source", "nosuch"}, 1, `404 not_found: source "nosuch": no such device source: create it with postbox sources create nosuch --kind device`},
		{[]string{"--source", "webhooks"}, 1, `source "webhooks" is a webhook source: no such device source`},
		{[]string{"--source", "billing", "--to", "redis://127.0.0.1:1?stream=x"}, 2, "--source names a postbox server's source: it goes with a ws:// or wss:// --to"},
	} {
		args := append([]string{"relay", "--db", db, "--to", "ws://" + addr, "--listen", ""}, tc.args...)
		if out, code := runScrubbed(t, args...); code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("relay %s: exit %d (want %d), output %q, want it to contain %q", strings.Join(tc.args, " "), code, tc.code, out, tc.want)
		}
	}
}
