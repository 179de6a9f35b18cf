package intake

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/forwarded"
	"github.com/postbox-events/postbox/internal/intakerate"
	"github.com/postbox-events/postbox/internal/jsonenc"
	"github.com/postbox-events/postbox/internal/schedule"
	"github.com/postbox-events/postbox/internal/tracing"
	"github.com/postbox-events/postbox/stream"
)

// Webhooks: a request and its source's settings in, the event to append
// or a refusal out. Nothing here reads the store or appends: the server
// reads the source, asks Webhook.Read and Webhook.Parse, checks what
// needs the store (a GitHub source's replay window, CloudEvents keyed
// by id alone before), appends and answers.

// maxKeyLength bounds an idempotency key: the native id of every intake
// but envelopes (postbox.Limits.CheckEvent).
const maxKeyLength = postbox.MaxKeyBytes

// Bounds of the headers a webhook keeps in its event's metadata (see
// keptHeader): a longer value, or more in all, is refused with 400.
const (
	maxHeaderValue  = 2048 // bytes of one header's values
	maxHeadersBytes = 8192 // bytes of every kept header's name and values
)

// Identity says where a source's webhooks carry their key and type,
// beside the headers every webhook may use (Idempotency-Key, webhook-id,
// X-Event-Type).
type Identity struct {
	KeyHeader  string // e.g. X-GitHub-Delivery
	KeyField   string // a top-level field of the body, e.g. Stripe's "id"
	TypeHeader string // e.g. X-GitHub-Event
	TypeField  string // e.g. Stripe's "type"
}

// Webhook is how a webhook source takes webhooks: its bounds, where a
// webhook's key and type come from, and the signature check. The zero
// Webhook with MaxBytes and MaxTypeBytes set takes unsigned webhooks;
// WebhookSettings.Webhook makes the one of a source's settings.
//
// Unsigned, the key comes from the Idempotency-Key header, else the
// Standard Webhooks webhook-id header, else KeyHeader, else the JSON
// body's KeyField; the type from X-Event-Type, else TypeHeader, else
// TypeField, else "webhook". Signed with a Standard Webhooks secret,
// identity comes only from what the signature covers: the key is the
// body's KeyField when set, else the signed webhook-id; the type the
// body's TypeField (defaulting to "type"), else "webhook". With a
// provider's preset, only from where the provider puts them.
type Webhook struct {
	Identity
	MaxBytes     int64 // largest body accepted
	MaxTypeBytes int   // longest type
	// ReplayWindow, when not 0, is how long the same body is not stored
	// under another key (WebhookSettings.ReplayWindow): the server
	// claims the body's digest before it appends.
	ReplayWindow time.Duration
	// RateLimit, when not zero, bounds the webhooks stored
	// (WebhookSettings.RateLimit): the server takes a token of the
	// source's bucket for each verified webhook before it appends.
	RateLimit intakerate.Rate

	from identityFrom
	// verify checks a webhook's signature; its error names the header.
	// nil: webhooks are not verified.
	verify func(r *http.Request, body []byte, now time.Time) error
	// handle reads a webhook's delivery handle (handle.go). nil: a
	// CloudEvent's, else none.
	handle handleFunc
}

// identityFrom says where a webhook's key and type may come from.
type identityFrom int

const (
	// fromAny: an unsigned webhook; the key from Idempotency-Key,
	// webhook-id, the key header or field; the type from X-Event-Type, the
	// type header or field. Only these read CloudEvents.
	fromAny identityFrom = iota
	// fromSigned: a Standard Webhooks signature; only what it covers, the
	// body's key field or the signed webhook-id, and the body's type field
	// (by default "type").
	fromSigned
	// fromProvider: a provider's preset (GitHub, Stripe); only where the
	// provider puts them, the source's key and type headers and fields.
	fromProvider
)

// Refusal is why a webhook is not taken: the code of the API's error,
// which gives its HTTP status, and a message naming what is wrong.
type Refusal struct {
	Code    api.Code
	Message string
}

// Status is the HTTP status of the refusal.
func (r *Refusal) Status() int { return r.Code.Status() }

