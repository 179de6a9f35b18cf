package server

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/groupcommit"
	ingest "github.com/postbox-events/postbox/internal/intake" // as ingest: the webhooks' own type is named intake
	"github.com/postbox-events/postbox/internal/jsonenc"
	"github.com/postbox-events/postbox/internal/tracing"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// WebhookSource is the source (and stream) of webhooks posted to
// /webhooks. Its default subscription, of the same name, puts every
// webhook into the inbox "webhooks".
const WebhookSource = "webhooks"

// DefaultWebhookMaxBytes is the default of WebhookConfig.MaxBytes.
const DefaultWebhookMaxBytes = 1 << 20

// maxKeyLength bounds an idempotency key: the native id of every intake
// but envelopes (postbox.Limits.CheckEvent).
const maxKeyLength = postbox.MaxKeyBytes

// Bounds of the headers a webhook keeps in its event's metadata (see
// keptHeader): a longer value, or more in all, is refused with 400.
const (
	maxHeaderValue  = 2048 // bytes of one header's values
	maxHeadersBytes = 8192 // bytes of every kept header's name and values
)

// WebhookConfig configures the webhook intake. Every provider puts the
// delivery's id and type somewhere else: the key comes from the
// Idempotency-Key header, else the Standard Webhooks webhook-id header,
// else KeyHeader, else the JSON body's KeyField; the type from
// X-Event-Type, else TypeHeader, else TypeField, else "webhook".
//
// With Secrets, identity comes only from what the signature covers: the
// key is the body's KeyField when set, else the signed webhook-id; the
// type the body's TypeField (defaulting to "type", where Standard Webhooks
// payloads carry it), else "webhook". Idempotency-Key, KeyHeader,
// X-Event-Type and TypeHeader are ignored.
type WebhookConfig struct {
	MaxBytes   int64  // largest body accepted; defaults to DefaultWebhookMaxBytes
	KeyHeader  string // e.g. X-GitHub-Delivery
	KeyField   string // a top-level field of the body, e.g. Stripe's "id"
	TypeHeader string // e.g. X-GitHub-Event
	TypeField  string // e.g. Stripe's "type"
	// Secrets, when set, make every webhook carry a Standard Webhooks
	// signature by one of them ("whsec_…"; several while rotating):
	// webhook-id, webhook-timestamp (within 5 minutes) and
	// webhook-signature. Others are refused with 401.
	Secrets []string
	// Target, when set, is the URL the workers POST each webhook to (the
	// target of the default subscription webhooks); "" leaves the webhooks
	// inbox to runtimes that lease it.
	Target string
}

// webhookID is the id of source's webhook at offset: wh_42 in the
// default source, wh_gh_42 in the source gh.
func webhookID(source string, offset int64) string {
	if source == WebhookSource {
		return "wh_" + strconv.FormatInt(offset, 10)
	}
	return "wh_" + source + "_" + strconv.FormatInt(offset, 10)
}

// parseWebhookID returns the source and offset of a webhookID.
func parseWebhookID(id string) (source string, offset int64, ok bool) {
	rest, ok := strings.CutPrefix(id, "wh_")
	if !ok {
		return "", 0, false
	}
	source = WebhookSource
	if i := strings.LastIndexByte(rest, '_'); i >= 0 {
		source, rest = rest[:i], rest[i+1:]
	}
	offset, err := strconv.ParseInt(rest, 10, 64)
	return source, offset, err == nil && offset >= 1 && delivery.ValidName(source)
}

// postWebhook takes a webhook for the default source, WebhookSource.
func (s *Server) postWebhook(w http.ResponseWriter, r *http.Request) {
	s.receiveWebhook(w, r, WebhookSource)
}

// postSourceWebhook takes a webhook for the source of kind webhook named
// in the path.
func (s *Server) postSourceWebhook(w http.ResponseWriter, r *http.Request) {
	s.receiveWebhook(w, r, r.PathValue("source"))
}

