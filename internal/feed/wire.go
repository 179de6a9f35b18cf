// Package feed is postbox's replay feed: the NDJSON wire format of
// GET /v1/streams/{stream}/events, which streams a stream's events by
// offset and keeps the connection open for new ones, and the Follower,
// which reads such a feed from another postbox and stores each event in a
// local stream once, under the identity it has upstream.
//
// The follower appends through the server's writer (the ingress's bounded
// queue and group commit) and records the last remote offset it stored in
// a Checkpoints once the append committed. A crash between the two makes
// it read some events again at restart; the stream's identity dedup
// (native id, variant) stores them as duplicates, so each event is stored
// once.
package feed

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/postbox-events/postbox/stream"
)

// DefaultHeartbeat is how often a feed writes a heartbeat line, whether
// or not it writes events: proxies see traffic, and a follower that reads
// nothing for a few heartbeats knows its peer is gone.
const DefaultHeartbeat = 15 * time.Second

// ContentType is the media type of a feed: one JSON object per line.
const ContentType = "application/x-ndjson"

// HeaderHighWatermark is the response header holding the stream's last
// offset when the feed began.
const HeaderHighWatermark = "Postbox-High-Watermark"

// Line is one line of a feed: an event, or (with Heartbeat set) a
// heartbeat.
//
// An event's payload and metadata are the JSON documents the stream
// holds, byte for byte: Payload and Metadata when they fit on one line,
// else PayloadText and MetadataText, JSON strings holding the same bytes
// (a stored document may be pretty-printed, or end with a newline), or
// PayloadBase64 and MetadataBase64 for bytes that are not UTF-8.
type Line struct {
	Offset       int64      `json:"offset,omitempty"`
	ID           string     `json:"id,omitempty"`        // the stream event id upstream
	NativeID     string     `json:"native_id,omitempty"` // with Variant, the event's identity
	Variant      string     `json:"variant,omitempty"`
	Type         string     `json:"type,omitempty"`
	OccurredAt   *time.Time `json:"occurred_at,omitempty"`
	StoredAt     *time.Time `json:"stored_at,omitempty"` // when upstream first stored it
	Sequence     *int64     `json:"sequence,omitempty"`
	MetadataText *string    `json:"metadata_text,omitempty"`
	PayloadText  *string    `json:"payload_text,omitempty"`
	// MetadataBase64 and PayloadBase64 hold a document that does not fit
	// on a line and is not UTF-8 (JSON strings cannot hold its bytes).
	MetadataBase64 []byte          `json:"metadata_base64,omitempty"`
	PayloadBase64  []byte          `json:"payload_base64,omitempty"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
	Payload        json.RawMessage `json:"payload,omitempty"`
	Heartbeat      *Heartbeat      `json:"heartbeat,omitempty"`
}

// Heartbeat is what a heartbeat line says.
type Heartbeat struct {
	HighWatermark int64     `json:"high_watermark"` // the stream's last offset
	At            time.Time `json:"at"`
}

// AppendEvent appends e's line, newline included, to dst.
func AppendEvent(dst []byte, e *stream.StoredEvent) []byte {
	l := Line{Offset: e.Offset, ID: e.ID, NativeID: e.NativeID, Variant: e.Variant, Type: e.Type, Sequence: e.Sequence}
	occurred, stored := e.OccurredAt.UTC(), e.StoredAt.UTC()
	l.OccurredAt, l.StoredAt = &occurred, &stored
	metaRaw := oneLine(e.Metadata)
	if !metaRaw {
		l.MetadataText, l.MetadataBase64 = escaped(e.Metadata)
	}
	payloadRaw := oneLine(e.Payload)
	if !payloadRaw {
		l.PayloadText, l.PayloadBase64 = escaped(e.Payload)
	}
	head, err := json.Marshal(&l) // the raw documents go in after: Marshal would compact them
	if err != nil {
		panic(fmt.Sprintf("feed: marshal line: %v", err)) // strings, numbers and times only
	}
	dst = append(dst, head[:len(head)-1]...)
	if metaRaw && len(e.Metadata) > 0 {
		dst = append(dst, `,"metadata":`...)
		dst = append(dst, e.Metadata...)
	}
	if payloadRaw && len(e.Payload) > 0 {
		dst = append(dst, `,"payload":`...)
		dst = append(dst, e.Payload...)
	}
	return append(dst, '}', '\n')
}

// AppendHeartbeat appends a heartbeat line to dst.
func AppendHeartbeat(dst []byte, hb Heartbeat) []byte {
	b, _ := json.Marshal(Line{Heartbeat: &hb})
	return append(append(dst, b...), '\n')
}

// oneLine reports whether doc can be written as it is inside a line and
// read back byte for byte: UTF-8 (a line is JSON text), no line break,
// and no space around it (a JSON decoder drops that).
func oneLine(doc []byte) bool {
	if len(doc) == 0 {
		return true
	}
	return bytes.IndexByte(doc, '\n') < 0 && bytes.IndexByte(doc, '\r') < 0 && !isSpace(doc[0]) && !isSpace(doc[len(doc)-1]) && utf8.Valid(doc)
}

// escaped returns doc as a string when it is UTF-8, else as bytes (that
// JSON writes in base64).
func escaped(doc []byte) (*string, []byte) {
	if utf8.Valid(doc) {
		s := string(doc)
		return &s, nil
	}
	return nil, doc
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// ErrBadLine: a feed line that is not a heartbeat or an event.
var ErrBadLine = errors.New("feed: bad line")

// ParseLine decodes one line (without its newline). An empty line is a
// heartbeat without a high watermark.
func ParseLine(b []byte) (Line, error) {
	var l Line
	if len(bytes.TrimSpace(b)) == 0 {
		l.Heartbeat = &Heartbeat{}
		return l, nil
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return Line{}, fmt.Errorf("%w: %v", ErrBadLine, err)
	}
	if l.Heartbeat != nil {
		return l, nil
	}
	switch {
	case l.PayloadText != nil:
		l.Payload = json.RawMessage(*l.PayloadText)
	case l.PayloadBase64 != nil:
		l.Payload = json.RawMessage(l.PayloadBase64)
	}
	switch {
	case l.MetadataText != nil:
		l.Metadata = json.RawMessage(*l.MetadataText)
	case l.MetadataBase64 != nil:
		l.Metadata = json.RawMessage(l.MetadataBase64)
	}
	switch {
	case l.Offset < 1:
		return Line{}, fmt.Errorf("%w: offset %d", ErrBadLine, l.Offset)
	case l.NativeID == "":
		return Line{}, fmt.Errorf("%w: offset %d: native_id missing", ErrBadLine, l.Offset)
	case l.Type == "":
		return Line{}, fmt.Errorf("%w: offset %d: type missing", ErrBadLine, l.Offset)
	case len(l.Payload) == 0:
		return Line{}, fmt.Errorf("%w: offset %d: payload missing", ErrBadLine, l.Offset)
	}
	return l, nil
}

// Event returns the event of an event line, to append downstream under
// the same identity.
func (l *Line) Event() stream.Event {
	e := stream.Event{NativeID: l.NativeID, Variant: l.Variant, Type: l.Type, Sequence: l.Sequence,
		Metadata: l.Metadata, Payload: l.Payload}
	if l.OccurredAt != nil {
		e.OccurredAt = *l.OccurredAt
	}
	return e
}
