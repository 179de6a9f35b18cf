package server_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/server"
)

// webhooks posts n webhooks of type typ with keys prefix-1.. to ts.
func webhooks(t *testing.T, ts *testServer, prefix, typ string, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		status, body, _ := post(t, ts, fmt.Sprintf(`{"n":%d}`, i), map[string]string{"Idempotency-Key": fmt.Sprintf("%s-%d", prefix, i), "X-Event-Type": typ})
		if status != http.StatusAccepted {
			t.Fatalf("POST /webhooks: %d %v", status, body)
		}
	}
}

// TestAPIPause: a paused subscription's items are not leased (a pull
// lease answers none) while its inbox keeps filling; resumed, they are.
// The subscription shows when and why it was paused.
func TestAPIPause(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	if status, body := call(t, ts, "POST", "/v1/subscriptions", `{"name": "jobs", "source": "webhooks", "start": "earliest"}`); status != 201 {
		t.Fatalf("create: %d %v", status, body)
	}
	status, sub := call(t, ts, "POST", "/v1/subscriptions/jobs/pause", `{"reason": "handler deploy"}`)
	if status != 200 || sub["paused"] != true || sub["paused_at"] == nil || sub["paused_reason"] != "handler deploy" {
		t.Fatalf("pause: %d %v", status, sub)
	}
	webhooks(t, ts, "job", "job.run", 3)
	waitFor(t, 30*time.Second, "3 pending items in jobs", func() bool {
		_, page := call(t, ts, "GET", "/v1/inboxes/jobs/items?state=pending", "")
		items, _ := page["items"].([]any)
		return len(items) == 3
	})
	if status, l := call(t, ts, "POST", "/v1/inboxes/jobs/lease", `{"max": 10}`); status != 200 || len(l["items"].([]any)) != 0 {
		t.Fatalf("lease while paused: %d %v, want 200 and no items", status, l)
	}
	if _, got := call(t, ts, "GET", "/v1/subscriptions", ""); got["subscriptions"].([]any)[0].(map[string]any)["paused"] != true {
		t.Fatalf("the list does not show jobs paused: %v", got)
	}

	for _, c := range []struct{ path, body, code string }{
		{"/v1/subscriptions/nope/pause", ``, "not_found"},
		{"/v1/subscriptions/jobs/pause", `{"why": "x"}`, "unknown_field"},
		{"/v1/subscriptions/jobs/pause", `{"reason": "` + strings.Repeat("x", 501) + `"}`, "invalid_field"},
		{"/v1/subscriptions/jobs/resume", `{"reason": "x"}`, "unknown_field"},
		{"/v1/subscriptions/nope/resume", ``, "not_found"},
	} {
		if _, body := call(t, ts, "POST", c.path, c.body); errorCode(body) != c.code {
			t.Errorf("POST %s %s: %v, want %s", c.path, c.body, body, c.code)
		}
	}

	status, sub = call(t, ts, "POST", "/v1/subscriptions/jobs/resume", "")
	if status != 200 || sub["paused"] != false || sub["paused_at"] != nil || sub["paused_reason"] != nil {
		t.Fatalf("resume: %d %v", status, sub)
	}
	if status, l := call(t, ts, "POST", "/v1/inboxes/jobs/lease", `{"max": 10}`); status != 200 || len(l["items"].([]any)) != 3 {
		t.Fatalf("lease after the resume: %d %v, want the 3 items", status, l)
	}
}

