// Package outbox is postbox's one relay mechanism: a durable table of
// unsent events and a Relay loop that sends them, retries with backoff and
// jitter, and settles each row only after the receiver answered it.
//
// The edge agent's outbox (outboxsqlite) and the transactional outbox of a
// service's own database (outboxpg) are both a Store; the ingress client
// (client.Publisher), Redis Streams (outboxredis), NATS JetStream
// (outboxnats) and Kafka (outboxkafka) are each a Publisher. The Relay is
// the same for all of them.
//
// Guarantees: a row leaves the outbox (deleted or marked delivered) only
// after the Publisher returned an ACK for it; a row refused with a
// non-retryable NACK is kept as rejected with the reason, for an operator
// to inspect and requeue; everything else is sent again until ACKed.
// Rows are sent in outbox order, but with many batches in flight and
// retries, the receiver may see them in another order.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/postbox-events/postbox"
)

// Message is one outbox row handed to a Publisher. Every Store hands out
// the same shape: Body is the event's payload and the other fields carry
// what postbox's envelope carries besides it, so that a Publisher sends
// the same bytes whichever outbox the event came from. Only a Publisher
// to a postbox server (client.Publisher) puts them into an envelope
// (Message.Envelope).
type Message struct {
	Seq     int64 // the row's position in the outbox; grows with each insert
	EventID string
	Type    string
	// Body is the event's payload: a JSON object, byte for byte as its
	// producer wrote it.
	Body []byte
	// CorrelationID ties together the events of one request or workflow;
	// sent to a postbox server as the envelope's session_id.
	CorrelationID string
	// TenantID says whose event this is; sent to a postbox server as the
	// envelope's device_id (DefaultDeviceID when empty). The edge
	// outbox's rows carry their device's id here.
	TenantID string
	// SourceSeq is the producer's own number for the event (the
	// envelope's optional seq, which a postbox server stores as the
	// source sequence); nil when it gave none. It is not Seq.
	SourceSeq *int64
	// TraceParent and TraceState are the W3C trace context the event
	// travels with ("" when it has none). The Relay replaces them with
	// its publish span's while tracing is on; every Publisher sends them
	// (a postbox server in the envelope, the others as a traceparent and
	// tracestate header or field).
	TraceParent string
	TraceState  string
	// Attempts counts the sends the receiver refused (NACKed); sends a
	// transport failure cut short do not count, so an outage neither
	// parks rows nor stretches their backoff.
	Attempts int
	// CreatedAt is when the event happened: the envelope's ts its
	// producer gave the edge outbox (with that ts's offset), or the time
	// a transactional outbox row was inserted.
	CreatedAt time.Time
	// Lease identifies the claim a Claimer's Due took on the row: the
	// claim's end as Due recorded it. An Extender moves the claim's end
	// on without changing its Lease. The Relay copies it into the row's
	// Outcome.
	Lease time.Time
}

// Event is what a service writes to its transactional outbox, in the same
// transaction as the business write it announces (see outboxpg.Insert,
// outboxpg.InsertPgx and outboxsqlite.Insert).
type Event struct {
	// ID is the event's identity, the key receivers deduplicate on.
	// Empty: Prepare sets a new NewEventID.
	ID string
	// Type names what happened ("order.created"). Required.
	Type string
	// Payload is the event's JSON. Required. Relayed to a postbox server
	// it must be a JSON object.
	Payload json.RawMessage
	// CorrelationID ties together the events of one request or workflow.
	// Empty: the event's ID.
	CorrelationID string
	// TenantID says whose event this is; may be empty.
	TenantID string
	// TraceParent and TraceState are the W3C trace context the event
	// travels with, sent on with it and stored with it by a postbox
	// server. Empty: the transactional Inserts take the context of the
	// span in their ctx, if there is one (PrepareContext).
	TraceParent string
	TraceState  string
}

// Limits of an Event's fields.
const (
	MaxEventIDBytes   = 128
	MaxEventTypeBytes = 128
)

// ErrInvalidEvent is wrapped by Prepare's errors.
var ErrInvalidEvent = errors.New("outbox: invalid event")

// ErrDuplicate is returned (wrapped, naming the id) by a transactional
// Insert of an event whose id is in the outbox already. Nothing is
// written for it, and the caller's transaction stays usable: the caller
// decides whether to commit the rest.
var ErrDuplicate = errors.New("outbox: event id already in the outbox")

// PrepareContext is Prepare that first takes an event's trace context
// from the span in ctx (OpenTelemetry's), when the event has none.
func (e *Event) PrepareContext(ctx context.Context) error {
	if e.TraceParent == "" {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			e.TraceParent = fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
			e.TraceState = sc.TraceState().String()
		}
	}
	return e.Prepare()
}

