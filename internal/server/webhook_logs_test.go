package server_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/postbox-events/postbox/internal/server"
)

// logBuffer collects a server's JSON log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// byMsg returns the lines logged, by message.
func (l *logBuffer) byMsg(t *testing.T) map[string][]map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		msg, _ := m["msg"].(string)
		out[msg] = append(out[msg], m)
	}
	return out
}

// TestWebhookLogs: a webhook stored, sent again and sent under its key with
// another body is logged each time with its identity (source, idempotency
// key, type, offset), as JSON lines.
func TestWebhookLogs(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	ts := start(t, server.Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, nil)
	h := map[string]string{"Idempotency-Key": "order-7", "X-Event-Type": "order.paid"}
	for i, body := range []string{`{"n":1}`, `{"n":1}`, `{"n":2}`} {
		if st, b, _ := post(t, ts, body, h); st != []int{202, 200, 409}[i] {
			t.Fatalf("webhook %d: %d %v", i, st, b)
		}
	}
	got := logs.byMsg(t)
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
