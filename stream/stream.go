// Package stream defines what postbox stores events in: one append-only
// stream per source, each event stored once under its source identity
// (stream, native id, variant), with an offset that only grows; and
// consumers, one per subscription, each with its own offset in one stream.
//
// Backends live in subpackages named after their technology; streamsqlite
// is the embedded default. Every backend passes the conformance suite in
// streamtest.
package stream

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Errors backends return; callers branch on them with errors.Is.
var (
	// ErrConflict: an event with this identity is stored with a different
	// type or payload. The append changed nothing. An AppendResult's Err
	// is then a *ConflictError, which names what differs.
	ErrConflict = errors.New("stream: event already stored with a different type or payload")
	// ErrStreamNotFound: no stream has this id.
	ErrStreamNotFound = errors.New("stream: stream not found")
	// ErrNotFound: no event has this identity or offset.
	ErrNotFound = errors.New("stream: event not found")
	// ErrConsumerNotFound: no consumer has this id.
	ErrConsumerNotFound = errors.New("stream: consumer not found")
	// ErrConsumerExists: EnsureConsumer found a consumer with this id on
	// another stream.
	ErrConsumerExists = errors.New("stream: consumer exists on another stream")
	// ErrCommitBehind: a commit would move a consumer's offset backwards.
	// Offsets only move back through Reset.
	ErrCommitBehind = errors.New("stream: commit behind the consumer's offset")
	// ErrOffsetOutOfRange: an offset past the stream's high watermark
	// (for a commit), or past the next offset to be written (for a start
	// position), or below 1.
	ErrOffsetOutOfRange = errors.New("stream: offset out of range")
	// ErrTooLarge: the backend cannot store an event of this size (a NATS
	// server's max_payload). It is the Err of that event's AppendResult;
	// the other events of the call are appended as if it were not there.
	ErrTooLarge = errors.New("stream: event too large for the backend")
	// ErrInvalidStart: a start position that is not one of the policies,
	// or lacks the offset or time its policy needs.
	ErrInvalidStart = errors.New("stream: invalid start position")
)

// Backend is an event log with consumers: the event bus postbox runs on.
//
// The rules every backend keeps (streamtest checks each):
//
//   - One source has one stream. Offsets within a stream start at 1 and
//     grow by one with each stored event; an offset is never reused, not
//     even after its event was deleted.
//   - Append is idempotent on the event's identity (stream, NativeID,
//     Variant): the same identity with the same type and payload stores
//     nothing new and reports Duplicate with the original offset; with
//     another type or payload it reports a *ConflictError (ErrConflict)
//     naming the field that differs, the type when both do, and changes
//     nothing. Payloads are compared byte for byte.
//   - Offsets belong to consumers. Read changes no offset; Commit moves one
//     consumer only, and only forwards; Reset moves it anywhere a start
//     position can name.
//   - Appends are accepted whether or not the stream has consumers; the
//     backlog is there for a later consumer that starts at earliest,
//     at_offset or at_time.
//
// Methods are safe for concurrent use. A context's end makes a call return
// its error; a write it interrupts either happened entirely or not at all.
type Backend interface {
	// EnsureStream returns the stream of sourceID, creating it if needed.
	EnsureStream(ctx context.Context, sourceID string) (Stream, error)
	// Append stores events in streamID and returns one result per event,
	// in order, once they are durable. It returns ErrStreamNotFound for an
	// unknown stream. After any other error some events of the call may
	// be stored and others not (a backend that publishes events one by
	// one cannot take back those that were); appending the same events
	// again is safe and reports the stored ones as Duplicate.
	Append(ctx context.Context, streamID string, events []Event) ([]AppendResult, error)
	// Streams returns every stream, by id.
	Streams(ctx context.Context) ([]Stream, error)
	// Event returns the event of streamID at offset, or ErrNotFound (also
	// for an offset whose event was trimmed), or ErrStreamNotFound.
	Event(ctx context.Context, streamID string, offset int64) (StoredEvent, error)
	// Lookup returns the event of streamID stored under the identity
	// (nativeID, variant), or ErrNotFound, or ErrStreamNotFound.
	Lookup(ctx context.Context, streamID, nativeID, variant string) (StoredEvent, error)

	// EnsureConsumer returns the consumer cfg.ID, creating it at
	// cfg.Start if it does not exist. An existing consumer keeps its
	// offset (cfg.Start is ignored); one on another stream is
	// ErrConsumerExists.
	EnsureConsumer(ctx context.Context, cfg ConsumerConfig) (Consumer, error)
	// Consumer returns the consumer id, or ErrConsumerNotFound.
	Consumer(ctx context.Context, id string) (Consumer, error)
	// DeleteConsumer deletes the consumer id, or returns ErrConsumerNotFound.
	DeleteConsumer(ctx context.Context, id string) error
	// Read returns up to limit events of the consumer's stream at or after
	// offset from, in offset order (from 0: the consumer's next offset).
	// It changes no offset: a consumer that reads ahead of its commits
	// passes the offset after its last event as the next from.
	Read(ctx context.Context, consumerID string, from int64, limit int) (Batch, error)
	// Commit records that the consumer processed every event up to and
	// including offset: its next offset becomes offset+1. Committing the
	// offset just before the next one again changes nothing (a retried
	// commit is safe); an offset further back is ErrCommitBehind; one past
	// the stream's high watermark is ErrOffsetOutOfRange.
	Commit(ctx context.Context, consumerID string, offset int64) (Consumer, error)
	// Reset moves the consumer to start, backwards or forwards.
	Reset(ctx context.Context, consumerID string, start Start) (Consumer, error)

	// Stats summarises streamID, or returns ErrStreamNotFound.
	Stats(ctx context.Context, streamID string) (Stats, error)
	// Lag returns how far the consumer is behind its stream's high
	// watermark.
	Lag(ctx context.Context, consumerID string) (Lag, error)

	// Close releases the backend.
	Close() error
}

