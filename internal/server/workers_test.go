package server_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/server"
)

// hookTarget is a webhook handler service: it answers status (settable)
// and records what it got.
type hookTarget struct {
	*httptest.Server
	mu       sync.Mutex
	statuses []int // answered in turn; the last one from then on
	got      []*http.Request
	bodies   []string
}

func newHookTarget(t *testing.T, statuses ...int) *hookTarget {
	h := &hookTarget{statuses: statuses}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		status := h.statuses[min(len(h.got), len(h.statuses)-1)]
		h.got = append(h.got, r)
		h.bodies = append(h.bodies, string(body))
		h.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *hookTarget) calls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.got)
}

func (h *hookTarget) answer(statuses ...int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.statuses = append(make([]int, len(h.got)), statuses...)
}

// fastRetries retries after 20ms, then 40ms, ...
var fastRetries = delivery.Config{RetryBaseDelay: 20 * time.Millisecond, RetryMaxDelay: 100 * time.Millisecond}

// TestWebhookTarget: a webhook POSTed to postbox reaches the target with
// its body and headers; a failed attempt is retried; the status endpoint
// and the metrics tell the story.
func TestWebhookTarget(t *testing.T) {
	tg := newHookTarget(t, 500, 204)
	ts := start(t, server.Config{Webhooks: server.WebhookConfig{Target: tg.URL + "/hooks"}, Delivery: fastRetries}, nil)
	status, body, _ := post(t, ts, `{"action": "opened"}`, map[string]string{"Idempotency-Key": "gh-1", "X-Event-Type": "pull_request",
		"X-GitHub-Event": "pull_request", "Authorization": "Bearer upstream-secret"})
	if status != http.StatusAccepted {
		t.Fatalf("POST: %d %v", status, body)
	}
	id := body["id"].(string)
	var got map[string]any
	waitFor(t, 10*time.Second, "the webhook to be completed", func() bool {
		_, got = call(t, ts, "GET", "/webhooks/"+id, "")
		return got["status"] == delivery.StateCompleted
	})
	// Completed: the 500 is history, in its delivery's attempts, not the
	// webhook's current error.
	if got["attempts"] != float64(2) || got["last_error"] != nil ||
		!strings.Contains(fmt.Sprint(got["deliveries"]), "answered 500 Internal Server Error") {
		t.Fatalf("status: %v", got)
	}
	if tg.calls() != 2 {
		t.Fatalf("the target got %d requests, want 2", tg.calls())
	}
	r := tg.got[1]
	if r.URL.Path != "/hooks" || tg.bodies[1] != `{"action": "opened"}` || r.Header.Get("Idempotency-Key") != "gh-1" ||
		r.Header.Get("X-Event-Type") != "pull_request" || r.Header.Get("X-Github-Event") != "pull_request" ||
		r.Header.Get("Authorization") != "" || r.Header.Get("X-Postbox-Attempt") != "2" {
		t.Fatalf("the target got %s %v %s", r.URL.Path, r.Header, tg.bodies[1])
	}
	ts.wantMetrics(t, map[string]float64{
		`postbox_worker_attempt_seconds_count{inbox="webhooks",result="completed"}`: 1,
		`postbox_worker_attempt_seconds_count{inbox="webhooks",result="pending"}`:   1,
		`postbox_inbox_items{inbox="webhooks",state="completed"}`:                   1,
		`postbox_inbox_items{inbox="webhooks",state="pending"}`:                     0,
		`postbox_inbox_oldest_pending_age_seconds{inbox="webhooks"}`:                0,
		`postbox_inbox_settled_total{inbox="webhooks",state="pending"}`:             1,
	})
}

