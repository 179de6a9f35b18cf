package postbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Envelope is the wire form of one event (seed 000 §4).
//
// Payload holds the event's JSON object exactly as the producer wrote it.
// Seq is optional: a producer that numbers its events may send that number,
// and the receiver stores it as the source sequence, but never uses it for
// identity.
type Envelope struct {
	SchemaVersion int             `json:"schema_version"`
	EventID       string          `json:"event_id"`
	Type          string          `json:"type"`
	TS            string          `json:"ts"`
	SessionID     string          `json:"session_id"`
	DeviceID      string          `json:"device_id"`
	Seq           *int64          `json:"seq,omitempty"`
	Payload       json.RawMessage `json:"payload"`
}

// Default limits of Limits.
const (
	DefaultMaxEnvelopeBytes = 256 << 10
	DefaultMaxIDBytes       = 128
	DefaultMaxTypeBytes     = 128
)

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
func ParseEnvelope(data []byte, lim Limits) (Envelope, error) {
	lim = lim.withDefaults()
	var env Envelope
	if len(data) > lim.MaxEnvelopeBytes {
		return env, &FieldError{Code: CodeTooLarge, Message: fmt.Sprintf("envelope is %d bytes, over the limit of %d", len(data), lim.MaxEnvelopeBytes)}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return env, decodeError(data, err)
	}
	if dec.More() {
		return env, &FieldError{Code: CodeInvalidJSON, Message: "envelope: unexpected data after the JSON object"}
	}
	return env, nil
}

// decodeError turns an encoding/json error into a FieldError naming the
// field where it can.
func decodeError(data []byte, err error) *FieldError {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			return &FieldError{Code: CodeInvalidJSON, Message: "envelope must be a JSON object, not " + te.Value}
		}
		return &FieldError{Field: field, Code: CodeInvalidField, Message: fmt.Sprintf("%s: must be %s, not %s", field, jsonKind(te.Type.Kind().String()), te.Value)}
	case errors.As(err, &se):
		return &FieldError{Code: CodeInvalidJSON, Message: fmt.Sprintf("envelope is not valid JSON at byte %d: %v", se.Offset, se)}
	}
	msg := err.Error()
	if f, ok := unknownField(msg); ok {
		return &FieldError{Field: f, Code: CodeUnknownField, Message: fmt.Sprintf("%s: unknown field", f)}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return &FieldError{Code: CodeInvalidJSON, Message: "envelope is empty"}
	}
	return &FieldError{Code: CodeInvalidJSON, Message: "envelope is not valid JSON: " + msg}
}

func unknownField(msg string) (string, bool) {
	const prefix = `json: unknown field "`
	if len(msg) > len(prefix) && msg[:len(prefix)] == prefix && msg[len(msg)-1] == '"' {
		return msg[len(prefix) : len(msg)-1], true
	}
	return "", false
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "int", "int64":
		return "an integer"
	case "ptr":
		return "an integer"
	case "slice":
		return "a JSON object"
	}
	return goKind
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
		if v[i] < 0x20 || v[i] == 0x7f {
			return &FieldError{Field: name, Code: CodeInvalidField, Message: name + ": contains a control character"}
		}
	}
	return nil
}

func missing(name string) *FieldError {
	return &FieldError{Field: name, Code: CodeMissingField, Message: name + ": required"}
}

// SplitFrame splits one transport frame into its envelopes: a frame holds a
// single envelope object or a JSON array of them. A frame that is neither
// returns a *FieldError with CodeInvalidJSON.
func SplitFrame(frame []byte) ([]json.RawMessage, error) {
	b := bytes.TrimLeft(frame, " \t\r\n")
	if len(b) > 0 && b[0] == '[' {
		var envs []json.RawMessage
		if err := json.Unmarshal(b, &envs); err != nil {
			return nil, &FieldError{Code: CodeInvalidJSON, Message: "frame is not a valid JSON array of envelopes: " + err.Error()}
		}
		return envs, nil
	}
	if len(b) == 0 || b[0] != '{' {
		return nil, &FieldError{Code: CodeInvalidJSON, Message: "frame must be an envelope object or an array of envelopes"}
	}
	return []json.RawMessage{frame}, nil
}

// PeekEventID returns the event_id of an encoded envelope if it has a string
// one, even when the rest of the envelope is invalid, so that a NACK can name
// the event it refuses.
func PeekEventID(data []byte) string {
	var v struct {
		EventID json.RawMessage `json:"event_id"`
	}
	if json.Unmarshal(data, &v) != nil || len(v.EventID) == 0 {
		return ""
	}
	var id string
	if json.Unmarshal(v.EventID, &id) != nil {
		return ""
	}
	return id
}