// Trimmer is implemented by backends that can delete old events:
// postbox's retention calls it when the backend has it.
type Trimmer interface {
	// Trim deletes up to limit of the oldest events of streamID stored
	// before t that every consumer of the stream has read (committed), and
	// returns how many it deleted. A stream without consumers keeps
	// nothing older than t. Offsets are never reused afterwards.
	Trim(ctx context.Context, streamID string, t time.Time, limit int) (int, error)
}

// Waiter is implemented by backends that can tell a reader when a stream
// grows, so that a consumer needs no polling delay.
type Waiter interface {
	// Wait returns once streamID holds an event with an offset above
	// after, or with ctx's error.
	Wait(ctx context.Context, streamID string, after int64) error
}

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
	Variant    string // distinguishes events a source sends under one id: postbox's device stream puts the envelope's device_id here
	Type       string
	OccurredAt time.Time       // when the source says it happened
	Sequence   *int64          // the source's own sequence number, if it has one
	Metadata   json.RawMessage // a JSON object: device_id, session_id, headers...
	Payload    json.RawMessage // a JSON object, stored as given
	// DeliveryHandle is where replies about this event go, copied into
	// every inbox item made from it. Optional.
	DeliveryHandle json.RawMessage
}

// StoredEvent is an Event as a stream holds it.
type StoredEvent struct {
	Event
	Offset   int64
	ID       string // the stream event id, unique across streams
	StreamID string
	SourceID string
	StoredAt time.Time // when it was first stored
}

// AppendResult is the outcome of appending one Event.
type AppendResult struct {
	Offset int64 // the stored event's offset
	// StoredAt is when the event was first stored; for a duplicate, the
	// original time.
	StoredAt  time.Time
	Duplicate bool // the identity was already stored with the same type and payload
	// Err is a *ConflictError (errors.Is ErrConflict), an error wrapping
	// ErrTooLarge, or nil. An event with an Err was not stored.
	Err error
}

// Fields a ConflictError names.
const (
	FieldType    = "type"
	FieldPayload = "payload"
)