// TestDeadLetterAPI: a target answering 410 dead-letters the webhook; the
// dead-letter API lists, shows and replays it, with every error status.
func TestDeadLetterAPI(t *testing.T) {
	tg := newHookTarget(t, http.StatusGone)
	ts := start(t, server.Config{Webhooks: server.WebhookConfig{Target: tg.URL}, Delivery: fastRetries}, nil)
	post(t, ts, `{"n": 1}`, map[string]string{"Idempotency-Key": "k-1"})
	var list map[string]any
	waitFor(t, 10*time.Second, "a dead letter", func() bool {
		_, list = call(t, ts, "GET", "/v1/dead-letters?subscription=webhooks", "")
		return len(list["items"].([]any)) == 1
	})
	item := list["items"].([]any)[0].(map[string]any)
	id := fmt.Sprint(item["id"])
	if item["state"] != delivery.StateFailed || item["attempts"] != float64(1) || item["failed_at"] == nil ||
		!strings.Contains(fmt.Sprint(item["last_error"]), "410 Gone") {
		t.Fatalf("dead letter: %v", item)
	}
	if st, got := call(t, ts, "GET", "/v1/dead-letters/"+id, ""); st != 200 || got["id"] != item["id"] {
		t.Fatalf("show: %d %v", st, got)
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, c := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"GET", "/v1/dead-letters/999", "", 404, "not_found"},
		{"GET", "/v1/dead-letters/x", "", 400, "invalid_field"},
		{"GET", "/v1/dead-letters?from=yesterday", "", 400, "invalid_field"},
		{"GET", "/v1/dead-letters?from=" + future + "&to=" + future, "", 400, "invalid_field"},
		{"GET", "/v1/dead-letters?limit=0", "", 400, "invalid_field"},
		{"POST", "/v1/dead-letters/999/replay", "", 404, "not_found"},
		{"POST", "/v1/dead-letters/replay", `{}`, 400, "missing_field"},
		{"POST", "/v1/dead-letters/replay", ``, 400, "invalid_json"},
		{"POST", "/v1/dead-letters/replay", `{"inbox": 7}`, 400, "invalid_json"},
		{"POST", "/v1/dead-letters/replay", `{"everything": true}`, 400, "unknown_field"},
	} {
		if st, got := call(t, ts, c.method, c.path, c.body); st != c.status || errorCode(got) != c.code {
			t.Errorf("%s %s %s: %d %v, want %d %s", c.method, c.path, c.body, st, got, c.status, c.code)
		}
	}
	if _, got := call(t, ts, "GET", "/v1/dead-letters?from="+future, ""); len(got["items"].([]any)) != 0 {
		t.Fatalf("dead letters failed after an hour from now: %v", got)
	}
	if st, got := call(t, ts, "POST", "/v1/dead-letters/replay", `{"inbox": "nobody"}`); st != 200 || got["replayed"] != float64(0) {
		t.Fatalf("replay of an empty selection: %d %v", st, got)
	}

	tg.answer(http.StatusOK) // the target is fixed
	st, got := call(t, ts, "POST", "/v1/dead-letters/"+id+"/replay", "")
	if st != 200 || got["replays"] != float64(1) || got["replayed_at"] == nil {
		t.Fatalf("replay: %d %v", st, got)
	}
	waitFor(t, 10*time.Second, "the replayed item to complete", func() bool {
		_, got = call(t, ts, "GET", "/v1/inboxes/webhooks/items/"+id, "")
		return got["state"] == delivery.StateCompleted
	})
	if tg.calls() != 2 || got["attempts"] != float64(1) {
		t.Fatalf("after replay: %d calls, item %v", tg.calls(), got)
	}
	if st, got := call(t, ts, "POST", "/v1/dead-letters/"+id+"/replay", ""); st != 409 || errorCode(got) != "invalid_state" {
		t.Fatalf("replay of a completed item: %d %v", st, got)
	}
	if st, got := call(t, ts, "GET", "/v1/dead-letters/"+id, ""); st != 404 {
		t.Fatalf("show of a completed item: %d %v", st, got)
	}
}

