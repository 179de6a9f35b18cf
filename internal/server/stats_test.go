package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestStats: GET /v1/stats charts what the server's counters count (events
// stored, group commits, subscriptions' lag), keeps a bounded number of
// samples however long it runs, and takes the API token.
func TestStats(t *testing.T) {
	ts := start(t, server.Config{StatsInterval: 2 * time.Millisecond}, nil)
	if status, v := call(t, ts, "POST", "/v1/subscriptions", `{"name": "later", "source": "devices"}`); status != 201 {
		t.Fatalf("create: %d %v", status, v)
	}
	for i := range 3 {
		req, _ := http.NewRequest("POST", ts.Base+"/webhooks", strings.NewReader(`{"n": 1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprint("s", i))
		resp, err := ts.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 202 {
			t.Fatalf("webhook: %d", resp.StatusCode)
		}
	}
	var last map[string]any
	testenv.Eventually(t, 30*time.Second, "120 samples, the last with the subscriptions' lag", func() bool {
		status, v := call(t, ts, "GET", "/v1/stats", "")
		if status != 200 {
			t.Fatalf("GET /v1/stats: %d %v", status, v)
		}
		samples := v["samples"].([]any)
		if len(samples) > 121 {
			t.Fatalf("%d samples: more than the 120 kept and the live one", len(samples))
		}
		if len(samples) == 0 {
			return false
		}
		last = v
		lag, _ := samples[len(samples)-1].(map[string]any)["lag"].(map[string]any)
		_, ok := lag["later"]
		return len(samples) == 120 && ok
	})
	totals := last["totals"].(map[string]any)
	if totals["stored"] != 3.0 || totals["commits"].(float64) < 1 {
		t.Errorf("totals %v: want 3 events stored in at least one commit", totals)
	}
	if last["interval"] != "2ms" {
		t.Errorf("interval %v, want 2ms", last["interval"])
	}

	tok := start(t, server.Config{APIToken: "t0k"}, nil)
	if status, _ := call(t, tok, "GET", "/v1/stats", ""); status != 401 {
		t.Errorf("GET /v1/stats without the token: %d, want 401", status)
	}
	resp, err := tok.HTTP.Get(tok.Base + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Security-Policy") == "" {
		t.Errorf("GET /ui/ without the token: %d (CSP %q), want 200 with a CSP: the console's files need no token", resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
	}
}