// TestAPICancelDiscard: a pending item is cancelled into a dead letter,
// an item is discarded, a processing one is refused both, and dead
// letters are discarded by selection.
func TestAPICancelDiscard(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	if status, body := call(t, ts, "POST", "/v1/subscriptions", `{"name": "jobs", "source": "webhooks", "start": "earliest"}`); status != 201 {
		t.Fatalf("create: %d %v", status, body)
	}
	webhooks(t, ts, "job", "job.run", 6)
	var ids []string // of the items, by id
	waitFor(t, 30*time.Second, "6 pending items in jobs", func() bool {
		_, page := call(t, ts, "GET", "/v1/inboxes/jobs/items?state=pending", "")
		items, _ := page["items"].([]any)
		ids = ids[:0]
		for _, it := range items {
			ids = append(ids, fmt.Sprint(it.(map[string]any)["id"]))
		}
		return len(items) == 6
	})
	item := func(i int) string { return "/v1/inboxes/jobs/items/" + ids[i] }
	status, it := call(t, ts, "POST", item(0)+"/cancel", `{"reason": "sent by mistake"}`)
	if status != 200 || it["state"] != "failed" || it["last_error"] != "cancelled by an operator: sent by mistake" || it["failed_at"] == nil {
		t.Fatalf("cancel: %d %v", status, it)
	}
	if _, body := call(t, ts, "POST", item(0)+"/cancel", ""); errorCode(body) != "invalid_state" {
		t.Fatalf("cancel of a dead letter: %v, want invalid_state", body)
	}
	for i := 1; i <= 3; i++ {
		if status, it := call(t, ts, "POST", item(i)+"/cancel", ""); status != 200 || it["last_error"] != "cancelled by an operator" {
			t.Fatalf("cancel %s: %d %v", ids[i], status, it)
		}
	}
	status, it = call(t, ts, "POST", item(4)+"/discard", "")
	if status != 200 || it["state"] != "pending" {
		t.Fatalf("discard of a pending item: %d %v", status, it)
	}
	if status, body := call(t, ts, "GET", item(4), ""); status != 404 {
		t.Fatalf("a discarded item: %d %v, want 404", status, body)
	}
	if status, l := call(t, ts, "POST", "/v1/inboxes/jobs/lease", `{"max": 10}`); status != 200 || len(l["items"].([]any)) != 1 {
		t.Fatalf("lease: %d %v, want the last item alone", status, l)
	}
	for _, c := range []struct{ path, body, code string }{
		{item(5) + "/discard", ``, "invalid_state"}, // processing
		{item(5) + "/cancel", ``, "invalid_state"},
		{"/v1/inboxes/jobs/items/999999/cancel", ``, "not_found"},
		{"/v1/inboxes/other/items/" + ids[0] + "/discard", ``, "not_found"},
		{"/v1/inboxes/jobs/items/x/discard", ``, "invalid_field"},
		{item(0) + "/cancel", `{"reason": 3}`, "invalid_json"},
		{"/v1/dead-letters/discard", `{}`, "missing_field"},
		{"/v1/dead-letters/discard", `{"ids": [0]}`, "invalid_field"},
		{"/v1/dead-letters/discard", `{"from": "yesterday"}`, "invalid_field"},
		{"/v1/dead-letters/discard", `{"inbox": "a b"}`, "invalid_field"},
	} {
		if _, body := call(t, ts, "POST", c.path, c.body); errorCode(body) != c.code {
			t.Errorf("POST %s %s: %v, want %s", c.path, c.body, body, c.code)
		}
	}

	// By ids, then every one of an inbox.
	status, res := call(t, ts, "POST", "/v1/dead-letters/discard", `{"ids": [`+ids[0]+`, `+ids[1]+`, `+ids[5]+`]}`)
	if status != 200 || fmt.Sprint(res["ids"]) != "["+ids[0]+" "+ids[1]+"]" || fmt.Sprint(res["discarded"]) != "2" {
		t.Fatalf("discard by ids: %d %v, want the first two (the last is processing)", status, res)
	}
	status, res = call(t, ts, "POST", "/v1/dead-letters/discard", `{"inbox": "jobs"}`)
	if status != 200 || fmt.Sprint(res["ids"]) != "["+ids[2]+" "+ids[3]+"]" {
		t.Fatalf("discard of inbox jobs: %d %v", status, res)
	}
	if _, page := call(t, ts, "GET", "/v1/dead-letters?inbox=jobs", ""); len(page["items"].([]any)) != 0 {
		t.Fatalf("dead letters left: %v", page)
	}
}

