// Package api holds the request and response types of the HTTP API of
// postbox serve (docs/API.md, docs/openapi.json), defined once: the
// server encodes them and the Go client (package client) decodes them.
//
// Times are RFC 3339 in UTC. A pointer field is JSON null when it is nil:
// a setting left to the server's default, a time that has not happened.
// Durations travel as Go duration strings ("30s", "1m30s").
package api

import (
	"encoding/json"
	"time"
)

// ErrorResponse is the body of every error answer (a status of 400 and
// above): {"error": {"code": "...", "message": "..."}}.
type ErrorResponse struct {
	Error Error `json:"error"`
}

// Error says what went wrong: Code, for programs to branch on, and
// Message, for people, naming the field or item at fault.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

// Item states.
const (
	StatePending    = "pending"    // waiting for its next attempt
	StateProcessing = "processing" // leased, or being pushed to its target
	StateCompleted  = "completed"  // acked
	StateFailed     = "failed"     // a dead letter: its last attempt failed
)

// Item is an inbox item: what a subscription materialised for one event,
// and where its processing stands.
type Item struct {
	ID             int64           `json:"id"`
	Inbox          string          `json:"inbox"`
	Subscription   string          `json:"subscription"`
	Stream         string          `json:"stream"`
	Offset         int64           `json:"offset"`
	StreamEventID  string          `json:"stream_event_id"`
	EventID        string          `json:"event_id"` // the same on every attempt: the key of an idempotent handler
	Type           string          `json:"type"`
	OccurredAt     time.Time       `json:"occurred_at"`     // the source's time of the event
	SourceSequence *int64          `json:"source_sequence"` // the source's sequence number of the event; null when it sent none
	StoredAt       time.Time       `json:"stored_at"`
	Metadata       json.RawMessage `json:"metadata"`
	Payload        json.RawMessage `json:"payload"`
	// DeliveryHandle is where the event came from and where a reply
	// goes (ParseDeliveryHandle): a JSON object with a kind and, when a
	// reply can go somewhere, a url; a device's event's is made from its
	// device_id and session_id. null when the event has none.
	DeliveryHandle json.RawMessage `json:"delivery_handle"`
	State          string          `json:"state"`
	Attempts       int             `json:"attempts"`
	NextAttemptAt  time.Time       `json:"next_attempt_at"`
	LeaseExpiresAt *time.Time      `json:"lease_expires_at"`
	LastError      *string         `json:"last_error"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	FailedAt       *time.Time      `json:"failed_at"`
	ReplayedAt     *time.Time      `json:"replayed_at"`
	Replays        int             `json:"replays"`

	// LastErrorPast is true when the item was completed after LastError:
	// the error is history, from an earlier attempt, not its state.
	LastErrorPast bool `json:"last_error_past"`

	// OrderKey is the item's key in an ordered subscription; null in an
	// unordered one.
	OrderKey *string `json:"order_key"`
}

// ItemPage is a page of items (GET /v1/inboxes/{inbox}/items, GET
// /v1/dead-letters): NextAfter, when not 0, is the after of the next page.
type ItemPage struct {
	Items     []Item `json:"items"`
	NextAfter int64  `json:"next_after"`
}

// InboxCounts are the items of one inbox by state (GET /v1/inboxes).
type InboxCounts struct {
	Inbox      string `json:"inbox"`
	Pending    int64  `json:"pending"`
	Processing int64  `json:"processing"`
	Completed  int64  `json:"completed"`
	Failed     int64  `json:"failed"`
	// OldestPendingAt is when the oldest pending item reached the inbox;
	// null when none is pending.
	OldestPendingAt *time.Time `json:"oldest_pending_at"`
}

// InboxList is the answer of GET /v1/inboxes.
type InboxList struct {
	Inboxes []InboxCounts `json:"inboxes"`
}

// LeaseRequest is the body of POST /v1/inboxes/{inbox}/lease. Nil fields
// take the server's defaults: 10 items, a visibility timeout of 30s, no
// wait.
type LeaseRequest struct {
	Max               *int    `json:"max,omitempty"`                // 1 to 1000
	VisibilityTimeout *string `json:"visibility_timeout,omitempty"` // 1ms to 12h
	Wait              *string `json:"wait,omitempty"`               // up to 1m: how long to wait when no item is ready
}

// Lease is the answer of a lease: the items it holds until ExpiresAt,
// each processing, an attempt counted. Ack, nack or extend them with the
// token Lease.
type Lease struct {
	ExpiresAt time.Time `json:"expires_at"`
	Items     []Item    `json:"items"`
	Lease     string    `json:"lease"`
}

// SettleRequest is the body of POST /v1/inboxes/{inbox}/ack and /nack.
// Lease is the token of the lease that holds the items ("" for an
// operator, who may settle any pending or processing item). Delay,
// Reason and Dead are for nack only: the wait before the next attempt (up
// to 24h), the error recorded as the item's last, and whether no further
// attempt can help (the items are dead letters at once; no Delay).
type SettleRequest struct {
	IDs    []int64 `json:"ids"`
	Lease  string  `json:"lease,omitempty"`
	Delay  *string `json:"delay,omitempty"`
	Reason string  `json:"reason,omitempty"`
	Dead   bool    `json:"dead,omitempty"`
}

// ExtendRequest is the body of POST /v1/inboxes/{inbox}/extend: the
// heartbeat of a runtime whose job outlives its lease. The lease of the
// items IDs, which Lease must hold and which must not have expired, then
// ends VisibilityTimeout (1ms to 12h; nil: 30s) from now.
type ExtendRequest struct {
	IDs               []int64 `json:"ids"`
	Lease             string  `json:"lease"`
	VisibilityTimeout *string `json:"visibility_timeout,omitempty"`
}

// ItemResult is the outcome of an ack, nack or extend for one item: its
// state after the call, or Error (CodeNotFound, CodeLeaseLost,
// CodeInvalidState).
type ItemResult struct {
	ID    int64  `json:"id"`
	State string `json:"state,omitempty"`
	Error *Error `json:"error,omitempty"`
}

// Results is the answer of an ack or nack: one result per id, in the
// order of the request.
type Results struct {
	Items []ItemResult `json:"items"`
}

// Extension is the answer of an extend: the new end of the lease of the
// items whose result has no error.
type Extension struct {
	ExpiresAt time.Time    `json:"expires_at"`
	Items     []ItemResult `json:"items"`
}

// Attempt is one delivery attempt of an item to its endpoint (GET
// /v1/inboxes/{inbox}/items/{id}/attempts).
type Attempt struct {
	Attempt         int       `json:"attempt"`
	AttemptedAt     time.Time `json:"attempted_at"`
	EndpointURL     string    `json:"endpoint_url"`
	StatusCode      int       `json:"status_code"` // 0: no answer
	LatencyMS       float64   `json:"latency_ms"`
	Error           *string   `json:"error"`
	ResponseExcerpt *string   `json:"response_excerpt"` // a bounded excerpt of the answer's body
}

// AttemptList is the answer of GET /v1/inboxes/{inbox}/items/{id}/attempts.
type AttemptList struct {
	Attempts []Attempt `json:"attempts"`
}
