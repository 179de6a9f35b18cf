package server_test

import (
	"testing"

	"github.com/postbox-events/postbox/internal/server"
)

// TestMetricSeriesFromStart: the series of a subscription, its inbox and
// a source exist at 0 in the first scrape after they are created, before
// any event (a rule on rate() or absent() sees no gap), and the
// subscription's are gone once it is deleted.
func TestMetricSeriesFromStart(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	// Found at the start: the default sources and subscription.
	m := ts.metrics(t)
	for _, name := range []string{
		`postbox_ingress_events_total{result="stored",source="devices"}`,
		`postbox_ingress_events_total{result="unauthorized",source="webhooks"}`,
		`postbox_subscription_items_total{subscription="webhooks"}`,
		`postbox_inbox_settled_total{inbox="webhooks",state="completed"}`,
	} {
		if v, ok := m[name]; !ok || v != 0 {
			t.Errorf("at the start: %s = %v (present %v), want 0", name, v, ok)
		}
	}

	if st, body := call(t, ts, "POST", "/v1/sources", `{"name":"shop","kind":"webhook"}`); st != 201 {
		t.Fatalf("create source: %d %v", st, body)
	}
	if st, body := call(t, ts, "POST", "/v1/subscriptions", `{"name":"orders","source":"shop","inbox":"orders-in"}`); st != 201 {
		t.Fatalf("create subscription: %d %v", st, body)
	}
	m = ts.metrics(t)
	for _, name := range []string{
		`postbox_ingress_events_total{result="stored",source="shop"}`,
		`postbox_ingress_events_total{result="duplicate",source="shop"}`,
		`postbox_ingress_events_total{result="throttled",source="shop"}`,
		`postbox_subscription_events_total{subscription="orders"}`,
		`postbox_subscription_items_total{subscription="orders"}`,
		`postbox_inbox_leased_total{inbox="orders-in"}`,
		`postbox_inbox_replayed_total{inbox="orders-in"}`,
		`postbox_inbox_settled_total{inbox="orders-in",state="completed"}`,
		`postbox_inbox_settled_total{inbox="orders-in",state="pending"}`,
		`postbox_inbox_settled_total{inbox="orders-in",state="failed"}`,
		`postbox_inbox_items{inbox="orders-in",state="pending"}`,
	} {
		if v, ok := m[name]; !ok || v != 0 {
			t.Errorf("right after creating: %s = %v (present %v), want 0", name, v, ok)
		}
	}

	if st, body := call(t, ts, "DELETE", "/v1/subscriptions/orders", ""); st != 204 {
		t.Fatalf("delete subscription: %d %v", st, body)
	}
	if st, body := call(t, ts, "DELETE", "/v1/sources/shop", ""); st != 204 {
		t.Fatalf("delete source: %d %v", st, body)
	}
	m = ts.metrics(t)
	for _, name := range []string{
		`postbox_ingress_events_total{result="stored",source="shop"}`,
		`postbox_subscription_items_total{subscription="orders"}`,
		`postbox_inbox_leased_total{inbox="orders-in"}`,
	} {
		if _, ok := m[name]; ok {
			t.Errorf("after deleting: %s is still there", name)
		}
	}
}