// TestAPITestEvent: a test event reaches the endpoint as the workers send
// items (signed, with its headers) and the answer says what the endpoint
// said, a failure included.
func TestAPITestEvent(t *testing.T) {
	var mu sync.Mutex
	var got *http.Request
	var body string
	fail := false
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		got, body = r, string(b)
		if fail {
			http.Error(w, "not today", http.StatusTeapot)
			return
		}
		w.Write([]byte(`{"ok":true}`))
	}))
	defer target.Close()
	ts := start(t, server.Config{}, nil)
	if status, b := call(t, ts, "POST", "/v1/subscriptions", `{"name": "hooks", "source": "webhooks", "target": "`+target.URL+`",
		"secret": "`+apiSecretA+`", "headers": {"X-Team": "ops"}}`); status != 201 {
		t.Fatalf("create: %d %v", status, b)
	}
	status, res := call(t, ts, "POST", "/v1/subscriptions/hooks/test", "")
	if status != 200 || res["ok"] != true || fmt.Sprint(res["status_code"]) != "200" || res["response_excerpt"] != `{"ok":true}` ||
		res["type"] != "postbox.test" || !strings.HasPrefix(fmt.Sprint(res["event_id"]), "test_") || res["endpoint_url"] != target.URL {
		t.Fatalf("test: %d %v", status, res)
	}
	mu.Lock()
	if got.Header.Get("X-Event-Type") != "postbox.test" || got.Header.Get("X-Team") != "ops" || got.Header.Get("webhook-signature") == "" ||
		got.Header.Get("webhook-id") != res["event_id"] || !strings.Contains(body, `"subscription":"hooks"`) {
		t.Errorf("the endpoint got %v %s", got.Header, body)
	}
	fail = true
	mu.Unlock()
	status, res = call(t, ts, "POST", "/v1/subscriptions/hooks/test", "")
	if status != 200 || res["ok"] != false || fmt.Sprint(res["status_code"]) != "418" || !strings.Contains(fmt.Sprint(res["error"]), "not today") {
		t.Fatalf("test of a failing endpoint: %d %v", status, res)
	}
	if _, page := call(t, ts, "GET", "/v1/inboxes/hooks/items", ""); len(page["items"].([]any)) != 0 {
		t.Errorf("a test event left items: %v", page)
	}

	if status, b := call(t, ts, "POST", "/v1/subscriptions", `{"name": "pull", "source": "webhooks"}`); status != 201 {
		t.Fatalf("create: %d %v", status, b)
	}
	if _, b := call(t, ts, "POST", "/v1/subscriptions/pull/test", ""); errorCode(b) != "invalid_field" {
		t.Errorf("test of a subscription without a target: %v, want invalid_field", b)
	}
	if _, b := call(t, ts, "POST", "/v1/subscriptions/nope/test", ""); errorCode(b) != "not_found" {
		t.Errorf("test of an unknown subscription: %v, want not_found", b)
	}
}

// TestAPIHiddenHeaderSentBack: the fingerprint the API shows for a
// credential header, sent back as its value (a form filled from a GET), is
// refused naming the header, and the credential stays.
func TestAPIHiddenHeaderSentBack(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	status, sub := call(t, ts, "POST", "/v1/subscriptions", `{"name": "hooks", "source": "webhooks", "target": "http://127.0.0.1:9/in",
		"headers": {"Authorization": "Bearer s3cret", "X-Team": "ops"}}`)
	if status != 201 {
		t.Fatalf("create: %d %v", status, sub)
	}
	shown := sub["headers"].(map[string]any)["Authorization"].(string)
	if !strings.HasPrefix(shown, "(hidden, ") {
		t.Fatalf("the credential shows as %q", shown)
	}
	status, body := call(t, ts, "PATCH", "/v1/subscriptions/hooks", `{"headers": {"Authorization": "`+shown+`", "X-Team": "billing"}}`)
	if status != 400 || errorCode(body) != "invalid_field" || !strings.Contains(fmt.Sprint(body), "Authorization") {
		t.Fatalf("PATCH with the shown fingerprint: %d %v, want 400 invalid_field naming Authorization", status, body)
	}
	if _, sub = call(t, ts, "GET", "/v1/subscriptions/hooks", ""); sub["headers"].(map[string]any)["Authorization"] != shown || sub["headers"].(map[string]any)["X-Team"] != "ops" {
		t.Fatalf("the headers changed: %v", sub["headers"])
	}
}

// TestAPITestEventPolicy: a test event obeys the server's target address
// policy as the workers do: a name that resolves to a loopback address is
// refused when it is dialled, and nothing reaches the endpoint.
func TestAPITestEventPolicy(t *testing.T) {
	var calls atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer target.Close()
	ts := start(t, server.Config{Delivery: delivery.Config{DenyPrivateTargets: true}}, nil)
	_, port, _ := net.SplitHostPort(target.Listener.Addr().String())
	url := "http://localhost:" + port + "/hooks"
	status, b := call(t, ts, "POST", "/v1/subscriptions", `{"name": "hooks", "source": "webhooks", "target": "`+url+`"}`)
	if status != 201 { // a name is resolved when it is dialled, not when it is set
		t.Fatalf("create: %d %v", status, b)
	}
	status, res := call(t, ts, "POST", "/v1/subscriptions/hooks/test", "")
	if status != 200 || res["ok"] != false || !strings.Contains(fmt.Sprint(res["error"]), "127.0.0.1") {
		t.Fatalf("a test event to a loopback name: %d %v; want ok false and the refused address", status, res)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the endpoint got %d requests, want none", n)
	}
}
