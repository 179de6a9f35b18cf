package server_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestAPIEndpointFlow: rate, concurrency and breaker settings are set on
// create and patch and answered back (breaker_failures 0: no breaker,
// null: the defaults); bad ones are 400 naming the field.
func TestAPIEndpointFlow(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	status, sub := call(t, ts, "POST", "/v1/subscriptions", `{"name": "billing", "source": "webhooks", "target": "http://127.0.0.1:9/in",
		"rate": "600/m", "concurrency": 4, "breaker_failures": 0, "breaker_probe": "10s", "disable_after": "1h"}`)
	if status != 201 {
		t.Fatalf("create: %d %v", status, sub)
	}
	if sub["rate"] != "600/m" || sub["concurrency"] != 4.0 || sub["breaker_failures"] != 0.0 || sub["breaker_probe"] != "10s" ||
		sub["disable_after"] != "1h" || fmt.Sprint(sub["breaker"]) != "map[consecutive_failures:0 last_error:<nil> next_probe:<nil> since:<nil> state:closed]" {
		t.Fatalf("create answered %v", sub)
	}
	status, sub = call(t, ts, "PATCH", "/v1/subscriptions/billing", `{"rate": "50/s", "concurrency": null, "breaker_failures": null,
		"breaker_probe": null}`)
	if status != 200 || sub["rate"] != "50/s" || sub["concurrency"] != nil || sub["breaker_failures"] != nil || sub["breaker_probe"] != nil ||
		sub["disable_after"] != "1h" {
		t.Fatalf("patch: %d %v", status, sub)
	}
	base := `"source": "webhooks", "target": "http://127.0.0.1:9/in"`
	for _, c := range []struct{ body, code, mentions string }{
		{`"rate": "fast"`, "invalid_field", "rate"},
		{`"rate": "0/s"`, "invalid_field", "rate"},
		{`"rate": "5/fortnight"`, "invalid_field", "rate"},
		{`"rate": 50`, "invalid_json", "rate"},
		{`"concurrency": 0`, "invalid_field", "concurrency"},
		{`"concurrency": "4"`, "invalid_json", "concurrency"},
		{`"concurrency": 1000000`, "invalid_field", "concurrency"},
		{`"breaker_failures": -1`, "invalid_field", "breaker_failures"},
		{`"breaker_probe": "0s"`, "invalid_field", "breaker_probe"},
		{`"disable_after": "soon"`, "invalid_field", "disable_after"},
	} {
		status, out := call(t, ts, "POST", "/v1/subscriptions", `{"name": "bad", `+base+`, `+c.body+`}`)
		e, _ := out["error"].(map[string]any)
		if status != 400 || e["code"] != c.code || !strings.Contains(fmt.Sprint(e["message"]), c.mentions) {
			t.Errorf("create with %s: %d %v, want 400 %s naming %s", c.body, status, out, c.code, c.mentions)
		}
		status, out = call(t, ts, "PATCH", "/v1/subscriptions/billing", `{`+c.body+`}`)
		e, _ = out["error"].(map[string]any)
		if status != 400 || !strings.Contains(fmt.Sprint(e["message"]), c.mentions) {
			t.Errorf("patch with %s: %d %v, want 400 naming %s", c.body, status, out, c.mentions)
		}
	}
}

// TestAPIEnable: a failing endpoint's breaker opens and shows in GET
// subscription; POST .../enable closes it and the waiting item is
// delivered. Enable needs a target and a subscription.
func TestAPIEnable(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	var failing atomic.Bool
	failing.Store(true)
	var calls atomic.Int64
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(tg.Close)
	if status, sub := call(t, ts, "POST", "/v1/subscriptions", `{"name": "billing", "source": "webhooks", "target": "`+tg.URL+`",
		"breaker_failures": 2, "breaker_probe": "1h", "retry_schedule": "1s", "max_attempts": 100}`); status != 201 {
		t.Fatalf("create: %d %v", status, sub)
	}
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodPost, ts.Base+"/webhooks", strings.NewReader(`{"n": 1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("enable-%d", i))
		resp, err := ts.HTTP.Do(req)
		if err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST /webhooks: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	var breaker map[string]any
	testenv.Eventually(t, 20*time.Second, "the breaker to open", func() bool {
		_, sub := call(t, ts, "GET", "/v1/subscriptions/billing", "")
		breaker, _ = sub["breaker"].(map[string]any)
		return breaker["state"] == "open"
	})
	if breaker["consecutive_failures"].(float64) < 2 || !strings.Contains(fmt.Sprint(breaker["last_error"]), "503") ||
		breaker["since"] == nil || breaker["next_probe"] == nil {
		t.Fatalf("open breaker %v", breaker)
	}
	failing.Store(false)
	status, sub := call(t, ts, "POST", "/v1/subscriptions/billing/enable", "")
	if status != 200 || sub["breaker"].(map[string]any)["state"] != "closed" {
		t.Fatalf("enable: %d %v", status, sub)
	}
	testenv.Eventually(t, 20*time.Second, "the items delivered", func() bool {
		_, out := call(t, ts, "GET", "/v1/inboxes/billing/items?state=completed", "")
		items, _ := out["items"].([]any)
		return len(items) == 2
	})
	// Delivered: the breaker shows its state, closed, without the error
	// from before; the items keep theirs as history.
	if _, sub := call(t, ts, "GET", "/v1/subscriptions/billing", ""); fmt.Sprint(sub["breaker"]) != "map[consecutive_failures:0 last_error:<nil> next_probe:<nil> since:<nil> state:closed]" {
		t.Errorf("the breaker once delivered: %v", sub["breaker"])
	}
	_, out := call(t, ts, "GET", "/v1/inboxes/billing/items?state=completed", "")
	for _, raw := range out["items"].([]any) {
		if it := raw.(map[string]any); !strings.Contains(fmt.Sprint(it["last_error"]), "503") || it["last_error_past"] != true {
			t.Errorf("a completed item: last_error %v, last_error_past %v; want the 503 kept as history", it["last_error"], it["last_error_past"])
		}
	}
	if status, out := call(t, ts, "POST", "/v1/subscriptions/webhooks/enable", ""); status != 400 || !strings.Contains(fmt.Sprint(out), "target") {
		t.Errorf("enable without a target: %d %v", status, out)
	}
	if status, _ := call(t, ts, "POST", "/v1/subscriptions/nope/enable", ""); status != 404 {
		t.Errorf("enable of no subscription: %d", status)
	}
}
