package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/stream"
)

// fakeSubscriptions holds subscriptions in a map; the methods it leaves
// out panic through the nil interface it embeds.
type fakeSubscriptions struct {
	subscriptions
	subs map[string]delivery.Subscription
	lags map[string]stream.Lag
	err  error // returned by every method when set
}

func (f *fakeSubscriptions) Subscriptions(ctx context.Context) ([]delivery.Subscription, error) {
	if f.err != nil {
		return nil, f.err
	}
	var out []delivery.Subscription
	for _, name := range slices.Sorted(maps.Keys(f.subs)) {
		out = append(out, f.subs[name])
	}
	return out, nil
}

func (f *fakeSubscriptions) Subscription(ctx context.Context, name string) (delivery.Subscription, error) {
	if f.err != nil {
		return delivery.Subscription{}, f.err
	}
	sub, ok := f.subs[name]
	if !ok {
		return sub, fmt.Errorf("subscription %q: %w", name, delivery.ErrNotFound)
	}
	return sub, nil
}

func (f *fakeSubscriptions) Create(ctx context.Context, s delivery.Subscription) (delivery.Subscription, bool, error) {
	if f.err != nil {
		return s, false, f.err
	}
	if old, ok := f.subs[s.Name]; ok {
		if old.Source != s.Source {
			return old, false, fmt.Errorf("subscription %q: %w", s.Name, delivery.ErrConflict)
		}
		return old, false, nil
	}
	s.Stream, s.Inbox = s.Source, s.Name
	f.subs[s.Name] = s
	return s, true, nil
}

func (f *fakeSubscriptions) SubscriptionCounts(ctx context.Context) (map[string]delivery.InboxCounts, error) {
	return map[string]delivery.InboxCounts{}, f.err
}

func (f *fakeSubscriptions) Held(ctx context.Context, s delivery.Subscription) (delivery.Held, error) {
	return delivery.Held{}, f.err
}

func (f *fakeSubscriptions) Lag(ctx context.Context, name string) (stream.Lag, error) {
	lag, ok := f.lags[name]
	if !ok {
		return lag, delivery.ErrNotFound
	}
	return lag, nil
}

// fakeDeadLetters answers the dead-letter handlers from a list of failed
// items and records the selections it was given.
type fakeDeadLetters struct {
	items []delivery.Item
	got   []delivery.DeadLetters
}

func (f *fakeDeadLetters) ListDeadLetters(ctx context.Context, sel delivery.DeadLetters) ([]delivery.Item, error) {
	f.got = append(f.got, sel)
	var out []delivery.Item
	for _, it := range f.items {
		if it.State == delivery.StateFailed && (sel.Inbox == "" || it.Inbox == sel.Inbox) && it.ID > sel.After && len(out) < sel.Limit {
			out = append(out, it)
		}
	}
	return out, nil
}

func (f *fakeDeadLetters) Replay(ctx context.Context, sel delivery.DeadLetters) ([]int64, error) {
	f.got = append(f.got, sel)
	var ids []int64
	for i, it := range f.items {
		if it.State == delivery.StateFailed && (sel.ID == 0 || it.ID == sel.ID) {
			f.items[i].State = delivery.StatePending
			ids = append(ids, it.ID)
		}
	}
	return ids, nil
}

func (f *fakeDeadLetters) Item(ctx context.Context, inbox string, id int64) (delivery.Item, error) {
	for _, it := range f.items {
		if it.ID == id {
			return it, nil
		}
	}
	return delivery.Item{}, fmt.Errorf("item %d: %w", id, delivery.ErrNotFound)
}

// newRoleServer is a Server with only the operator API's routes and the
// roles given: no store, no stream backend, no writer.
func newRoleServer(r roles) *Server {
	s := &Server{log: slog.New(slog.DiscardHandler), mux: http.NewServeMux(), roles: r}
	s.routeAPI()
	return s
}

