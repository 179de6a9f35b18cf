package api

import "time"

// PauseSubscription is the body of POST /v1/subscriptions/{name}/pause
// (optional): why delivery is paused, shown with the subscription.
type PauseSubscription struct {
	Reason string `json:"reason,omitempty"`
}

// CancelItem is the body of POST /v1/inboxes/{inbox}/items/{id}/cancel
// (optional): why, recorded in the item's last error.
type CancelItem struct {
	Reason string `json:"reason,omitempty"`
}

// DiscardDeadLetters is the body of POST /v1/dead-letters/discard: the
// dead letters to delete for good, by ids, inbox, subscription and time
// of failure (From inclusive, To exclusive, RFC 3339); every field given
// narrows the selection. An empty selection must say All.
type DiscardDeadLetters struct {
	IDs          []int64 `json:"ids,omitempty"`
	Inbox        string  `json:"inbox,omitempty"`
	Subscription string  `json:"subscription,omitempty"`
	From         string  `json:"from,omitempty"`
	To           string  `json:"to,omitempty"`
	All          bool    `json:"all,omitempty"`
}

// Discarded is the answer of POST /v1/dead-letters/discard: the items
// deleted.
type Discarded struct {
	IDs       []int64 `json:"ids"`
	Discarded int     `json:"discarded"`
}

// TestDelivery is the answer of POST /v1/subscriptions/{name}/test: what
// the subscription's endpoint answered a synthetic event of type
// postbox.test, sent as the workers send items. OK is a 2xx answer.
type TestDelivery struct {
	EventID         string    `json:"event_id"` // test_<ULID>: its webhook-id and Idempotency-Key
	Type            string    `json:"type"`     // postbox.test
	EndpointURL     string    `json:"endpoint_url"`
	AttemptedAt     time.Time `json:"attempted_at"`
	OK              bool      `json:"ok"`
	StatusCode      int       `json:"status_code"` // 0: no answer
	LatencyMS       float64   `json:"latency_ms"`
	Error           *string   `json:"error"`
	ResponseExcerpt *string   `json:"response_excerpt"`
}
