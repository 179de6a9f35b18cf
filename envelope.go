package postbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Envelope is the wire form of one event (docs/PROTOCOL.md).
//
// Payload holds the event's JSON object exactly as the producer wrote it.
// Seq is optional: a producer that numbers its events may send that number,
// and the receiver stores it as the source sequence, but never uses it for
// identity. TraceParent and TraceState are optional too: the W3C trace
// context (https://www.w3.org/TR/trace-context/) the event travels with,
// stored with it and sent on with its deliveries; they are not part of its
// identity either. DeliverAt is optional: an RFC 3339 time, at most
// MaxDeliverAhead after the receiver's now, before which the event's
// deliveries do not start (one in the past: at once); it is stored with
// the event (metadata deliver_at), not part of its identity.
type Envelope struct {
	SchemaVersion int             `json:"schema_version"`
	EventID       string          `json:"event_id"`
	Type          string          `json:"type"`
	TS            string          `json:"ts"`
	SessionID     string          `json:"session_id"`
	DeviceID      string          `json:"device_id"`
	TraceParent   string          `json:"traceparent,omitempty"`
	TraceState    string          `json:"tracestate,omitempty"`
	DeliverAt     string          `json:"deliver_at,omitempty"`
	Seq           *int64          `json:"seq,omitempty"`
	Payload       json.RawMessage `json:"payload"`
}

// Default limits of Limits.
const (
	DefaultMaxEnvelopeBytes = 256 << 10
	DefaultMaxIDBytes       = 128
	DefaultMaxTypeBytes     = 128
)

// MaxPayloadDepth bounds how deep a payload's arrays and objects nest. An
// envelope, a frame of envelopes and every answer that carries a payload
// (an inbox page, a feed line, a delivery) nest it a few levels deeper, so
// a payload near encoding/json's own limit of 10,000 would make a frame or
// an answer that JSON decoders refuse whole; a deeper one is refused on
// its own (invalid_field, payload).
const MaxPayloadDepth = 1000

// Limits bounds what an envelope may hold. A zero field takes its default.
type Limits struct {
	// MaxEnvelopeBytes bounds the encoded envelope. Defaults to 256 KiB.
	MaxEnvelopeBytes int
	// MaxIDBytes bounds event_id, session_id and device_id. Defaults to 128.
	MaxIDBytes int
	// MaxTypeBytes bounds type. Defaults to 128.
	MaxTypeBytes int
}

func (l Limits) withDefaults() Limits {
	if l.MaxEnvelopeBytes <= 0 {
		l.MaxEnvelopeBytes = DefaultMaxEnvelopeBytes
	}
	if l.MaxIDBytes <= 0 {
		l.MaxIDBytes = DefaultMaxIDBytes
	}
	if l.MaxTypeBytes <= 0 {
		l.MaxTypeBytes = DefaultMaxTypeBytes
	}
	return l
}

// DecodeEnvelope decodes one encoded envelope and validates it. Unknown
// fields are refused so that a misspelt field fails loudly. The error is a
// *FieldError naming what is wrong.
func DecodeEnvelope(data []byte, lim Limits) (Envelope, error) {
	env, err := ParseEnvelope(data, lim)
	if err != nil {
		return env, err
	}
	return env, env.Validate(lim)
}

// ParseEnvelope decodes one encoded envelope without validating its
// values, for a producer that fills in missing fields before Validate.
// Types, unknown fields and the size limit are checked.
//
// Decoding follows encoding/json (see decode.go), but refuses what
// encoding/json would silently rewrite or drop: keys match
// case-insensitively, and a field given twice is refused; a string field
// that is not valid UTF-8 text (encoding/json's U+FFFD) is refused and left
// empty, and so is a payload that is not valid UTF-8. The payload may be
// any JSON value, which Validate then checks. The returned Payload is a
// sub-slice of data, not a copy. After a syntax error the envelope is zero;
// after a field error it holds the fields that decoded, but for an
// event_id given twice.
func ParseEnvelope(data []byte, lim Limits) (Envelope, error) {
	lim = lim.withDefaults()
	var env Envelope
	if len(data) > lim.MaxEnvelopeBytes {
		return env, &FieldError{Code: CodeTooLarge, Message: fmt.Sprintf("envelope is %d bytes, over the limit of %d", len(data), lim.MaxEnvelopeBytes)}
	}
	if err := decodeEnvelope(data, &env); err != nil {
		return env, err
	}
	return env, nil
}