// Prepare fills in an event's defaults and checks its fields, returning an
// error wrapping ErrInvalidEvent that names the field that is wrong.
func (e *Event) Prepare() error {
	if e.ID == "" {
		e.ID = NewEventID()
	}
	if e.CorrelationID == "" {
		e.CorrelationID = e.ID
	}
	switch {
	case len(e.ID) > MaxEventIDBytes:
		return fmt.Errorf("%w: id is %d bytes, over %d", ErrInvalidEvent, len(e.ID), MaxEventIDBytes)
	case e.Type == "":
		return fmt.Errorf("%w: type is empty", ErrInvalidEvent)
	case len(e.Type) > MaxEventTypeBytes:
		return fmt.Errorf("%w: type is %d bytes, over %d", ErrInvalidEvent, len(e.Type), MaxEventTypeBytes)
	case len(e.Payload) == 0:
		return fmt.Errorf("%w: payload is empty", ErrInvalidEvent)
	case !postbox.Valid(e.Payload):
		return fmt.Errorf("%w: payload is not valid JSON", ErrInvalidEvent)
	case !utf8.Valid(e.Payload):
		return fmt.Errorf("%w: payload is not valid UTF-8", ErrInvalidEvent)
	}
	if e.TraceParent != "" {
		if err := postbox.CheckTraceParent(e.TraceParent); err != nil {
			return fmt.Errorf("%w: traceparent: %v", ErrInvalidEvent, err)
		}
	} else if e.TraceState != "" {
		return fmt.Errorf("%w: tracestate given without a traceparent", ErrInvalidEvent)
	}
	if err := postbox.CheckTraceState(e.TraceState); err != nil {
		return fmt.Errorf("%w: tracestate: %v", ErrInvalidEvent, err)
	}
	for _, f := range []struct{ name, value string }{
		{"id", e.ID}, {"type", e.Type}, {"correlation id", e.CorrelationID}, {"tenant id", e.TenantID},
	} {
		if !utf8.ValidString(f.value) || strings.ContainsRune(f.value, 0) {
			return fmt.Errorf("%w: %s %q is not UTF-8 text without NUL characters", ErrInvalidEvent, f.name, f.value)
		}
	}
	return nil
}

// Publisher sends messages to a receiver.
type Publisher interface {
	// Publish sends msgs and returns one reply per message, in the order
	// of msgs. An error means the transport failed and nothing can be
	// assumed about any of the messages; the Relay sends them again.
	// Publish may be called from several goroutines at once.
	Publish(ctx context.Context, msgs []Message) ([]postbox.Reply, error)
}

// Store is an outbox as the Relay sees it.
type Store interface {
	// Due returns up to limit pending rows whose Seq is above after and
	// whose next attempt is due at now, in Seq order. The Relay never has one event in flight
	// twice; a store that several relays share (the transactional outbox)
	// must also keep relays apart, for example by claiming the rows it
	// returns with a lease (FOR UPDATE SKIP LOCKED, then a next attempt
	// time in the future) that Settle ends.
	Due(ctx context.Context, now time.Time, after int64, limit int) ([]Message, error)
	// Settle records the outcomes of one publish in one transaction.
	// The Relay records Delivered and Rejected outcomes again when Settle
	// failed, and a Settle that timed out may still have committed: a
	// Delivered or Rejected outcome recorded twice must count its attempt
	// once.
	Settle(ctx context.Context, outcomes []Outcome) error
}

// Claimer is implemented by a Store whose Due claims the rows it returns
// for the calling relay (the transactional outbox), so that Due never
// returns a row in flight. The Relay then asks for exactly the rows it
// has room for and sends every row Due returned.
type Claimer interface {
	Claims() bool
}

// Extender is implemented by a Claimer whose claims the relay holding
// them can extend: its heartbeat. A relay that is alive keeps its claims
// for as long as it is sending or settling their rows, however slow the
// receiver or the store, so that no other relay takes them; only a relay
// that died (or stopped beating for a whole claim period) loses them.
type Extender interface {
	// ClaimPeriod is how long a claim lasts without being extended.
	ClaimPeriod() time.Duration
	// Extend moves the end of each claim whose row still carries it (by
	// its Lease) to now plus ClaimPeriod, as Due does, and returns how
	// many it extended. Rows settled since, or claimed by another relay
	// after the claim ran out, are left alone. A claim keeps its Lease
	// when it is extended: an Outcome carries the Lease Due handed out.
	Extend(ctx context.Context, now time.Time, claims []Claim) (int64, error)
}

