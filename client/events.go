package client

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/postbox-events/postbox/api"
)

// Event returns the event at offset of a stream with its deliveries: what
// every subscription made of it, deleted subscriptions' items included,
// with their attempt logs.
func (c *API) Event(ctx context.Context, stream string, offset int64) (api.Event, error) {
	var out api.Event
	return out, c.get(ctx, fmt.Sprintf("/v1/streams/%s/events/%d", name(stream), offset), &out)
}

// EventByID is Event by the source's id of the event (an envelope's
// event_id, a webhook's idempotency key, a polled item's id). variant
// names the device in the device stream, where one event_id may come from
// several ("" when the stream has one event of that id: an *APIError
// that IsConflict when it has several).
func (c *API) EventByID(ctx context.Context, stream, id, variant string) (api.Event, error) {
	v := url.Values{"id": {id}}
	if variant != "" {
		v.Set("variant", variant)
	}
	var out api.Event
	return out, c.get(ctx, withQuery("/v1/streams/"+name(stream)+"/events", v), &out)
}

// SearchQuery selects a page of a search of a stream's events or an
// inbox's items. Zero fields select everything, from the newest, 100 per
// page.
type SearchQuery struct {
	ID    string // the source's id of the event: an event_id, an idempotency key
	Type  string
	State string // items only: api.StatePending, ...
	// Since and Until select what was stored (items: materialised) at
	// or after Since and before Until.
	Since, Until time.Time
	Before       int64 // the NextBefore of the previous page
	Limit        int   // 1 to 1000
}

func (q SearchQuery) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"id": q.ID, "type": q.Type, "state": q.State} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Until.IsZero() {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	if q.Before != 0 {
		v.Set("before", strconv.FormatInt(q.Before, 10))
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

// SearchEvents returns a page of a stream's events that q selects,
// newest first, without their deliveries. q.State is not for events.
func (c *API) SearchEvents(ctx context.Context, stream string, q SearchQuery) (api.EventPage, error) {
	var out api.EventPage
	return out, c.get(ctx, withQuery("/v1/streams/"+name(stream)+"/search", q.values()), &out)
}

// SearchItems returns a page of an inbox's items that q selects, newest
// first.
func (c *API) SearchItems(ctx context.Context, inbox string, q SearchQuery) (api.ItemSearchPage, error) {
	var out api.ItemSearchPage
	return out, c.get(ctx, withQuery("/v1/inboxes/"+name(inbox)+"/search", q.values()), &out)
}
