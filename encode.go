package postbox

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/postbox-events/postbox/internal/jsonenc"
)

// AppendJSON appends e as json.Marshal encodes it, byte for byte, and
// fails where json.Marshal fails (a payload that is not valid JSON). It
// appends the fields by hand and copies a payload that is valid, compact
// and has nothing to escape, else it calls json.Marshal: json.Marshal's
// reflection and its second scan of every payload were 7% of the CPU of
// an agent relaying to a server in one process.
func (e *Envelope) AppendJSON(dst []byte) ([]byte, error) {
	if !plainPayload(e.Payload) {
		b, err := json.Marshal(e)
		return append(dst, b...), err
	}
	dst = append(dst, `{"schema_version":`...)
	dst = strconv.AppendInt(dst, int64(e.SchemaVersion), 10)
	dst = append(dst, `,"event_id":`...)
	dst = jsonenc.AppendString(dst, e.EventID)
	dst = append(dst, `,"type":`...)
	dst = jsonenc.AppendString(dst, e.Type)
	dst = append(dst, `,"ts":`...)
	dst = jsonenc.AppendString(dst, e.TS)
	dst = append(dst, `,"session_id":`...)
	dst = jsonenc.AppendString(dst, e.SessionID)
	dst = append(dst, `,"device_id":`...)
	dst = jsonenc.AppendString(dst, e.DeviceID)
	if e.TraceParent != "" {
		dst = append(dst, `,"traceparent":`...)
		dst = jsonenc.AppendString(dst, e.TraceParent)
	}
	if e.TraceState != "" {
		dst = append(dst, `,"tracestate":`...)
		dst = jsonenc.AppendString(dst, e.TraceState)
	}
	if e.Seq != nil {
		dst = append(dst, `,"seq":`...)
		dst = strconv.AppendInt(dst, *e.Seq, 10)
	}
	dst = append(dst, `,"payload":`...)
	dst = AppendCompact(dst, e.Payload)
	return append(dst, '}'), nil
}

// plainPayload reports whether json.Marshal writes p, a json.RawMessage,
// as AppendCompact does: p is one valid JSON value without the bytes
// encoding/json escapes in a RawMessage ('<', '>', '&', and the first
// byte of U+2028 and U+2029).
func plainPayload(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	for _, c := range []byte{'<', '>', '&', 0xe2} {
		if bytes.IndexByte(p, c) >= 0 {
			return false
		}
	}
	return Valid(p)
}

// PayloadDepth returns how deep the arrays and objects of the JSON value
// payload nest: 0 for a scalar, 1 for {"a":1}; -1 when it is not one
// valid JSON value. A payload deeper than MaxPayloadDepth is refused. A
// payload of n bytes nests at most n/2 deep.
func PayloadDepth(payload []byte) int {
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
	if d := PayloadDepth(payload); d > MaxPayloadDepth {
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