// Validate checks an envelope's fields against lim and returns a *FieldError
// naming the first field that is wrong.
func (e *Envelope) Validate(lim Limits) error {
	lim = lim.withDefaults()
	if e.SchemaVersion != SchemaVersion {
		if e.SchemaVersion == 0 {
			return missing("schema_version")
		}
		return &FieldError{Field: "schema_version", Code: CodeUnsupportedVersion, Message: fmt.Sprintf("schema_version: %d is not supported (this receiver speaks %d)", e.SchemaVersion, SchemaVersion)}
	}
	for _, f := range []struct {
		name, value string
		max         int
	}{
		{"event_id", e.EventID, lim.MaxIDBytes},
		{"type", e.Type, lim.MaxTypeBytes},
		{"ts", e.TS, 64},
		{"session_id", e.SessionID, lim.MaxIDBytes},
		{"device_id", e.DeviceID, lim.MaxIDBytes},
	} {
		if err := checkString(f.name, f.value, f.max); err != nil {
			return err
		}
		if err := checkSpace(f.name, f.value); err != nil {
			return err
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, e.TS); err != nil {
		return &FieldError{Field: "ts", Code: CodeInvalidField, Message: fmt.Sprintf("ts: %q is not an RFC 3339 timestamp", e.TS)}
	}
	p := bytes.TrimLeft(e.Payload, " \t\r\n")
	switch {
	case len(p) == 0 || bytes.Equal(p, []byte("null")):
		return missing("payload")
	case p[0] != '{':
		return &FieldError{Field: "payload", Code: CodeInvalidField, Message: "payload: must be a JSON object"}
	}
	if e.Seq != nil && *e.Seq < 0 {
		return &FieldError{Field: "seq", Code: CodeInvalidField, Message: "seq: must not be negative"}
	}
	if e.DeliverAt != "" {
		if err := checkString("deliver_at", e.DeliverAt, 64); err != nil {
			return err
		}
		at, err := time.Parse(time.RFC3339Nano, e.DeliverAt)
		if err != nil {
			return &FieldError{Field: "deliver_at", Code: CodeInvalidField, Message: fmt.Sprintf("deliver_at: %q is not an RFC 3339 timestamp", e.DeliverAt)}
		}
		if time.Until(at) > MaxDeliverAhead {
			return &FieldError{Field: "deliver_at", Code: CodeInvalidField, Message: fmt.Sprintf("deliver_at: %s is more than %d days ahead", e.DeliverAt, MaxDeliverAhead/(24*time.Hour))}
		}
	}
	if e.TraceParent != "" {
		if err := CheckTraceParent(e.TraceParent); err != nil {
			return &FieldError{Field: "traceparent", Code: CodeInvalidField, Message: "traceparent: " + err.Error()}
		}
	} else if e.TraceState != "" {
		return &FieldError{Field: "tracestate", Code: CodeInvalidField, Message: "tracestate: given without a traceparent"}
	}
	if err := CheckTraceState(e.TraceState); err != nil {
		return &FieldError{Field: "tracestate", Code: CodeInvalidField, Message: "tracestate: " + err.Error()}
	}
	return nil
}

// MaxDeliverAhead bounds how far ahead of the receiver's now an event may
// be scheduled (Envelope.DeliverAt).
const MaxDeliverAhead = 365 * 24 * time.Hour

// MaxTraceStateBytes bounds a tracestate, as W3C Trace Context's 32
// list members of at most 256 characters would not; receivers may drop
// longer ones anyway (the specification asks them to keep 512).
const MaxTraceStateBytes = 512

// CheckTraceParent returns an error saying what is wrong with a W3C
// traceparent ("00-" 32 hex digits "-" 16 hex digits "-" 2 hex digits, in
// lower case, with a trace id and a parent id that are not all zeros), or
// nil. A version after 00 may carry more fields after a dash.
func CheckTraceParent(v string) error {
	if len(v) < 55 || (len(v) > 55 && (v[:2] == "00" || v[55] != '-')) {
		return fmt.Errorf("%q is not a W3C traceparent (version-traceid-parentid-flags, 55 characters)", v)
	}
	for i := 0; i < 55; i++ {
		c := v[i]
		if i == 2 || i == 35 || i == 52 {
			if c != '-' {
				return fmt.Errorf("%q is not a W3C traceparent (version-traceid-parentid-flags, 55 characters)", v)
			}
			continue
		}
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return fmt.Errorf("%q: %q is not a lower-case hex digit", v, c)
		}
	}
	switch {
	case v[:2] == "ff":
		return fmt.Errorf("%q: version ff is invalid", v)
	case v[3:35] == strings.Repeat("0", 32):
		return fmt.Errorf("%q: the trace id is all zeros", v)
	case v[36:52] == strings.Repeat("0", 16):
		return fmt.Errorf("%q: the parent id is all zeros", v)
	}
	return nil
}