func refuse(code api.Code, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Parsed is a webhook taken: what its event is made of (Event), and
// what the server's checks and answer need.
type Parsed struct {
	Key        string    // the idempotency key: the event's native id
	Type       string    // the event's type
	OccurredAt time.Time // a CloudEvent's time, else when it was parsed
	// Payload is the body as received (a CloudEvent's data): the bytes a
	// provider signed, and what a target is sent.
	Payload []byte
	// Traceparent and Tracestate are the trace context the event
	// carries: the one the webhook brought when valid (else ""), or the
	// intake span's (Trace).
	Traceparent, Tracestate string
	// CloudEvent is the CloudEvent the webhook is; nil when it is none.
	CloudEvent *CloudEvent
	// Handle is the event's delivery handle (internal/replyto); nil when
	// it has none.
	Handle json.RawMessage
	// DeliverAt is when the webhook's items are due (HeaderDeliverAt,
	// HeaderDelay); zero: at once.
	DeliverAt time.Time

	headers json.RawMessage // the kept headers and the remote address
}

// Event returns the event to append: the webhook's key, type and
// payload, and as metadata its kept headers, its trace context, a
// CloudEvent's attributes and its delivery time (schedule.Key).
func (p *Parsed) Event() stream.Event {
	return stream.Event{
		NativeID:       p.Key,
		Type:           p.Type,
		OccurredAt:     p.OccurredAt,
		Metadata:       withWebhookExtras(p.headers, p.Traceparent, p.Tracestate, p.CloudEvent, p.DeliverAt),
		Payload:        p.Payload,
		DeliveryHandle: p.Handle,
	}
}

// Trace starts the intake span of the webhook, appended to source, as a
// child of the trace context it brought, and makes the span's context
// the one its event carries. The caller ends the span once the webhook
// is answered; it is called only when tracing is enabled.
func (p *Parsed) Trace(source string) trace.Span {
	var span trace.Span
	span, p.Traceparent, p.Tracestate = tracing.StartIntake(p.Traceparent, p.Tracestate, source, p.Key, p.Type)
	return span
}

// Read reads the body of a webhook request, at most wh.MaxBytes, after
// checking its media type (a webhook is JSON), so that a body refused
// for its type is not read. w is the request's response, which
// http.MaxBytesReader tells to close the connection after a body over
// the bound.
func (wh *Webhook) Read(w http.ResponseWriter, r *http.Request) ([]byte, *Refusal) {
	if !IsJSONMediaType(r.Header.Get("Content-Type")) {
		return nil, refuse(api.CodeUnsupportedMediaType, "Content-Type %q: send application/json", r.Header.Get("Content-Type"))
	}
	body, err := readBody(w, r, wh.MaxBytes)
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return nil, refuse(api.CodeTooLarge, "the body is over %d bytes", wh.MaxBytes)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, refuse(api.CodeRequestTimeout, "the body did not arrive in time (--http-read-timeout)")
	}
	if err != nil {
		return nil, refuse(api.CodeInvalidJSON, "the body could not be read: it ended early")
	}
	return body, nil
}

