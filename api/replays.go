package api

import (
	"encoding/json"
	"time"
)

// ReplayDeadLetters is the body of POST /v1/dead-letters/replay: the dead
// letters to replay, by inbox, subscription and time of failure (From
// inclusive, To exclusive, RFC 3339). An empty selection must say All.
type ReplayDeadLetters struct {
	Inbox        string `json:"inbox,omitempty"`
	Subscription string `json:"subscription,omitempty"`
	From         string `json:"from,omitempty"`
	To           string `json:"to,omitempty"`
	All          bool   `json:"all,omitempty"`
}

// Replayed is the answer of POST /v1/dead-letters/replay: the items made
// pending again.
type Replayed struct {
	IDs      []int64 `json:"ids"`
	Replayed int     `json:"replayed"`
}

// ReplayRange is the body of POST /v1/subscriptions/{name}/replay: every
// item of the subscription stored in [Since, Until) (RFC 3339; no Until:
// now) is delivered again, completed ones included.
type ReplayRange struct {
	Since     string   `json:"since"`
	Until     string   `json:"until,omitempty"`
	States    []string `json:"states,omitempty"`     // completed, failed or both (the default)
	BatchSize int      `json:"batch_size,omitempty"` // items per transaction
}

// Replay is a replay job and its progress (GET /v1/replays/{id}).
type Replay struct {
	ID           string     `json:"id"`
	Subscription string     `json:"subscription"`
	Inbox        string     `json:"inbox"`
	Since        time.Time  `json:"since"`
	Until        time.Time  `json:"until"`
	States       []string   `json:"states"`
	BatchSize    int        `json:"batch_size"`
	State        string     `json:"state"` // running, completed or failed
	Matched      int64      `json:"matched"`
	Replayed     int64      `json:"replayed"`
	Batches      int64      `json:"batches"`
	Reached      time.Time  `json:"reached"` // how far in the range it got
	Error        *string    `json:"error"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
	FinishedAt   *time.Time `json:"finished_at"`
}

// ReplayList is the answer of GET /v1/replays.
type ReplayList struct {
	Replays []Replay `json:"replays"`
}

// Source kinds.
const (
	SourceWebhook = "webhook"
	SourceDevice  = "device"
)

// Source is where events come from (GET /v1/sources).
type Source struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"` // SourceWebhook or SourceDevice
	Stream string `json:"stream"`
	// Settings are the kind's settings: WebhookSourceSettings for a
	// webhook source.
	Settings json.RawMessage `json:"settings"`
	// Path is where a webhook source takes its webhooks.
	Path       string     `json:"path,omitempty"`
	Checkpoint Checkpoint `json:"checkpoint"`
	CreatedAt  time.Time  `json:"created_at"`
}

// Checkpoint is how far a source's ingress got: empty for a source that
// is sent to.
type Checkpoint struct {
	Cursor      string     `json:"cursor,omitempty"`
	LastEventAt *time.Time `json:"last_event_at,omitempty"`
	LastError   string     `json:"last_error,omitempty"`
	LastPollAt  *time.Time `json:"last_poll_at,omitempty"`
	UpdatedAt   *time.Time `json:"updated_at,omitempty"`
}

// WebhookSourceSettings are a webhook source's effective settings as the
// API shows them, its secrets as fingerprints.
type WebhookSourceSettings struct {
	Preset     string         `json:"preset,omitempty"`
	Secrets    []SourceSecret `json:"secrets"`
	KeyHeader  string         `json:"key_header,omitempty"`
	KeyField   string         `json:"key_field,omitempty"`
	TypeHeader string         `json:"type_header,omitempty"`
	TypeField  string         `json:"type_field,omitempty"`
	ServeFlags bool           `json:"serve_flags,omitempty"`
	Signature  string         `json:"signature"` // the scheme checked: standard-webhooks, github, stripe or none
	// ReplayWindow, for the github preset, is how long the same signed
	// body sent under another delivery id is answered as a duplicate
	// ("0s": never), e.g. "24h".
	ReplayWindow string `json:"replay_window,omitempty"`
}

// SourceSecret is a source's secret, shown by its fingerprint.
type SourceSecret struct {
	Fingerprint string `json:"fingerprint"`
}

// SourceList is the answer of GET /v1/sources.
type SourceList struct {
	Sources []Source `json:"sources"`
}

// CreateSource is the body of POST /v1/sources. Settings are the kind's:
// for a webhook source, preset, secrets, key_header, key_field,
// type_header, type_field (docs/API.md#sources).
type CreateSource struct {
	Name     string          `json:"name"`
	Kind     string          `json:"kind"`
	Settings json.RawMessage `json:"settings,omitempty"`
}

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
