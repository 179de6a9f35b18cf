package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
)

// webhookItem waits for the item of the webhook sent under key in the
// webhooks inbox, and returns it.
func webhookItem(t *testing.T, ts *testServer, key string) map[string]any {
	t.Helper()
	var it map[string]any
	waitFor(t, 30*time.Second, "the item of "+key, func() bool {
		_, page := call(t, ts, "GET", "/v1/inboxes/webhooks/items?limit=1000", "")
		items, _ := page["items"].([]any)
		for _, x := range items {
			if m := x.(map[string]any); m["event_id"] == key {
				it = m
				return true
			}
		}
		return false
	})
	return it
}

// dueAt is an item's next_attempt_at.
func dueAt(t *testing.T, it map[string]any) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(it["next_attempt_at"]))
	if err != nil {
		t.Fatalf("next_attempt_at of %v: %v", it, err)
	}
	return at
}

// leasedKeys leases up to 10 items of the webhooks inbox, waiting up to
// wait for one, and returns the keys of their events and the item ids.
func leasedKeys(t *testing.T, ts *testServer, wait string) (keys, ids []string) {
	t.Helper()
	status, l := call(t, ts, "POST", "/v1/inboxes/webhooks/lease", `{"max": 10, "wait": "`+wait+`"}`)
	if status != 200 {
		t.Fatalf("lease: %d %v", status, l)
	}
	for _, x := range l["items"].([]any) {
		m := x.(map[string]any)
		keys, ids = append(keys, fmt.Sprint(m["event_id"])), append(ids, fmt.Sprint(m["id"]))
	}
	return keys, ids
}

// TestWebhookSchedule: a webhook sent with Postbox-Delay: 2s makes an
// item due 2 s after it was received (its next_attempt_at) that a lease
// does not take before then and takes after; Postbox-Deliver-At sets the
// time itself (a redelivery with another time changes nothing), and one
// in the past is due at once. A scheduled item is
// cancelled before it is due (a dead letter, never leased), and cancelling
// one that a lease took is 409.
func TestWebhookSchedule(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	sent := time.Now()
	if status, body, _ := post(t, ts, `{"n":1}`, map[string]string{"Idempotency-Key": "delayed", "Postbox-Delay": "2s"}); status != http.StatusAccepted {
		t.Fatalf("POST with Postbox-Delay: %d %v", status, body)
	}
	received := time.Now()
	later := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	if status, body, _ := post(t, ts, `{"n":2}`, map[string]string{"Idempotency-Key": "later", "Postbox-Deliver-At": later.Format(time.RFC3339)}); status != http.StatusAccepted {
		t.Fatalf("POST with Postbox-Deliver-At: %d %v", status, body)
	}
	if status, body, _ := post(t, ts, `{"n":3}`, map[string]string{"Idempotency-Key": "past", "Postbox-Deliver-At": "2020-01-02T03:04:05Z"}); status != http.StatusAccepted {
		t.Fatalf("POST with a past Postbox-Deliver-At: %d %v", status, body)
	}
	delayed := webhookItem(t, ts, "delayed")
	if due := dueAt(t, delayed); due.Before(sent.Add(2*time.Second).Truncate(time.Microsecond)) || due.After(received.Add(2*time.Second)) {
		t.Fatalf("the delayed item is due at %v, want 2s after it was received (%v..%v)", due, sent, received)
	}
	if due := dueAt(t, webhookItem(t, ts, "later")); !due.Equal(later) {
		t.Fatalf("the later item is due at %v, want %v", due, later)
	}
	// Sent again with another time, it is the duplicate it is: the first
	// schedule stands.
	if status, body, _ := post(t, ts, `{"n":2}`, map[string]string{"Idempotency-Key": "later", "Postbox-Delay": "1s"}); status != http.StatusOK {
		t.Fatalf("the later webhook sent again: %d %v, want 200 (a duplicate)", status, body)
	}
	if due := dueAt(t, webhookItem(t, ts, "later")); !due.Equal(later) {
		t.Fatalf("after a redelivery, the later item is due at %v, want %v still", due, later)
	}
	webhookItem(t, ts, "past")

	keys, ids := leasedKeys(t, ts, "0s")
	if strings.Join(keys, ",") != "past" {
		t.Fatalf("leased %v at once, want past alone", keys)
	}
	takenPast := ids[0]
	// The delayed item goes once due: a lease that waits gets it, and not
	// before its time.
	keys, ids = leasedKeys(t, ts, "10s")
	if now := time.Now(); strings.Join(keys, ",") != "delayed" || now.Before(dueAt(t, delayed)) {
		t.Fatalf("leased %v at %v, want delayed, due at %v", keys, now, dueAt(t, delayed))
	}

	// Cancel the later one before it is due: a dead letter.
	laterID := fmt.Sprint(webhookItem(t, ts, "later")["id"])
	status, it := call(t, ts, "POST", "/v1/inboxes/webhooks/items/"+laterID+"/cancel", `{"reason": "not needed"}`)
	if status != 200 || it["state"] != "failed" || it["last_error"] != "cancelled by an operator: not needed" {
		t.Fatalf("cancel before due: %d %v", status, it)
	}
	// Taken items are not cancelled: 409.
	for _, id := range []string{takenPast, ids[0]} {
		status, body := call(t, ts, "POST", "/v1/inboxes/webhooks/items/"+id+"/cancel", "")
		if status != http.StatusConflict || errorCode(body) != "invalid_state" {
			t.Fatalf("cancel of a leased item: %d %v, want 409 invalid_state", status, body)
		}
	}
}

