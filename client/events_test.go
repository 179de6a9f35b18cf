package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/postbox-events/postbox/client"
)

// TestEventPaths: the event, lookup and search calls ask the paths and
// queries the API documents.
func TestEventPaths(t *testing.T) {
	ts := httptest.NewServer(http.NotFoundHandler())
	defer ts.Close()
	c, err := client.NewAPI(ts.URL, client.APIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	since := time.Date(2026, 11, 21, 11, 0, 0, 0, time.FixedZone("CET", 3600))
	for _, call := range []struct {
		do   func() error
		want string
	}{
		{func() error { _, err := c.Event(ctx, "web hooks", 42); return err }, "/v1/streams/web%20hooks/events/42"},
		{func() error { _, err := c.EventByID(ctx, "devices", "evt 1", ""); return err }, "/v1/streams/devices/events?id=evt+1"},
		{func() error { _, err := c.EventByID(ctx, "devices", "evt-1", "pi-7"); return err }, "/v1/streams/devices/events?id=evt-1&variant=pi-7"},
		{func() error { _, err := c.SearchEvents(ctx, "orders", client.SearchQuery{}); return err }, "/v1/streams/orders/search"},
		{func() error {
			_, err := c.SearchEvents(ctx, "orders", client.SearchQuery{Type: "order.paid", Since: since, Before: 9, Limit: 2})
			return err
		}, "/v1/streams/orders/search?before=9&limit=2&since=2026-11-21T10%3A00%3A00Z&type=order.paid"},
		{func() error {
			_, err := c.SearchItems(ctx, "orders", client.SearchQuery{ID: "k-1", State: "failed", Until: since})
			return err
		}, "/v1/inboxes/orders/search?id=k-1&state=failed&until=2026-11-21T10%3A00%3A00Z"},
	} {
		err := call.do()
		ae, ok := errors.AsType[*client.APIError](err)
		if !ok || ae.Status != http.StatusNotFound || ae.Path != call.want {
			t.Errorf("%v (%+v), want a 404 of GET %s", err, ae, call.want)
		}
	}
}
