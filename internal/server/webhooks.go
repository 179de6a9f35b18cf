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
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/intakerate"
	"github.com/postbox-events/postbox/internal/jsonenc"
	"github.com/postbox-events/postbox/internal/logsample"
	"github.com/postbox-events/postbox/internal/names"
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
	return source, offset, err == nil && offset >= 1 && names.Valid(source)
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

// receiveWebhook takes a webhook for source: its intake (internal/intake)
// reads and parses it into the event to append, or refuses it; what
// needs the store is checked here (a CloudEvent stored under its id
// alone before, a GitHub source's replay window), then the event is
// appended and answered (storeWebhook).
func (s *Server) receiveWebhook(w http.ResponseWriter, r *http.Request, source string) {
	if !s.isReady() {
		w.Header().Set("Retry-After", "1")
		writeError(w, api.CodeUnavailable, "not ready yet (starting or shutting down): send it again")
		return
	}
	wh, ok := s.webhookIntake(w, r, source)
	if !ok {
		return
	}
	var p intake.Parsed
	body, ref := wh.Read(w, r)
	if ref == nil {
		p, ref = wh.Parse(r, body, time.Now())
	}
	if ref != nil {
		if ref.Code == api.CodeInvalidSignature {
			s.metrics.Count(source, "unauthorized", 1)
		}
		writeError(w, ref.Code, "%s", ref.Message)
		return
	}
	if !wh.RateLimit.IsZero() && !s.underRate(w, r, source, wh.RateLimit) {
		return
	}
	if tracing.Enabled() {
		span := p.Trace(source)
		defer span.End()
	}
	ev := p.Event()
	if p.CloudEvent != nil && s.wh.ceByID.Load() && s.answeredByID(w, r, source, p.CloudEvent, ev) {
		return
	}
	if wh.ReplayWindow > 0 && !s.firstDelivery(w, r, source, p.Key, p.Payload, wh.ReplayWindow) {
		return
	}
	s.storeWebhook(w, r, source, ev)
}

// underRate takes a token of source's rate limit for a verified webhook,
// and reports whether it got one; over the limit it answers 429
// rate_limited with Retry-After (whole seconds, at least 1) and counts
// it. Only webhooks that verify take tokens: forged ones, answered 401,
// cannot use up a provider's budget. Should a shared store fail, the
// webhook is answered 503 to be sent again.
func (s *Server) underRate(w http.ResponseWriter, r *http.Request, source string, rate intakerate.Rate) bool {
	ok, wait, err := s.limiter.Take(r.Context(), "source:"+source, rate, 1)
	switch {
	case ok:
		return true
	case r.Context().Err() != nil:
		return false // the sender left
	case err != nil:
		s.metrics.Count(source, "unavailable", 1)
		w.Header().Set("Retry-After", "1")
		writeError(w, api.CodeUnavailable, "checking the source's rate limit: %v; send it again", err)
		return false
	}
	s.metrics.Count(source, "throttled", 1)
	s.metrics.Limited(source, "source", 1)
	w.Header().Set("Retry-After", strconv.FormatInt(int64(max(1, math.Ceil(wait.Seconds()))), 10))
	writeError(w, api.CodeRateLimited, "source %q is over its rate limit (rate_limit: %s): send it again after Retry-After; nothing was stored", source, rate)
	return false
}

// storeWebhook appends ev, a webhook of source whose payload is its body
// exactly as received (the bytes a provider signed and a target is
// sent), and answers once the writer committed it. A redelivery is
// recognised on the body's compact form: the stream compares payload
// bytes, so a payload conflict is checked again against the stored
// event, and one that differs in whitespace alone is answered as the
// duplicate it is.
func (s *Server) storeWebhook(w http.ResponseWriter, r *http.Request, source string, ev stream.Event) {
	wait := appendWaits.Get().(*appendWait)
	err := s.writer.TryAppendAsync(source, []stream.Event{ev}, wait.done)
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
		prev, err := s.streams.Lookup(r.Context(), source, ev.NativeID, "")
		switch {
		case err == nil && bytes.Equal(postbox.AppendCompact(nil, prev.Payload), postbox.AppendCompact(nil, ev.Payload)):
			res, stored = stream.AppendResult{Offset: prev.Offset, StoredAt: prev.StoredAt, Duplicate: true}, prev
		case err == nil: // another payload: the conflict it is
		case r.Context().Err() != nil:
			return // the sender left
		default: // ErrNotFound: trimmed since; sent again, it is stored anew
			s.metrics.Count(source, "unavailable", 1)
			w.Header().Set("Retry-After", "1")
			writeError(w, api.CodeUnavailable, "idempotency key %q: reading the stored webhook to compare: %v; send it again", ev.NativeID, err)
			return
		}
	}
	s.answerStored(w, r, source, ev.NativeID, stored, res)
}

