package postbox

import (
	"errors"
	"strconv"
	"time"
)

// Reply statuses.
const (
	StatusStored = "stored" // an ACK: the event is durably stored
	StatusNack   = "nack"   // a NACK: the event was refused; Code says why
)

// Reply is a receiver's answer to one envelope: an ACK (Status "stored") or
// a NACK (Status "nack"). A receiver sends exactly one reply per envelope,
// and an ACK only after the transaction holding the event has committed.
//
// A NACK whose envelope could not be parsed far enough to read its event_id
// has an empty EventID.
type Reply struct {
	EventID string `json:"event_id"`
	Status  string `json:"status"`
	// AckTS is when the receiver stored (or found) the event; ACKs only.
	AckTS string `json:"ack_ts,omitempty"`
	// Duplicate marks an ACK of an event that was already stored.
	Duplicate bool `json:"duplicate,omitempty"`

	Code      Code   `json:"code,omitempty"`
	Field     string `json:"field,omitempty"`
	Message   string `json:"message,omitempty"`
	Retryable bool   `json:"retryable,omitempty"`
}

// Ack returns the ACK of eventID stored at t.
func Ack(eventID string, t time.Time, duplicate bool) Reply {
	return Reply{EventID: eventID, Status: StatusStored, AckTS: t.UTC().Format(time.RFC3339Nano), Duplicate: duplicate}
}

// Nack returns the NACK of eventID for err. A *FieldError keeps its code and
// field; any other error is CodeUnavailable, which is retryable.
func Nack(eventID string, err error) Reply {
	r := Reply{EventID: eventID, Status: StatusNack, Code: CodeUnavailable, Message: err.Error()}
	var fe *FieldError
	if errors.As(err, &fe) {
		r.Code, r.Field = fe.Code, fe.Field
	}
	r.Retryable = r.Code.Retryable()
	return r
}

// MarshalJSON writes r as AppendJSON does.
func (r Reply) MarshalJSON() ([]byte, error) { return r.AppendJSON(nil), nil }

// AppendJSON appends r as the protocol's JSON reply: the fields its tags
// name, those empty left out, except that a NACK always carries
// "retryable" (false too), so a reader needs no default to tell.
func (r Reply) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"event_id":`...)
	dst = appendString(dst, r.EventID)
	dst = append(dst, `,"status":`...)
	dst = appendString(dst, r.Status)
	dst = appendOptional(dst, `,"ack_ts":`, r.AckTS)
	if r.Duplicate {
		dst = append(dst, `,"duplicate":true`...)
	}
	dst = appendOptional(dst, `,"code":`, string(r.Code))
	dst = appendOptional(dst, `,"field":`, r.Field)
	dst = appendOptional(dst, `,"message":`, r.Message)
	if r.Retryable || r.Status == StatusNack {
		dst = append(dst, `,"retryable":`...)
		dst = strconv.AppendBool(dst, r.Retryable)
	}
	return append(dst, '}')
}

// appendOptional appends key and v, unless v is empty.
func appendOptional(dst []byte, key, v string) []byte {
	if v == "" {
		return dst
	}
	return appendString(append(dst, key...), v)
}

// OK reports whether r is an ACK.
func (r Reply) OK() bool { return r.Status == StatusStored }

// Err returns nil for an ACK and a *FieldError describing a NACK.
func (r Reply) Err() error {
	if r.OK() {
		return nil
	}
	return &FieldError{Field: r.Field, Code: r.Code, Message: r.Message}
}
