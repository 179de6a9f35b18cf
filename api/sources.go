package api

import (
	"encoding/json"
	"fmt"
	"time"
)

// Source kinds.
const (
	SourceWebhook = "webhook"
	SourceDevice  = "device"
	SourcePoll    = "poll" // polls a JSON HTTP API
	SourceFeed    = "feed" // follows another postbox's replay feed
)

// Source is where events come from (GET /v1/sources).
type Source struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"` // SourceWebhook, SourceDevice, SourcePoll or SourceFeed
	Stream string `json:"stream"`
	// Settings are the kind's settings: WebhookSourceSettings for a
	// webhook source, PollSourceSettings for a poll source,
	// FeedSourceSettings for a feed source, {} for a device source.
	// WebhookSettings, PollSettings and FeedSettings decode them.
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
	// RateLimit, when set, bounds the webhooks the source stores.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
	// APIURL, for a preset, is the provider's API its delivery handles
	// point into: https://api.github.com, https://api.stripe.com, or the
	// source's api_url.
	APIURL string `json:"api_url,omitempty"`
	// HandleHeader or HandlePointer, without a preset, is where each
	// webhook carries its delivery handle (docs/API.md#delivery-handles).
	HandleHeader  string `json:"handle_header,omitempty"`
	HandlePointer string `json:"handle_pointer,omitempty"`
	// Reply holds what a reply to the source's events carries, its
	// secrets as fingerprints.
	Reply *ReplySettings `json:"reply,omitempty"`
}

// ReplySettings are what a reply to a source's events carries (the
// "reply" member of every kind's settings but device): headers, a value
// "env:NAME" read from serve's environment at each reply and never
// stored, and a Standard Webhooks secret ("whsec_…") that signs each
// reply. The API shows header values that are not env:NAME, and the
// secret, as fingerprints.
//
// The headers go only to a preset's API (its api_url) and to Origins
// ("https://chat.example"): a generic webhook's or a poll's handle url
// comes with the event.
type ReplySettings struct {
	Headers       map[string]string `json:"headers,omitempty"`
	SigningSecret string            `json:"signing_secret,omitempty"`
	Origins       []string          `json:"origins,omitempty"`
}

// RateLimit is an intake rate limit: a token bucket of PerSecond
// events a second holding up to Burst (0 when given: one second's worth,
// at least 1; the API shows the burst in effect). Over it a webhook is
// answered 429 rate_limited with Retry-After.
type RateLimit struct {
	PerSecond float64 `json:"per_second"`
	Burst     int     `json:"burst,omitempty"`
}

// WebhookSettings decodes the settings of a webhook source.
func (s Source) WebhookSettings() (WebhookSourceSettings, error) {
	var out WebhookSourceSettings
	return out, s.decodeSettings(SourceWebhook, &out)
}

// PollSettings decodes the settings of a poll source.
func (s Source) PollSettings() (PollSourceSettings, error) {
	var out PollSourceSettings
	return out, s.decodeSettings(SourcePoll, &out)
}

// FeedSettings decodes the settings of a feed source.
func (s Source) FeedSettings() (FeedSourceSettings, error) {
	var out FeedSourceSettings
	return out, s.decodeSettings(SourceFeed, &out)
}

// decodeSettings decodes s.Settings into out, which are kind's; no
// settings decode as the zero ones.
func (s Source) decodeSettings(kind string, out any) error {
	if s.Kind != kind {
		return fmt.Errorf("source %s is of kind %s, not %s", s.Name, s.Kind, kind)
	}
	if len(s.Settings) == 0 {
		return nil
	}
	if err := json.Unmarshal(s.Settings, out); err != nil {
		return fmt.Errorf("settings of source %s: %w", s.Name, err)
	}
	return nil
}

// SourceSecret is a source's secret, shown by its fingerprint.
type SourceSecret struct {
	Fingerprint string `json:"fingerprint"`
}

// SourceList is the answer of GET /v1/sources.
type SourceList struct {
	Sources []Source `json:"sources"`
}

// CreateSource is the body of POST /v1/sources. Settings are the kind's,
// as JSON: CreateWebhookSettings for a webhook source,
// PollSourceSettings for a poll source, FeedSourceSettings for a feed
// source, none for a device source (docs/API.md#sources).
type CreateSource struct {
	Name     string          `json:"name"`
	Kind     string          `json:"kind"`
	Settings json.RawMessage `json:"settings,omitempty"`
}

