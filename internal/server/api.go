package server

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/httproute"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/names"
	"github.com/postbox-events/postbox/internal/replyto"
	"github.com/postbox-events/postbox/stream"
)

// The HTTP API of subscriptions, streams, consumers and inboxes
// (docs/API.md).

// maxAPIBody bounds the body of an API request.
const maxAPIBody = 1 << 20

func (s *Server) routeAPI() {
	for pattern, h := range map[string]http.HandlerFunc{
		"POST /v1/subscriptions":                      s.createSubscription,
		"GET /v1/subscriptions":                       s.listSubscriptions,
		"GET /v1/subscriptions/{name}":                s.getSubscription,
		"DELETE /v1/subscriptions/{name}":             s.deleteSubscription,
		"PATCH /v1/subscriptions/{name}":              s.patchSubscription,
		"POST /v1/subscriptions/{name}/enable":        s.enableSubscription,
		"GET /v1/streams":                             s.listStreams,
		"GET /v1/streams/{stream}":                    s.getStream,
		"GET /v1/streams/{stream}/events":             s.streamEvents,
		"GET /v1/streams/{stream}/events/{offset}":    s.getEvent,
		"GET /v1/streams/{stream}/search":             s.searchStream,
		"GET /v1/inboxes/{inbox}/search":              s.searchInbox,
		"GET /v1/consumers":                           s.listConsumers,
		"GET /v1/inboxes":                             s.listInboxes,
		"GET /v1/inboxes/{inbox}/items":               s.listItems,
		"GET /v1/inboxes/{inbox}/items/{id}":          s.getItem,
		"GET /v1/inboxes/{inbox}/items/{id}/attempts": s.listAttempts,
		"POST /v1/inboxes/{inbox}/lease":              s.leaseItems,
		"POST /v1/inboxes/{inbox}/ack":                s.ackItems,
		"POST /v1/inboxes/{inbox}/nack":               s.nackItems,
		"POST /v1/inboxes/{inbox}/extend":             s.extendItems,
		"GET /v1/dead-letters":                        s.listDeadLetters,
		"GET /v1/dead-letters/{id}":                   s.getDeadLetter,
		"POST /v1/dead-letters/{id}/replay":           s.replayDeadLetter,
		"POST /v1/dead-letters/replay":                s.replayDeadLetters,
		"POST /v1/subscriptions/{name}/replay":        s.replaySubscription,
		"GET /v1/replays":                             s.listReplays,
		"GET /v1/replays/{id}":                        s.getReplay,
		"POST /v1/sources":                            s.createSource,
		"GET /v1/sources":                             s.listSources,
		"GET /v1/sources/{name}":                      s.getSource,
		"DELETE /v1/sources/{name}":                   s.deleteSource,
		"GET /v1/backup":                              s.getBackup,
	} {
		s.handle(pattern, s.requireToken(h))
	}
	s.handle("POST /webhooks/{source}", http.HandlerFunc(s.postSourceWebhook)) // sent by providers: no API token
}