// CheckTraceState returns an error when a tracestate is longer than
// MaxTraceStateBytes or holds characters it may not (it is printable
// ASCII), or nil.
func CheckTraceState(v string) error {
	if len(v) > MaxTraceStateBytes {
		return fmt.Errorf("%d bytes, over the limit of %d", len(v), MaxTraceStateBytes)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("holds the byte %#02x: it is printable ASCII", c)
		}
	}
	return nil
}

// Time returns the envelope's ts as a time. It is valid after Validate.
func (e *Envelope) Time() time.Time {
	t, _ := time.Parse(time.RFC3339Nano, e.TS)
	return t
}

func checkString(name, v string, max int) error {
	switch {
	case v == "":
		return missing(name)
	case len(v) > max:
		return &FieldError{Field: name, Code: CodeInvalidField, Message: fmt.Sprintf("%s: %d bytes, over the limit of %d", name, len(v), max)}
	case !utf8.ValidString(v):
		return &FieldError{Field: name, Code: CodeInvalidField, Message: name + ": not valid UTF-8"}
	}
	for i := 0; i < len(v); i++ {
		// C0, DEL, and C1 (U+0080 to U+009F: 0xC2 then 0x80 to 0x9F),
		// which display as nothing: "tr1" and "tr1\u0080" would be two
		// events that look like one.
		if c := v[i]; c < 0x20 || c == 0x7f || (c == 0xc2 && i+1 < len(v) && v[i+1] < 0xa0) {
			return &FieldError{Field: name, Code: CodeInvalidField, Message: name + ": contains a control character"}
		}
	}
	return nil
}

// checkSpace refuses a blank value, or one that begins or ends with
// (Unicode) white space: " evt_1" and "evt_1" would be two events that
// look like one.
func checkSpace(name, v string) error {
	if a, z := v[0], v[len(v)-1]; a != ' ' && a < utf8.RuneSelf && z != ' ' && z < utf8.RuneSelf {
		return nil // checkString refused control characters
	}
	first, _ := utf8.DecodeRuneInString(v)
	last, _ := utf8.DecodeLastRuneInString(v)
	if !isSpace(first) && !isSpace(last) {
		return nil
	}
	if strings.TrimFunc(v, unicode.IsSpace) == "" {
		return &FieldError{Field: name, Code: CodeInvalidField, Message: name + ": blank (only white space)"}
	}
	return &FieldError{Field: name, Code: CodeInvalidField, Message: name + ": begins or ends with white space"}
}

// isSpace is unicode.IsSpace, quick for ASCII.
func isSpace(r rune) bool {
	if r < utf8.RuneSelf {
		return r == ' ' || r == '\t' || r == '\n' || r == '\v' || r == '\f' || r == '\r'
	}
	return unicode.IsSpace(r)
}

func missing(name string) *FieldError {
	return &FieldError{Field: name, Code: CodeMissingField, Message: name + ": required"}
}

// SplitFrame splits one transport frame into its envelopes: a frame holds a
// single envelope object or a JSON array of them. A frame that is neither,
// or an array that is not valid JSON, returns a *FieldError with
// CodeInvalidJSON. The envelopes are sub-slices of frame, not copies.
func SplitFrame(frame []byte) ([]json.RawMessage, error) {
	return splitFrame(frame)
}

// PeekEventID returns the event_id of an encoded envelope if it has one
// that ParseEnvelope reads (a string, valid UTF-8 text, given once), even
// when the rest of the envelope is invalid or too large, so that a NACK can
// name the event it refuses.
func PeekEventID(data []byte) string {
	var env Envelope
	decodeEnvelope(data, &env)
	return env.EventID
}
