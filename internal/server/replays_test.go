package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestReplayAPI: POST /v1/subscriptions/{name}/replay answers 202 with
// the job and its URL, which shows its progress to its end; a bad time,
// range or state is 400 naming the field; an unknown subscription or job
// is 404.
func TestReplayAPI(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	if status, v := call(t, ts, "POST", "/v1/subscriptions", `{"name": "r", "source": "devices"}`); status != 201 {
		t.Fatalf("create: %d %v", status, v)
	}
	for _, c := range []struct {
		path, body     string
		status         int
		code, mentions string
	}{
		{"/v1/subscriptions/r/replay", `{}`, 400, "missing_field", "since"},
		{"/v1/subscriptions/r/replay", `{"since": "yesterday"}`, 400, "invalid_field", "since"},
		{"/v1/subscriptions/r/replay", `{"since": "2026-01-01T00:00:00Z", "until": "soon"}`, 400, "invalid_field", "until"},
		{"/v1/subscriptions/r/replay", `{"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}`, 400, "invalid_field", "until"},
		{"/v1/subscriptions/r/replay", `{"since": "2026-01-01T00:00:00Z", "states": ["pending"]}`, 400, "invalid_field", "states"},
		{"/v1/subscriptions/r/replay", `{"since": "2026-01-01T00:00:00Z", "colour": 1}`, 400, "unknown_field", "colour"},
		{"/v1/subscriptions/nope/replay", `{"since": "2026-01-01T00:00:00Z"}`, 404, "not_found", "nope"},
	} {
		status, v := call(t, ts, "POST", c.path, c.body)
		e, _ := v["error"].(map[string]any)
		if status != c.status || e["code"] != c.code || !strings.Contains(e["message"].(string), c.mentions) {
			t.Errorf("POST %s %s: %d %v, want %d %s naming %q", c.path, c.body, status, v, c.status, c.code, c.mentions)
		}
	}
	status, v := call(t, ts, "POST", "/v1/subscriptions/r/replay", `{"since": "2026-01-01T00:00:00Z", "states": ["failed"]}`)
	if status != 202 || v["state"] != "running" || v["subscription"] != "r" || v["matched"] != 0.0 {
		t.Fatalf("replay: %d %v", status, v)
	}
	id := v["id"].(string)
	testenv.Eventually(t, 10*time.Second, "the replay to complete", func() bool {
		status, v = call(t, ts, "GET", "/v1/replays/"+id, "")
		return status == 200 && v["state"] == "completed"
	})
	if v["finished_at"] == nil || v["error"] != nil {
		t.Fatalf("completed replay: %v", v)
	}
	if status, v = call(t, ts, "GET", "/v1/replays?subscription=r", ""); status != 200 || len(v["replays"].([]any)) != 1 {
		t.Fatalf("list: %d %v", status, v)
	}
	if status, v = call(t, ts, "GET", "/v1/replays/rpl_nope", ""); status != 404 {
		t.Fatalf("unknown replay: %d %v", status, v)
	}
}
