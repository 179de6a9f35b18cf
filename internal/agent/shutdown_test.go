package agent_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/agent"
	"github.com/postbox-events/postbox/internal/testenv"
)

// The agent logs that it shuts down when its context ends, and that it
// stopped, with what its outbox still holds.
func TestAgentLogsItsShutdown(t *testing.T) {
	var logs testenv.Buffer
	a := startAgent(t, agent.Config{Server: "ws://127.0.0.1:1", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if code, body := a.post(t, `{"type":"t","payload":{"a":1}}`); code != 202 && code != 200 {
		t.Fatalf("intake answered %d: %s", code, body)
	}
	a.stop()
	out := logs.String()
	for _, want := range []string{`msg="postbox agent: running"`, `msg="postbox agent: shutting down`, `msg="postbox agent: stopped" pending=1 rejected=0`} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %s:\n%s", want, out)
		}
	}
}
