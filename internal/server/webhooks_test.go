package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/stdwebhook"
)

// post sends a webhook with headers and returns the status, the decoded
// body and the response's headers.
func post(t *testing.T, ts *testServer, body string, headers map[string]string) (int, map[string]any, http.Header) {
	t.Helper()
	req, err := http.NewRequest("POST", ts.Base+"/webhooks", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := ts.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("POST /webhooks: %d, body is not JSON: %s", resp.StatusCode, data)
	}
	return resp.StatusCode, out, resp.Header
}

func errorCode(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

// TestWebhookIntake: every answer of POST /webhooks, from a real client.
func TestWebhookIntake(t *testing.T) {
	ts := start(t, server.Config{Webhooks: server.WebhookConfig{MaxBytes: 4096}}, nil)
	key := map[string]string{"Idempotency-Key": "delivery-1", "X-Event-Type": "invoice.paid", "Authorization": "Bearer secret"}

	status, body, _ := post(t, ts, `{"amount": 42}`, key)
	if status != http.StatusAccepted || body["idempotency_key"] != "delivery-1" || body["status"] != "pending" ||
		!strings.HasPrefix(fmt.Sprint(body["id"]), "wh_") || body["created_at"] == nil {
		t.Fatalf("new webhook: %d %v", status, body)
	}
	id, created := body["id"], body["created_at"]
	// The same delivery again, whitespace aside: 200, the same id and time.
	status, body, _ = post(t, ts, `{"amount":42}`, key)
	if status != http.StatusOK || body["id"] != id || body["created_at"] != created || body["status"] == nil {
		t.Fatalf("redelivery: %d %v", status, body)
	}
	if status, body, _ = post(t, ts, `{"amount": 43}`, key); status != http.StatusConflict || errorCode(body) != "conflict" {
		t.Fatalf("same key, another payload: %d %v", status, body)
	}
	// The Standard Webhooks id is a key too.
	if status, body, _ = post(t, ts, `{}`, map[string]string{"Webhook-Id": "msg_2"}); status != http.StatusAccepted || body["idempotency_key"] != "msg_2" {
		t.Fatalf("webhook-id: %d %v", status, body)
	}
	for _, c := range []struct {
		body    string
		headers map[string]string
		status  int
		code    string
	}{
		{`{}`, nil, 400, "missing_field"},
		{`{"a":`, map[string]string{"Idempotency-Key": "k"}, 400, "invalid_json"},
		{``, map[string]string{"Idempotency-Key": "k"}, 400, "invalid_json"},
		{"{\"a\":\"\xff\"}", map[string]string{"Idempotency-Key": "k"}, 400, "invalid_json"},                                     // not UTF-8
		{strings.Repeat("[", 1001) + strings.Repeat("]", 1001), map[string]string{"Idempotency-Key": "k"}, 400, "invalid_field"}, // nested too deep
		{`{}`, map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, 400, "invalid_field"},
		{`{"big":"` + strings.Repeat("x", 5000) + `"}`, map[string]string{"Idempotency-Key": "k"}, 413, "too_large"},
		{`a=1`, map[string]string{"Idempotency-Key": "k", "Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
		{`{}`, map[string]string{"Idempotency-Key": "k", "Content-Type": ""}, 415, "unsupported_media_type"},
	} {
		status, body, _ := post(t, ts, c.body, c.headers)
		if status != c.status || errorCode(body) != c.code {
			t.Errorf("%.40q %v: %d %v, want %d %s", c.body, c.headers, status, body, c.status, c.code)
		}
	}
	if status, _, _ := post(t, ts, `{}`, map[string]string{"Idempotency-Key": "vendor", "Content-Type": "application/vnd.acme+json"}); status != http.StatusAccepted {
		t.Errorf("a +json media type: %d", status)
	}
	// Refused requests stored nothing; the conflict and the redelivery
	// were counted.
	if _, st := call(t, ts, "GET", "/v1/streams/webhooks", ""); st["events"] != 3.0 {
		t.Fatalf("the webhooks stream holds %v events, want the 3 accepted", st["events"])
	}
	m := ts.metrics(t)
	for result, want := range map[string]float64{"stored": 3, "duplicate": 1, "conflict": 1} {
		if got := m[`postbox_ingress_events_total{result="`+result+`",source="webhooks"}`]; got != want {
			t.Errorf("webhooks %s counted %v, want %v", result, got, want)
		}
	}

	// The webhook is found by id and by key, with its state in the default
	// subscription; a runtime completes it through the inbox "webhooks".
	get := func(path string) (int, map[string]any) { return call(t, ts, "GET", path, "") }
	inInbox := func() bool {
		_, body := call(t, ts, "GET", "/v1/inboxes/webhooks/items?state=pending", "")
		items, _ := body["items"].([]any)
		return len(items) == 3 // delivery-1, msg_2, vendor
	}
	waitFor(t, 10*time.Second, "3 webhooks in the inbox", inInbox)
	status, body = get("/webhooks/" + fmt.Sprint(id))
	if status != 200 || body["status"] != "pending" || body["type"] != "invoice.paid" || body["attempts"] != 0.0 || body["updated_at"] == nil {
		t.Fatalf("GET by id: %d %v", status, body)
	}
	_, lease := call(t, ts, "POST", "/v1/inboxes/webhooks/lease", `{"max":1}`)
	it := lease["items"].([]any)[0].(map[string]any)
	meta := it["metadata"].(map[string]any)["headers"].(map[string]any)
	if it["event_id"] != "delivery-1" || meta["x-event-type"] != "invoice.paid" || meta["authorization"] != nil {
		t.Fatalf("leased webhook: %v (credentials must not be kept)", it)
	}
	call(t, ts, "POST", "/v1/inboxes/webhooks/ack", fmt.Sprintf(`{"ids":[%v],"lease":%q}`, it["id"], lease["lease"]))
	status, body = get("/webhooks?idempotency_key=delivery-1")
	if status != 200 || body["id"] != id || body["status"] != "completed" || body["attempts"] != 1.0 {
		t.Fatalf("GET by key after the ack: %d %v", status, body)
	}
	if _, body, _ = post(t, ts, `{"amount":42}`, key); body["status"] != "completed" {
		t.Fatalf("a redelivery after completion says %v", body)
	}
	for path, want := range map[string]int{"/webhooks/wh_999": 404, "/webhooks/nope": 404, "/webhooks?idempotency_key=nope": 404, "/webhooks": 400} {
		if status, body := get(path); status != want {
			t.Errorf("GET %s: %d %v, want %d", path, status, body, want)
		}
	}
}

// TestWebhookProviders: the key and type come from where GitHub and
// Stripe put them when the source is told so.
func TestWebhookProviders(t *testing.T) {
	github := start(t, server.Config{Webhooks: server.WebhookConfig{KeyHeader: "X-GitHub-Delivery", TypeHeader: "X-GitHub-Event"}}, nil)
	status, body, _ := post(t, github, `{"action":"opened"}`, map[string]string{"X-GitHub-Delivery": "72d3162e", "X-GitHub-Event": "pull_request"})
	if status != 202 || body["idempotency_key"] != "72d3162e" {
		t.Fatalf("GitHub: %d %v", status, body)
	}
	if _, got := call(t, github, "GET", "/webhooks/"+fmt.Sprint(body["id"]), ""); got["type"] != "pull_request" {
		t.Fatalf("GitHub type: %v", got)
	}
	status, body, _ = post(t, github, `{}`, nil)
	if status != 400 || !strings.Contains(fmt.Sprint(body), "X-GitHub-Delivery") {
		t.Fatalf("GitHub without a delivery id: %d %v (the message should name the header)", status, body)
	}

	stripe := start(t, server.Config{Webhooks: server.WebhookConfig{KeyField: "id", TypeField: "type"}}, nil)
	status, body, _ = post(t, stripe, `{"id":"evt_1NG8Du2eZvKYlo2C","type":"charge.succeeded","data":{}}`, nil)
	if status != 202 || body["idempotency_key"] != "evt_1NG8Du2eZvKYlo2C" {
		t.Fatalf("Stripe: %d %v", status, body)
	}
	if _, got := call(t, stripe, "GET", "/webhooks?idempotency_key=evt_1NG8Du2eZvKYlo2C", ""); got["type"] != "charge.succeeded" {
		t.Fatalf("Stripe type: %v", got)
	}
}

// TestWebhookQueueFull: when the writer's queue is full, POST /webhooks
// answers 429 with Retry-After at once; what was accepted is stored once
// the writer runs again and is answered 202.
func TestWebhookQueueFull(t *testing.T) {
	ts := start(t, server.Config{QueueSize: 1}, nil)
	release := lockDB(t, ts.DBPath) // the writer cannot commit
	var wg sync.WaitGroup
	statuses := make(chan int, 20)
	for i := range 20 {
		wg.Go(func() {
			status, _, h := post(t, ts, `{}`, map[string]string{"Idempotency-Key": fmt.Sprint("k", i)})
			if status == http.StatusTooManyRequests && h.Get("Retry-After") == "" {
				t.Errorf("429 without Retry-After")
			}
			statuses <- status
		})
	}
	waitFor(t, 10*time.Second, "a 429", func() bool { return len(statuses) > 0 })
	count := map[int]int{}
	for len(statuses) > 0 { // answered while nothing can commit: never 202
		if s := <-statuses; s != http.StatusTooManyRequests {
			t.Fatalf("answered %d while the writer could not commit", s)
		}
		count[http.StatusTooManyRequests]++
	}
	release()
	wg.Wait()
	close(statuses)
	for s := range statuses {
		count[s]++
	}
	if count[http.StatusTooManyRequests] == 0 || count[http.StatusAccepted] == 0 || count[429]+count[202] != 20 {
		t.Fatalf("answers %v, want some 202 and some 429 and nothing else", count)
	}
}

// TestWebhookSignatures: with a signing secret, only webhooks signed the
// Standard Webhooks way by one of the secrets, within 5 minutes, are
// stored; the rest get 401 naming what is wrong.
func TestWebhookSignatures(t *testing.T) {
	const secret, old = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_c2VjcmV0LW9mLWFub3RoZXItZW5kcG9pbnQ="
	ts := start(t, server.Config{Webhooks: server.WebhookConfig{Secrets: []string{secret, old}}}, nil)
	signed := func(key, id string, at time.Time, body string) map[string]string {
		k, err := stdwebhook.ParseSecret(key)
		if err != nil {
			t.Fatal(err)
		}
		return map[string]string{"Webhook-Id": id, "Webhook-Timestamp": fmt.Sprint(at.Unix()), "Webhook-Signature": stdwebhook.Sign(k, id, at, []byte(body))}
	}
	body := `{"type": "user.created", "data": {"id": 7}}`
	if status, got, _ := post(t, ts, body, signed(secret, "msg_1", time.Now(), body)); status != 202 || got["idempotency_key"] != "msg_1" {
		t.Fatalf("signed: %d %v", status, got)
	}
	if status, got, _ := post(t, ts, body, signed(old, "msg_2", time.Now(), body)); status != 202 {
		t.Fatalf("signed with the second secret: %d %v", status, got)
	}
	tampered := signed(secret, "msg_3", time.Now(), body)
	stale := signed(secret, "msg_4", time.Now().Add(-10*time.Minute), body)
	unsigned := map[string]string{"Webhook-Id": "msg_5", "Idempotency-Key": "k5"}
	for name, c := range map[string]struct {
		headers  map[string]string
		body     string
		mentions string
	}{
		"tampered body":  {tampered, `{"type": "user.created", "data": {"id": 8}}`, "no signature matches"},
		"replayed later": {stale, body, "timestamp"},
		"no signature":   {unsigned, body, "missing"},
		"another secret": {signed("whsec_"+"b3RoZXI=", "msg_6", time.Now(), body), body, "no signature matches"},
	} {
		status, got, _ := post(t, ts, c.body, c.headers)
		if status != http.StatusUnauthorized || errorCode(got) != "invalid_signature" || !strings.Contains(fmt.Sprint(got), c.mentions) {
			t.Errorf("%s: %d %v, want 401 invalid_signature mentioning %q", name, status, got, c.mentions)
		}
	}
	if _, err := server.NewDefault(server.Config{DBPath: filepath.Join(t.TempDir(), "p.db"), Webhooks: server.WebhookConfig{Secrets: []string{"whsec_%%%"}}}); err == nil || !strings.Contains(err.Error(), "whsec") {
		t.Error("a secret that is not base64 was accepted at startup")
	}
}
