package streamnats

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"

	"github.com/postbox-events/postbox/stream"
)

// HeaderEvent is the one header of every event message that carries the
// event's fields; the message's data is the payload, byte for byte. Its
// value is a list of key=value fields separated by ';', stored_at first:
//
//	at=2026-11-24T08:10:49.123456789Z;id=ord-1;type=order.created;occurred=2026-11-24T08:10:48.000000000Z;meta={"device_id":"dev-17"}
//
// The fields: at (stored at), id (native id), type, variant, occurred
// (occurred at), seq (the event's sequence, decimal), meta (metadata JSON)
// and handle (delivery handle JSON). Times are RFC 3339 in UTC with nine
// fractional digits, a fixed width that reads without time.Parse. A field
// whose value is empty is left out. Values are escaped (see appendEscaped):
// bytes below 0x20, DEL, '%', ';' and spaces at either end of a value
// become %XX, so any string survives NATS's header framing.
const HeaderEvent = "Postbox-Event"

// Header that makes JetStream refuse a second message on a subject.
const expectedLastSubjectSeq = "Nats-Expected-Last-Subject-Sequence"

// timeLayout is the layout of the times of HeaderEvent: fixed width, UTC.
const timeLayout = "2006-01-02T15:04:05.000000000Z"

// appendTime appends t in timeLayout, digit by digit (time.AppendFormat
// costs more than the rest of a message's header), falling back to
// AppendFormat for a year outside 0–9999.
func appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	y, mo, d := t.Date()
	if y < 0 || y > 9999 {
		return t.AppendFormat(b, timeLayout)
	}
	h, mi, sec := t.Clock()
	digits := func(b []byte, n, width int) []byte {
		var buf [9]byte
		for i := width - 1; i >= 0; i-- {
			buf[i] = byte('0' + n%10)
			n /= 10
		}
		return append(b, buf[:width]...)
	}
	b = digits(b, y, 4)
	b = append(b, '-')
	b = digits(b, int(mo), 2)
	b = append(b, '-')
	b = digits(b, d, 2)
	b = append(b, 'T')
	b = digits(b, h, 2)
	b = append(b, ':')
	b = digits(b, mi, 2)
	b = append(b, ':')
	b = digits(b, sec, 2)
	b = append(b, '.')
	b = digits(b, t.Nanosecond(), 9)
	return append(b, 'Z')
}

// parseTime reads a time in timeLayout, digit by digit, and falls back to
// time.Parse (RFC 3339) for anything else.
func parseTime(s string) (time.Time, error) {
	if len(s) == len(timeLayout) && s[4] == '-' && s[7] == '-' && s[10] == 'T' && s[13] == ':' && s[16] == ':' && s[19] == '.' && s[29] == 'Z' {
		num := func(from, to int) int {
			n := 0
			for i := from; i < to; i++ {
				c := s[i] - '0'
				if c > 9 {
					return -1
				}
				n = n*10 + int(c)
			}
			return n
		}
		y, mo, d, h, mi, sec, ns := num(0, 4), num(5, 7), num(8, 10), num(11, 13), num(14, 16), num(17, 19), num(20, 29)
		if y >= 0 && 1 <= mo && mo <= 12 && 1 <= d && d <= 31 && 0 <= h && h < 24 && 0 <= mi && mi < 60 && 0 <= sec && sec < 60 && ns >= 0 {
			t := time.Date(y, time.Month(mo), d, h, mi, sec, ns, time.UTC)
			if t.Day() == d { // not a 31st of a shorter month
				return t, nil
			}
		}
	}
	return time.Parse(time.RFC3339Nano, s)
}

// identityToken returns the subject token of an event identity: 32 hex
// digits of sha256(len(variant) | variant | nativeID). The length prefix
// keeps (variant, nativeID) pairs apart whatever bytes they hold.
func identityToken(nativeID, variant string) string { return identitySubject("", nativeID, variant) }

// identitySubject returns prefix followed by the identity token of
// (nativeID, variant), built in one allocation.
func identitySubject(prefix, nativeID, variant string) string {
	var stack [256]byte
	in := stack[:0]
	if need := binary.MaxVarintLen64 + len(variant) + len(nativeID); need > len(stack) {
		in = make([]byte, 0, need)
	}
	in = binary.AppendUvarint(in, uint64(len(variant)))
	in = append(in, variant...)
	in = append(in, nativeID...)
	sum := sha256.Sum256(in)
	out := make([]byte, len(prefix)+32)
	copy(out, prefix)
	hex.Encode(out[len(prefix):], sum[:16])
	return unsafe.String(unsafe.SliceData(out), len(out))
}

// header returns the HeaderEvent value of ev, stored at storedAt (in
// timeLayout).
func header(ev *stream.Event, storedAt string) string {
	b := make([]byte, 0, 64+len(ev.NativeID)+len(ev.Variant)+len(ev.Type)+len(ev.Metadata)+len(ev.DeliveryHandle))
	b = append(b, "at="...)
	b = append(b, storedAt...)
	b = appendField(b, "id", ev.NativeID)
	b = appendField(b, "type", ev.Type)
	b = appendField(b, "variant", ev.Variant)
	if !ev.OccurredAt.IsZero() {
		b = append(b, ";occurred="...)
		b = appendTime(b, ev.OccurredAt)
	}
	if ev.Sequence != nil {
		b = append(b, ";seq="...)
		b = strconv.AppendInt(b, *ev.Sequence, 10)
	}
	b = appendField(b, "meta", unsafe.String(unsafe.SliceData(ev.Metadata), len(ev.Metadata)))               // read, not kept
	b = appendField(b, "handle", unsafe.String(unsafe.SliceData(ev.DeliveryHandle), len(ev.DeliveryHandle))) // read, not kept
	return string(b)
}

