package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/postbox-events/postbox"
)

// DefaultDeviceID is the envelope device_id of a transactional outbox
// event without a tenant.
const DefaultDeviceID = "outbox"

// Envelope returns a transactional outbox message as postbox's wire form:
// event_id, type, ts (the row's created_at), session_id (the correlation
// id), device_id (the tenant, or DefaultDeviceID) and payload (Body).
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
		TS:            m.CreatedAt.UTC().Format(time.RFC3339Nano),
		SessionID:     session,
		DeviceID:      device,
		Payload:       m.Body,
	}
}

// Envelopes wraps pub, a publisher of envelopes such as client.Publisher,
// so that it relays a transactional outbox: each message's Body, the
// event's payload, is sent inside its Envelope.
func Envelopes(pub Publisher) Publisher { return envelopes{pub} }

type envelopes struct{ pub Publisher }

func (e envelopes) Publish(ctx context.Context, msgs []Message) ([]postbox.Reply, error) {
	wrapped := make([]Message, len(msgs))
	for i, m := range msgs {
		body, err := json.Marshal(m.Envelope())
		if err != nil {
			return nil, fmt.Errorf("outbox: envelope of %s: %w", m.EventID, err)
		}
		m.Body = body
		wrapped[i] = m
	}
	return e.pub.Publish(ctx, wrapped)
}