// CreateWebhookSettings are the settings a request gives a webhook
// source, all optional; the source then shows them as
// WebhookSourceSettings.
type CreateWebhookSettings struct {
	// Preset names a provider, "github" or "stripe": the key and type
	// come from where it puts them, and every webhook must carry its
	// signature by one of Secrets.
	Preset string `json:"preset,omitempty"`
	// Secrets verify each webhook: with a preset, the provider's as
	// written there; without one, Standard Webhooks secrets ("whsec_…").
	// None: webhooks are not verified.
	Secrets    []string `json:"secrets,omitempty"`
	KeyHeader  string   `json:"key_header,omitempty"`  // the header holding the idempotency key
	KeyField   string   `json:"key_field,omitempty"`   // the top-level body field holding it
	TypeHeader string   `json:"type_header,omitempty"` // the header holding the type
	TypeField  string   `json:"type_field,omitempty"`  // the top-level body field holding it
	// ServeFlags takes every setting from serve's --webhook-* flags, as
	// the default source webhooks does; no other field goes with it.
	ServeFlags bool `json:"serve_flags,omitempty"`
	// ReplayWindow, for the github preset, is how long the same signed
	// body sent under another delivery id is answered as a duplicate
	// ("0" or "0s": never); "": 24h.
	ReplayWindow string `json:"replay_window,omitempty"`
	// RateLimit bounds the webhooks the source stores, over every node
	// of a shared store; nil: no bound. It may go with ServeFlags.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
	// APIURL, with a preset (none other), is the base of the provider's
	// API that delivery handles point into: "" is https://api.github.com
	// or https://api.stripe.com (GitHub Enterprise: https://HOST/api/v3).
	APIURL string `json:"api_url,omitempty"`
	// HandleHeader (a request header) or HandlePointer (a JSON pointer
	// into the body), one of them and without a preset, is where each
	// webhook carries its delivery handle: an absolute http(s) URL is the
	// handle's url, any other string its target.
	HandleHeader  string `json:"handle_header,omitempty"`
	HandlePointer string `json:"handle_pointer,omitempty"`
	// Reply holds what a reply to the source's events carries; it may go
	// with ServeFlags.
	Reply *ReplySettings `json:"reply,omitempty"`
}

// PollSourceSettings are the settings of a poll source: the JSON HTTP API
// it polls and where each answer holds its items (JSON pointers, RFC
// 6901). A request gives them; the API shows them with header values
// that are not env:NAME as fingerprints.
type PollSourceSettings struct {
	// URL is the API, asked with GET (its query is kept). Required.
	URL string `json:"url"`
	// Items points at the array of items in each answer; "" when the
	// answer is the array. Required.
	Items *string `json:"items"`
	// ID points, within an item, at its id (a string or a number).
	// Required.
	ID string `json:"id"`
	// Type points at an item's type. Required.
	Type string `json:"type"`
	// Time points at an item's time (RFC 3339, or seconds since 1970);
	// "": when it was polled.
	Time string `json:"time,omitempty"`
	// CursorParam and Next, both or neither: the cursor read at Next in
	// an answer goes back as the query parameter CursorParam.
	CursorParam string `json:"cursor_param,omitempty"`
	Next        string `json:"next,omitempty"`
	// Interval is the wait between polls when there is nothing new, e.g.
	// "5s"; "": 5s.
	Interval string `json:"interval,omitempty"`
	// Headers are sent with each request; a value "env:NAME" is read from
	// serve's environment at each poll and never stored.
	Headers map[string]string `json:"headers,omitempty"`
	// Redirects is which redirects a poll follows: "same-origin" (the
	// default, "") or "none".
	Redirects string `json:"redirects,omitempty"`
	// Handle makes each item's delivery handle: member name → JSON
	// pointer into the item; a member named "url" is where a reply goes.
	// A pointer that finds nothing leaves its member out. None: items
	// have no handle.
	Handle map[string]string `json:"handle,omitempty"`
	// Reply holds what a reply to the source's events carries.
	Reply *ReplySettings `json:"reply,omitempty"`
}

// FeedSourceSettings are the settings of a feed source: the other
// postbox's stream whose replay feed it follows. The API shows a Token
// that is not env:NAME as its fingerprint.
type FeedSourceSettings struct {
	// URL is the other's stream, http(s)://HOST:PORT/v1/streams/NAME.
	// Required.
	URL string `json:"url"`
	// Token is the other's API token, or "env:NAME" to read it from
	// serve's environment at each connection; "": none.
	Token string `json:"token,omitempty"`
	// Redirects is which redirects the follower follows: "same-origin"
	// (the default, "") or "none".
	Redirects string `json:"redirects,omitempty"`
	// Reply holds what a reply to the source's events carries.
	Reply *ReplySettings `json:"reply,omitempty"`
}