// ConflictError is the Err of an AppendResult whose identity is stored
// with another type or payload. errors.Is(err, ErrConflict) holds.
type ConflictError struct {
	// Field is what differs from the stored event: FieldType, or
	// FieldPayload when the type is the same.
	Field string
}

func (e *ConflictError) Error() string {
	return "stream: event already stored with a different " + e.Field
}

// Is makes a ConflictError match ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// Conflict returns the ConflictError of stored and ev, two events of one
// identity, or nil when ev is a duplicate of stored: the same type and the
// same payload bytes.
func Conflict(stored, ev *Event) error {
	switch {
	case stored.Type != ev.Type:
		return &ConflictError{Field: FieldType}
	case string(stored.Payload) != string(ev.Payload):
		return &ConflictError{Field: FieldPayload}
	}
	return nil
}

// Start policies: where a new (or reset) consumer begins.
const (
	// StartLatest begins after the stream's high watermark: only events
	// stored from now on. The default.
	StartLatest = "latest"
	// StartEarliest begins at the oldest event the stream still holds.
	StartEarliest = "earliest"
	// StartAtOffset begins at Start.Offset.
	StartAtOffset = "at_offset"
	// StartAtTime begins at the first event stored at or after Start.Time.
	// It is the time the stream stored the event, as with JetStream's
	// start time, not the source's OccurredAt: device clocks drift and
	// offline devices send late, and only stored time follows offsets.
	StartAtTime = "at_time"
)

// Start is a start position: a policy and what it needs.
type Start struct {
	Policy string    // StartLatest ("" means it), StartEarliest, StartAtOffset or StartAtTime
	Offset int64     // StartAtOffset: the first offset to read (≥ 1, ≤ high watermark + 1)
	Time   time.Time // StartAtTime
}

// Validate returns ErrInvalidStart when s names no policy or lacks what
// its policy needs.
func (s Start) Validate() error {
	switch s.Policy {
	case "", StartLatest, StartEarliest:
		return nil
	case StartAtOffset:
		if s.Offset < 1 {
			return ErrInvalidStart
		}
		return nil
	case StartAtTime:
		if s.Time.IsZero() {
			return ErrInvalidStart
		}
		return nil
	}
	return ErrInvalidStart
}

// startJSON is a Start as JSON: its policy, and the offset or time only
// when the policy needs it.
type startJSON struct {
	Policy string     `json:"policy"`
	Offset int64      `json:"offset,omitempty"`
	Time   *time.Time `json:"time,omitempty"`
}

// Canonical returns s as a backend records it: the empty policy as
// StartLatest, and only the offset (at_offset) or UTC time (at_time) the
// policy needs.
func (s Start) Canonical() Start {
	c := Start{Policy: s.Policy}
	switch c.Policy {
	case "":
		c.Policy = StartLatest
	case StartAtOffset:
		c.Offset = s.Offset
	case StartAtTime:
		c.Time = s.Time.UTC()
	}
	return c
}

