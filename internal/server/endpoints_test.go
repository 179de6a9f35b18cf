package server_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
)

const (
	apiSecretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	apiSecretB = "whsec_dGhpcyBpcyBhIHRlc3Qgc2VjcmV0IG9mIDMyIGJ5dGVzIQ=="
)

// TestAPIEndpointSettings: a subscription's endpoint settings are set on
// create and patch, answered back, and its secrets never are: only their
// fingerprints. A new secret rotates the old one out after its overlap.
func TestAPIEndpointSettings(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	status, sub := call(t, ts, "POST", "/v1/subscriptions", `{"name": "billing", "source": "webhooks", "target": "http://127.0.0.1:9/in",
		"secret": "`+apiSecretA+`", "headers": {"X-Team": "billing"}, "timeout": "10s", "retry_schedule": "5s, 1m,10m", "max_attempts": 8}`)
	if status != 201 {
		t.Fatalf("create: %d %v", status, sub)
	}
	if fmt.Sprint(sub["headers"]) != "map[X-Team:billing]" || sub["timeout"] != "10s" || sub["retry_schedule"] != "5s,1m,10m" ||
		fmt.Sprint(sub["max_attempts"]) != "8" || sub["retry_base_delay"] != nil {
		t.Fatalf("create answered %v", sub)
	}
	secrets := sub["secrets"].([]any)
	if len(secrets) != 1 || !isFingerprint(secrets[0].(map[string]any)["fingerprint"]) || secrets[0].(map[string]any)["expires_at"] != nil {
		t.Fatalf("secrets %v", secrets)
	}
	fpA := secrets[0].(map[string]any)["fingerprint"]
	// The same definition again is a no-op; another secret is a conflict.
	if status, _ := call(t, ts, "POST", "/v1/subscriptions", `{"name": "billing", "source": "webhooks", "target": "http://127.0.0.1:9/in",
		"secret": "`+apiSecretA+`", "headers": {"X-Team": "billing"}, "timeout": "10s", "retry_schedule": "5s,1m,10m", "max_attempts": 8}`); status != 200 {
		t.Fatalf("create again: %d", status)
	}
	if status, _ := call(t, ts, "POST", "/v1/subscriptions", `{"name": "billing", "source": "webhooks", "target": "http://127.0.0.1:9/in",
		"secret": "`+apiSecretB+`", "headers": {"X-Team": "billing"}, "timeout": "10s", "retry_schedule": "5s,1m,10m", "max_attempts": 8}`); status != 409 {
		t.Fatalf("create with another secret: %d, want 409", status)
	}

	status, sub = call(t, ts, "PATCH", "/v1/subscriptions/billing", `{"secret": "`+apiSecretB+`", "secret_overlap": "2h", "timeout": null,
		"retry_schedule": null, "retry_base_delay": "2s", "retry_max_delay": "1h"}`)
	if status != 200 {
		t.Fatalf("patch: %d %v", status, sub)
	}
	secrets = sub["secrets"].([]any)
	if len(secrets) != 2 || !isFingerprint(secrets[0].(map[string]any)["fingerprint"]) || secrets[0].(map[string]any)["fingerprint"] == fpA ||
		secrets[0].(map[string]any)["expires_at"] != nil || secrets[1].(map[string]any)["fingerprint"] != fpA || secrets[1].(map[string]any)["expires_at"] == nil {
		t.Fatalf("secrets after rotation %v", secrets)
	}
	if sub["timeout"] != nil || sub["retry_schedule"] != nil || sub["retry_base_delay"] != "2s" || sub["retry_max_delay"] != "1h" ||
		fmt.Sprint(sub["max_attempts"]) != "8" || sub["target"] != "http://127.0.0.1:9/in" {
		t.Fatalf("patch answered %v", sub)
	}
	for _, path := range []string{"/v1/subscriptions/billing", "/v1/subscriptions"} {
		resp, err := ts.HTTP.Get(ts.Base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, secret := range []string{apiSecretA, apiSecretB, apiSecretA[6:20], apiSecretB[6:20]} {
			if strings.Contains(string(body), secret) {
				t.Fatalf("GET %s shows a secret: %s", path, body)
			}
		}
	}
	// null removes the secret.
	if status, sub = call(t, ts, "PATCH", "/v1/subscriptions/billing", `{"secret": null}`); status != 200 || len(sub["secrets"].([]any)) != 0 {
		t.Fatalf("secret null: %d %v", status, sub)
	}
}

// TestAPIEndpointBadInput: every bad endpoint setting is a 400 whose
// message names the field; max attempts beyond the schedule is fine.
func TestAPIEndpointBadInput(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	base := `"source": "webhooks", "target": "http://127.0.0.1:9/in"`
	for _, c := range []struct{ body, code, mentions string }{
		{`"secret": "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"`, "invalid_field", "secret"},
		{`"secret": "whsec_%%%"`, "invalid_field", "secret"},
		{`"secret": 42`, "invalid_json", "secret"},
		{`"headers": {"Connection": "close"}`, "invalid_field", "Connection"},
		{`"headers": {"Transfer-Encoding": "chunked"}`, "invalid_field", "Transfer-Encoding"},
		{`"headers": {"Expect": "100-continue"}`, "invalid_field", "Expect"},
		{`"headers": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`, "invalid_field", "traceparent"},
		{`"headers": {"webhook-signature": "v1,x"}`, "invalid_field", "webhook-signature"},
		{`"headers": {"X-A": "line\nbreak"}`, "invalid_field", "headers"},
		{`"headers": {"Bad Name": "x"}`, "invalid_field", "headers"},
		{`"headers": {"X-` + strings.Repeat("h", 300) + `": "x"}`, "invalid_field", "at most 256"},
		{`"headers": ["X-A"]`, "invalid_json", "headers"},
		{`"headers": {"X-A": null}`, "invalid_json", "not null"},
		{`"retry_schedule": "5s,soon"`, "invalid_field", "retry_schedule"},
		{`"retry_schedule": "5s,0s"`, "invalid_field", "retry_schedule"},
		{`"retry_schedule": "5s", "retry_base_delay": "1s"`, "invalid_field", "retry_schedule"},
		{`"retry_base_delay": "1h", "retry_max_delay": "1ms"`, "invalid_field", "retry_base_delay 1h0m0s is above retry_max_delay"},
		{`"timeout": "0s"`, "invalid_field", "timeout"},
		{`"timeout": "-1s"`, "invalid_field", "timeout"},
		{`"timeout": "1h"`, "invalid_field", "timeout"},
		{`"retry_base_delay": "later"`, "invalid_field", "retry_base_delay"},
		{`"retry_max_delay": "-5m"`, "invalid_field", "retry_max_delay"},
		{`"max_attempts": 0`, "invalid_field", "max_attempts"},
		{`"max_attempts": -2`, "invalid_field", "max_attempts"},
		{`"max_attempts": "3"`, "invalid_json", "max_attempts"},
	} {
		status, out := call(t, ts, "POST", "/v1/subscriptions", `{"name": "bad", `+base+`, `+c.body+`}`)
		e, _ := out["error"].(map[string]any)
		if status != 400 || e["code"] != c.code || !strings.Contains(fmt.Sprint(e["message"]), c.mentions) {
			t.Errorf("create with %s: %d %v, want 400 %s naming %s", c.body, status, out, c.code, c.mentions)
		}
		status, out = call(t, ts, "PATCH", "/v1/subscriptions/webhooks", `{"target": "http://127.0.0.1:9/p", `+c.body+`}`)
		e, _ = out["error"].(map[string]any)
		if status != 400 || !strings.Contains(fmt.Sprint(e["message"]), c.mentions) {
			t.Errorf("patch with %s: %d %v, want 400 naming %s", c.body, status, out, c.mentions)
		}
	}
	if status, out := call(t, ts, "POST", "/v1/subscriptions", `{"name": "bad", "source": "webhooks", "secret": "`+apiSecretA+`"}`); status != 400 ||
		!strings.Contains(fmt.Sprint(out), "target") {
		t.Errorf("a secret without a target: %d %v", status, out)
	}
	if status, out := call(t, ts, "PATCH", "/v1/subscriptions/webhooks", `{"secret_overlap": "1h"}`); status != 400 || !strings.Contains(fmt.Sprint(out), "secret_overlap") {
		t.Errorf("an overlap without a secret: %d %v", status, out)
	}
	if status, out := call(t, ts, "PATCH", "/v1/subscriptions/webhooks", `{}`); status != 400 || !strings.Contains(fmt.Sprint(out), "missing_field") {
		t.Errorf("an empty patch: %d %v", status, out)
	}
	if status, out := call(t, ts, "POST", "/v1/subscriptions", `{"name": "long", `+base+`, "retry_schedule": "1s,2s", "max_attempts": 50}`); status != 201 {
		t.Errorf("max attempts beyond the schedule: %d %v", status, out)
	}
}

// TestAPIAttempts: GET .../attempts lists what the workers did to deliver
// an item: each attempt's status, latency and the start of the answer.
func TestAPIAttempts(t *testing.T) {
	calls := 0
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if calls == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "try later")
			return
		}
		io.WriteString(w, "thanks")
	}))
	t.Cleanup(tg.Close)
	ts := start(t, server.Config{}, nil)
	if status, out := call(t, ts, "PATCH", "/v1/subscriptions/webhooks", `{"target": "`+tg.URL+`", "retry_schedule": "1s"}`); status != 200 {
		t.Fatalf("patch: %d %v", status, out)
	}
	req, _ := http.NewRequest("POST", ts.Base+"/webhooks", strings.NewReader(`{"amount": 1}`))
	req.Header.Set("Idempotency-Key", "att-1")
	req.Header.Set("Content-Type", "application/json")
	resp, err := ts.HTTP.Do(req)
	if err != nil || resp.StatusCode != 202 {
		t.Fatalf("webhook: %v %v", resp, err)
	}
	resp.Body.Close()
	var id any
	waitFor(t, 15*time.Second, "the item to complete", func() bool {
		_, out := call(t, ts, "GET", "/v1/inboxes/webhooks/items?state=completed", "")
		items, _ := out["items"].([]any)
		if len(items) == 1 {
			id = items[0].(map[string]any)["id"]
		}
		return len(items) == 1
	})
	status, out := call(t, ts, "GET", fmt.Sprint("/v1/inboxes/webhooks/items/", id, "/attempts"), "")
	log, _ := out["attempts"].([]any)
	if status != 200 || len(log) != 2 {
		t.Fatalf("attempts: %d %v", status, out)
	}
	a, b := log[0].(map[string]any), log[1].(map[string]any)
	if fmt.Sprint(a["attempt"]) != "1" || fmt.Sprint(a["status_code"]) != "503" || a["response_excerpt"] != "try later" ||
		!strings.Contains(fmt.Sprint(a["error"]), "503") || a["endpoint_url"] != tg.URL || a["latency_ms"].(float64) <= 0 {
		t.Fatalf("first attempt %v", a)
	}
	if fmt.Sprint(b["attempt"]) != "2" || fmt.Sprint(b["status_code"]) != "200" || b["response_excerpt"] != "thanks" || b["error"] != nil {
		t.Fatalf("second attempt %v", b)
	}
	if status, _ := call(t, ts, "GET", fmt.Sprint("/v1/inboxes/other/items/", id, "/attempts"), ""); status != 404 {
		t.Fatalf("attempts of an item of another inbox: %d, want 404", status)
	}
}

