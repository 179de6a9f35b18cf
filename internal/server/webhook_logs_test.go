package server_test

import (
	"testing"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestWebhookLogs: a webhook stored, sent again and sent under its key with
// another body is logged each time with its identity (source, idempotency
// key, type, offset), as JSON lines.
func TestWebhookLogs(t *testing.T) {
	t.Parallel()
	var logs testenv.JSONLog
	ts := start(t, server.Config{Logger: logs.Logger()}, nil)
	h := map[string]string{"Idempotency-Key": "order-7", "X-Event-Type": "order.paid"}
	for i, body := range []string{`{"n":1}`, `{"n":1}`, `{"n":2}`} {
		if st, b, _ := post(t, ts, body, h); st != []int{202, 200, 409}[i] {
			t.Fatalf("webhook %d: %d %v", i, st, b)
		}
	}
	got := map[string][]map[string]any{}
	for _, l := range logs.Lines(t, "") {
		msg, _ := l["msg"].(string)
		got[msg] = append(got[msg], l)
	}
	for msg, want := range map[string]map[string]any{
		"webhook: stored": {"level": "INFO", "source": "webhooks", "event_id": "order-7", "type": "order.paid", "offset": 1.0},
		"webhook: duplicate answered 200, stored before":                             {"level": "INFO", "event_id": "order-7", "offset": 1.0},
		"webhook: refused: its idempotency key was stored with another body or type": {"level": "WARN", "source": "webhooks", "event_id": "order-7"},
	} {
		if len(got[msg]) != 1 {
			t.Errorf("%d lines %q, want 1 (all: %v)", len(got[msg]), msg, got)
			continue
		}
		for k, v := range want {
			if got[msg][0][k] != v {
				t.Errorf("%q: %s is %v, want %v", msg, k, got[msg][0][k], v)
			}
		}
	}
}