// answerStored answers a webhook of source sent under key whose append
// (or lookup) gave res, the event stored under that key being stored:
// 409 for a conflict, 200 and the stored webhook for a duplicate, 202 for
// a new one.
func (s *Server) answerStored(w http.ResponseWriter, r *http.Request, source, key string, stored stream.StoredEvent, res stream.AppendResult) {
	s.logStored(source, key, stored, res)
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
		j.Subscription, j.Stream, j.Offset, j.Deliveries, j.Note = "", "", 0, nil, ""
		writeJSON(w, http.StatusOK, j)
	default:
		s.metrics.Count(source, "stored", 1)
		writeAccepted(w, source, res.Offset, key, res.StoredAt)
	}
}

// logStored logs what became of the webhook of source sent under key,
// with its identity: stored and duplicate at INFO, a conflict at WARN, at
// most 10 lines of each a second (the next line that goes out says how
// many were left out).
func (s *Server) logStored(source, key string, stored stream.StoredEvent, res stream.AppendResult) {
	level, msg := slog.LevelInfo, "webhook: stored"
	switch {
	case errors.Is(res.Err, stream.ErrConflict):
		level, msg = slog.LevelWarn, "webhook: refused: its idempotency key was stored with another body or type"
	case res.Err != nil:
		level, msg = slog.LevelWarn, "webhook: refused: too large for the stream backend"
	case res.Duplicate:
		msg = "webhook: duplicate answered 200, stored before"
	}
	if !s.log.Enabled(context.Background(), level) {
		return
	}
	ok, skipped := s.wh.sample.Allow(msg)
	if !ok {
		return
	}
	attrs := []slog.Attr{slog.String("source", source), slog.String("event_id", key), slog.String("type", stored.Type)}
	if res.Err == nil {
		attrs = append(attrs, slog.Int64("offset", stored.Offset))
	}
	if skipped > 0 {
		attrs = append(attrs, slog.Int("skipped", skipped))
	}
	s.log.LogAttrs(context.Background(), level, msg, attrs...)
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
	// sample bounds the lines logged of each webhook stored (logStored).
	sample logsample.Sampler
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

// appendWait is where storeWebhook waits for its append: done, the
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

// maxTypeBytes bounds a webhook's type as Limits bound an envelope's.
func (s *Server) maxTypeBytes() int {
	if n := s.cfg.Limits.MaxTypeBytes; n > 0 {
		return n
	}
	return postbox.DefaultMaxTypeBytes
}

// webhookJSON describes a stored webhook of source with where it stands
// in each subscription of the source (webhookDeliveries), or, when the
// store cannot say, as pending.
func (s *Server) webhookJSON(ctx context.Context, source string, ev stream.StoredEvent) api.Webhook {
	j := api.Webhook{ID: webhookID(source, ev.Offset), IdempotencyKey: ev.NativeID, Type: ev.Type, Status: delivery.StatePending, CreatedAt: ev.StoredAt}
	updated, attempts := ev.StoredAt, 0
	j.UpdatedAt, j.Attempts = &updated, &attempts
	if err := s.webhookDeliveries(ctx, &j, source, &ev); err != nil {
		s.log.Warn("webhooks: reading the deliveries of a webhook failed", "source", source, "offset", ev.Offset, "err", err)
		j.Note = "where its deliveries stand could not be read: " + err.Error()
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
	case err == nil && src.Kind == intake.KindWebhook:
		return true
	case err == nil || errors.Is(err, intake.ErrNotFound):
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
		{markerDeviceSource, DeviceSource, intake.KindDevice, `{}`},
		{markerWebhookSource, WebhookSource, intake.KindWebhook, `{"serve_flags":true}`},
	} {
		err := s.delivery.Once(ctx, d.marker, func(ctx context.Context) error {
			_, _, err := s.sourceStore.CreateSource(ctx, intake.Source{Name: d.name, Kind: d.kind, Settings: json.RawMessage(d.settings)})
			if errors.Is(err, intake.ErrConflict) {
				return nil // created by an operator first: theirs
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("default source %s: %w", d.name, err)
		}
	}
	// Every source's series exist from the start.
	srcs, err := s.sourceStore.Sources(ctx)
	if err != nil {
		return fmt.Errorf("sources: %w", err)
	}
	for _, src := range srcs {
		s.metrics.Source(src.Name, src.Kind == intake.KindWebhook)
	}
	err = s.delivery.Once(ctx, markerWebhookSubscription, func(ctx context.Context) error {
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
