package postbox

import "strings"

// MaxKeyBytes bounds the native id an event is stored under when it is
// not an envelope's event_id (which Limits.MaxIDBytes bounds): a
// webhook's idempotency key or CloudEvents id, a poll item's id, a feed
// event's native id and variant.
const MaxKeyBytes = 255

// CheckEvent checks what every intake path stores of an event, whatever
// its wire, against one set of limits: its native id and variant (when
// not empty) are text (UTF-8 without control characters) of at most
// MaxKeyBytes or MaxIDBytes, whichever is larger; its type is text of
// at most MaxTypeBytes; its payload and metadata nest at most
// MaxPayloadDepth deep. It returns a *FieldError naming the first that is
// wrong ("id", "variant", "type", "payload" or "metadata"), or nil.
//
// An envelope's Validate (and its decoder, for the depth) and a
// webhook's intake check the same with the same limits, each naming the
// field as its sender wrote it; pollers and feed followers, which have
// no field of their own, call CheckEvent.
func (l Limits) CheckEvent(id, variant, typ string, payload, metadata []byte) *FieldError {
	l = l.withDefaults()
	idMax := max(l.MaxIDBytes, MaxKeyBytes)
	if err := checkString("id", id, idMax); err != nil {
		return err.(*FieldError)
	}
	if variant != "" {
		if err := checkString("variant", variant, idMax); err != nil {
			return err.(*FieldError)
		}
	}
	if err := checkString("type", typ, l.MaxTypeBytes); err != nil {
		return err.(*FieldError)
	}
	if fe := CheckPayloadDepth(payload); fe != nil {
		return fe
	}
	if fe := CheckPayloadDepth(metadata); fe != nil {
		return &FieldError{Field: "metadata", Code: fe.Code, Message: "metadata" + strings.TrimPrefix(fe.Message, "payload")}
	}
	return nil
}
