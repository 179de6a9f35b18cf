package server_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/internal/server"
)

// TestEventDeliveriesAPI: a webhook read by several subscriptions shows,
// in the webhook lookup and the event's page, where it stands in each:
// completed by one target, dead-lettered by another, pending in the
// default subscription, and still kept for a subscription deleted since.
// The lookup's status is the one that needs an eye (the dead letter), not
// the default subscription's; without a subscription, it says so.
func TestEventDeliveriesAPI(t *testing.T) {
	ok, gone := newHookTarget(t, http.StatusOK), newHookTarget(t, http.StatusGone)
	ts := start(t, server.Config{Delivery: fastRetries}, nil)

	// No subscription reads the source: the lookup says so.
	if st, body := call(t, ts, "DELETE", "/v1/subscriptions/webhooks", ""); st != 204 {
		t.Fatalf("delete the default subscription: %d %v", st, body)
	}
	post(t, ts, `{"n": 0}`, map[string]string{"Idempotency-Key": "lonely"})
	if st, wh := call(t, ts, "GET", "/webhooks?idempotency_key=lonely", ""); st != 200 || wh["status"] != "pending" ||
		!strings.Contains(fmt.Sprint(wh["note"]), `no subscription reads source "webhooks"`) || wh["deliveries"] != nil {
		t.Fatalf("a webhook nothing reads: %d %v", st, wh)
	}

	for _, sub := range []string{
		`{"name": "webhooks", "source": "webhooks"}`,
		`{"name": "orders", "source": "webhooks", "target": "` + ok.URL + `"}`,
		`{"name": "billing", "source": "webhooks", "target": "` + gone.URL + `"}`,
		`{"name": "audit", "source": "webhooks"}`,
		`{"name": "other", "source": "webhooks", "types": ["never.*"]}`,
	} {
		if st, body := call(t, ts, "POST", "/v1/subscriptions", sub); st != 201 {
			t.Fatalf("create %s: %d %v", sub, st, body)
		}
	}
	st, accepted, _ := post(t, ts, `{"order": 42}`, map[string]string{"Idempotency-Key": "order-42", "X-Event-Type": "order.created"})
	if st != 202 {
		t.Fatalf("POST: %d %v", st, accepted)
	}
	var wh map[string]any
	waitFor(t, 10*time.Second, "orders completed, billing dead-lettered", func() bool {
		_, wh = call(t, ts, "GET", "/webhooks?idempotency_key=order-42", "")
		return strings.Contains(fmt.Sprint(wh["deliveries"]), "state:completed") && strings.Contains(fmt.Sprint(wh["deliveries"]), "state:failed") &&
			strings.Count(fmt.Sprint(wh["deliveries"]), "status:item") == 4
	})
	if st, body := call(t, ts, "DELETE", "/v1/subscriptions/audit", ""); st != 204 {
		t.Fatalf("delete audit: %d %v", st, body)
	}
	if st, body := call(t, ts, "POST", "/v1/subscriptions/webhooks/pause", `{"reason": "maintenance"}`); st != 200 {
		t.Fatalf("pause webhooks: %d %v", st, body)
	}

	type row struct{ sub, status, state string }
	rows := func(v any) []row {
		var out []row
		for _, raw := range v.([]any) {
			d := raw.(map[string]any)
			r := row{sub: d["subscription"].(string), status: d["status"].(string)}
			if d["deleted"] == true {
				r.sub += " (deleted)"
			}
			if d["paused"] == true {
				r.sub += " (paused)"
			}
			if it, ok := d["item"].(map[string]any); ok {
				r.state = it["state"].(string)
			}
			out = append(out, r)
		}
		return out
	}
	want := []row{
		{"audit (deleted)", delivery.DeliveryItem, delivery.StatePending},
		{"billing", delivery.DeliveryItem, delivery.StateFailed},
		{"orders", delivery.DeliveryItem, delivery.StateCompleted},
		{"webhooks (paused)", delivery.DeliveryItem, delivery.StatePending},
	}
	_, wh = call(t, ts, "GET", "/webhooks/"+accepted["id"].(string), "")
	if got := rows(wh["deliveries"]); !slices.Equal(got, want) {
		t.Fatalf("the webhook's deliveries: %v, want %v", got, want)
	}
	if wh["status"] != delivery.StateFailed || wh["subscription"] != "billing" || wh["attempts"] != float64(1) ||
		!strings.Contains(fmt.Sprint(wh["last_error"]), "410") || wh["stream"] != "webhooks" || wh["type"] != "order.created" {
		t.Fatalf("the webhook's summary: %v", wh)
	}

	// The event's page says the same, with the endpoint's answers.
	st, ev := call(t, ts, "GET", fmt.Sprintf("/v1/streams/webhooks/events/%v", wh["offset"]), "")
	if st != 200 || ev["event_id"] != "order-42" || ev["webhook_id"] != accepted["id"] || ev["type"] != "order.created" {
		t.Fatalf("the event: %d %v", st, ev)
	}
	if got := rows(ev["deliveries"]); !slices.Equal(got, want) {
		t.Fatalf("the event's deliveries: %v, want %v", got, want)
	}
	for _, raw := range ev["deliveries"].([]any) {
		d := raw.(map[string]any)
		attempts := d["attempts"].([]any)
		switch d["subscription"] {
		case "billing", "orders":
			if len(attempts) != 1 {
				t.Fatalf("%s: attempts %v, want one", d["subscription"], attempts)
			}
			code := attempts[0].(map[string]any)["status_code"]
			if want := map[any]float64{"billing": 410, "orders": 200}[d["subscription"]]; code != want {
				t.Errorf("%s: the endpoint answered %v, want %v", d["subscription"], code, want)
			}
		default:
			if len(attempts) != 0 {
				t.Errorf("%s: attempts %v, want none (a runtime's inbox)", d["subscription"], attempts)
			}
		}
	}
	// By key on the events route, the same event.
	if st, byKey := call(t, ts, "GET", "/v1/streams/webhooks/events?key=order-42", ""); st != 200 || byKey["offset"] != ev["offset"] || len(byKey["deliveries"].([]any)) != 4 {
		t.Fatalf("by key: %d %v", st, byKey)
	}
	// The first webhook came before every subscription but the default
	// one: they started after it.
	_, lonely := call(t, ts, "GET", "/v1/streams/webhooks/events?key=lonely", "")
	for _, raw := range lonely["deliveries"].([]any) {
		d := raw.(map[string]any)
		if d["status"] != delivery.DeliveryNone || !strings.Contains(fmt.Sprint(d["reason"]), "started after") {
			t.Errorf("lonely in %s: %v, want none: started after", d["subscription"], d)
		}
	}

	// Bad input names the field.
	for _, c := range []struct{ path, field string }{
		{"/v1/streams/webhooks/events/0", "offset"},
		{"/v1/streams/webhooks/events?id=a&key=b", "id"},
		{"/v1/streams/webhooks/search?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z", "since"},
		{"/v1/streams/webhooks/search?limit=0", "limit"},
		{"/v1/inboxes/webhooks/search?before=x", "before"},
		{"/v1/inboxes/webhooks/search?type=%01", "type"},
	} {
		st, body := call(t, ts, "GET", c.path, "")
		msg := fmt.Sprint(body["error"])
		if st != 400 || !strings.Contains(msg, c.field) {
			t.Errorf("GET %s: %d %v, want 400 naming %s", c.path, st, body, c.field)
		}
	}
}