// TestWebhookScheduleInvalid: a schedule header that does not parse, a
// negative delay, a time or delay beyond 365 days, or both headers at
// once are refused with 400 invalid_field naming the header, and nothing
// is stored.
func TestWebhookScheduleInvalid(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	tooFar := time.Now().Add(366 * 24 * time.Hour).UTC().Format(time.RFC3339)
	for i, c := range []struct{ header, value, also string }{
		{"Postbox-Delay", "soon", ""},
		{"Postbox-Delay", "-5s", ""},
		{"Postbox-Delay", "8785h", ""},
		{"Postbox-Deliver-At", "tomorrow", ""},
		{"Postbox-Deliver-At", "2026-13-01T00:00:00Z", ""},
		{"Postbox-Deliver-At", tooFar, ""},
		{"Postbox-Deliver-At", "2030-01-01T00:00:00Z", "Postbox-Delay"},
	} {
		headers := map[string]string{"Idempotency-Key": fmt.Sprintf("bad-%d", i), c.header: c.value}
		if c.also != "" {
			headers[c.also] = "1m"
		}
		status, body, _ := post(t, ts, `{"n":1}`, headers)
		msg := fmt.Sprint(body["error"])
		if status != http.StatusBadRequest || errorCode(body) != "invalid_field" || !strings.Contains(msg, "header "+c.header) {
			t.Errorf("%s: %q: %d %v, want 400 invalid_field naming the header", c.header, c.value, status, body)
		}
	}
	if status, page := call(t, ts, "GET", "/v1/inboxes/webhooks/items", ""); status != 200 || len(page["items"].([]any)) != 0 {
		t.Fatalf("items after refusals: %d %v, want none", status, page)
	}
}

// TestEnvelopeSchedule: an envelope's deliver_at makes its items due then
// (their next_attempt_at, the event's metadata deliver_at in UTC), and a
// lease does not take them before; one in the past is due at once.
func TestEnvelopeSchedule(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	if status, body := call(t, ts, "POST", "/v1/subscriptions", `{"name": "dev", "source": "devices", "start": "earliest"}`); status != 201 {
		t.Fatalf("create: %d %v", status, body)
	}
	c := dial(t, ts.WS, client.Options{})
	later := time.Now().Add(time.Hour).Truncate(time.Second)
	scheduled := envelope("sched-1", "pi-1", `{"n":1}`)
	scheduled.DeliverAt = later.In(time.FixedZone("", 2*3600)).Format(time.RFC3339) // an offset: stored in UTC
	past := envelope("sched-2", "pi-1", `{"n":2}`)
	past.DeliverAt = "2020-01-02T03:04:05Z"
	for _, r := range send(t, c, message(t, scheduled), message(t, past)) {
		if r.Status != postbox.StatusStored {
			t.Fatalf("send: %+v", r)
		}
	}
	var items []any
	waitFor(t, 30*time.Second, "2 items in dev", func() bool {
		_, page := call(t, ts, "GET", "/v1/inboxes/dev/items", "")
		items, _ = page["items"].([]any)
		return len(items) == 2
	})
	first := items[0].(map[string]any)
	if due := dueAt(t, first); first["event_id"] != "sched-1" || !due.Equal(later) {
		t.Fatalf("the scheduled item: %v, want due at %v", first, later)
	}
	if meta := first["metadata"].(map[string]any); meta["deliver_at"] != later.UTC().Format(time.RFC3339) {
		t.Fatalf("metadata %v, want deliver_at %s", meta, later.UTC().Format(time.RFC3339))
	}
	status, l := call(t, ts, "POST", "/v1/inboxes/dev/lease", `{"max": 10}`)
	if got := l["items"].([]any); status != 200 || len(got) != 1 || got[0].(map[string]any)["event_id"] != "sched-2" {
		t.Fatalf("lease: %d %v, want sched-2 alone (sched-1 is due in an hour)", status, l)
	}
}
