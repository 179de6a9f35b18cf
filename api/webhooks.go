package api

import "time"

// Webhook is a webhook taken by POST /webhooks and where its delivery
// stands (GET /webhooks/{id}, GET /webhooks?idempotency_key=…).
//
// In a lookup, Deliveries says where it stands in each subscription of
// its source, deleted ones included, and Status, UpdatedAt, Attempts and
// LastError sum them up: Status is the state that most needs an operator's
// eye (failed, then pending, processing, completed; an event a
// subscription has yet to read counts as pending), the subscription of
// that state in Subscription. With no delivery Status is pending and
// Note says why (no subscription reads the source, or none takes the
// webhook).
type Webhook struct {
	ID             string     `json:"id"`
	IdempotencyKey string     `json:"idempotency_key"`
	Type           string     `json:"type,omitempty"`
	Status         string     `json:"status"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      *time.Time `json:"updated_at,omitempty"`
	Attempts       *int       `json:"attempts,omitempty"`
	LastError      *string    `json:"last_error,omitempty"`
	Subscription   string     `json:"subscription,omitempty"`
	Stream         string     `json:"stream,omitempty"`
	Offset         int64      `json:"offset,omitempty"`
	Deliveries     []Delivery `json:"deliveries,omitempty"`
	Note           string     `json:"note,omitempty"`
}
