package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// Subscription is a filtered consumer of one source, its inbox and, with
// a target, the endpoint postbox pushes the inbox's items to.
type Subscription struct {
	Name        string            `json:"name"`
	Source      string            `json:"source"`
	Stream      string            `json:"stream"`
	Inbox       string            `json:"inbox"`
	Types       []string          `json:"types"`
	Metadata    map[string]string `json:"metadata"`
	Start       string            `json:"start"` // latest, earliest, at_offset or at_time
	StartOffset int64             `json:"start_offset"`
	StartTime   *time.Time        `json:"start_time"`
	Target      *string           `json:"target"` // null: runtimes lease the inbox
	Endpoint
	CreatedAt     time.Time `json:"created_at"`
	NextOffset    int64     `json:"next_offset"`
	HighWatermark int64     `json:"high_watermark"`
	Lag           int64     `json:"lag"` // events of the stream not yet read
	// Paused says an operator paused the subscription's delivery (POST
	// …/pause): none of its items is leased until it is resumed, while
	// its inbox keeps filling. PausedAt and PausedReason say when and why.
	Paused       bool       `json:"paused"`
	PausedAt     *time.Time `json:"paused_at"`
	PausedReason *string    `json:"paused_reason"`
	// OrderBy, when not null, orders the subscription's items per key:
	// where an event's key comes from (device_id, session_id,
	// metadata.NAME, header.NAME, or a JSON pointer into the payload such
	// as /order/id). The items of a key are handed out one at a time, in
	// offset order. OnDeadLetter says what a dead letter of a key does to
	// the key's next items: "block" (they wait for an operator) or "skip";
	// null when the subscription is not ordered.
	OrderBy      *string `json:"order_by"`
	OnDeadLetter *string `json:"on_dead_letter"`
	// Held is what holds back the keys of an ordered subscription; in
	// the list and a get, nil elsewhere and for an unordered one.
	Held *SubscriptionHeld `json:"held,omitempty"`
	// Counts are the subscription's items by state (its share of its
	// inbox's), as the server keeps them; in the list and a get, nil
	// elsewhere.
	Counts *SubscriptionCounts `json:"counts,omitempty"`
}

// Endpoint is the settings of a subscription's target as the API shows
// them; a nil setting is the server's.
type Endpoint struct {
	Secrets         []Secret          `json:"secrets"`
	Headers         map[string]string `json:"headers"` // credentials shown as their length and last characters
	Timeout         *string           `json:"timeout"`
	RetrySchedule   *string           `json:"retry_schedule"`
	RetryBaseDelay  *string           `json:"retry_base_delay"`
	RetryMaxDelay   *string           `json:"retry_max_delay"`
	MaxAttempts     *int              `json:"max_attempts"`
	Rate            *string           `json:"rate"`
	Concurrency     *int              `json:"concurrency"`
	BreakerFailures *int              `json:"breaker_failures"` // 0: no breaker
	BreakerProbe    *string           `json:"breaker_probe"`
	DisableAfter    *string           `json:"disable_after"`
	Format          string            `json:"format"`            // "postbox" or "cloudevents" (binary mode)
	Breaker         *Breaker          `json:"breaker,omitempty"` // with a target
}

// Secret is a signing secret of an endpoint, shown by its fingerprint:
// never the secret itself.
type Secret struct {
	Fingerprint string     `json:"fingerprint"`
	CreatedAt   time.Time  `json:"created_at"`
	ExpiresAt   *time.Time `json:"expires_at"` // null: the current one; else a rotated one, valid until then
}

// Breaker states.
const (
	BreakerClosed   = "closed"
	BreakerOpen     = "open"
	BreakerDisabled = "disabled"
)

// Breaker is the state of an endpoint's circuit breaker.
type Breaker struct {
	State     string     `json:"state"` // BreakerClosed, BreakerOpen or BreakerDisabled
	Since     *time.Time `json:"since"` // when it opened; null when closed
	Failures  int        `json:"consecutive_failures"`
	LastError *string    `json:"last_error"`
	NextProbe *time.Time `json:"next_probe"` // open: when the next probe may go
}

// SubscriptionList is the answer of GET /v1/subscriptions.
type SubscriptionList struct {
	Subscriptions []Subscription `json:"subscriptions"`
}

// EndpointSettings are the endpoint settings a request may give; a nil
// one is left as it is (to the server's default on create).
type EndpointSettings struct {
	Secret          *string           `json:"secret,omitempty"`         // "whsec_…": signs each delivery (Standard Webhooks)
	SecretOverlap   *string           `json:"secret_overlap,omitempty"` // with Secret: how long the previous one stays valid
	Headers         map[string]string `json:"headers,omitempty"`        // sent with each delivery
	Timeout         *string           `json:"timeout,omitempty"`
	RetrySchedule   *string           `json:"retry_schedule,omitempty"` // "5s,5m,30m"
	RetryBaseDelay  *string           `json:"retry_base_delay,omitempty"`
	RetryMaxDelay   *string           `json:"retry_max_delay,omitempty"`
	MaxAttempts     *int              `json:"max_attempts,omitempty"`
	Rate            *string           `json:"rate,omitempty"` // "50/s"
	Concurrency     *int              `json:"concurrency,omitempty"`
	BreakerFailures *int              `json:"breaker_failures,omitempty"` // 0: no breaker
	BreakerProbe    *string           `json:"breaker_probe,omitempty"`
	DisableAfter    *string           `json:"disable_after,omitempty"`
	Format          *string           `json:"format,omitempty"` // "postbox" (the default) or "cloudevents"
}

