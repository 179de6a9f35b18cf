package api

import (
	"encoding/json"
	"time"
)

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
