package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/internal/stdwebhook"
	"github.com/postbox-events/postbox/stream"
)

// WebhookSource is the source (and stream) of webhooks posted to
// /webhooks. Its default subscription, of the same name, puts every
// webhook into the inbox "webhooks".
const WebhookSource = "webhooks"

// DefaultWebhookMaxBytes is the default of WebhookConfig.MaxBytes.
const DefaultWebhookMaxBytes = 1 << 20

// maxKeyLength bounds an idempotency key.
const maxKeyLength = 255

// WebhookConfig configures the webhook intake. Every provider puts the
// delivery's id and type somewhere else: the key comes from the
// Idempotency-Key header, else the Standard Webhooks webhook-id header,
// else KeyHeader, else the JSON body's KeyField; the type from
// X-Event-Type, else TypeHeader, else TypeField, else "webhook".
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

// webhookJSON is a webhook in the API (seed 003).
type webhookJSON struct {
	ID             string     `json:"id"`
	IdempotencyKey string     `json:"idempotency_key"`
	Type           string     `json:"type,omitempty"`
	Status         string     `json:"status"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      *time.Time `json:"updated_at,omitempty"`
	Attempts       *int       `json:"attempts,omitempty"`
	LastError      *string    `json:"last_error,omitempty"`
}

func webhookID(offset int64) string { return "wh_" + strconv.FormatInt(offset, 10) }

// secretHeaders are not kept in an event's metadata.
var secretHeaders = map[string]bool{"Authorization": true, "Cookie": true, "Proxy-Authorization": true}

func (s *Server) postWebhook(w http.ResponseWriter, r *http.Request) {
	if !s.isReady() {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "unavailable", "not ready yet (starting or shutting down): send it again")
		return
	}
	cfg := s.cfg.Webhooks
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "Content-Type %q: send application/json", r.Header.Get("Content-Type"))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, cfg.MaxBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", "the body is over %d bytes", cfg.MaxBytes)
		return
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", "reading the body: %v", err)
		return
	}
	if len(bytes.TrimSpace(body)) == 0 || !json.Valid(body) {
		writeError(w, http.StatusBadRequest, "invalid_json", "the body is not valid JSON")
		return
	}
	if len(s.webhookKeys) > 0 {
		err := stdwebhook.Verify(s.webhookKeys, r.Header.Get("Webhook-Id"), r.Header.Get("Webhook-Timestamp"),
			r.Header.Get("Webhook-Signature"), body, time.Now())
		if err != nil {
			s.metrics.Count(WebhookSource, "unauthorized", 1)
			writeError(w, http.StatusUnauthorized, "invalid_signature", "Standard Webhooks signature: %v", err)
			return
		}
	}
	fields := bodyFields(body, cfg)
	key, keyFrom := webhookKey(r, fields, cfg)
	switch {
	case key == "":
		writeError(w, http.StatusBadRequest, "missing_field", "idempotency key: send an Idempotency-Key or webhook-id header%s", keyHint(cfg))
		return
	case len(key) > maxKeyLength:
		writeError(w, http.StatusBadRequest, "invalid_field", "%s: at most %d bytes", keyFrom, maxKeyLength)
		return
	}
	ev := stream.Event{
		NativeID:   key,
		Type:       webhookType(r, fields, cfg),
		OccurredAt: time.Now(),
		Metadata:   webhookMetadata(r),
		Payload:    postbox.AppendCompact(nil, body), // whitespace alone does not make a conflict
	}
	type outcome struct {
		res []stream.AppendResult
		err error
	}
	done := make(chan outcome, 1)
	err = s.store.TryAppendAsync(WebhookSource, []stream.Event{ev}, func(res []stream.AppendResult, err error) { done <- outcome{res, err} })
	switch {
	case errors.Is(err, groupcommit.ErrFull):
		s.metrics.Count(WebhookSource, "throttled", 1)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, "queue_full", "the write queue is full: send it again after Retry-After")
		return
	case err != nil:
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "unavailable", "not stored (%v): send it again", err)
		return
	}
	var o outcome
	select {
	case o = <-done:
	case <-r.Context().Done():
		return // the sender left; it will send again and get 200 if it was stored
	}
	if o.err != nil {
		s.metrics.Count(WebhookSource, "unavailable", 1)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "unavailable", "not stored (%v): send it again", o.err)
		return
	}
	res := o.res[0]
	switch {
	case errors.Is(res.Err, stream.ErrConflict):
		s.metrics.Count(WebhookSource, "conflict", 1)
		writeError(w, http.StatusConflict, "conflict", "idempotency key %q was stored with a different payload; nothing was changed", key)
	case res.Duplicate:
		s.metrics.Count(WebhookSource, "duplicate", 1)
		j := s.webhookJSON(r.Context(), stream.StoredEvent{Event: ev, Offset: res.Offset, StoredAt: res.StoredAt})
		j.Type, j.UpdatedAt, j.Attempts, j.LastError = "", nil, nil, nil // the same shape as 202
		writeJSON(w, http.StatusOK, j)
	default:
		s.metrics.Count(WebhookSource, "stored", 1)
		writeJSON(w, http.StatusAccepted, webhookJSON{ID: webhookID(res.Offset), IdempotencyKey: key, Status: delivery.StatePending, CreatedAt: res.StoredAt})
	}
}

// webhookKey returns the idempotency key of a webhook and where it came
// from.
func webhookKey(r *http.Request, fields map[string]json.RawMessage, cfg WebhookConfig) (key, from string) {
	for _, h := range []string{"Idempotency-Key", "Webhook-Id", cfg.KeyHeader} {
		if h != "" {
			if v := strings.TrimSpace(r.Header.Get(h)); v != "" {
				return v, h + " header"
			}
		}
	}
	if cfg.KeyField != "" {
		return scalar(fields[cfg.KeyField]), "field " + cfg.KeyField
	}
	return "", ""
}

func keyHint(cfg WebhookConfig) string {
	var also []string
	if cfg.KeyHeader != "" {
		also = append(also, "a "+cfg.KeyHeader+" header")
	}
	if cfg.KeyField != "" {
		also = append(also, "a string or number field "+strconv.Quote(cfg.KeyField)+" in the body")
	}
	if len(also) == 0 {
		return ""
	}
	return ", or " + strings.Join(also, " or ")
}

func webhookType(r *http.Request, fields map[string]json.RawMessage, cfg WebhookConfig) string {
	for _, h := range []string{"X-Event-Type", cfg.TypeHeader} {
		if h != "" {
			if v := strings.TrimSpace(r.Header.Get(h)); v != "" {
				return v
			}
		}
	}
	if v := scalar(fields[cfg.TypeField]); cfg.TypeField != "" && v != "" {
		return v
	}
	return "webhook"
}

// bodyFields returns the top-level fields of a JSON object body, parsed
// only when the source takes its key or type from one.
func bodyFields(body []byte, cfg WebhookConfig) map[string]json.RawMessage {
	if cfg.KeyField == "" && cfg.TypeField == "" {
		return nil
	}
	var fields map[string]json.RawMessage
	json.Unmarshal(body, &fields) // not an object: no fields
	return fields
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

// webhookMetadata keeps the request's headers (but credentials) in the
// event's metadata, so that handlers see X-GitHub-Event, Stripe-Signature
// and the like.
func webhookMetadata(r *http.Request) json.RawMessage {
	headers := map[string]string{}
	for name, values := range r.Header {
		if !secretHeaders[name] {
			headers[strings.ToLower(name)] = strings.Join(values, ", ")
		}
	}
	meta, _ := json.Marshal(map[string]any{"headers": headers, "remote_addr": r.RemoteAddr})
	return meta
}

// webhookJSON describes a stored webhook with the state of its item in the
// default webhook subscription (pending until it is materialised).
func (s *Server) webhookJSON(ctx context.Context, ev stream.StoredEvent) webhookJSON {
	j := webhookJSON{ID: webhookID(ev.Offset), IdempotencyKey: ev.NativeID, Type: ev.Type, Status: delivery.StatePending, CreatedAt: ev.StoredAt}
	updated, attempts := ev.StoredAt, 0
	j.UpdatedAt, j.Attempts = &updated, &attempts
	if it, err := s.delivery.ItemOf(ctx, WebhookSource, ev.Offset); err == nil {
		j.Status, j.LastError = it.State, it.LastError
		*j.UpdatedAt, *j.Attempts = it.UpdatedAt, it.Attempts
	}
	return j
}

func (s *Server) getWebhook(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	offset, err := strconv.ParseInt(strings.TrimPrefix(id, "wh_"), 10, 64)
	if !strings.HasPrefix(id, "wh_") || err != nil || offset < 1 {
		writeError(w, http.StatusNotFound, "not_found", "no webhook %q: ids look like wh_42", id)
		return
	}
	ev, err := s.store.Event(r.Context(), WebhookSource, offset)
	if errors.Is(err, stream.ErrNotFound) {
		writeError(w, http.StatusNotFound, "not_found", "no webhook %q", id)
		return
	}
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.webhookJSON(r.Context(), ev))
}

func (s *Server) findWebhook(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	if key == "" {
		writeError(w, http.StatusBadRequest, "missing_field", "idempotency_key: GET /webhooks?idempotency_key=KEY, or GET /webhooks/{id}")
		return
	}
	ev, err := s.store.Lookup(r.Context(), WebhookSource, key, "")
	if errors.Is(err, stream.ErrNotFound) {
		writeError(w, http.StatusNotFound, "not_found", "no webhook with idempotency key %q", key)
		return
	}
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.webhookJSON(r.Context(), ev))
}

// ensureWebhooks creates the webhook stream and its default subscription,
// which puts every webhook into the inbox "webhooks" from the first one
// on. A default subscription an operator redefined is left as it is.
func (s *Server) ensureWebhooks(ctx context.Context) error {
	if _, err := s.store.EnsureStream(ctx, WebhookSource); err != nil {
		return err
	}
	sub, _, err := s.delivery.Create(ctx, delivery.Subscription{Name: WebhookSource, Source: WebhookSource,
		Start: stream.Start{Policy: stream.StartEarliest}, Target: s.cfg.Webhooks.Target})
	if errors.Is(err, delivery.ErrConflict) {
		if sub.Target == s.cfg.Webhooks.Target {
			s.log.Info("webhooks: the default subscription was redefined; keeping it", "subscription", WebhookSource)
			return nil
		}
		// The target follows the configuration (--webhook-target).
		return s.delivery.SetTarget(ctx, WebhookSource, s.cfg.Webhooks.Target)
	}
	return err
}

func (s *Server) isReady() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}
