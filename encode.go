package postbox

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// AppendJSON appends e as JSON: its fields as json.Marshal writes them,
// and its payload compacted but otherwise the bytes it holds. json.Marshal
// would escape every '<', '>' and '&' of a payload as six bytes, so that
// an envelope measured under the receiver's limit could arrive over it,
// and the receiver would store other bytes than the sender's.
//
// It fails on a payload that is empty or not one valid JSON value, and on
// text that is not valid UTF-8, in a field or the payload: json.Marshal
// would replace it with U+FFFD, and the receiver would store, under
// another event id, what the sender never wrote (receivers refuse such
// text).
func (e *Envelope) AppendJSON(dst []byte) ([]byte, error) {
	for _, f := range [...]struct{ name, v string }{
		{"event_id", e.EventID}, {"type", e.Type}, {"ts", e.TS}, {"session_id", e.SessionID},
		{"device_id", e.DeviceID}, {"traceparent", e.TraceParent}, {"tracestate", e.TraceState}, {"deliver_at", e.DeliverAt},
	} {
		if !utf8.ValidString(f.v) {
			return dst, &FieldError{Field: f.name, Code: CodeInvalidField, Message: f.name + ": not valid UTF-8"}
		}
	}
	switch {
	case len(e.Payload) == 0:
		return dst, missing("payload")
	case !Valid(e.Payload) || !utf8.Valid(e.Payload):
		return dst, &FieldError{Field: "payload", Code: CodeInvalidJSON, Message: "payload: not one valid JSON value in UTF-8"}
	}
	dst = append(dst, `{"schema_version":`...)
	dst = strconv.AppendInt(dst, int64(e.SchemaVersion), 10)
	dst = append(dst, `,"event_id":`...)
	dst = appendString(dst, e.EventID)
	dst = append(dst, `,"type":`...)
	dst = appendString(dst, e.Type)
	dst = append(dst, `,"ts":`...)
	dst = appendString(dst, e.TS)
	dst = append(dst, `,"session_id":`...)
	dst = appendString(dst, e.SessionID)
	dst = append(dst, `,"device_id":`...)
	dst = appendString(dst, e.DeviceID)
	if e.TraceParent != "" {
		dst = append(dst, `,"traceparent":`...)
		dst = appendString(dst, e.TraceParent)
	}
	if e.TraceState != "" {
		dst = append(dst, `,"tracestate":`...)
		dst = appendString(dst, e.TraceState)
	}
	if e.DeliverAt != "" {
		dst = append(dst, `,"deliver_at":`...)
		dst = appendString(dst, e.DeliverAt)
	}
	if e.Seq != nil {
		dst = append(dst, `,"seq":`...)
		dst = strconv.AppendInt(dst, *e.Seq, 10)
	}
	dst = append(dst, `,"payload":`...)
	dst = AppendCompact(dst, e.Payload)
	return append(dst, '}'), nil
}

// appendString appends s as encoding/json writes a string: the same
// bytes, escapes included (HTML characters, invalid UTF-8, U+2028 and
// U+2029). Plain ASCII is copied as it is; anything else goes through
// encoding/json. internal/jsonenc.AppendString is the same for the rest
// of postbox: this package imports the standard library only.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// payloadDepth returns how deep the arrays and objects of the JSON value
// payload nest: 0 for a scalar, 1 for {"a":1}; -1 when it is not one
// valid JSON value. A payload deeper than MaxPayloadDepth is refused. A
// payload of n bytes nests at most n/2 deep.
func payloadDepth(payload []byte) int {
	s := scanner{data: payload}
	i := s.value(skipSpace(payload, 0), 0)
	if i < 0 || skipSpace(payload, i) != len(payload) {
		return -1
	}
	return s.deepest
}

// CheckPayloadDepth returns the refusal of a payload nested deeper than
// MaxPayloadDepth (invalid_field, payload), as a receiver refuses it, or
// nil. It scans only a payload long enough to nest that deep.
func CheckPayloadDepth(payload []byte) *FieldError {
	if len(payload) <= 2*MaxPayloadDepth {
		return nil
	}
	if d := payloadDepth(payload); d > MaxPayloadDepth {
		return payloadTooDeep(d)
	}
	return nil
}

// Valid reports whether data is one valid JSON value, as json.Valid does,
// with the scanner of the envelope decoder (several times faster).
func Valid(data []byte) bool {
	s := scanner{data: data}
	i := s.value(skipSpace(data, 0), 0)
	return i >= 0 && skipSpace(data, i) == len(data)
}