// TestAPIEndpointCredentialHeaders: a header that carries a credential
// (Authorization, a token, an API key) is sent as set but never answered
// whole, by create or by GET; other headers are.
func TestAPIEndpointCredentialHeaders(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	status, sub := call(t, ts, "POST", "/v1/subscriptions", `{"name": "billing", "source": "webhooks", "target": "http://127.0.0.1:9/in",
		"headers": {"Authorization": "Bearer s3cret-abcdefgh", "X-Api-Key": "k1", "X-Team": "billing"}}`)
	if status != 201 {
		t.Fatalf("create: %d %v", status, sub)
	}
	_, got := call(t, ts, "GET", "/v1/subscriptions/billing", "")
	for what, answer := range map[string]map[string]any{"create": sub, "get": got} {
		h, _ := answer["headers"].(map[string]any)
		auth, _ := h["Authorization"].(string)
		key, _ := h["X-Api-Key"].(string)
		if !isFingerprint(strings.TrimSuffix(strings.TrimPrefix(auth, "(hidden, "), ")")) ||
			!isFingerprint(strings.TrimSuffix(strings.TrimPrefix(key, "(hidden, "), ")")) || auth == key || h["X-Team"] != "billing" {
			t.Errorf("%s answered headers %v", what, h)
		}
		if strings.Contains(fmt.Sprint(answer), "s3cret") || strings.Contains(fmt.Sprint(answer), "efgh") {
			t.Errorf("%s answered the credential: %v", what, answer)
		}
	}
}