// MarshalJSON writes s canonical, as {"policy": …} with the offset or
// time its policy needs: how backends that keep consumers as JSON store
// their start.
func (s Start) MarshalJSON() ([]byte, error) {
	c := s.Canonical()
	j := startJSON{Policy: c.Policy, Offset: c.Offset}
	if c.Policy == StartAtTime {
		j.Time = &c.Time
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *Start) UnmarshalJSON(b []byte) error {
	var j startJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = Start{Policy: j.Policy, Offset: j.Offset}
	if j.Time != nil {
		s.Time = j.Time.UTC()
	}
	return nil
}

// ConsumerConfig describes a consumer to EnsureConsumer.
type ConsumerConfig struct {
	ID       string // the consumer's id: postbox uses the subscription's name
	StreamID string
	Start    Start
}

// Consumer is one subscription's position in one stream.
type Consumer struct {
	ID         string // postbox uses the subscription's name
	StreamID   string
	Key        string // backend-wide unique key: stream/consumer
	NextOffset int64  // the next offset this consumer has not processed
	Start      Start  // how it started, or was last reset
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// Batch is what Read returns.
type Batch struct {
	Consumer      Consumer
	Events        []StoredEvent
	HighWatermark int64 // the stream's last offset when read; 0 when empty
}

// Stats summarises a stream.
type Stats struct {
	StreamID      string
	Events        int64     // events the stream holds
	FirstOffset   int64     // 0 when empty
	LastOffset    int64     // the high watermark; 0 when nothing was ever stored
	FirstStoredAt time.Time // zero when empty
	LastStoredAt  time.Time
}

// Lag is how far a consumer is behind its stream.
type Lag struct {
	ConsumerID    string
	StreamID      string
	NextOffset    int64
	HighWatermark int64
	Events        int64 // events at or after NextOffset: LagOf(NextOffset, HighWatermark)
}

// LagOf returns how many events a reader whose next offset is next has
// not read in a stream whose high watermark (its last offset, 0 when
// nothing was ever stored) is highWatermark: highWatermark - next + 1, at
// least 0. Offsets start at 1, so a reader at 1 of an empty stream, or
// one past the high watermark, has none to read.
func LagOf(next, highWatermark int64) int64 {
	return max(highWatermark-next+1, 0)
}

// Scanner is implemented by backends that can read a stream by offset
// without a consumer: a reader that keeps its own position (a replay
// feed) reads through it, and shows in no consumer list and holds back no
// retention. ReadFrom calls it when the backend has it.
type Scanner interface {
	// ReadFrom returns up to limit events of streamID at or after offset
	// from (≥ 1), in offset order, skipping offsets whose events were
	// trimmed; none past the high watermark. It returns ErrStreamNotFound
	// for an unknown stream. A backend may return fewer than limit events
	// when more are stored (it bounds each read); limit ≤ 0 takes the
	// backend's default.
	ReadFrom(ctx context.Context, streamID string, from int64, limit int) ([]StoredEvent, error)
}

// ReadFrom returns up to limit (≥ 1) events of streamID at or after
// offset from, in offset order, without a consumer: b's Scanner when it
// has one, else Stats and Event per offset, which is slower but keeps the
// same contract. It returns ErrStreamNotFound for an unknown stream and
// ErrOffsetOutOfRange for from < 1.
func ReadFrom(ctx context.Context, b Backend, streamID string, from int64, limit int) ([]StoredEvent, error) {
	if from < 1 {
		return nil, ErrOffsetOutOfRange
	}
	if limit < 1 {
		limit = 1
	}
	if s, ok := b.(Scanner); ok {
		return s.ReadFrom(ctx, streamID, from, limit)
	}
	st, err := b.Stats(ctx, streamID)
	if err != nil {
		return nil, err
	}
	from = max(from, st.FirstOffset)
	var out []StoredEvent
	for off := from; off <= st.LastOffset && len(out) < limit; off++ {
		e, err := b.Event(ctx, streamID, off)
		if errors.Is(err, ErrNotFound) {
			continue // trimmed meanwhile
		}
		if err != nil {
			return out, err
		}
		out = append(out, e)
	}
	return out, nil
}

// Query selects events of a stream for a Searcher. Its zero fields select
// every event.
type Query struct {
	// NativeID selects the events stored under this native id (an
	// envelope's event_id, a webhook's idempotency key), of any variant.
	NativeID string
	// Type selects the events of this type.
	Type string
	// Since and Until select the events stored at or after Since and
	// before Until.
	Since, Until time.Time
	// Before selects the events with an offset below it: the offset of
	// the last event of the previous page.
	Before int64
	// Limit bounds how many events are returned; ≤ 0 takes the backend's
	// default.
	Limit int
}

// Searcher is implemented by backends that find a stream's events by
// native id, type and stored time through an index, without reading the
// stream through.
type Searcher interface {
	// Search returns up to q.Limit events of streamID that q selects,
	// newest (highest offset) first. It returns ErrStreamNotFound for an
	// unknown stream.
	Search(ctx context.Context, streamID string, q Query) ([]StoredEvent, error)
}
