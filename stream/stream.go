// Package stream defines what postbox stores events in: one append-only
// stream per source, each event stored once under its source identity
// (stream, native id, variant), with an offset that only grows.
//
// Backends live in subpackages named after their technology; streamsqlite
// is the embedded default.
package stream

import (
	"encoding/json"
	"errors"
	"time"
)

// Errors backends return; callers branch on them with errors.Is.
var (
	// ErrConflict: an event with this identity is stored with a different
	// payload. The append changed nothing.
	ErrConflict = errors.New("stream: event already stored with a different payload")
	// ErrStreamNotFound: no stream has this id.
	ErrStreamNotFound = errors.New("stream: stream not found")
)

// Stream is one source's append-only log.
type Stream struct {
	ID        string
	SourceID  string
	Backend   string
	CreatedAt time.Time
}

// Event is one event to append. NativeID (with Variant) is its identity
// within the stream; appending the same identity again stores nothing new.
type Event struct {
	NativeID   string // the source's own id: an envelope's event_id, a webhook's idempotency key
	Variant    string // distinguishes events a source sends under one id; usually ""
	Type       string
	OccurredAt time.Time       // when the source says it happened
	Sequence   *int64          // the source's own sequence number, if it has one
	Metadata   json.RawMessage // a JSON object: device_id, session_id, headers...
	Payload    json.RawMessage // a JSON object, stored as given
	// DeliveryHandle is where replies about this event go, copied into
	// every inbox item made from it. Optional.
	DeliveryHandle json.RawMessage
}

// AppendResult is the outcome of appending one Event.
type AppendResult struct {
	Offset int64 // the stored event's offset
	// StoredAt is when the event was first stored; for a duplicate, the
	// original time.
	StoredAt  time.Time
	Duplicate bool  // the identity was already stored with the same payload
	Err       error // ErrConflict, or nil
}

// Stats summarises a stream.
type Stats struct {
	StreamID    string
	Events      int64
	FirstOffset int64 // 0 when empty
	LastOffset  int64 // the high watermark; 0 when empty
}