// receiveWebhook stores a webhook for source under its idempotency key
// with its body exactly as received, the bytes a provider signed and a
// target is sent. A redelivery is recognised on the body's compact form:
// the stream compares payload bytes, so a payload conflict is checked
// again against the stored event, and one that differs in whitespace
// alone is answered as the duplicate it is.
func (s *Server) receiveWebhook(w http.ResponseWriter, r *http.Request, source string) {
	if !s.isReady() {
		w.Header().Set("Retry-After", "1")
		writeError(w, api.CodeUnavailable, "not ready yet (starting or shutting down): send it again")
		return
	}
	in, ok := s.webhookIntake(w, r, source)
	if !ok {
		return
	}
	cfg := in.cfg
	if !jsonMediaType(r.Header.Get("Content-Type")) {
		writeError(w, api.CodeUnsupportedMediaType, "Content-Type %q: send application/json", r.Header.Get("Content-Type"))
		return
	}
	body, err := readBody(w, r, cfg.MaxBytes)
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		writeError(w, api.CodeTooLarge, "the body is over %d bytes", cfg.MaxBytes)
		return
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		writeError(w, api.CodeRequestTimeout, "the body did not arrive in time (--http-read-timeout)")
		return
	}
	if err != nil {
		writeError(w, api.CodeInvalidJSON, "the body could not be read: it ended early")
		return
	}
	if len(bytes.TrimSpace(body)) == 0 {
		writeError(w, api.CodeInvalidJSON, "the body is empty: send the webhook's JSON")
		return
	}
	if !postbox.Valid(body) {
		writeError(w, api.CodeInvalidJSON, "the body is not valid JSON")
		return
	}
	if err := in.verify(r, body, time.Now()); err != nil {
		s.metrics.Count(source, "unauthorized", 1)
		writeError(w, api.CodeInvalidSignature, "%v", err)
		return
	}
	var ce *cloudEvent // a CloudEvent gives the key, type, time and payload (cloudevents.go)
	if in.from == fromAny && isCloudEvent(r) {
		var cerr *ceError
		if ce, cerr = parseCloudEvent(r, body, s.maxTypeBytes()); cerr != nil {
			writeError(w, cerr.code, "%s", cerr.message)
			return
		}
		body = ce.data
	}
	fields, err := bodyFields(body, cfg, in.from)
	if err != nil {
		writeError(w, api.CodeInvalidField, "%v", err)
		return
	}
	key, err := webhookKey(r, fields, cfg, in.from)
	if ce != nil {
		key, err = cloudEventKey(ce.source, ce.id), nil
	}
	if err == nil && key == "" { // a signed webhook has a webhook-id
		writeError(w, api.CodeMissingField, "idempotency key: %s", keyHint(cfg, in.from))
		return
	}
	var typ string
	var meta json.RawMessage
	if err == nil {
		typ, err = webhookType(r, fields, cfg, in.from, s.maxTypeBytes())
	}
	if err == nil {
		meta, err = webhookMetadata(r, cfg)
	}
	if err != nil {
		writeError(w, api.CodeInvalidField, "%v", err)
		return
	}
	// JSON text is UTF-8 (RFC 8259), and the API, the feed and targets
	// hand the payload on as JSON text. (After the key and type, whose
	// errors name their field.)
	if !utf8.Valid(body) {
		writeError(w, api.CodeInvalidJSON, "the body is not valid UTF-8: send JSON text encoded as UTF-8")
		return
	}
	if fe := postbox.CheckPayloadDepth(body); fe != nil { // an inbox page holding it must stay readable JSON
		writeError(w, api.CodeInvalidField, "the body's %s", strings.TrimPrefix(fe.Message, "payload: "))
		return
	}
	occurred := time.Now()
	if ce != nil {
		typ = ce.typ
		if !ce.time.IsZero() {
			occurred = ce.time
		}
	}
	traceparent, tracestate := webhookTrace(r, ce)
	if tracing.Enabled() {
		var span trace.Span
		span, traceparent, tracestate = startWebhookIntake(source, key, typ, traceparent, tracestate)
		defer span.End()
	}
	meta = withWebhookExtras(meta, traceparent, tracestate, ce)
	ev := stream.Event{
		NativeID:   key,
		Type:       typ,
		OccurredAt: occurred,
		Metadata:   meta,
		Payload:    body, // the bytes as received: what a provider signed, and what a target gets
	}
	if ce != nil && s.wh.ceByID.Load() {
		prev, found, err := s.cloudEventByID(r.Context(), source, ce)
		if err != nil {
			if r.Context().Err() == nil {
				s.metrics.Count(source, "unavailable", 1)
				w.Header().Set("Retry-After", "1")
				writeError(w, api.CodeUnavailable, "CloudEvent %q from %q: looking for it among the events stored before postbox keyed them by source: %v; send it again", ce.id, ce.source, err)
			}
			return
		}
		if found {
			s.answerStored(w, r, source, prev.NativeID, prev, storedAgain(prev, ev))
			return
		}
	}
	if in.replayWindow > 0 && !s.firstDelivery(w, r, source, key, body, in.replayWindow) {
		return
	}
	wait := appendWaits.Get().(*appendWait)
	err = s.writer.TryAppendAsync(source, []stream.Event{ev}, wait.done)
	switch {
	case errors.Is(err, groupcommit.ErrFull):
		s.metrics.Count(source, "throttled", 1)
		w.Header().Set("Retry-After", "1")
		writeError(w, api.CodeQueueFull, "the write queue is full: send it again after Retry-After")
		return
	case err != nil:
		w.Header().Set("Retry-After", "1")
		writeError(w, api.CodeUnavailable, "not stored (%v): send it again", err)
		return
	}
	var o appendOutcome
	select {
	case o = <-wait.c:
		appendWaits.Put(wait)
	case <-r.Context().Done():
		return // the sender left; it will send again and get 200 if it was stored (wait is the writer's until then)
	}
	if o.err != nil {
		s.metrics.Count(source, "unavailable", 1)
		w.Header().Set("Retry-After", "1")
		writeError(w, api.CodeUnavailable, "not stored (%v): send it again", o.err)
		return
	}
	res, stored := o.res[0], stream.StoredEvent{Event: ev, Offset: o.res[0].Offset, StoredAt: o.res[0].StoredAt}
	if c, ok := errors.AsType[*stream.ConflictError](res.Err); ok && c.Field == stream.FieldPayload {
		// The backend compares bytes; whitespace alone does not make a
		// conflict. A stored event never changes, so reading it now is
		// as good as comparing inside the append.
		prev, err := s.streams.Lookup(r.Context(), source, key, "")
		switch {
		case err == nil && bytes.Equal(postbox.AppendCompact(nil, prev.Payload), postbox.AppendCompact(nil, body)):
			res, stored = stream.AppendResult{Offset: prev.Offset, StoredAt: prev.StoredAt, Duplicate: true}, prev
		case err == nil: // another payload: the conflict it is
		case r.Context().Err() != nil:
			return // the sender left
		default: // ErrNotFound: trimmed since; sent again, it is stored anew
			s.metrics.Count(source, "unavailable", 1)
			w.Header().Set("Retry-After", "1")
			writeError(w, api.CodeUnavailable, "idempotency key %q: reading the stored webhook to compare: %v; send it again", key, err)
			return
		}
	}
	s.answerStored(w, r, source, key, stored, res)
}

