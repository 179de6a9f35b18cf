package server

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/stream"
)

// fakeEvents answers Deliveries with what it holds; the methods it
// leaves out panic through the nil interface it embeds.
type fakeEvents struct {
	events
	deliveries []delivery.EventDelivery
	err        error
}

func (f *fakeEvents) Deliveries(ctx context.Context, streamID string, ev *stream.StoredEvent) ([]delivery.EventDelivery, error) {
	return f.deliveries, f.err
}

// TestWebhookStatusOfDeliveries: the webhook lookup sums up the
// deliveries the events role gives: the one that most needs an eye, a
// deleted subscription's only when no live one has an item, and a note
// when nothing delivers it or they cannot be read.
func TestWebhookStatusOfDeliveries(t *testing.T) {
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	item := func(state string, attempts int) *delivery.Item {
		return &delivery.Item{State: state, Attempts: attempts, UpdatedAt: at.Add(time.Duration(attempts) * time.Minute)}
	}
	got := func(d delivery.EventDelivery) delivery.EventDelivery {
		if d.Item != nil {
			d.Status = delivery.DeliveryItem
		}
		return d
	}
	subs := &fakeSubscriptions{subs: map[string]delivery.Subscription{"orders": {Name: "orders", Source: "webhooks", Stream: "webhooks"}}}
	for _, c := range []struct {
		name       string
		deliveries []delivery.EventDelivery
		err        error
		subs       *fakeSubscriptions
		status     string
		sub        string
		attempts   int
		note       string
	}{
		{name: "a dead letter beside a completed and a pending item", deliveries: []delivery.EventDelivery{
			got(delivery.EventDelivery{Subscription: "billing", Item: item(delivery.StateFailed, 3)}),
			got(delivery.EventDelivery{Subscription: "orders", Item: item(delivery.StateCompleted, 1)}),
			got(delivery.EventDelivery{Subscription: "webhooks", Item: item(delivery.StatePending, 0)}),
		}, status: delivery.StateFailed, sub: "billing", attempts: 3},
		{name: "a deleted subscription's pending item ranks below a live completed one", deliveries: []delivery.EventDelivery{
			got(delivery.EventDelivery{Subscription: "old", Deleted: true, Item: item(delivery.StatePending, 0)}),
			got(delivery.EventDelivery{Subscription: "orders", Item: item(delivery.StateCompleted, 2)}),
		}, status: delivery.StateCompleted, sub: "orders", attempts: 2},
		{name: "an unread event waits", deliveries: []delivery.EventDelivery{
			got(delivery.EventDelivery{Subscription: "orders", Item: item(delivery.StateCompleted, 1)}),
			{Subscription: "slow", Status: delivery.DeliveryUnread},
		}, status: delivery.StatePending, sub: "slow"},
		{name: "no subscription reads the source", subs: &fakeSubscriptions{}, status: delivery.StatePending, note: "no subscription reads source"},
		{name: "subscriptions read it, none takes it", subs: subs, status: delivery.StatePending, note: "no subscription of source"},
		{name: "subscriptions that started after it", deliveries: []delivery.EventDelivery{{Subscription: "late", Status: delivery.DeliveryNone}},
			status: delivery.StatePending, note: "no subscription holds an item"},
		{name: "the store fails", err: errors.New("store down"), status: delivery.StatePending, note: "could not be read: store down"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := c.subs
			if fs == nil {
				fs = subs
			}
			s := &Server{log: slog.New(slog.DiscardHandler), roles: roles{subs: fs, events: &fakeEvents{deliveries: c.deliveries, err: c.err}}}
			j := s.webhookJSON(t.Context(), "webhooks", stream.StoredEvent{Event: stream.Event{NativeID: "k"}, Offset: 4, StoredAt: at})
			if j.Status != c.status || j.Subscription != c.sub || *j.Attempts != c.attempts || !strings.Contains(j.Note, c.note) || (c.note == "") != (j.Note == "") {
				t.Errorf("status %s of %q, %d attempts, note %q; want %s of %q, %d attempts, a note with %q",
					j.Status, j.Subscription, *j.Attempts, j.Note, c.status, c.sub, c.attempts, c.note)
			}
			if len(j.Deliveries) != len(c.deliveries) {
				t.Errorf("%d deliveries, want %d", len(j.Deliveries), len(c.deliveries))
			}
		})
	}
}
