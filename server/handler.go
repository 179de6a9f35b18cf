package server

import (
	"context"
	"encoding/json"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
)

// Handler completes one inbox item in the program (Config.Handlers). A
// nil error completes the item. An error is a failed attempt: the item
// is retried with backoff until DeliveryConfig.MaxAttempts, then it is a
// dead letter. Mark the error with the retry package to say more:
// retry.Permanent dead-letters the item at once; retry.Transient (not the
// item's fault: a database the handler writes to is down) retries it
// without counting the attempt, so an outage dead-letters nothing;
// retry.RetryAfter(d, err) makes the next attempt wait at least d, but no
// longer than DeliveryConfig.RetryMaxDelay. ctx ends
// after DeliveryConfig.HandlerTimeout, or when the server stops (the item
// is then handed back, and the attempt is not counted).
//
// Items are handled at least once: a Handler must be idempotent
// (Item.EventID is the same on every attempt).
type Handler func(ctx context.Context, it *Item) error

// State is the state of an inbox item.
type State string

// Item states. An item is pending until an attempt leases it, processing
// during the attempt, then completed, pending again for a retry, or failed.
const (
	StatePending    State = "pending"
	StateProcessing State = "processing"
	StateCompleted  State = "completed"
	StateFailed     State = "failed" // a dead letter
)

// Item is an inbox item as a Handler sees it: the event and its attempt.
type Item struct {
	// ID is the item's id, as the operator API and the inbox commands
	// show it.
	ID int64
	// Inbox and Subscription name the inbox the item is in and the
	// subscription that put it there.
	Inbox        string
	Subscription string
	// Stream and Offset are where the event is stored.
	Stream string
	Offset int64
	// EventID is the source's id of the event (an envelope's id, a
	// webhook's idempotency key): the same on every attempt and on every
	// delivery of the same event, the key to deduplicate on.
	EventID string
	// Type is the event's type, "" when it has none.
	Type string
	// OccurredAt is when the source says the event happened; StoredAt
	// when postbox stored it.
	OccurredAt time.Time
	StoredAt   time.Time
	// Metadata is the event's metadata (a JSON object; for a webhook, its
	// headers), nil when it has none.
	Metadata json.RawMessage
	// Payload is the event's payload: the bytes of a webhook's body as it
	// arrived, an envelope's payload.
	Payload json.RawMessage
	// State is StateProcessing while a Handler has the item.
	State State
	// Attempts counts the attempts so far, this one included: 1 on the
	// first.
	Attempts int
	// LastError is the error of the previous attempt, "" on the first.
	LastError string
	// CreatedAt is when the item was put in the inbox.
	CreatedAt time.Time
}

// newItem is the Item a Handler sees of it.
func newItem(it *delivery.Item) *Item {
	out := &Item{ID: it.ID, Inbox: it.Inbox, Subscription: it.Subscription, Stream: it.Stream, Offset: it.Offset,
		EventID: it.EventID, Type: it.Type, OccurredAt: it.OccurredAt, StoredAt: it.StoredAt,
		Metadata: it.Metadata, Payload: it.Payload, State: State(it.State), Attempts: it.Attempts, CreatedAt: it.CreatedAt}
	if it.LastError != nil {
		out.LastError = *it.LastError
	}
	return out
}

// internal is h as the workers call it.
func (h Handler) internal() delivery.Handler {
	if h == nil {
		return nil
	}
	return func(ctx context.Context, it *delivery.Item) error { return h(ctx, newItem(it)) }
}
