package api

import "time"

// Webhook is a webhook taken by POST /webhooks and where its delivery
// stands (GET /webhooks/{id}).
type Webhook struct {
	ID             string     `json:"id"`
	IdempotencyKey string     `json:"idempotency_key"`
	Type           string     `json:"type,omitempty"`
	Status         string     `json:"status"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      *time.Time `json:"updated_at,omitempty"`
	Attempts       *int       `json:"attempts,omitempty"`
	LastError      *string    `json:"last_error,omitempty"`
}