func appendField(b []byte, key, v string) []byte {
	if v == "" {
		return b
	}
	b = append(b, ';')
	b = append(b, key...)
	b = append(b, '=')
	return appendEscaped(b, v)
}

// message builds the message of ev on subject, stored at storedAt (in
// timeLayout).
func message(subject string, ev *stream.Event, storedAt string) *nats.Msg {
	return &nats.Msg{Subject: subject, Data: ev.Payload, Header: nats.Header{
		expectedLastSubjectSeq: []string{"0"},
		HeaderEvent:            []string{header(ev, storedAt)},
	}}
}

// decode fills e from a stored message's headers and data. types interns
// event types (nil: no interning).
func decode(e *stream.StoredEvent, h nats.Header, data []byte, types map[string]string) error {
	v := first(h, HeaderEvent)
	if v == "" {
		return fmt.Errorf("no %s header", HeaderEvent)
	}
	var meta, handle string
	for v != "" {
		field := v
		if i := strings.IndexByte(v, ';'); i >= 0 {
			field, v = v[:i], v[i+1:]
		} else {
			v = ""
		}
		eq := strings.IndexByte(field, '=')
		if eq < 0 {
			return fmt.Errorf("%s: field %q has no '='", HeaderEvent, field)
		}
		key, val := field[:eq], field[eq+1:]
		var err error
		switch key {
		case "at":
			e.StoredAt, err = parseTime(val)
		case "id":
			e.NativeID, err = unescape(val)
		case "type":
			if t, ok := types[val]; ok {
				e.Type = t
			} else if e.Type, err = unescape(val); err == nil && types != nil {
				types[e.Type] = e.Type
			}
		case "variant":
			e.Variant, err = unescape(val)
		case "occurred":
			e.OccurredAt, err = parseTime(val)
		case "seq":
			var n int64
			if n, err = strconv.ParseInt(val, 10, 64); err == nil {
				e.Sequence = &n
			}
		case "meta":
			meta, err = unescape(val)
		case "handle":
			handle, err = unescape(val)
		}
		// An unknown key is skipped: a later postbox may add fields.
		if err != nil {
			return fmt.Errorf("%s %s: %w", HeaderEvent, key, err)
		}
	}
	if meta == "" {
		meta = "{}" // as streamsqlite gives back an event appended without metadata
	}
	buf := make([]byte, 0, len(meta)+len(handle)) // one allocation for both
	buf = append(buf, meta...)
	buf = append(buf, handle...)
	e.Metadata = json.RawMessage(buf[:len(meta):len(meta)])
	if handle != "" {
		e.DeliveryHandle = json.RawMessage(buf[len(meta):])
	}
	e.Payload = data
	return nil
}

// storedAt returns a stored message's stored-at time (the first field of
// HeaderEvent), or fallback (JetStream's own time) when it has none.
func storedAt(h nats.Header, fallback time.Time) time.Time {
	v := strings.TrimPrefix(first(h, HeaderEvent), "at=")
	if i := strings.IndexByte(v, ';'); i >= 0 {
		v = v[:i]
	}
	if t, err := parseTime(v); err == nil {
		return t
	}
	return fallback.UTC()
}

func first(h nats.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// appendEscaped appends s to b as a value of HeaderEvent: bytes below
// 0x20, DEL, '%' and ';' anywhere, and spaces at either end, become %XX.
// Everything else, UTF-8 included, stays as it is, so ordinary values read
// as they are.
func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if mustEscape(s, i) {
			b = append(b, '%', hexDigits[s[i]>>4], hexDigits[s[i]&15])
		} else {
			b = append(b, s[i])
		}
	}
	return b
}

const hexDigits = "0123456789ABCDEF"

func mustEscape(s string, i int) bool {
	c := s[i]
	switch {
	case c < 0x20 || c == 0x7f || c == '%' || c == ';':
		return true
	case c == ' ':
		return i == 0 || i == len(s)-1
	}
	return false
}

// unescape reverses appendEscaped.
func unescape(s string) (string, error) {
	if strings.IndexByte(s, '%') < 0 {
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("bad escape in %q", s)
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("bad escape in %q", s)
		}
		b = append(b, byte(v))
		i += 2
	}
	return string(b), nil
}

// maxNameLen bounds the encoded part of a stream name; a longer one is cut
// and ends in '=' and a hash (encodeName never writes '=').
const maxNameLen = 96

// encodeName encodes an arbitrary string as a JetStream name, subject
// token and KV key: ASCII letters, digits and '-' stay, every other byte
// becomes _XX. It is one-to-one, and readable for ordinary ids.
func encodeName(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('_')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	out := b.String()
	if len(out) > maxNameLen {
		sum := sha256.Sum256([]byte(s))
		out = out[:maxNameLen-33] + "=" + hex.EncodeToString(sum[:16])
	}
	return out
}