// CreateSubscription is the body of POST /v1/subscriptions. Name and
// Source are required; Inbox defaults to Name, Start to latest.
type CreateSubscription struct {
	Name        string            `json:"name"`
	Source      string            `json:"source"`
	Types       []string          `json:"types,omitempty"` // type patterns ("order.*"); none: every type
	Metadata    map[string]string `json:"metadata,omitempty"`
	Inbox       string            `json:"inbox,omitempty"`
	Start       string            `json:"start,omitempty"`
	StartOffset int64             `json:"start_offset,omitempty"` // with start at_offset
	StartTime   string            `json:"start_time,omitempty"`   // with start at_time: RFC 3339
	Target      string            `json:"target,omitempty"`       // the URL to push items to; "": runtimes lease them
	// OrderBy orders the items per key (see Subscription.OrderBy);
	// OnDeadLetter is "block" (the default with OrderBy) or "skip".
	OrderBy      string `json:"order_by,omitempty"`
	OnDeadLetter string `json:"on_dead_letter,omitempty"`
	EndpointSettings
}

// UpdateSubscription is the body of PATCH /v1/subscriptions/{name}: what
// may change of a subscription. Nil fields stay as they are.
type UpdateSubscription struct {
	// Target is the new target URL; "" removes the target (the inbox is
	// then left to runtimes that lease it).
	Target *string
	// OnDeadLetter, of an ordered subscription, becomes its
	// on_dead_letter: "block" or "skip".
	OnDeadLetter *string
	EndpointSettings
	// Reset names endpoint settings (their JSON names: "timeout",
	// "retry_schedule", "secret", ...) to set back to the server's
	// default; "secret" stops signing.
	Reset []string
}

// MarshalJSON encodes u as the API reads it: an empty Target and each
// setting of Reset as null.
func (u UpdateSubscription) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(u.EndpointSettings)
	if err != nil {
		return nil, err
	}
	fields := map[string]json.RawMessage{}
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, err
	}
	for _, name := range u.Reset {
		if _, set := fields[name]; set {
			return nil, fmt.Errorf("update subscription: %s is both set and reset", name)
		}
		fields[name] = json.RawMessage("null")
	}
	if u.Target != nil {
		fields["target"] = json.RawMessage("null")
		if *u.Target != "" {
			fields["target"], _ = json.Marshal(*u.Target)
		}
	}
	if u.OnDeadLetter != nil {
		fields["on_dead_letter"], _ = json.Marshal(*u.OnDeadLetter)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(fields); err != nil {
		return nil, err
	}
	return bytes.TrimSpace(buf.Bytes()), nil
}

// Consumer is a subscription's position in its stream (GET /v1/consumers).
type Consumer struct {
	Consumer      string    `json:"consumer"`
	Subscription  string    `json:"subscription"`
	Stream        string    `json:"stream"`
	NextOffset    int64     `json:"next_offset"`
	HighWatermark int64     `json:"high_watermark"`
	Lag           int64     `json:"lag"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// ConsumerList is the answer of GET /v1/consumers.
type ConsumerList struct {
	Consumers []Consumer `json:"consumers"`
}

// Stream is a source's append-only log of events (GET /v1/streams).
type Stream struct {
	Stream        string     `json:"stream"`
	Source        string     `json:"source"`
	Backend       string     `json:"backend"`
	Events        int64      `json:"events"`
	FirstOffset   int64      `json:"first_offset"`
	LastOffset    int64      `json:"last_offset"`
	FirstStoredAt *time.Time `json:"first_stored_at"` // null: no event yet
	LastStoredAt  *time.Time `json:"last_stored_at"`
	CreatedAt     time.Time  `json:"created_at"`
}

// StreamList is the answer of GET /v1/streams.
type StreamList struct {
	Streams []Stream `json:"streams"`
}

// SubscriptionHeld is what holds back the keys of an ordered
// subscription.
type SubscriptionHeld struct {
	// Keys is how many keys have items waiting behind an earlier item of
	// theirs that failed: one waiting for a retry, or a dead letter (with
	// on_dead_letter block).
	Keys int64 `json:"keys"`
	// OldestAt is when the oldest item waiting behind such an item was
	// made; null when none waits.
	OldestAt *time.Time `json:"oldest_at"`
}

// SubscriptionCounts is a subscription's items by state: its share of
// its inbox's.
type SubscriptionCounts struct {
	Inbox      string `json:"inbox"`
	Pending    int64  `json:"pending"`
	Processing int64  `json:"processing"`
	Completed  int64  `json:"completed"`
	Failed     int64  `json:"failed"`
}