// TestHandlersRunOnFakeRoles drives handler groups of the operator API
// with fakes of the roles they use, without a store or a writer: what a
// fake returns is answered, and its errors get their statuses.
func TestHandlersRunOnFakeRoles(t *testing.T) {
	newSubs := func() *fakeSubscriptions {
		return &fakeSubscriptions{
			subs: map[string]delivery.Subscription{
				"billing": {Name: "billing", Source: "devices", Stream: "devices", Inbox: "billing"},
				"audit":   {Name: "audit", Source: "webhooks", Stream: "webhooks", Inbox: "audit"},
			},
			lags: map[string]stream.Lag{"billing": {NextOffset: 8, HighWatermark: 10, Events: 3}},
		}
	}
	newDead := func() *fakeDeadLetters {
		return &fakeDeadLetters{items: []delivery.Item{
			{ID: 3, Inbox: "billing", State: delivery.StateFailed},
			{ID: 5, Inbox: "audit", State: delivery.StateFailed},
			{ID: 7, Inbox: "billing", State: delivery.StateCompleted},
			{ID: 9, Inbox: "billing", State: delivery.StateFailed},
			{ID: 11, Inbox: "billing", State: delivery.StateFailed},
		}}
	}
	for _, tc := range []struct {
		name         string
		subsErr      error
		method, path string
		body         string
		status       int
		check        func(t *testing.T, body []byte, subs *fakeSubscriptions, dead *fakeDeadLetters)
	}{
		{
			name: "subscriptions are listed from the fake with their lags", method: "GET", path: "/v1/subscriptions", status: 200,
			check: func(t *testing.T, body []byte, _ *fakeSubscriptions, _ *fakeDeadLetters) {
				var got api.SubscriptionList
				decodeAnswer(t, body, &got)
				var names []string
				for _, s := range got.Subscriptions {
					names = append(names, s.Name)
				}
				if !slices.Equal(names, []string{"audit", "billing"}) {
					t.Fatalf("subscriptions %v, want audit and billing", names)
				}
				if b := got.Subscriptions[1]; b.NextOffset != 8 || b.HighWatermark != 10 || b.Lag != 3 || b.Stream != "devices" {
					t.Errorf("billing: next %d, high %d, lag %d, stream %q; want the fake's 8, 10, 3, devices",
						b.NextOffset, b.HighWatermark, b.Lag, b.Stream)
				}
			},
		},
		{
			name: "an unknown subscription is the fake's ErrNotFound: 404", method: "GET", path: "/v1/subscriptions/orders", status: 404,
			check: wantCode(api.CodeNotFound),
		},
		{
			name: "a store that fails is 503", subsErr: errors.New("store down"), method: "GET", path: "/v1/subscriptions", status: 503,
			check: wantCode(api.CodeUnavailable),
		},
		{
			name: "a subscription created by the fake is 201", method: "POST", path: "/v1/subscriptions",
			body: `{"name":"orders","source":"devices"}`, status: 201,
			check: func(t *testing.T, body []byte, subs *fakeSubscriptions, _ *fakeDeadLetters) {
				var got api.Subscription
				decodeAnswer(t, body, &got)
				if got.Name != "orders" || got.Inbox != "orders" {
					t.Errorf("created %+v, want orders with the fake's inbox orders", got)
				}
				if _, ok := subs.subs["orders"]; !ok {
					t.Error("the fake holds no subscription orders")
				}
			},
		},
		{
			name: "the fake's ErrConflict is 409", method: "POST", path: "/v1/subscriptions",
			body: `{"name":"billing","source":"webhooks"}`, status: 409,
			check: wantCode(api.CodeConflict),
		},
		{
			name: "dead letters are a page of the fake's failed items", method: "GET", path: "/v1/dead-letters?inbox=billing&limit=2", status: 200,
			check: func(t *testing.T, body []byte, _ *fakeSubscriptions, dead *fakeDeadLetters) {
				var got api.ItemPage
				decodeAnswer(t, body, &got)
				var ids []int64
				for _, it := range got.Items {
					ids = append(ids, it.ID)
				}
				if !slices.Equal(ids, []int64{3, 9}) || got.NextAfter != 9 {
					t.Errorf("items %v, next_after %d; want 3 and 9, next_after 9", ids, got.NextAfter)
				}
				if want := (delivery.DeadLetters{Inbox: "billing", Limit: 2}); len(dead.got) != 1 || !reflect.DeepEqual(dead.got[0], want) {
					t.Errorf("the fake was asked for %+v, want %+v", dead.got, want)
				}
			},
		},
		{
			name: "a dead letter is replayed by the fake", method: "POST", path: "/v1/dead-letters/3/replay", status: 200,
			check: func(t *testing.T, body []byte, _ *fakeSubscriptions, _ *fakeDeadLetters) {
				var got api.Item
				decodeAnswer(t, body, &got)
				if got.ID != 3 || got.State != delivery.StatePending {
					t.Errorf("item %d %s, want 3 pending", got.ID, got.State)
				}
			},
		},
		{
			name: "an item the fake did not fail is not replayed: 409", method: "POST", path: "/v1/dead-letters/7/replay", status: 409,
			check: wantCode(api.CodeInvalidState),
		},
		{
			name: "an item the fake does not hold is 404", method: "GET", path: "/v1/dead-letters/4", status: 404,
			check: wantCode(api.CodeNotFound),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			subs, dead := newSubs(), newDead()
			subs.err = tc.subsErr
			s := newRoleServer(roles{subs: subs, deadLetters: dead})
			rec := httptest.NewRecorder()
			s.mux.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body)))
			if rec.Code != tc.status {
				t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, rec.Code, rec.Body, tc.status)
			}
			tc.check(t, rec.Body.Bytes(), subs, dead)
		})
	}
}

func decodeAnswer(t *testing.T, body []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
}

// wantCode checks that an answer is the error of code.
func wantCode(code api.Code) func(*testing.T, []byte, *fakeSubscriptions, *fakeDeadLetters) {
	return func(t *testing.T, body []byte, _ *fakeSubscriptions, _ *fakeDeadLetters) {
		t.Helper()
		var got api.ErrorResponse
		decodeAnswer(t, body, &got)
		if got.Error.Code != code {
			t.Errorf("error %q (%s), want %q", got.Error.Code, got.Error.Message, code)
		}
	}
}