// answerStored answers a webhook of source sent under key whose append
// (or lookup) gave res, the event stored under that key being stored:
// 409 for a conflict, 200 and the stored webhook for a duplicate, 202 for
// a new one.
func (s *Server) answerStored(w http.ResponseWriter, r *http.Request, source, key string, stored stream.StoredEvent, res stream.AppendResult) {
	switch {
	case errors.Is(res.Err, stream.ErrConflict):
		s.metrics.Count(source, "conflict", 1)
		field := stream.FieldPayload
		if c, ok := errors.AsType[*stream.ConflictError](res.Err); ok {
			field = c.Field
		}
		writeError(w, api.CodeConflict, "idempotency key %q was stored with a different %s; nothing was changed", key, field)
	case res.Err != nil: // stream.ErrTooLarge: the backend cannot store it, ever
		s.metrics.Count(source, "rejected", 1)
		writeError(w, api.CodeTooLarge, "%v; nothing was stored", res.Err)
	case res.Duplicate:
		s.metrics.Count(source, "duplicate", 1)
		j := s.webhookJSON(r.Context(), source, stored)
		j.Type, j.UpdatedAt, j.Attempts, j.LastError = "", nil, nil, nil // the same shape as 202
		writeJSON(w, http.StatusOK, j)
	default:
		s.metrics.Count(source, "stored", 1)
		writeAccepted(w, source, res.Offset, key, res.StoredAt)
	}
}

