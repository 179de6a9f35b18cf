package postbox

// Code says why an event was refused. Every NACK carries one.
type Code string

// The codes a NACK carries. Only CodeUnavailable and CodeOutage are
// retryable: the others describe the event itself, and sending it again
// unchanged cannot succeed.
const (
	// CodeInvalidJSON: the envelope is not a JSON object.
	CodeInvalidJSON Code = "invalid_json"
	// CodeMissingField: a required field is absent or empty.
	CodeMissingField Code = "missing_field"
	// CodeInvalidField: a field has the wrong type or an invalid value.
	CodeInvalidField Code = "invalid_field"
	// CodeUnknownField: the envelope holds a field this schema does not have.
	CodeUnknownField Code = "unknown_field"
	// CodeUnsupportedVersion: schema_version is not one the receiver speaks.
	CodeUnsupportedVersion Code = "unsupported_version"
	// CodeTooLarge: the envelope is over the receiver's size limit.
	CodeTooLarge Code = "too_large"
	// CodeConflict: an event with this device_id and event_id is stored
	// with another type or payload; Field names which. Nothing was changed.
	CodeConflict Code = "conflict"
	// CodeForbidden: the sender may not send events for this device_id.
	CodeForbidden Code = "forbidden"
	// CodeUnavailable: the receiver could not store the event now. Send it
	// again later; a sender counts it as a failed attempt of the event.
	// (Publishers of other targets NACK an event they refuse with it.)
	CodeUnavailable Code = "unavailable"
	// CodeOutage: the receiver cannot store anything now (its commit
	// failed: a full disk, an I/O error; or it is shutting down); nothing
	// is wrong with the event. Send it again once the receiver recovers; a
	// sender treats it as an outage of the receiver, not as a failed
	// attempt of the event (outbox.IsOutage).
	CodeOutage Code = "outage"
)

// Retryable reports whether an event refused with c may succeed when sent
// again unchanged.
func (c Code) Retryable() bool { return c == CodeUnavailable || c == CodeOutage }

// FieldError is a refusal of one envelope: what is wrong and, where one
// field is to blame, which.
type FieldError struct {
	Field   string // the JSON name of the field at fault, or "" for the whole envelope
	Code    Code
	Message string // names the field: "ts: \"yesterday\" is not an RFC 3339 timestamp"
}

func (e *FieldError) Error() string { return e.Message }