// Parse takes the webhook of r whose body Read returned, at now: it
// checks the body, the signature, a CloudEvent's attributes, the key,
// the type and the headers kept, and returns the webhook or why it is
// refused. A signature refused is api.CodeInvalidSignature.
func (wh *Webhook) Parse(r *http.Request, body []byte, now time.Time) (Parsed, *Refusal) {
	if len(bytes.TrimSpace(body)) == 0 {
		return Parsed{}, refuse(api.CodeInvalidJSON, "the body is empty: send the webhook's JSON")
	}
	if !postbox.Valid(body) {
		return Parsed{}, refuse(api.CodeInvalidJSON, "the body is not valid JSON")
	}
	if wh.verify != nil {
		if err := wh.verify(r, body, now); err != nil {
			return Parsed{}, refuse(api.CodeInvalidSignature, "%v", err)
		}
	}
	var ce *CloudEvent // a CloudEvent gives the key, type, time and payload (cloudevents.go)
	if wh.from == fromAny && isCloudEvent(r) {
		var ref *Refusal
		if ce, ref = parseCloudEvent(r, body, wh.MaxTypeBytes); ref != nil {
			return Parsed{}, ref
		}
		body = ce.data
	}
	fields, err := bodyFields(body, &wh.Identity, wh.from)
	if err != nil {
		return Parsed{}, refuse(api.CodeInvalidField, "%v", err)
	}
	var key string
	if ce != nil {
		key = cloudEventKey(ce.Source, ce.ID)
	} else if key, err = webhookKey(r, fields, &wh.Identity, wh.from); err == nil && key == "" { // a signed webhook has a webhook-id
		return Parsed{}, refuse(api.CodeMissingField, "idempotency key: %s", keyHint(&wh.Identity, wh.from))
	}
	var typ string
	var meta json.RawMessage
	if err == nil {
		typ, err = webhookType(r, fields, &wh.Identity, wh.from, wh.MaxTypeBytes)
	}
	if err == nil {
		meta, err = webhookMetadata(r, &wh.Identity)
	}
	var deliverAt time.Time
	if err == nil {
		deliverAt, err = webhookSchedule(r, now)
	}
	if err != nil {
		return Parsed{}, refuse(api.CodeInvalidField, "%v", err)
	}
	// JSON text is UTF-8 (RFC 8259), and the API, the feed and targets
	// hand the payload on as JSON text. (After the key and type, whose
	// errors name their field.)
	if !utf8.Valid(body) {
		return Parsed{}, refuse(api.CodeInvalidJSON, "the body is not valid UTF-8: send JSON text encoded as UTF-8")
	}
	if fe := postbox.CheckPayloadDepth(body); fe != nil { // an inbox page holding it must stay readable JSON
		return Parsed{}, refuse(api.CodeInvalidField, "the body's %s", strings.TrimPrefix(fe.Message, "payload: "))
	}
	p := Parsed{Key: key, Type: typ, OccurredAt: now, Payload: body, CloudEvent: ce, DeliverAt: deliverAt, headers: meta}
	switch {
	case wh.handle != nil:
		var ref *Refusal
		if p.Handle, ref = wh.handle(r, body); ref != nil {
			return Parsed{}, ref
		}
	case ce != nil:
		p.Handle = cloudEventHandle(ce)
	}
	if ce != nil {
		p.Type = ce.Type
		if !ce.Time.IsZero() {
			p.OccurredAt = ce.Time
		}
	}
	p.Traceparent, p.Tracestate = webhookTrace(r, ce)
	return p, nil
}

// The headers that schedule a webhook's delivery: its items are due at
// an RFC 3339 time, or after a delay (a Go duration: 90s, 2h) from when
// it is received; one of them, at most schedule.Max ahead. A time in the
// past is due at once. They are the sender's, as Idempotency-Key is,
// and no signature covers them.
const (
	HeaderDeliverAt = "Postbox-Deliver-At"
	HeaderDelay     = "Postbox-Delay"
)

// webhookSchedule returns the delivery time r's headers ask for (zero:
// none), or an error naming the header at fault.
func webhookSchedule(r *http.Request, now time.Time) (time.Time, error) {
	at, delay := r.Header.Get(HeaderDeliverAt), r.Header.Get(HeaderDelay)
	if at == "" && delay == "" {
		return time.Time{}, nil
	}
	return schedule.Parse(strings.TrimSpace(at), strings.TrimSpace(delay), now, "header "+HeaderDeliverAt, "header "+HeaderDelay)
}

