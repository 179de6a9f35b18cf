// Package schedule is the delivery time an event may carry: when the
// items subscriptions make of it become due. It travels in the event's
// metadata under Key, as RFC 3339 text in UTC, so that every stream
// backend stores and hands it back unchanged; delivery reads it when it
// writes the event's items (their next_attempt_at), and the intakes
// (a webhook's headers, an envelope's deliver_at) write it.
package schedule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/postbox-events/postbox"
)

// Key is the key of an event's metadata that holds its delivery time.
const Key = "deliver_at"

// Max bounds how far ahead of now an event may be scheduled: an
// envelope's deliver_at as a webhook's headers.
const Max = postbox.MaxDeliverAhead

// Layout is how a delivery time is written into metadata: RFC 3339 in
// UTC, to the microsecond (the precision of the delivery store).
const Layout = "2006-01-02T15:04:05.999999Z07:00"

// Parse reads a delivery time given either as an absolute time,
// deliverAt (RFC 3339), or as a delay from now, delay (a Go duration
// such as "90s" or "2h"), at most one of them; the zero time when
// neither is given. A time in the past is due now: it is returned as
// given, and items of it are due at once. Unparseable values, a negative
// delay, both at once, and a time or delay beyond Max are refused with a
// *FieldError naming the field: deliverAtField or delayField.
func Parse(deliverAt, delay string, now time.Time, deliverAtField, delayField string) (time.Time, error) {
	switch {
	case deliverAt != "" && delay != "":
		return time.Time{}, &FieldError{Field: deliverAtField, Message: fmt.Sprintf("give %s or %s, not both", deliverAtField, delayField)}
	case deliverAt != "":
		t, err := time.Parse(time.RFC3339Nano, deliverAt)
		if err != nil {
			return time.Time{}, &FieldError{Field: deliverAtField, Message: fmt.Sprintf("%q is not an RFC 3339 time (2026-01-02T15:04:05Z)", deliverAt)}
		}
		if t.Sub(now) > Max {
			return time.Time{}, &FieldError{Field: deliverAtField, Message: fmt.Sprintf("%s is more than %s ahead; at most %s", deliverAt, days(Max), days(Max))}
		}
		return t.UTC().Truncate(time.Microsecond), nil
	case delay != "":
		d, err := time.ParseDuration(delay)
		switch {
		case err != nil:
			return time.Time{}, &FieldError{Field: delayField, Message: fmt.Sprintf("%q is not a duration (90s, 15m, 2h)", delay)}
		case d < 0:
			return time.Time{}, &FieldError{Field: delayField, Message: fmt.Sprintf("%s is negative", delay)}
		case d > Max:
			return time.Time{}, &FieldError{Field: delayField, Message: fmt.Sprintf("%s is more than %s; at most %s", delay, days(Max), days(Max))}
		}
		return now.Add(d).UTC().Truncate(time.Microsecond), nil
	}
	return time.Time{}, nil
}

func days(d time.Duration) string { return fmt.Sprintf("%d days", int(d/(24*time.Hour))) }

// FieldError is a delivery time refused, and the field that gave it.
type FieldError struct {
	Field   string
	Message string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

// Of returns the delivery time of an event whose metadata is meta, and
// whether it has one: a Key holding an RFC 3339 time. Metadata without
// the key is read no further than a byte search, so that the events of
// the write path that carry none cost nearly nothing; a value that is no
// time is no delivery time (the event is due at once).
func Of(meta json.RawMessage) (time.Time, bool) {
	if !bytes.Contains(meta, []byte(`"`+Key+`"`)) {
		return time.Time{}, false
	}
	var m struct {
		At string `json:"deliver_at"`
	}
	if json.Unmarshal(meta, &m) != nil || m.At == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, m.At)
	if err != nil {
		return time.Time{}, false
	}
	return t.UTC(), true
}

// Format is t as written under Key.
func Format(t time.Time) string { return t.UTC().Format(Layout) }