// TestSubscriptionTarget: subscriptions created over the API with a target
// are pushed to it; a bad target or a shared inbox is refused.
func TestSubscriptionTarget(t *testing.T) {
	tg := newHookTarget(t, 200)
	ts := start(t, server.Config{}, nil)
	for body, code := range map[string]string{
		`{"name":"a","source":"webhooks","target":"ftp://x"}`: "invalid_field",
		`{"name":"a","source":"webhooks","target":"nohost"}`:  "invalid_field",
		`{"name":"a","source":"webhooks","target":7}`:         "invalid_json",
	} {
		if st, got := call(t, ts, "POST", "/v1/subscriptions", body); st != 400 || errorCode(got) != code {
			t.Errorf("%s: %d %v", body, st, got)
		}
	}
	st, got := call(t, ts, "POST", "/v1/subscriptions", `{"name":"orders","source":"webhooks","types":["order.*"],"target":"`+tg.URL+`"}`)
	if st != 201 || got["target"] != tg.URL {
		t.Fatalf("create: %d %v", st, got)
	}
	if st, got := call(t, ts, "POST", "/v1/subscriptions", `{"name":"other","source":"webhooks","inbox":"orders"}`); st != 409 {
		t.Fatalf("a pull subscription into the pushed inbox orders: %d %v", st, got)
	}
	post(t, ts, `{}`, map[string]string{"Idempotency-Key": "o-1", "X-Event-Type": "order.paid"})
	post(t, ts, `{}`, map[string]string{"Idempotency-Key": "u-1", "X-Event-Type": "user.created"})
	waitFor(t, 10*time.Second, "the order to reach the target", func() bool { return tg.calls() == 1 })
	if k := tg.got[0].Header.Get("Idempotency-Key"); k != "o-1" {
		t.Fatalf("the target got %s", k)
	}
}

// TestPatchTarget: a subscription's target changes over the API, and the
// workers follow it.
func TestPatchTarget(t *testing.T) {
	first, second := newHookTarget(t, 200), newHookTarget(t, 200)
	ts := start(t, server.Config{Webhooks: server.WebhookConfig{Target: first.URL}}, nil)
	post(t, ts, `{}`, map[string]string{"Idempotency-Key": "p-1"})
	waitFor(t, 10*time.Second, "the first target to get p-1", func() bool { return first.calls() == 1 })
	st, got := call(t, ts, "PATCH", "/v1/subscriptions/webhooks", `{"target": "`+second.URL+`"}`)
	if st != 200 || got["target"] != second.URL {
		t.Fatalf("patch: %d %v", st, got)
	}
	post(t, ts, `{}`, map[string]string{"Idempotency-Key": "p-2"})
	waitFor(t, 10*time.Second, "the second target to get p-2", func() bool { return second.calls() == 1 })
	if st, got := call(t, ts, "PATCH", "/v1/subscriptions/webhooks", `{"target": null}`); st != 200 || got["target"] != nil {
		t.Fatalf("patch to none: %d %v", st, got)
	}
	post(t, ts, `{}`, map[string]string{"Idempotency-Key": "p-3"})
	waitFor(t, 10*time.Second, "p-3 to wait in the inbox for a runtime", func() bool {
		_, got := call(t, ts, "GET", "/v1/inboxes", "")
		in := got["inboxes"].([]any)
		return len(in) == 1 && in[0].(map[string]any)["pending"] == float64(1)
	})
	for body, want := range map[string]string{`{}`: "missing_field", `{"target": 3}`: "invalid_json",
		`{"target": "ftp://x"}`: "invalid_field", `{"types": ["a"]}`: "unknown_field"} {
		if st, got := call(t, ts, "PATCH", "/v1/subscriptions/webhooks", body); st != 400 || errorCode(got) != want {
			t.Errorf("PATCH %s: %d %v, want 400 %s", body, st, got, want)
		}
	}
	if st, _ := call(t, ts, "PATCH", "/v1/subscriptions/nope", `{"target": null}`); st != 404 {
		t.Errorf("PATCH of an unknown subscription: %d", st)
	}
	if first.calls() != 1 || second.calls() != 1 {
		t.Fatalf("calls %d and %d, want 1 and 1", first.calls(), second.calls())
	}
}