// webhookState is what the webhook intake keeps beside the sources'
// settings.
type webhookState struct {
	// ceByID: the store may hold CloudEvents keyed by their id alone
	// (cloudEventsKeys).
	ceByID atomic.Bool
	// fingerprintKey is the store's key of secrets' fingerprints
	// (fingerprint), read once.
	fingerprintKey struct {
		sync.Mutex
		k []byte
	}
}

// firstDelivery reports whether the webhook of source under key, whose
// provider signs its body alone (GitHub), may be stored: whether its body
// was not stored under another key within the source's replay window. A
// replay is answered here: 200 and the webhook first stored, or 409 when
// that one is not stored (yet, or any more). The body's digest is
// claimed in the store before the append, so that of two deliveries of
// one body at once, on any node, only the first is stored.
func (s *Server) firstDelivery(w http.ResponseWriter, r *http.Request, source, key string, body []byte, window time.Duration) bool {
	sum := sha256.Sum256(body) // the bytes the provider signed
	owner, err := s.sourceStore.ClaimDigest(r.Context(), source, hex.EncodeToString(sum[:]), key, window)
	switch {
	case r.Context().Err() != nil:
		return false // the sender left
	case err != nil:
		s.metrics.Count(source, "unavailable", 1)
		w.Header().Set("Retry-After", "1")
		writeError(w, api.CodeUnavailable, "not stored (%v): send it again", err)
		return false
	case owner == key:
		return true
	}
	prev, err := s.streams.Lookup(r.Context(), source, owner, "")
	switch {
	case err == nil:
		s.answerStored(w, r, source, owner, prev, stream.AppendResult{Offset: prev.Offset, StoredAt: prev.StoredAt, Duplicate: true})
	case r.Context().Err() != nil:
	case errors.Is(err, stream.ErrNotFound):
		s.metrics.Count(source, "conflict", 1)
		writeError(w, api.CodeConflict, "this signed body was sent under the key %q within the source's replay window (%s), and is not stored under it (yet, or any more): "+
			"a provider that signs the body alone sends one body under one key, so this is a replay; nothing was stored", owner, delivery.FormatSchedule([]time.Duration{window}))
	default:
		s.metrics.Count(source, "unavailable", 1)
		w.Header().Set("Retry-After", "1")
		writeError(w, api.CodeUnavailable, "reading the webhook this body was first sent as (%q): %v; send it again", owner, err)
	}
	return false
}

// appendOutcome is what the writer reports of a webhook's append.
type appendOutcome struct {
	res []stream.AppendResult
	err error
}

// appendWait is where receiveWebhook waits for its append: done, the
// callback given to the writer (which calls it once), sends its outcome
// on c. A handler puts it back into appendWaits once it received the
// outcome, and drops it when it stops waiting first (the writer calls
// done later) or the writer refused the append.
type appendWait struct {
	c    chan appendOutcome
	done func([]stream.AppendResult, error)
}

var appendWaits = sync.Pool{New: func() any {
	w := &appendWait{c: make(chan appendOutcome, 1)}
	w.done = func(res []stream.AppendResult, err error) { w.c <- appendOutcome{res, err} }
	return w
}}

