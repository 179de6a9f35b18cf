package outbox

import (
	"time"

	"github.com/postbox-events/postbox"
)

// DefaultDeviceID is the envelope device_id of an event without a tenant.
const DefaultDeviceID = "outbox"

// Envelope returns the message in postbox's wire form: event_id, type, ts
// (CreatedAt in RFC 3339 with nanoseconds, keeping its offset), session_id
// (CorrelationID, or the event id), device_id (TenantID, or
// DefaultDeviceID), traceparent and tracestate, seq (SourceSeq) and
// payload (Body). A Publisher to a
// postbox server sends it; the stores keep the fields, not the envelope.
func (m Message) Envelope() postbox.Envelope {
	device := m.TenantID
	if device == "" {
		device = DefaultDeviceID
	}
	session := m.CorrelationID
	if session == "" {
		session = m.EventID
	}
	return postbox.Envelope{
		SchemaVersion: postbox.SchemaVersion,
		EventID:       m.EventID,
		Type:          m.Type,
		TS:            m.CreatedAt.Format(time.RFC3339Nano),
		SessionID:     session,
		DeviceID:      device,
		TraceParent:   m.TraceParent,
		TraceState:    m.TraceState,
		Seq:           m.SourceSeq,
		Payload:       m.Body,
	}
}