// IsJSONMediaType reports whether a Content-Type is application/json or
// another JSON type (+json), parameters aside.
func IsJSONMediaType(ct string) bool {
	if ct == "application/json" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// readBody reads r's body, at most max bytes (a longer one fails with
// *http.MaxBytesError, as http.MaxBytesReader has it), into a buffer
// sized by its Content-Length when it has one, up to readBodyPresize:
// io.ReadAll would start at 512 bytes and grow.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, max)
	size := int64(512)
	if n := r.ContentLength; n >= 0 && n < max {
		size = min(n+1, readBodyPresize) // room to read io.EOF without growing
	}
	b := make([]byte, 0, size)
	for {
		n, err := rd.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// readBodyPresize bounds the buffer readBody allocates before the body
// arrives: a sender that announces a megabyte and sends nothing holds
// no more than this.
const readBodyPresize = 64 << 10

// webhookKey returns the idempotency key of a webhook: "" when there is
// none (whitespace alone is none), an error naming where it came from when
// it is not valid. A signed webhook's key comes only from what the
// signature covers: the body's KeyField when one is configured, else its
// webhook-id.
func webhookKey(r *http.Request, fields map[string]json.RawMessage, id *Identity, from identityFrom) (string, error) {
	headers := []string{"Idempotency-Key", "Webhook-Id", id.KeyHeader}
	switch from {
	case fromSigned:
		if id.KeyField != "" {
			if v, err := fieldText(fields, id.KeyField, maxKeyLength); v != "" || err != nil {
				return v, err
			}
		}
		headers = []string{"Webhook-Id"}
	case fromProvider:
		headers = []string{id.KeyHeader}
	}
	for _, h := range headers {
		if h != "" {
			if v := strings.TrimSpace(r.Header.Get(h)); v != "" {
				return v, checkHeader(h, v, maxKeyLength)
			}
		}
	}
	if id.KeyField != "" && from != fromSigned {
		return fieldText(fields, id.KeyField, maxKeyLength)
	}
	return "", nil
}

// fieldText returns the string or number value of a top-level field of
// the body, checked with CheckText; "" when it has none.
func fieldText(fields map[string]json.RawMessage, name string, max int) (string, error) {
	from := "field " + strconv.Quote(name)
	raw := fields[name]
	if !utf8.Valid(raw) {
		return "", fmt.Errorf("%s: not valid UTF-8", from)
	}
	if len(raw) > 0 && (raw[0] == '{' || raw[0] == '[' || raw[0] == 't' || raw[0] == 'f') {
		kind := map[byte]string{'{': "object", '[': "array", 't': "boolean", 'f': "boolean"}[raw[0]]
		return "", fmt.Errorf("%s: want a string or a number, got a JSON %s", from, kind)
	}
	v := scalar(raw)
	if strings.TrimSpace(v) == "" {
		return "", nil
	}
	return v, CheckText(from, v, max)
}

// CheckText refuses an idempotency key or type that is not valid UTF-8,
// holds a control character or is longer than max bytes, naming from.
// U+FFFD is refused too: it is what invalid UTF-8 becomes when decoded,
// so two distinct keys would merge.
func CheckText(from, v string, max int) error {
	if !utf8.ValidString(v) {
		return fmt.Errorf("%s: not valid UTF-8", from)
	}
	for _, c := range v {
		switch {
		case c == utf8.RuneError:
			return fmt.Errorf("%s: holds U+FFFD, which stands for invalid UTF-8", from)
		case unicode.IsControl(c):
			return fmt.Errorf("%s: holds the control character %U", from, c)
		}
	}
	if len(v) > max {
		return fmt.Errorf("%s: %d bytes, at most %d", from, len(v), max)
	}
	return nil
}

// checkHeader is CheckText for the value of header h, named "h header"
// in its error; the name is put together only for an error.
func checkHeader(h, v string, max int) error {
	if CheckText("", v, max) == nil {
		return nil
	}
	return CheckText(h+" header", v, max)
}

// keyHint says where a webhook's idempotency key is looked for.
func keyHint(id *Identity, from identityFrom) string {
	var where []string
	switch from {
	case fromAny:
		where = append(where, "an Idempotency-Key or webhook-id header")
	case fromSigned:
		where = append(where, "a webhook-id header")
	}
	if id.KeyHeader != "" && from != fromSigned {
		where = append(where, "a "+id.KeyHeader+" header")
	}
	if id.KeyField != "" {
		where = append(where, "a string or number field "+strconv.Quote(id.KeyField)+" in the body")
	}
	return "send " + strings.Join(where, ", or ")
}

// webhookType returns the type of a webhook, or an error naming where an
// invalid one came from. A signed webhook's type comes only from its body
// (TypeField, by default "type"), which the signature covers; a
// provider's only from its type header or field.
func webhookType(r *http.Request, fields map[string]json.RawMessage, id *Identity, from identityFrom, max int) (string, error) {
	field := id.TypeField
	headers := []string{"X-Event-Type", id.TypeHeader}
	switch from {
	case fromSigned:
		if field == "" {
			field = "type"
		}
		headers = nil
	case fromProvider:
		headers = []string{id.TypeHeader}
	}
	for _, h := range headers {
		if h != "" {
			if v := strings.TrimSpace(r.Header.Get(h)); v != "" {
				return v, checkHeader(h, v, max)
			}
		}
	}
	if field != "" {
		if v, err := fieldText(fields, field, max); v != "" || err != nil {
			return v, err
		}
	}
	return "webhook", nil
}

// bodyFields returns the top-level fields of a JSON object body, parsed
// only when the source takes its key or type from one.
//
// A field the identity is read from that appears twice is an error: the
// key or type would be whichever one a reader takes.
func bodyFields(body []byte, id *Identity, from identityFrom) (map[string]json.RawMessage, error) {
	if id.KeyField == "" && id.TypeField == "" && from != fromSigned {
		return nil, nil
	}
	typeField := id.TypeField
	if typeField == "" && from == fromSigned {
		typeField = "type" // webhookType's default for a signed webhook
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil // not an object: no fields
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil // the body is valid JSON: not reached
		}
		name, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil
		}
		if _, dup := fields[name]; dup && name != "" && (name == id.KeyField || name == typeField) {
			return nil, fmt.Errorf("field %q: appears twice in the body; which one is the webhook's?", name)
		}
		fields[name] = v
	}
	return fields, nil
}

