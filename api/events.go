package api

import (
	"encoding/json"
	"time"
)

// Event is one event stored in a stream (GET
// /v1/streams/{stream}/events/{offset}, GET
// /v1/streams/{stream}/events?id=…, GET /v1/streams/{stream}/search).
type Event struct {
	ID             string          `json:"id"` // the stream event id: stream/offset
	Stream         string          `json:"stream"`
	Source         string          `json:"source"`
	Offset         int64           `json:"offset"`
	EventID        string          `json:"event_id"`          // the source's id: an envelope's event_id, a webhook's idempotency key, a polled item's id
	Variant        string          `json:"variant,omitempty"` // with EventID, the event's identity (the device stream: the device_id)
	Type           string          `json:"type"`
	OccurredAt     time.Time       `json:"occurred_at"`
	SourceSequence *int64          `json:"source_sequence"`
	StoredAt       time.Time       `json:"stored_at"`
	Metadata       json.RawMessage `json:"metadata"`
	Payload        json.RawMessage `json:"payload"`
	// DeliveryHandle is where the event came from and where a reply
	// goes (ParseDeliveryHandle): a JSON object with a kind and, when a
	// reply can go somewhere, a url; a device's event's is made from its
	// device_id and session_id. null when the event has none.
	DeliveryHandle json.RawMessage `json:"delivery_handle"`
	// WebhookID is the id GET /webhooks/{id} takes, for an event of a
	// webhook source.
	WebhookID string `json:"webhook_id,omitempty"`
	// Deliveries is what each subscription made of the event: set by
	// the answers about one event, not by a search.
	Deliveries []Delivery `json:"deliveries,omitempty"`
}

// What became of an event in one subscription (Delivery.Status).
const (
	DeliveryItem   = "item"   // the subscription made an item of it: Item says where it stands
	DeliveryUnread = "unread" // the subscription takes the event and has not read it yet
	DeliveryNone   = "none"   // the subscription takes the event and holds no item of it (Reason says why)
)

// Delivery is what one subscription made of one event: its item there,
// with the item's state and attempts, and the endpoint's answers to each
// attempt (the attempt log). Deleted says the subscription that made the
// item was deleted since; the item is what the store still knows.
type Delivery struct {
	Subscription string    `json:"subscription"`
	Inbox        string    `json:"inbox"`
	Deleted      bool      `json:"deleted"`
	Paused       bool      `json:"paused"` // an operator paused the subscription: its item waits
	Status       string    `json:"status"`
	Reason       string    `json:"reason,omitempty"`
	Item         *Item     `json:"item"` // null unless Status is item
	Attempts     []Attempt `json:"attempts"`
}

// EventPage is a page of a stream search (GET /v1/streams/{stream}/search),
// newest first: NextBefore, when not 0, is the before of the next page.
type EventPage struct {
	Events     []Event `json:"events"`
	NextBefore int64   `json:"next_before"`
}

// ItemSearchPage is a page of an inbox search (GET
// /v1/inboxes/{inbox}/search), newest first: NextBefore, when not 0, is
// the before of the next page.
type ItemSearchPage struct {
	Items      []Item `json:"items"`
	NextBefore int64  `json:"next_before"`
}