// TestSearchAPI: a stream's events and an inbox's items by key, type and
// time, newest first, by pages.
func TestSearchAPI(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	for i := range 5 {
		typ := []string{"order.created", "order.paid"}[i%2]
		if st, body, _ := post(t, ts, fmt.Sprintf(`{"n": %d}`, i), map[string]string{"Idempotency-Key": fmt.Sprintf("k-%d", i), "X-Event-Type": typ}); st != 202 {
			t.Fatalf("POST: %d %v", st, body)
		}
	}
	keys := func(list any, field string) []string {
		var out []string
		for _, raw := range list.([]any) {
			out = append(out, raw.(map[string]any)[field].(string))
		}
		return out
	}
	_, page := call(t, ts, "GET", "/v1/streams/webhooks/search?type=order.created&limit=2", "")
	if got := keys(page["events"], "event_id"); !slices.Equal(got, []string{"k-4", "k-2"}) || page["next_before"] == float64(0) {
		t.Fatalf("the first page by type: %v", page)
	}
	_, page = call(t, ts, "GET", fmt.Sprintf("/v1/streams/webhooks/search?type=order.created&limit=2&before=%v", page["next_before"]), "")
	if got := keys(page["events"], "event_id"); !slices.Equal(got, []string{"k-0"}) || page["next_before"] != float64(0) {
		t.Fatalf("the second page by type: %v", page)
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if _, page = call(t, ts, "GET", "/v1/streams/webhooks/search?since="+future, ""); len(page["events"].([]any)) != 0 {
		t.Fatalf("events stored in the future: %v", page)
	}
	if _, page = call(t, ts, "GET", "/v1/streams/webhooks/search?key=k-3", ""); !slices.Equal(keys(page["events"], "event_id"), []string{"k-3"}) {
		t.Fatalf("by key: %v", page)
	}
	waitFor(t, 10*time.Second, "5 items in the inbox webhooks", func() bool {
		_, page = call(t, ts, "GET", "/v1/inboxes/webhooks/search?until="+future, "")
		return len(page["items"].([]any)) == 5
	})
	if got := keys(page["items"], "event_id"); !slices.Equal(got, []string{"k-4", "k-3", "k-2", "k-1", "k-0"}) {
		t.Fatalf("the inbox's items, newest first: %v", got)
	}
	if _, page = call(t, ts, "GET", "/v1/inboxes/webhooks/search?type=order.paid&state=pending", ""); !slices.Equal(keys(page["items"], "event_id"), []string{"k-3", "k-1"}) {
		t.Fatalf("items by type and state: %v", page)
	}
	if _, page = call(t, ts, "GET", "/v1/inboxes/webhooks/search?key=k-2", ""); !slices.Equal(keys(page["items"], "event_id"), []string{"k-2"}) {
		t.Fatalf("items by key: %v", page)
	}
}

// TestSearchWithoutIndex: on JetStream streams, which have no index to
// search by, a search without a filter pages by offset, newest first, an
// id is a lookup, and a type or time range is refused naming why; an
// event shows its deliveries as on SQLite.
func TestSearchWithoutIndex(t *testing.T) {
	ts := startNATS(t, natstest.Start(t), "SRCH_", server.Config{})
	for i := range 5 {
		if st, body, _ := post(t, ts, fmt.Sprintf(`{"n": %d}`, i), map[string]string{"Idempotency-Key": fmt.Sprintf("k-%d", i)}); st != 202 {
			t.Fatalf("POST: %d %v", st, body)
		}
	}
	offsets := func(page map[string]any) []float64 {
		var out []float64
		for _, raw := range page["events"].([]any) {
			out = append(out, raw.(map[string]any)["offset"].(float64))
		}
		return out
	}
	_, page := call(t, ts, "GET", "/v1/streams/webhooks/search?limit=2", "")
	if got := offsets(page); !slices.Equal(got, []float64{5, 4}) || page["next_before"] != float64(4) {
		t.Fatalf("the newest page: %v", page)
	}
	_, page = call(t, ts, "GET", "/v1/streams/webhooks/search?limit=2&before=2", "")
	if got := offsets(page); !slices.Equal(got, []float64{1}) || page["next_before"] != float64(0) {
		t.Fatalf("the last page: %v", page)
	}
	if _, page = call(t, ts, "GET", "/v1/streams/webhooks/search?key=k-2", ""); !slices.Equal(offsets(page), []float64{3}) {
		t.Fatalf("by key: %v", page)
	}
	if st, body := call(t, ts, "GET", "/v1/streams/webhooks/search?type=webhook", ""); st != 400 || !strings.Contains(fmt.Sprint(body), "searches by id") {
		t.Fatalf("by type: %d %v, want 400 saying why", st, body)
	}
	waitFor(t, 10*time.Second, "the item of k-2", func() bool {
		_, ev := call(t, ts, "GET", "/v1/streams/webhooks/events?key=k-2", "")
		return strings.Contains(fmt.Sprint(ev["deliveries"]), "state:pending")
	})
}