// scalar returns a JSON string's value or a number's text, or "".
func scalar(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// keptHeader reports whether a header (canonical name) is kept in a
// webhook's metadata, so that handlers see X-GitHub-Event,
// Stripe-Signature and the like: those the workers forward to a target
// (forwarded.Header), Content-Type, User-Agent, X-Event-Type and
// the configured key and type headers. Credentials and the first hop's
// headers are not kept.
func keptHeader(name string, id *Identity) bool {
	switch name {
	case "Content-Type", "User-Agent", "X-Event-Type", "Idempotency-Key":
		return true
	}
	if (id.KeyHeader != "" && strings.EqualFold(name, id.KeyHeader)) || (id.TypeHeader != "" && strings.EqualFold(name, id.TypeHeader)) {
		return true
	}
	// forwarded.Header lower-cases the name; a short ASCII one is lowered
	// here, on the stack, so that it need not allocate.
	var buf [32]byte
	if len(name) > len(buf) || !isASCII(name) {
		return forwarded.Header(name)
	}
	lower := buf[:len(name)]
	for i := range lower {
		lower[i] = lowerASCII(name[i])
	}
	return forwarded.Header(string(lower))
}

// metaHeader is a header kept in a webhook's metadata: its name, lower
// case but for ASCII letters, and its values.
type metaHeader struct{ name, value string }

// webhookMetadata keeps the request's kept headers (keptHeader) in the
// event's metadata, each at most maxHeaderValue bytes and all together at
// most maxHeadersBytes: more is refused, not cut (a cut signature is
// useless). The JSON is what encoding/json makes of
// {"headers": {lower-case name: values joined by ", "}, "remote_addr": …}
// (keys sorted, strings escaped alike), appended without maps or
// reflection.
func webhookMetadata(r *http.Request, id *Identity) (json.RawMessage, error) {
	var arr [16]metaHeader
	kept := arr[:0]
	total, size := 0, len(`{"headers":{},"remote_addr":""}`)+len(r.RemoteAddr)
	for name, values := range r.Header {
		if !keptHeader(name, id) {
			continue
		}
		v := strings.Join(values, ", ")
		if len(v) > maxHeaderValue {
			return nil, fmt.Errorf("header %s: %d bytes, at most %d", name, len(v), maxHeaderValue)
		}
		if total += len(name) + len(v); total > maxHeadersBytes {
			return nil, fmt.Errorf("headers: the ones kept with a webhook (provider ids, events, signatures) exceed %d bytes", maxHeadersBytes)
		}
		if !isASCII(name) {
			name = strings.ToLower(name)
		}
		kept = append(kept, metaHeader{name, v})
		size += len(name) + len(v) + len(`"":"",`)
	}
	slices.SortFunc(kept, func(a, b metaHeader) int { return compareLowerASCII(a.name, b.name) })
	b := make([]byte, 0, size)
	b = append(b, `{"headers":{`...)
	for i, h := range kept {
		if i > 0 {
			if compareLowerASCII(kept[i-1].name, h.name) == 0 {
				continue // two names of one lower case: one value, as a map keeps
			}
			b = append(b, ',')
		}
		b = appendJSONLowerASCII(b, h.name)
		b = append(b, ':')
		b = jsonenc.AppendString(b, h.value)
	}
	b = append(b, `},"remote_addr":`...)
	b = jsonenc.AppendString(b, r.RemoteAddr)
	return append(b, '}'), nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// compareLowerASCII compares a and b with their ASCII letters in lower
// case: for ASCII strings, as strings.ToLower(a) and strings.ToLower(b)
// compare.
func compareLowerASCII(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if ca, cb := lowerASCII(a[i]), lowerASCII(b[i]); ca != cb {
			return int(ca) - int(cb)
		}
	}
	return len(a) - len(b)
}

// appendJSONLowerASCII appends s with its ASCII letters in lower case as
// a JSON string (jsonenc.AppendString).
func appendJSONLowerASCII(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if !jsonenc.Plain(s[i]) {
			return jsonenc.AppendString(b, strings.ToLower(s))
		}
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		b = append(b, lowerASCII(s[i]))
	}
	return append(b, '"')
}
