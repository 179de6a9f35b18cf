package outboxredis

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"
)

// The fields of a stream entry written by Publisher and read by Consumer.
const (
	FieldEventID       = "event_id"
	FieldType          = "type"
	FieldPayload       = "payload"        // the message Body: the event's payload (or the envelope, from an edge outbox)
	FieldCorrelationID = "correlation_id" // written even when empty
	FieldTenantID      = "tenant_id"      // omitted when empty
	FieldCreatedAt     = "created_at"     // RFC 3339 with nanoseconds, UTC
	FieldTraceParent   = "traceparent"    // W3C trace context; omitted when empty
	FieldTraceState    = "tracestate"     // omitted when empty
)

// The fields a Consumer adds to an entry it moves to the dead-letter
// stream, after the original entry's fields.
const (
	FieldDeadEntryID    = "dead_entry_id"   // the entry's ID in the source stream
	FieldDeadGroup      = "dead_group"      // the consumer group that gave up on it
	FieldDeadConsumer   = "dead_consumer"   // the consumer that moved it
	FieldDeadReason     = "dead_reason"     // the handler's last error, or why the entry is not an event
	FieldDeadDeliveries = "dead_deliveries" // deliveries to the group, when known
	FieldDeadAt         = "dead_at"         // when it was moved, RFC 3339 UTC
)

// Message is one stream entry as a Handler sees it.
type Message struct {
	// ID is the entry's stream ID ("1700000000000-0"), not the event's.
	ID            string
	EventID       string
	Type          string
	Payload       []byte
	CorrelationID string
	TenantID      string
	CreatedAt     time.Time // zero when the entry has no created_at
	// TraceParent and TraceState are the W3C trace context the event
	// travels with; "" when it has none.
	TraceParent string
	TraceState  string
	// Deliveries counts the deliveries of this entry to the group, this
	// one included, as Redis counts them (the pending entry's delivery
	// counter): 1 the first time, more after a failure or a consumer's
	// death, not counting those that ended in a Transient error. 0 when
	// unknown.
	Deliveries int
}

// errMalformed wraps the reason an entry is not an event.
var errMalformed = errors.New("not an event")

// parseEntry reads an entry written by Publisher. Only event_id is
// required; created_at, when present, must be RFC 3339.
func parseEntry(e redis.XMessage) (Message, error) {
	m := Message{ID: e.ID}
	str := func(field string) (string, error) {
		v, ok := e.Values[field]
		if !ok {
			return "", nil
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("%w: %s is a %T, not a string", errMalformed, field, v)
		}
		return s, nil
	}
	var err error
	if m.EventID, err = str(FieldEventID); err != nil {
		return m, err
	}
	if m.EventID == "" {
		return m, fmt.Errorf("%w: the entry has no %s field", errMalformed, FieldEventID)
	}
	if m.Type, err = str(FieldType); err != nil {
		return m, err
	}
	payload, err := str(FieldPayload)
	if err != nil {
		return m, err
	}
	m.Payload = []byte(payload)
	if m.CorrelationID, err = str(FieldCorrelationID); err != nil {
		return m, err
	}
	if m.TenantID, err = str(FieldTenantID); err != nil {
		return m, err
	}
	if m.TraceParent, err = str(FieldTraceParent); err != nil {
		return m, err
	}
	if m.TraceState, err = str(FieldTraceState); err != nil {
		return m, err
	}
	created, err := str(FieldCreatedAt)
	if err != nil {
		return m, err
	}
	if created != "" {
		t, err := time.Parse(time.RFC3339Nano, created)
		if err != nil {
			return m, fmt.Errorf("%w: %s %q is not an RFC 3339 time", errMalformed, FieldCreatedAt, created)
		}
		m.CreatedAt = t
	}
	return m, nil
}

// sortedValues returns an entry's fields as name, value pairs in name
// order (go-redis hands them over as a map).
func sortedValues(values map[string]any) []any {
	names := make([]string, 0, len(values))
	for k := range values {
		names = append(names, k)
	}
	sort.Strings(names)
	out := make([]any, 0, 2*len(names))
	for _, k := range names {
		out = append(out, k, values[k])
	}
	return out
}