// jsonMediaType reports whether a Content-Type is application/json or
// another JSON type (+json), parameters aside.
func jsonMediaType(ct string) bool {
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

// writeAccepted answers 202 for a webhook of source stored at offset:
// what writeJSON writes of api.Webhook{ID, IdempotencyKey, Status
// pending, CreatedAt}, appended without reflection.
func writeAccepted(w http.ResponseWriter, source string, offset int64, key string, created time.Time) {
	bp := answerBufs.Get().(*[]byte)
	b := append((*bp)[:0], `{"id":"wh_`...)
	if source != WebhookSource {
		b = append(append(b, source...), '_') // a source's name needs no escaping
	}
	b = strconv.AppendInt(b, offset, 10)
	b = append(b, `","idempotency_key":`...)
	b = jsonenc.AppendString(b, key)
	b = append(b, `,"status":"`+delivery.StatePending+`","created_at":"`...)
	b = created.AppendFormat(b, time.RFC3339Nano)
	b = append(b, "\"}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	w.Write(b)
	*bp = b
	answerBufs.Put(bp)
}

// answerBufs are the buffers of writeAccepted.
var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// identityFrom says where a webhook's key and type may come from.
type identityFrom int

const (
	// fromAny: an unsigned webhook; the key from Idempotency-Key,
	// webhook-id, the key header or field; the type from X-Event-Type, the
	// type header or field.
	fromAny identityFrom = iota
	// fromSigned: a Standard Webhooks signature; only what it covers, the
	// body's key field or the signed webhook-id, and the body's type field
	// (by default "type").
	fromSigned
	// fromProvider: a provider's preset (GitHub, Stripe); only where the
	// provider puts them, the source's key and type headers and fields.
	fromProvider
)

// webhookKey returns the idempotency key of a webhook: "" when there is
// none (whitespace alone is none), an error naming where it came from when
// it is not valid. A signed webhook's key comes only from what the
// signature covers: the body's KeyField when one is configured, else its
// webhook-id.
func webhookKey(r *http.Request, fields map[string]json.RawMessage, cfg WebhookConfig, from identityFrom) (string, error) {
	headers := []string{"Idempotency-Key", "Webhook-Id", cfg.KeyHeader}
	switch from {
	case fromSigned:
		if cfg.KeyField != "" {
			if v, err := fieldText(fields, cfg.KeyField, maxKeyLength); v != "" || err != nil {
				return v, err
			}
		}
		headers = []string{"Webhook-Id"}
	case fromProvider:
		headers = []string{cfg.KeyHeader}
	}
	for _, h := range headers {
		if h != "" {
			if v := strings.TrimSpace(r.Header.Get(h)); v != "" {
				return v, checkHeader(h, v, maxKeyLength)
			}
		}
	}
	if cfg.KeyField != "" && from != fromSigned {
		return fieldText(fields, cfg.KeyField, maxKeyLength)
	}
	return "", nil
}

// fieldText returns the string or number value of a top-level field of
// the body, checked with checkText; "" when it has none.
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
	return v, checkText(from, v, max)
}

// checkText refuses an idempotency key or type that is not valid UTF-8,
// holds a control character or is longer than max bytes, naming from.
// U+FFFD is refused too: it is what invalid UTF-8 becomes when decoded,
// so two distinct keys would merge.
func checkText(from, v string, max int) error {
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

// checkHeader is checkText for the value of header h, named "h header"
// in its error; the name is put together only for an error.
func checkHeader(h, v string, max int) error {
	if checkText("", v, max) == nil {
		return nil
	}
	return checkText(h+" header", v, max)
}

// keyHint says where a webhook's idempotency key is looked for.
func keyHint(cfg WebhookConfig, from identityFrom) string {
	var where []string
	switch from {
	case fromAny:
		where = append(where, "an Idempotency-Key or webhook-id header")
	case fromSigned:
		where = append(where, "a webhook-id header")
	}
	if cfg.KeyHeader != "" && from != fromSigned {
		where = append(where, "a "+cfg.KeyHeader+" header")
	}
	if cfg.KeyField != "" {
		where = append(where, "a string or number field "+strconv.Quote(cfg.KeyField)+" in the body")
	}
	return "send " + strings.Join(where, ", or ")
}

// webhookType returns the type of a webhook, or an error naming where an
// invalid one came from. A signed webhook's type comes only from its body
// (TypeField, by default "type"), which the signature covers; a
// provider's only from its type header or field.
func webhookType(r *http.Request, fields map[string]json.RawMessage, cfg WebhookConfig, from identityFrom, max int) (string, error) {
	field := cfg.TypeField
	headers := []string{"X-Event-Type", cfg.TypeHeader}
	switch from {
	case fromSigned:
		if field == "" {
			field = "type"
		}
		headers = nil
	case fromProvider:
		headers = []string{cfg.TypeHeader}
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
func bodyFields(body []byte, cfg WebhookConfig, from identityFrom) (map[string]json.RawMessage, error) {
	if cfg.KeyField == "" && cfg.TypeField == "" && from != fromSigned {
		return nil, nil
	}
	typeField := cfg.TypeField
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
		if _, dup := fields[name]; dup && name != "" && (name == cfg.KeyField || name == typeField) {
			return nil, fmt.Errorf("field %q: appears twice in the body; which one is the webhook's?", name)
		}
		fields[name] = v
	}
	return fields, nil
}

// maxTypeBytes bounds a webhook's type as Limits bound an envelope's.
func (s *Server) maxTypeBytes() int {
	if n := s.cfg.Limits.MaxTypeBytes; n > 0 {
		return n
	}
	return postbox.DefaultMaxTypeBytes
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
// (delivery.ForwardedHeader), Content-Type, User-Agent, X-Event-Type and
// the configured key and type headers. Credentials and the first hop's
// headers are not kept.
func keptHeader(name string, cfg WebhookConfig) bool {
	switch name {
	case "Content-Type", "User-Agent", "X-Event-Type", "Idempotency-Key":
		return true
	}
	if (cfg.KeyHeader != "" && strings.EqualFold(name, cfg.KeyHeader)) || (cfg.TypeHeader != "" && strings.EqualFold(name, cfg.TypeHeader)) {
		return true
	}
	// ForwardedHeader lower-cases the name; a short ASCII one is lowered
	// here, on the stack, so that it need not allocate.
	var buf [32]byte
	if len(name) > len(buf) || !isASCII(name) {
		return delivery.ForwardedHeader(name)
	}
	lower := buf[:len(name)]
	for i := range lower {
		lower[i] = lowerASCII(name[i])
	}
	return delivery.ForwardedHeader(string(lower))
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
func webhookMetadata(r *http.Request, cfg WebhookConfig) (json.RawMessage, error) {
	var arr [16]metaHeader
	kept := arr[:0]
	total, size := 0, len(`{"headers":{},"remote_addr":""}`)+len(r.RemoteAddr)
	for name, values := range r.Header {
		if !keptHeader(name, cfg) {
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
// a JSON string (appendJSONString).
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

// webhookJSON describes a stored webhook of source with the state of its
// item in the subscription of the source's name when that reads the
// source, as the default subscription webhooks does (pending until it is
// materialised, or without such a subscription).
func (s *Server) webhookJSON(ctx context.Context, source string, ev stream.StoredEvent) api.Webhook {
	j := api.Webhook{ID: webhookID(source, ev.Offset), IdempotencyKey: ev.NativeID, Type: ev.Type, Status: delivery.StatePending, CreatedAt: ev.StoredAt}
	updated, attempts := ev.StoredAt, 0
	j.UpdatedAt, j.Attempts = &updated, &attempts
	if sub, err := s.delivery.Subscription(ctx, source); err != nil || sub.Source != source {
		return j
	}
	if it, err := s.delivery.ItemOf(ctx, source, ev.Offset); err == nil {
		j.Status, j.LastError = it.State, it.LastError
		*j.UpdatedAt, *j.Attempts = it.UpdatedAt, it.Attempts
	}
	return j
}

func (s *Server) getWebhook(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("source") // GET /webhooks/{source}: a webhook id, wh_42 or wh_gh_42
	source, offset, ok := parseWebhookID(id)
	if !ok {
		writeError(w, api.CodeNotFound, "no webhook %q: ids look like wh_42 (the default source) or wh_gh_42 (the source gh)", id)
		return
	}
	if !s.isWebhookSource(w, r, source) {
		return
	}
	ev, err := s.streams.Event(r.Context(), source, offset)
	if errors.Is(err, stream.ErrNotFound) {
		writeError(w, api.CodeNotFound, "no webhook %q", id)
		return
	}
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.webhookJSON(r.Context(), source, ev))
}

func (s *Server) findWebhook(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	key, source := q.Get("idempotency_key"), cmp.Or(q.Get("source"), WebhookSource)
	if key == "" {
		writeError(w, api.CodeMissingField, "idempotency_key: GET /webhooks?idempotency_key=KEY[&source=NAME], or GET /webhooks/{id}")
		return
	}
	if !s.isWebhookSource(w, r, source) {
		return
	}
	ev, err := s.streams.Lookup(r.Context(), source, key, "")
	if errors.Is(err, stream.ErrNotFound) {
		writeError(w, api.CodeNotFound, "no webhook with idempotency key %q in source %q", key, source)
		return
	}
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.webhookJSON(r.Context(), source, ev))
}

// isWebhookSource reports whether source takes webhooks, and answers 404
// when it does not. The default source is not looked up: its stream
// answers for it.
func (s *Server) isWebhookSource(w http.ResponseWriter, r *http.Request, source string) bool {
	if source == WebhookSource {
		return true
	}
	if !checkName(w, "source", source) {
		return false
	}
	src, err := s.sourceStore.Source(r.Context(), source)
	switch {
	case err == nil && src.Kind == ingest.KindWebhook:
		return true
	case err == nil || errors.Is(err, ingest.ErrNotFound):
		writeError(w, api.CodeNotFound, "no webhook source %q", source)
	default:
		s.writeErr(w, err)
	}
	return false
}

// Markers of the defaults the store creates once (delivery.Once): what an
// operator deletes afterwards is not created again at the next start.
const (
	markerDeviceSource        = "default-source:" + DeviceSource
	markerWebhookSource       = "default-source:" + WebhookSource
	markerWebhookSubscription = "default-subscription:" + WebhookSource
)

// ensureWebhooks creates, once in the store's life, the default sources
// devices and webhooks (whose settings are serve's --webhook-* flags) and
// the default subscription webhooks, which puts every webhook into the
// inbox "webhooks" from the first one on. What an operator deleted since
// stays deleted. A default subscription an operator redefined is left as
// it is, but its target follows the configuration (--webhook-target).
func (s *Server) ensureWebhooks(ctx context.Context) error {
	if err := s.cloudEventsKeys(ctx); err != nil { // before the default sources: it asks whether they were made before
		return err
	}
	if _, err := s.fingerprintKey(); err != nil {
		return fmt.Errorf("fingerprints: %w", err)
	}
	if c := s.cfg.Webhooks; len(s.webhookKeys) > 0 && (c.KeyHeader != "" || c.TypeHeader != "") {
		s.log.Warn("webhooks: with a signing secret the key is the signed webhook-id and the type the signed body's field; the key and type headers are ignored",
			"key_header", c.KeyHeader, "type_header", c.TypeHeader)
	}
	for _, d := range []struct{ marker, name, kind, settings string }{
		{markerDeviceSource, DeviceSource, ingest.KindDevice, `{}`},
		{markerWebhookSource, WebhookSource, ingest.KindWebhook, `{"serve_flags":true}`},
	} {
		err := s.delivery.Once(ctx, d.marker, func(ctx context.Context) error {
			_, _, err := s.sourceStore.CreateSource(ctx, ingest.Source{Name: d.name, Kind: d.kind, Settings: json.RawMessage(d.settings)})
			if errors.Is(err, ingest.ErrConflict) {
				return nil // created by an operator first: theirs
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("default source %s: %w", d.name, err)
		}
	}
	err := s.delivery.Once(ctx, markerWebhookSubscription, func(ctx context.Context) error {
		_, _, err := s.delivery.Create(ctx, delivery.Subscription{Name: WebhookSource, Source: WebhookSource,
			Start: stream.Start{Policy: stream.StartEarliest}, Target: s.cfg.Webhooks.Target})
		if errors.Is(err, delivery.ErrConflict) || errors.Is(err, delivery.ErrNotFound) {
			return nil // redefined, or its source deleted: the operator's choice
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("default subscription %s: %w", WebhookSource, err)
	}
	sub, err := s.delivery.Subscription(ctx, WebhookSource)
	switch {
	case errors.Is(err, delivery.ErrNotFound):
		if s.cfg.Webhooks.Target != "" {
			s.log.Warn("webhooks: the default subscription was deleted; --webhook-target is not used", "subscription", WebhookSource)
		}
		return nil
	case err != nil:
		return err
	case sub.Target != s.cfg.Webhooks.Target:
		// The target follows the configuration (--webhook-target).
		if err := s.delivery.SetTarget(ctx, WebhookSource, s.cfg.Webhooks.Target); err != nil {
			return err
		}
	}
	return s.inlineWebhooks(ctx)
}

// hooker is a stream backend that runs a function in the transaction of
// the events it appends (streamsqlite.Backend, the embedded default).
type hooker interface {
	Hook(streamID string, fn streamsqlite.AppendHook)
}

// inlineWebhooks makes the store write the item of the default
// subscription webhooks in the transaction that stores its webhook, where
// the stream backend and delivery can (delivery.InlineHook): a webhook is
// then written with its item and not read back to be materialised.
func (s *Server) inlineWebhooks(ctx context.Context) error {
	h, ok := s.streams.(hooker)
	if !ok {
		return nil
	}
	fn, err := s.delivery.InlineHook(ctx, WebhookSource)
	if err != nil || fn == nil {
		return err
	}
	h.Hook(WebhookSource, fn)
	return nil
}

func (s *Server) isReady() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}
