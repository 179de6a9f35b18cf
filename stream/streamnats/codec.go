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

	"github.com/nats-io/nats.go"

	"github.com/postbox-events/postbox/stream"
)

// Headers of every event message; the message's data is the payload,
// byte for byte. Values are escaped (see escape): bytes below 0x20, DEL,
// '%' and spaces at either end become %XX, so any string survives NATS's
// header framing. A header whose value is empty is left out.
const (
	HeaderNativeID       = "Postbox-Native-Id"
	HeaderVariant        = "Postbox-Variant"
	HeaderType           = "Postbox-Type"
	HeaderOccurredAt     = "Postbox-Occurred-At" // RFC 3339, nanoseconds
	HeaderSequence       = "Postbox-Sequence"    // decimal
	HeaderMetadata       = "Postbox-Metadata"    // JSON
	HeaderDeliveryHandle = "Postbox-Delivery-Handle"
	HeaderStoredAt       = "Postbox-Stored-At" // RFC 3339, nanoseconds, UTC
)

// Header that makes JetStream refuse a second message on a subject.
const expectedLastSubjectSeq = "Nats-Expected-Last-Subject-Sequence"

// identityToken returns the subject token of an event identity: 32 hex
// digits of sha256(len(variant) | variant | nativeID). The length prefix
// keeps (variant, nativeID) pairs apart whatever bytes they hold.
func identityToken(nativeID, variant string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(variant)))])
	h.Write([]byte(variant))
	h.Write([]byte(nativeID))
	var sum [32]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// message builds the message of ev on subject, stored at storedAt.
func message(subject string, ev *stream.Event, storedAt string) *nats.Msg {
	h := make(nats.Header, 8) // at most 8 keys in the usual case: a small map, one allocation
	h[expectedLastSubjectSeq] = []string{"0"}
	h[HeaderNativeID] = []string{escape(ev.NativeID)}
	if ev.Variant != "" {
		h[HeaderVariant] = []string{escape(ev.Variant)}
	}
	h[HeaderType] = []string{escape(ev.Type)}
	if !ev.OccurredAt.IsZero() {
		h[HeaderOccurredAt] = []string{ev.OccurredAt.Format(time.RFC3339Nano)}
	}
	if ev.Sequence != nil {
		h[HeaderSequence] = []string{strconv.FormatInt(*ev.Sequence, 10)}
	}
	if len(ev.Metadata) > 0 {
		h[HeaderMetadata] = []string{escape(string(ev.Metadata))}
	}
	if len(ev.DeliveryHandle) > 0 {
		h[HeaderDeliveryHandle] = []string{escape(string(ev.DeliveryHandle))}
	}
	h[HeaderStoredAt] = []string{storedAt}
	return &nats.Msg{Subject: subject, Header: h, Data: ev.Payload}
}

// decode fills e from a stored message's headers and data. types interns
// event types (nil: no interning).
func decode(e *stream.StoredEvent, h nats.Header, data []byte, types map[string]string) error {
	var err error
	if e.NativeID, err = unescape(first(h, HeaderNativeID)); err != nil {
		return fmt.Errorf("%s: %w", HeaderNativeID, err)
	}
	if e.Variant, err = unescape(first(h, HeaderVariant)); err != nil {
		return fmt.Errorf("%s: %w", HeaderVariant, err)
	}
	typ := first(h, HeaderType)
	if t, ok := types[typ]; ok {
		e.Type = t
	} else {
		if e.Type, err = unescape(typ); err != nil {
			return fmt.Errorf("%s: %w", HeaderType, err)
		}
		if types != nil && e.Type == typ {
			types[typ] = typ
		}
	}
	if v := first(h, HeaderOccurredAt); v != "" {
		if e.OccurredAt, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return fmt.Errorf("%s: %w", HeaderOccurredAt, err)
		}
	}
	if v := first(h, HeaderSequence); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("%s: %w", HeaderSequence, err)
		}
		e.Sequence = &n
	}
	meta, err := unescape(first(h, HeaderMetadata))
	if err != nil {
		return fmt.Errorf("%s: %w", HeaderMetadata, err)
	}
	handle, err := unescape(first(h, HeaderDeliveryHandle))
	if err != nil {
		return fmt.Errorf("%s: %w", HeaderDeliveryHandle, err)
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
	if v := first(h, HeaderStoredAt); v != "" {
		if e.StoredAt, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return fmt.Errorf("%s: %w", HeaderStoredAt, err)
		}
	}
	return nil
}

// storedAt returns a stored message's Postbox-Stored-At, or fallback
// (JetStream's own time) when it has none.
func storedAt(h nats.Header, fallback time.Time) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, first(h, HeaderStoredAt)); err == nil {
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

// escape makes s safe as a NATS header value: bytes below 0x20, DEL and
// '%' anywhere, and spaces at either end, become %XX. Everything else,
// UTF-8 included, stays as it is, so ordinary values read as they are.
func escape(s string) string {
	need := false
	for i := 0; i < len(s); i++ {
		if mustEscape(s, i) {
			need = true
			break
		}
	}
	if !need {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		if mustEscape(s, i) {
			b.WriteByte('%')
			b.WriteByte(hexDigits[s[i]>>4])
			b.WriteByte(hexDigits[s[i]&15])
		} else {
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

const hexDigits = "0123456789ABCDEF"

func mustEscape(s string, i int) bool {
	c := s[i]
	switch {
	case c < 0x20 || c == 0x7f || c == '%':
		return true
	case c == ' ':
		return i == 0 || i == len(s)-1
	}
	return false
}

// unescape reverses escape.
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