// Claim is a row a relay holds: the Message's EventID, Seq and Lease.
type Claim struct {
	EventID string
	Seq     int64
	Lease   time.Time
}

// Notifier is implemented by a Store that can tell the Relay about new
// rows, so they are sent at once instead of at the next poll.
type Notifier interface {
	Notify() <-chan struct{}
}

// Outcome is what happened to one message.
type Outcome struct {
	EventID string
	// Seq is the Message's Seq, by which a Store may find the row; 0
	// when the outcome did not come from a Message, and the Store finds
	// the row by EventID.
	Seq     int64
	Kind    OutcomeKind
	Error   string    // the receiver's reason, or the transport error
	RetryAt time.Time // for Retry: when to send again
	// Lease is the Message's Lease. A Claimer applies an outcome other
	// than Delivered only while the row still carries this claim, so a
	// relay whose claim ended cannot undo what the next one does.
	Lease time.Time
}

// OutcomeKind says how a Store must settle a row.
type OutcomeKind int

const (
	// Delivered: ACKed. The row leaves the outbox.
	Delivered OutcomeKind = iota
	// Rejected: refused with a non-retryable NACK, or refused MaxAttempts
	// times (parked). The row is kept as rejected with Error until an
	// operator requeues it.
	Rejected
	// Retry: refused with a retryable NACK. Count the attempt, record
	// Error, send again at RetryAt.
	Retry
	// Unanswered: sent, but the transport failed before a reply. Record
	// Error, without counting an attempt; the row stays due.
	Unanswered
)

// ReplyOutcome turns a receiver's reply into an Outcome.
func ReplyOutcome(r postbox.Reply, retryAt time.Time) Outcome {
	switch {
	case r.OK():
		return Outcome{EventID: r.EventID, Kind: Delivered}
	case r.Retryable:
		return Outcome{EventID: r.EventID, Kind: Retry, Error: string(r.Code) + ": " + r.Message, RetryAt: retryAt}
	default:
		return Outcome{EventID: r.EventID, Kind: Rejected, Error: string(r.Code) + ": " + r.Message}
	}
}

// Row states.
const (
	StatePending   = "pending"   // waiting to be sent, or being sent
	StateRejected  = "rejected"  // refused for good or parked; kept for an operator
	StateDelivered = "delivered" // ACKed; the transactional outbox keeps it until retention
)

// Row is an outbox row as operators see it (postbox outbox list).
// CreatedAt is when the row was inserted.
type Row struct {
	EventID       string          `json:"event_id"`
	Type          string          `json:"type"`
	State         string          `json:"state"`
	CreatedAt     time.Time       `json:"created_at"`
	NextAttemptAt time.Time       `json:"next_attempt_at"`
	Attempts      int             `json:"attempt_count"`
	LastError     string          `json:"last_error,omitempty"`
	Payload       json.RawMessage `json:"payload,omitempty"` // the event's payload, as Message.Body
	CorrelationID string          `json:"correlation_id,omitempty"`
	TenantID      string          `json:"tenant_id,omitempty"`
	DeliveredAt   *time.Time      `json:"delivered_at,omitempty"`
}

// Admin is an outbox as operators see it (postbox outbox, the relay's
// metrics). Both stores implement it.
type Admin interface {
	// List returns up to limit rows in state (StatePending,
	// StateRejected, StateDelivered, or "" for all), oldest first. A
	// store that deletes delivered rows lists none as delivered.
	List(ctx context.Context, state string, limit int) ([]Row, error)
	// Counts returns how many rows are pending and rejected.
	Counts(ctx context.Context) (pending, rejected int64, err error)
	// OldestPending returns when the oldest pending row was inserted; ok
	// is false when nothing is pending.
	OldestPending(ctx context.Context) (t time.Time, ok bool, err error)
	// Requeue makes rejected rows pending and due now, with their
	// attempts counted from zero again; with no ids, every rejected row.
	// It returns how many rows it requeued.
	Requeue(ctx context.Context, ids []string) (int64, error)
}

// RowAdmin is an Admin's operations on rows named by id (postbox outbox
// requeue and drop). Both stores implement it.
type RowAdmin interface {
	// Rows returns the rows of ids, in any state, in no particular
	// order; an id the outbox does not hold has no row.
	Rows(ctx context.Context, ids []string) ([]Row, error)
	// Drop deletes rejected rows for good: those of ids, or with no ids
	// every rejected row. A row in another state stays. It returns the
	// ids of the rows it deleted.
	Drop(ctx context.Context, ids []string) ([]string, error)
}
