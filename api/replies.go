package api

import (
	"encoding/json"
	"time"
)

// ReplyRequest is the body of POST /v1/inboxes/{inbox}/items/{id}/reply:
// the JSON postbox sends to the url of the item's delivery handle, and
// the key it is stored under, once (a digest of Body when empty).
type ReplyRequest struct {
	Key  string          `json:"key,omitempty"`
	Body json.RawMessage `json:"body"`
}

// Reply is a reply to an item's event (POST …/reply, GET …/replies).
type Reply struct {
	Key           string          `json:"key"`
	Item          int64           `json:"item"`
	URL           string          `json:"url"`
	Body          json.RawMessage `json:"body"`
	State         string          `json:"state"` // pending, completed or failed (a dead letter)
	Attempts      int             `json:"attempts"`
	NextAttemptAt *time.Time      `json:"next_attempt_at"` // when pending
	LastError     *string         `json:"last_error"`
	CreatedAt     time.Time       `json:"created_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
	AttemptLog    []Attempt       `json:"attempt_log"`
}

// ReplyList is the answer of GET /v1/inboxes/{inbox}/items/{id}/replies.
type ReplyList struct {
	Replies []Reply `json:"replies"`
}