// requireToken answers 401 unless the request carries the API token (when
// one is configured).
func (s *Server) requireToken(h http.HandlerFunc) http.HandlerFunc {
	if s.cfg.APIToken == "" {
		return h
	}
	want := []byte(s.cfg.APIToken)
	return func(w http.ResponseWriter, r *http.Request) {
		if token, ok := ingress.BearerToken(r.Header.Get("Authorization")); !ok || subtle.ConstantTimeCompare([]byte(token), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="postbox"`)
			if ok {
				writeError(w, api.CodeUnauthorized, "the token given is not the server's API token (serve --api-token): Authorization: Bearer TOKEN (postbox --token, POSTBOX_API_TOKEN)")
				return
			}
			writeError(w, api.CodeUnauthorized, "this API needs the server's API token: Authorization: Bearer TOKEN (postbox --token, POSTBOX_API_TOKEN)")
			return
		}
		h(w, r)
	}
}

// noRoute answers what no route takes, in JSON as every other error:
// 405 with Allow when the path has routes for other methods, else 404.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	if allow := httproute.Allowed(s.mux, r); len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeError(w, api.CodeMethodNotAllowed, "%s %s: this path takes %s", r.Method, r.URL.Path, strings.Join(allow, ", "))
		return
	}
	writeError(w, api.CodeNotFound, "no route %s %s (docs/API.md lists them)", r.Method, r.URL.Path)
}

// withQuery refuses a request whose query does not parse (a bad %
// escape), which r.URL.Query would read as if the broken pair were not
// there: GET …/items?limit=%zz would answer the default page.
func withQuery(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery != "" {
			if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
				writeError(w, api.CodeInvalidField, "the query %q: %v", r.URL.RawQuery, err)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// withCleanPath answers a path with empty, "." or ".." segments 404 in
// JSON, as every other error, where ServeMux would redirect it to its
// clean form with an HTML body (/v1/subscriptions/../../etc/passwd to
// /etc/passwd).
func withCleanPath(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Path; p != "" && r.Method != http.MethodConnect {
			if c := path.Clean(p); c != p && c+"/" != p {
				writeError(w, api.CodeNotFound, "path %q: not in its clean form (no //, /./ or /../ in it)", p)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// writeError answers code, with its status from the table of api.Codes,
// and a message formatted for people, cut at maxErrorMessage bytes (a
// message that quotes a huge bad value would otherwise repeat it).
func writeError(w http.ResponseWriter, code api.Code, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if len(msg) > maxErrorMessage {
		msg = strings.ToValidUTF8(msg[:maxErrorMessage], "") + "…"
	}
	writeJSON(w, code.Status(), api.ErrorResponse{Error: api.Error{Code: code, Message: msg}})
}

// maxErrorMessage bounds the message of an error answer.
const maxErrorMessage = 1024

// writeErr answers err with the status and code of its kind.
func (s *Server) writeErr(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, delivery.ErrNotFound), errors.Is(err, intake.ErrNotFound), errors.Is(err, stream.ErrStreamNotFound), errors.Is(err, stream.ErrConsumerNotFound):
		writeError(w, api.CodeNotFound, "%v", err)
	case errors.Is(err, delivery.ErrConflict), errors.Is(err, intake.ErrConflict):
		writeError(w, api.CodeConflict, "%v", err)
	case errors.Is(err, delivery.ErrInvalid), errors.Is(err, intake.ErrInvalid), errors.Is(err, stream.ErrOffsetOutOfRange), errors.Is(err, stream.ErrInvalidStart):
		writeError(w, api.CodeInvalidField, "%v", err)
	case errors.Is(err, delivery.ErrLeaseLost):
		writeError(w, api.CodeLeaseLost, "%v", err)
	case errors.Is(err, delivery.ErrInvalidState):
		writeError(w, api.CodeInvalidState, "%v", err)
	default:
		s.log.Error("api: request failed", "err", err)
		writeError(w, api.CodeUnavailable, "%v", err)
	}
}

// decodeBody decodes the JSON body of r into v as decodeStrict does, and
// answers the error itself when it fails.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, optional bool) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAPIBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeError(w, api.CodeTooLarge, "the body is over %d bytes", maxAPIBody)
		return false
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		writeError(w, api.CodeRequestTimeout, "the body did not arrive in time (--http-read-timeout)")
		return false
	}
	if err != nil {
		writeError(w, api.CodeInvalidJSON, "the body could not be read: it ended early")
		return false
	}
	switch trimmed := bytes.TrimSpace(body); {
	case len(trimmed) == 0 && optional:
		return true
	case len(trimmed) == 0:
		writeError(w, api.CodeInvalidJSON, "the body is empty: send a JSON object")
		return false
	case string(trimmed) == "null":
		writeError(w, api.CodeInvalidJSON, "the body is null: send a JSON object")
		return false
	}
	if code, msg, ok := decodeStrict(body, v); !ok {
		writeError(w, code, "%s", msg)
		return false
	}
	return true
}

// jsonError says in plain words what is wrong with a body the decoder
// refused, naming the field, never a Go type.
func jsonError(err error) (code api.Code, msg string) {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return api.CodeInvalidJSON, fmt.Sprintf("the body: want %s, got a JSON %s", jsonKind(typeErr.Type), typeErr.Value)
		}
		return api.CodeInvalidJSON, fmt.Sprintf("field %q: want %s, got a JSON %s", typeErr.Field, jsonKind(typeErr.Type), typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return api.CodeUnknownField, strings.TrimPrefix(err.Error(), "json: ")
	case errors.As(err, &syntaxErr):
		return api.CodeInvalidJSON, fmt.Sprintf("invalid JSON at byte %d of the body", syntaxErr.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return api.CodeInvalidJSON, "invalid JSON: the body ends inside its value"
	}
	return api.CodeInvalidJSON, "invalid JSON in the body"
}

// jsonKind names the JSON value a Go type decodes from.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// Bounds of what the operator API accepts (docs/API.md#limits).
const (
	// MaxVisibilityTimeout bounds a lease's visibility_timeout.
	MaxVisibilityTimeout = 12 * time.Hour
	// MaxNackDelay bounds a nack's delay.
	MaxNackDelay = 24 * time.Hour
	// maxNameLen bounds the names of subscriptions, inboxes, sources and
	// streams (names.Valid).
	maxNameLen = 128
	// maxTypes and maxTypeLen bound a subscription's type patterns.
	maxTypes, maxTypeLen = 100, 128
	// maxMetadata, maxMetadataKey and maxMetadataValue bound a
	// subscription's metadata filter.
	maxMetadata, maxMetadataKey, maxMetadataValue = 32, 128, 1024
	// maxTargetLen bounds a target URL.
	maxTargetLen = 2048
	// maxReasonLen bounds a nack's reason.
	maxReasonLen = 1024
	// maxLeaseTokenLen bounds a lease token sent back.
	maxLeaseTokenLen = 256
)

// checkName answers 400 naming field unless v is a valid name
// (names.Valid).
func checkName(w http.ResponseWriter, field, v string) bool {
	if names.Valid(v) {
		return true
	}
	if len(v) > maxNameLen {
		v = v[:maxNameLen] + "…"
	}
	writeError(w, api.CodeInvalidField, "%s %q: %s", field, v, names.Rule)
	return false
}

// checkAPIText answers 400 naming field unless v passes intake.CheckText,
// the check of a webhook's key and type (and is not empty unless
// allowEmpty).
func checkAPIText(w http.ResponseWriter, field, v string, max int, allowEmpty bool) bool {
	if v == "" {
		if !allowEmpty {
			writeError(w, api.CodeInvalidField, "%s: empty", field)
		}
		return allowEmpty
	}
	if err := intake.CheckText(field, v, max); err != nil {
		writeError(w, api.CodeInvalidField, "%v", err)
		return false
	}
	return true
}

// durationField parses the duration field name (def when absent) in
// [lo, hi], or answers 400 naming it.
func durationField(w http.ResponseWriter, name string, v *string, def, lo, hi time.Duration) (time.Duration, bool) {
	if v == nil {
		return def, true
	}
	d, err := time.ParseDuration(*v)
	if err != nil || d < 0 {
		writeError(w, api.CodeInvalidField, "%s %q: want a duration such as \"30s\", from %s to %s", name, *v, lo, hi)
		return 0, false
	}
	if d < lo || d > hi {
		writeError(w, api.CodeInvalidField, "%s %s: want a duration from %s to %s", name, d, lo, hi)
		return 0, false
	}
	return d, true
}

// subscriptionJSON is sub in the API.
func (s *Server) subscriptionJSON(r *http.Request, sub delivery.Subscription) api.Subscription {
	j := api.Subscription{
		Name: sub.Name, Source: sub.Source, Stream: sub.Stream, Inbox: sub.Inbox, Types: sub.Types, Metadata: sub.Metadata,
		Start: sub.Start.Policy, StartOffset: sub.Start.Offset, CreatedAt: sub.CreatedAt, Endpoint: newEndpointJSON(sub, s.fingerprint),
	}
	if !sub.Start.Time.IsZero() {
		t := sub.Start.Time
		j.StartTime = &t
	}
	if sub.Target != "" {
		j.Target = &sub.Target
		j.Breaker = s.breakerJSON(r, sub.Inbox)
	}
	if !sub.PausedAt.IsZero() {
		at := sub.PausedAt
		j.Paused, j.PausedAt = true, &at
		if sub.PausedReason != "" {
			reason := sub.PausedReason
			j.PausedReason = &reason
		}
	}
	if sub.OrderBy != "" {
		j.OrderBy, j.OnDeadLetter = &sub.OrderBy, &sub.OnDeadLetter
	}
	if lag, err := s.subs.Lag(r.Context(), sub.Name); err == nil {
		j.NextOffset, j.HighWatermark, j.Lag = lag.NextOffset, lag.HighWatermark, lag.Events
	}
	return j
}

// heldJSON is what holds back the keys of sub, for the list and a get;
// nil for an unordered subscription.
func (s *Server) heldJSON(r *http.Request, sub delivery.Subscription) (*api.SubscriptionHeld, error) {
	if sub.OrderBy == "" {
		return nil, nil
	}
	h, err := s.subs.Held(r.Context(), sub)
	if err != nil {
		return nil, err
	}
	j := &api.SubscriptionHeld{Keys: h.Keys}
	if !h.Oldest.IsZero() {
		j.OldestAt = &h.Oldest
	}
	return j, nil
}

func (s *Server) createSubscription(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name         *string           `json:"name"`
		Source       *string           `json:"source"`
		Types        []string          `json:"types"`
		Metadata     map[string]string `json:"metadata"`
		Inbox        string            `json:"inbox"`
		Start        string            `json:"start"`
		StartOffset  int64             `json:"start_offset"`
		StartTime    string            `json:"start_time"`
		Target       string            `json:"target"`
		OrderBy      string            `json:"order_by"`
		OnDeadLetter string            `json:"on_dead_letter"`
		endpointRequest
	}
	if !decodeBody(w, r, &req, false) {
		return
	}
	var ep delivery.Endpoint
	secret, _, ok := req.endpointRequest.apply(w, &ep)
	if !ok {
		return
	}
	switch {
	case req.Name == nil:
		writeError(w, api.CodeMissingField, "name: required")
		return
	case req.Source == nil:
		writeError(w, api.CodeMissingField, "source: required")
		return
	}
	if !checkName(w, "name", *req.Name) || !checkName(w, "source", *req.Source) ||
		(req.Inbox != "" && !checkName(w, "inbox", req.Inbox)) ||
		!checkAPIText(w, "target", req.Target, maxTargetLen, true) {
		return
	}
	if len(req.Types) > maxTypes {
		writeError(w, api.CodeInvalidField, "types: %d patterns, at most %d", len(req.Types), maxTypes)
		return
	}
	for _, t := range req.Types {
		if !checkAPIText(w, "types", t, maxTypeLen, false) {
			return
		}
	}
	if len(req.Metadata) > maxMetadata {
		writeError(w, api.CodeInvalidField, "metadata: %d keys, at most %d", len(req.Metadata), maxMetadata)
		return
	}
	for k, v := range req.Metadata {
		if !checkAPIText(w, "metadata key", k, maxMetadataKey, false) || !checkAPIText(w, "metadata "+strconv.Quote(k), v, maxMetadataValue, true) {
			return
		}
	}
	sub := delivery.Subscription{Name: *req.Name, Source: *req.Source, Types: req.Types, Metadata: req.Metadata, Inbox: req.Inbox,
		Start: stream.Start{Policy: req.Start, Offset: req.StartOffset}, Target: req.Target, Endpoint: ep,
		OrderBy: req.OrderBy, OnDeadLetter: req.OnDeadLetter}
	if secret != nil && *secret != "" {
		sub.Secrets = []delivery.Secret{{Key: *secret}}
	}
	if req.StartTime != "" {
		t, err := time.Parse(time.RFC3339Nano, req.StartTime)
		if err != nil {
			writeError(w, api.CodeInvalidField, "start_time %q: want an RFC 3339 time such as 2026-11-21T10:00:00Z", req.StartTime)
			return
		}
		sub.Start.Time = t
	}
	if req.StartOffset != 0 && req.Start != stream.StartAtOffset {
		start := req.Start
		if start == "" {
			start = "latest, the default"
		}
		writeError(w, api.CodeInvalidField, "start_offset is for start at_offset, not %s", start)
		return
	}
	if req.StartTime != "" && req.Start != stream.StartAtTime {
		writeError(w, api.CodeInvalidField, "start_time is for start at_time, not %q", req.Start)
		return
	}
	got, created, err := s.subs.Create(r.Context(), sub)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.subscriptionJSON(r, got))
}

func (s *Server) listSubscriptions(w http.ResponseWriter, r *http.Request) {
	subs, err := s.subs.Subscriptions(r.Context())
	if err != nil {
		s.writeErr(w, err)
		return
	}
	counts, err := s.subs.SubscriptionCounts(r.Context())
	if err != nil {
		s.writeErr(w, err)
		return
	}
	out := make([]api.Subscription, 0, len(subs))
	for _, sub := range subs {
		j := s.subscriptionJSON(r, sub)
		j.Counts = countsJSON(sub, counts)
		if j.Held, err = s.heldJSON(r, sub); err != nil {
			s.writeErr(w, err)
			return
		}
		out = append(out, j)
	}
	writeJSON(w, http.StatusOK, api.SubscriptionList{Subscriptions: out})
}

func (s *Server) getSubscription(w http.ResponseWriter, r *http.Request) {
	if !checkName(w, "subscription", r.PathValue("name")) {
		return
	}
	sub, err := s.subs.Subscription(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeErr(w, err)
		return
	}
	counts, err := s.subs.SubscriptionCounts(r.Context())
	if err != nil {
		s.writeErr(w, err)
		return
	}
	j := s.subscriptionJSON(r, sub)
	j.Counts = countsJSON(sub, counts)
	if j.Held, err = s.heldJSON(r, sub); err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, j)
}

// patchSubscription changes what may change of a subscription: its
// target ("target": URL, or null for none) and its endpoint's settings
// (each absent one stays, null resets it). The rest defines what it reads
// and is fixed: create another subscription for another definition.
func (s *Server) patchSubscription(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Target       json.RawMessage `json:"target"` // null stays "null": absent is empty
		OnDeadLetter *string         `json:"on_dead_letter"`
		endpointRequest
	}
	if !checkName(w, "subscription", r.PathValue("name")) || !decodeBody(w, r, &req, false) {
		return
	}
	if len(req.Target) == 0 && !req.endpointRequest.any() && req.OnDeadLetter == nil {
		writeError(w, api.CodeMissingField, "target: required (a URL, or null for none), an endpoint setting or on_dead_letter (docs/API.md)")
		return
	}
	change := delivery.Change{OnDeadLetter: req.OnDeadLetter}
	if len(req.Target) > 0 {
		var target *string
		if err := json.Unmarshal(req.Target, &target); err != nil {
			writeError(w, api.CodeInvalidJSON, "field \"target\": want a string or null")
			return
		}
		if target != nil && *target == "" {
			writeError(w, api.CodeInvalidField, "target: empty: give a URL, or null to remove the target")
			return
		}
		if target != nil && !checkAPIText(w, "target", *target, maxTargetLen, false) {
			return
		}
		t := ptrValue(target)
		change.Target = &t
	}
	name := r.PathValue("name")
	if req.endpointRequest.any() {
		sub, err := s.subs.Subscription(r.Context(), name)
		if err != nil {
			s.writeErr(w, err)
			return
		}
		ep := sub.Endpoint
		secret, overlap, ok := req.endpointRequest.apply(w, &ep)
		if !ok {
			return
		}
		change.Endpoint, change.Secret, change.SecretOverlap = &ep, secret, overlap
	}
	if _, err := s.subs.Update(r.Context(), name, change); err != nil {
		s.writeErr(w, err)
		return
	}
	s.getSubscription(w, r)
}

func ptrValue[T any](p *T) T {
	var v T
	if p != nil {
		v = *p
	}
	return v
}

func (s *Server) deleteSubscription(w http.ResponseWriter, r *http.Request) {
	if !checkName(w, "subscription", r.PathValue("name")) {
		return
	}
	if err := s.subs.Delete(r.Context(), r.PathValue("name")); err != nil {
		s.writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// streamJSON is st in the API.
func (s *Server) streamJSON(r *http.Request, st stream.Stream) (api.Stream, error) {
	stats, err := s.streams.Stats(r.Context(), st.ID)
	if err != nil {
		return api.Stream{}, err
	}
	j := api.Stream{Stream: st.ID, Source: st.SourceID, Backend: st.Backend, Events: stats.Events,
		FirstOffset: stats.FirstOffset, LastOffset: stats.LastOffset, CreatedAt: st.CreatedAt}
	if !stats.FirstStoredAt.IsZero() {
		j.FirstStoredAt, j.LastStoredAt = &stats.FirstStoredAt, &stats.LastStoredAt
	}
	return j, nil
}

func (s *Server) listStreams(w http.ResponseWriter, r *http.Request) {
	streams, err := s.streams.Streams(r.Context())
	if err != nil {
		s.writeErr(w, err)
		return
	}
	out := []api.Stream{}
	for _, st := range streams {
		j, err := s.streamJSON(r, st)
		if err != nil {
			s.writeErr(w, err)
			return
		}
		out = append(out, j)
	}
	writeJSON(w, http.StatusOK, api.StreamList{Streams: out})
}

func (s *Server) getStream(w http.ResponseWriter, r *http.Request) {
	if !checkName(w, "stream", r.PathValue("stream")) {
		return
	}
	streams, err := s.streams.Streams(r.Context())
	if err != nil {
		s.writeErr(w, err)
		return
	}
	for _, st := range streams {
		if st.ID == r.PathValue("stream") {
			j, err := s.streamJSON(r, st)
			if err != nil {
				s.writeErr(w, err)
				return
			}
			writeJSON(w, http.StatusOK, j)
			return
		}
	}
	writeError(w, api.CodeNotFound, "no stream %q", r.PathValue("stream"))
}

func (s *Server) listConsumers(w http.ResponseWriter, r *http.Request) {
	subs, err := s.subs.Subscriptions(r.Context())
	if err != nil {
		s.writeErr(w, err)
		return
	}
	out := []api.Consumer{}
	for _, sub := range subs {
		c, err := s.streams.Consumer(r.Context(), sub.Name)
		if errors.Is(err, stream.ErrConsumerNotFound) {
			continue // being created or deleted
		}
		if err != nil {
			s.writeErr(w, err)
			return
		}
		lag, err := s.subs.Lag(r.Context(), sub.Name)
		if err != nil {
			s.writeErr(w, err)
			return
		}
		out = append(out, api.Consumer{Consumer: c.ID, Subscription: sub.Name, Stream: c.StreamID, NextOffset: lag.NextOffset,
			HighWatermark: lag.HighWatermark, Lag: lag.Events, UpdatedAt: c.UpdatedAt})
	}
	writeJSON(w, http.StatusOK, api.ConsumerList{Consumers: out})
}

// countsJSON is the item counts of sub in the API: zero when it has no
// item.
func countsJSON(sub delivery.Subscription, counts map[string]delivery.InboxCounts) *api.SubscriptionCounts {
	c := counts[sub.UID]
	return &api.SubscriptionCounts{Inbox: sub.Inbox, Pending: c.Pending, Processing: c.Processing, Completed: c.Completed, Failed: c.Failed}
}

func (s *Server) listInboxes(w http.ResponseWriter, r *http.Request) {
	counts, err := s.inboxes.Inboxes(r.Context())
	if err != nil {
		s.writeErr(w, err)
		return
	}
	out := make([]api.InboxCounts, 0, len(counts))
	for _, c := range counts {
		j := api.InboxCounts{Inbox: c.Inbox, Pending: c.Pending, Processing: c.Processing, Completed: c.Completed, Failed: c.Failed}
		if !c.OldestPending.IsZero() {
			at := c.OldestPending
			j.OldestPendingAt = &at
		}
		out = append(out, j)
	}
	writeJSON(w, http.StatusOK, api.InboxList{Inboxes: out})
}

// itemsJSON is items in the API.
func itemsJSON(items []delivery.Item) []api.Item {
	out := make([]api.Item, len(items))
	for i, it := range items {
		handle := replyto.Of(it.DeliveryHandle, it.Metadata) // a device's is derived from its metadata
		if len(handle) == 0 {
			handle = json.RawMessage("null")
		}
		out[i] = api.Item{ID: it.ID, Inbox: it.Inbox, Subscription: it.Subscription, Stream: it.Stream, Offset: it.Offset,
			StreamEventID: it.StreamEventID, EventID: it.EventID, Type: it.Type, OccurredAt: it.OccurredAt, SourceSequence: it.SourceSequence, StoredAt: it.StoredAt,
			Metadata: it.Metadata, Payload: it.Payload, DeliveryHandle: handle, State: it.State, Attempts: it.Attempts,
			NextAttemptAt: it.NextAttemptAt, LeaseExpiresAt: it.LeaseExpiresAt, LastError: it.LastError,
			LastErrorPast: it.LastError != nil && it.State == delivery.StateCompleted, CreatedAt: it.CreatedAt,
			UpdatedAt: it.UpdatedAt, FailedAt: it.FailedAt, ReplayedAt: it.ReplayedAt, Replays: it.Replays, OrderKey: it.OrderKey}
	}
	return out
}

// maxListLimit bounds a page of items.
const maxListLimit = 1000

func (s *Server) listItems(w http.ResponseWriter, r *http.Request) {
	if !checkName(w, "inbox", r.PathValue("inbox")) {
		return
	}
	q := r.URL.Query()
	state := q.Get("state")
	if state != "" && !delivery.ValidState(state) {
		writeError(w, api.CodeInvalidField, "state %q: use pending, processing, completed or failed", state)
		return
	}
	limit, ok := intParam(w, q.Get("limit"), "limit", 100, 1, maxListLimit)
	if !ok {
		return
	}
	after, ok := intParam(w, q.Get("after"), "after", 0, 0, 1<<62)
	if !ok {
		return
	}
	items, err := s.inboxes.List(r.Context(), r.PathValue("inbox"), state, after, int(limit))
	if err != nil {
		s.writeErr(w, err)
		return
	}
	next := int64(0)
	if len(items) == int(limit) {
		next = items[len(items)-1].ID
	}
	writeJSON(w, http.StatusOK, api.ItemPage{Items: itemsJSON(items), NextAfter: next})
}

// intParam parses a query parameter (def when empty) in [lo, hi], or
// answers 400 naming it.
func intParam(w http.ResponseWriter, v, name string, def, lo, hi int64) (int64, bool) {
	if v == "" {
		return def, true
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		writeError(w, api.CodeInvalidField, "%s %q: want a whole number from %d to %d", name, v, lo, hi)
		return 0, false
	}
	return n, true
}

func (s *Server) getItem(w http.ResponseWriter, r *http.Request) {
	inbox, id, ok := itemPath(w, r)
	if !ok {
		return
	}
	it, err := s.inboxes.Item(r.Context(), inbox, id)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, itemsJSON([]delivery.Item{it})[0])
}

// maxLease bounds the items of one lease.
const maxLease = 1000

func (s *Server) leaseItems(w http.ResponseWriter, r *http.Request) {
	var req api.LeaseRequest
	if !checkName(w, "inbox", r.PathValue("inbox")) || !decodeBody(w, r, &req, true) {
		return
	}
	n := 10
	if req.Max != nil {
		n = *req.Max
	}
	if n < 1 || n > maxLease {
		writeError(w, api.CodeInvalidField, "max %d: want 1 to %d", n, maxLease)
		return
	}
	visibility, ok := durationField(w, "visibility_timeout", req.VisibilityTimeout, delivery.DefaultVisibilityTimeout, time.Millisecond, MaxVisibilityTimeout)
	if !ok {
		return
	}
	wait, ok := durationField(w, "wait", req.Wait, 0, 0, delivery.MaxWait)
	if !ok {
		return
	}
	ctx := r.Context()
	s.mu.Lock()
	if s.stopping != nil { // a shutdown ends the wait: the lease answers what it has
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(s.stopping, cancel)()
	}
	s.mu.Unlock()
	l, err := s.inboxes.Lease(ctx, r.PathValue("inbox"), n, visibility, wait)
	if err != nil {
		if r.Context().Err() != nil {
			return // the client left
		}
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Lease{Lease: l.Token, ExpiresAt: l.ExpiresAt, Items: itemsJSON(l.Items)})
}

// settleRequest is api.SettleRequest with its lease told apart: absent
// (an operator settles) or given, when it must not be empty: a runtime
// whose token is blank must not settle as an operator.
type settleRequest struct {
	api.SettleRequest
	Lease *string `json:"lease,omitempty"`
}

// decodeSettle reads the body of an ack or nack, or answers 400.
func decodeSettle(w http.ResponseWriter, r *http.Request, req *settleRequest) bool {
	if !checkName(w, "inbox", r.PathValue("inbox")) || !decodeBody(w, r, req, false) || !checkIDs(w, req.IDs) {
		return false
	}
	if req.Lease != nil {
		if *req.Lease == "" {
			writeError(w, api.CodeInvalidField, "lease: empty: give the lease's token, or leave lease out to settle as an operator")
			return false
		}
		req.SettleRequest.Lease = *req.Lease
	}
	return checkAPIText(w, "lease", req.SettleRequest.Lease, maxLeaseTokenLen, true) && checkAPIText(w, "reason", req.Reason, maxReasonLen, true)
}

func (s *Server) ackItems(w http.ResponseWriter, r *http.Request) {
	var req settleRequest
	if !decodeSettle(w, r, &req) {
		return
	}
	if req.Delay != nil || req.Reason != "" || req.Dead {
		writeError(w, api.CodeUnknownField, "delay, reason and dead are for nack, not ack")
		return
	}
	res, err := s.inboxes.Ack(r.Context(), r.PathValue("inbox"), req.IDs, req.SettleRequest.Lease)
	s.writeResults(w, res, err)
}

func (s *Server) nackItems(w http.ResponseWriter, r *http.Request) {
	var req settleRequest
	if !decodeSettle(w, r, &req) {
		return
	}
	if req.Dead {
		if req.Delay != nil {
			writeError(w, api.CodeInvalidField, "delay: a dead letter has no next attempt (dead is true)")
			return
		}
		res, err := s.inboxes.NackDead(r.Context(), r.PathValue("inbox"), req.IDs, req.SettleRequest.Lease, req.Reason)
		s.writeResults(w, res, err)
		return
	}
	delay, ok := durationField(w, "delay", req.Delay, 0, 0, MaxNackDelay)
	if !ok {
		return
	}
	res, err := s.inboxes.Nack(r.Context(), r.PathValue("inbox"), req.IDs, req.SettleRequest.Lease, delay, req.Reason)
	s.writeResults(w, res, err)
}

// extendItems extends the lease of items a runtime holds: 200 with a
// result per item, lease_lost for one whose lease ended (expired, settled
// or another's).
func (s *Server) extendItems(w http.ResponseWriter, r *http.Request) {
	var req api.ExtendRequest
	if !checkName(w, "inbox", r.PathValue("inbox")) || !decodeBody(w, r, &req, false) || !checkIDs(w, req.IDs) {
		return
	}
	if req.Lease == "" {
		writeError(w, api.CodeMissingField, "lease: required: the token of the lease the items hold")
		return
	}
	if !checkAPIText(w, "lease", req.Lease, maxLeaseTokenLen, false) {
		return
	}
	visibility, ok := durationField(w, "visibility_timeout", req.VisibilityTimeout, delivery.DefaultVisibilityTimeout, time.Millisecond, MaxVisibilityTimeout)
	if !ok {
		return
	}
	res, expires, err := s.inboxes.Extend(r.Context(), r.PathValue("inbox"), req.IDs, req.Lease, visibility)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Extension{ExpiresAt: expires, Items: itemResults(res)})
}

// maxSettle bounds the ids of one ack or nack.
const maxSettle = 1000

func checkIDs(w http.ResponseWriter, ids []int64) bool {
	if len(ids) == 0 {
		writeError(w, api.CodeMissingField, "ids: give the ids of one or more items")
		return false
	}
	if len(ids) > maxSettle {
		writeError(w, api.CodeInvalidField, "ids: %d ids, at most %d per request", len(ids), maxSettle)
		return false
	}
	for _, id := range ids {
		if id < 1 {
			writeError(w, api.CodeInvalidField, "ids: %d is not an item id", id)
			return false
		}
	}
	return true
}

func (s *Server) writeResults(w http.ResponseWriter, res []delivery.Result, err error) {
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Results{Items: itemResults(res)})
}

// itemResults is res in the API.
func itemResults(res []delivery.Result) []api.ItemResult {
	out := make([]api.ItemResult, len(res))
	for i, r := range res {
		out[i] = api.ItemResult{ID: r.ID, State: r.State}
		if r.Err != nil {
			code := api.CodeInvalidState
			switch {
			case errors.Is(r.Err, delivery.ErrNotFound):
				code = api.CodeNotFound
			case errors.Is(r.Err, delivery.ErrLeaseLost):
				code = api.CodeLeaseLost
			}
			out[i].Error = &api.Error{Code: code, Message: r.Err.Error()}
		}
	}
	return out
}
