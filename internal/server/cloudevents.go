package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/tracing"
	"github.com/postbox-events/postbox/stream"
)

// CloudEvents over HTTP (https://github.com/cloudevents/spec, version 1.0)
// on POST /webhooks and /webhooks/{source}:
//
//   - binary mode: the attributes are ce-* headers, the body is the data
//     exactly as received (it must be JSON, as every webhook's body);
//   - structured mode: Content-Type application/cloudevents+json, the body
//     is the event as a JSON object; the stored payload is the bytes of its
//     "data" member as received (data_base64 is decoded and must hold
//     JSON; no data stores null).
//
// The spec makes source and id together unique, so both are the
// idempotency key (cloudEventKey): the same id from two sources is two
// events. type is the event's type, time (when given) when it occurred;
// every attribute, source included, is kept in the event's metadata under
// "cloudevents". A CloudEvent without specversion, id,
// source or type is refused with 400 naming the attribute. The batched
// mode (application/cloudevents-batch+json) is refused with 415.
//
// Only sources that take identity from the request (no signing secret, no
// provider preset) read CloudEvents: a signed source's identity is what
// the signature covers, a provider's where the provider puts it.

// ceMediaType is the Content-Type of structured mode.
const (
	ceMediaType      = "application/cloudevents+json"
	ceBatchMediaType = "application/cloudevents-batch+json"
	ceSpecVersion    = "1.0"
)

// cloudEvent is what a webhook's CloudEvent attributes give it.
type cloudEvent struct {
	id, source, typ string
	time            time.Time       // zero without a time attribute
	attrs           map[string]any  // every attribute but data: kept in the metadata
	data            json.RawMessage // the payload
	trace           [2]string       // traceparent, tracestate extension attributes
}

// maxCESourceBytes bounds a CloudEvent's source attribute (a URI
// reference, which the spec does not bound).
const maxCESourceBytes = 4096

// cloudEventKey is the idempotency key of the CloudEvent (source, id):
// the JSON array ["source","id"] (as encoding/json writes it, but with
// <, > and & as they are), or, when that is longer than maxKeyLength,
// "cloudevents-sha256:" and the hex SHA-256 of that array. Each string is
// quoted and escaped, so two different pairs never make the same key,
// and no key of one form is of the other (an array starts with "[").
func cloudEventKey(source, id string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode([2]string{source, id})
	k := bytes.TrimSuffix(b.Bytes(), []byte("\n"))
	if len(k) <= maxKeyLength {
		return string(k)
	}
	sum := sha256.Sum256(k)
	return cloudEventsDigestPrefix + hex.EncodeToString(sum[:])
}

// cloudEventsDigestPrefix starts the key of a CloudEvent whose source and
// id are too long for an array key.
const cloudEventsDigestPrefix = "cloudevents-sha256:"

// ceError is a CloudEvent the request is not: its code (which says the
// HTTP status) and message.
type ceError struct {
	code    api.Code
	message string
}

func (e *ceError) Error() string { return e.message }

func ceInvalid(code api.Code, format string, args ...any) *ceError {
	return &ceError{code: code, message: fmt.Sprintf(format, args...)}
}

// isCloudEvent reports whether a request carries a CloudEvent, in binary
// (a ce- header) or structured mode (its media type).
func isCloudEvent(r *http.Request) bool {
	if ct := r.Header.Get("Content-Type"); ct != "application/json" { // the common case, parsed without allocating
		if mt, _, _ := mime.ParseMediaType(ct); mt == ceMediaType || mt == ceBatchMediaType {
			return true
		}
	}
	for name := range r.Header {
		if len(name) > 3 && strings.EqualFold(name[:3], "ce-") {
			return true
		}
	}
	return false
}

// parseCloudEvent reads the CloudEvent of a request whose body (valid
// JSON) was read; maxType bounds its type as every webhook's.
func parseCloudEvent(r *http.Request, body []byte, maxType int) (*cloudEvent, *ceError) {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var ce *cloudEvent
	var err *ceError
	switch mt {
	case ceBatchMediaType:
		return nil, &ceError{code: api.CodeUnsupportedMediaType,
			message: "CloudEvents batched mode is not supported: send one event per request, in binary or structured mode"}
	case ceMediaType:
		ce, err = structuredCloudEvent(body)
	default:
		ce, err = binaryCloudEvent(r, body)
	}
	if err != nil {
		return nil, err
	}
	return ce, ce.check(maxType)
}

// binaryCloudEvent reads the ce-* headers; the body is the data.
func binaryCloudEvent(r *http.Request, body []byte) (*cloudEvent, *ceError) {
	ce := &cloudEvent{attrs: map[string]any{}, data: body}
	for name, values := range r.Header {
		if len(name) <= 3 || !strings.EqualFold(name[:3], "ce-") {
			continue
		}
		attr := strings.ToLower(name[3:])
		if len(values) > 1 {
			return nil, ceInvalid(api.CodeInvalidField, "CloudEvents attribute %s: the ce-%s header is given %d times", attr, attr, len(values))
		}
		ce.attrs[attr] = values[0]
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		ce.attrs["datacontenttype"] = ct
	}
	return ce, nil
}

// structuredCloudEvent reads an application/cloudevents+json body.
func structuredCloudEvent(body []byte) (*cloudEvent, *ceError) {
	var fields map[string]json.RawMessage
	if code, msg, ok := decodeStrict(body, &fields); !ok {
		return nil, ceInvalid(code, "a structured CloudEvent is a JSON object: %s", msg)
	}
	ce := &cloudEvent{attrs: map[string]any{}}
	for name, raw := range fields {
		switch name {
		case "data":
			ce.data = raw
			continue
		case "data_base64":
			var s string
			if json.Unmarshal(raw, &s) != nil {
				return nil, ceInvalid(api.CodeInvalidField, "CloudEvents data_base64: must be a string")
			}
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return nil, ceInvalid(api.CodeInvalidField, "CloudEvents data_base64: %v", err)
			}
			if !postbox.Valid(b) {
				return nil, &ceError{code: api.CodeUnsupportedMediaType,
					message: "CloudEvents data_base64: postbox stores JSON data; this is not JSON"}
			}
			ce.data = b
			continue
		}
		var v any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if dec.Decode(&v) != nil {
			return nil, ceInvalid(api.CodeInvalidField, "CloudEvents attribute %s: not valid JSON", name)
		}
		switch v.(type) {
		case string, json.Number, bool, nil:
		default:
			return nil, ceInvalid(api.CodeInvalidField, "CloudEvents attribute %s: must be a string, number or boolean", name)
		}
		if v != nil {
			ce.attrs[name] = v
		}
	}
	if _, ok := fields["data"]; ok {
		if _, ok := fields["data_base64"]; ok {
			return nil, ceInvalid(api.CodeInvalidField, "CloudEvents data and data_base64: give one of them")
		}
	}
	if ce.data == nil {
		ce.data = json.RawMessage("null")
	}
	return ce, nil
}

// check validates the required attributes and sets id, type and time.
func (ce *cloudEvent) check(maxType int) *ceError {
	str := func(name string) (string, *ceError) {
		v, ok := ce.attrs[name]
		if !ok {
			return "", ceInvalid(api.CodeMissingField, "CloudEvents attribute %s: required", name)
		}
		s, ok := v.(string)
		if !ok {
			return "", ceInvalid(api.CodeInvalidField, "CloudEvents attribute %s: must be a string", name)
		}
		if strings.TrimSpace(s) == "" {
			return "", ceInvalid(api.CodeMissingField, "CloudEvents attribute %s: required, and empty", name)
		}
		return s, nil
	}
	spec, err := str("specversion")
	if err != nil {
		return err
	}
	if spec != ceSpecVersion {
		return ceInvalid(api.CodeInvalidField, "CloudEvents attribute specversion: %q is not supported (postbox reads %s)", spec, ceSpecVersion)
	}
	if ce.id, err = str("id"); err != nil {
		return err
	}
	if e := checkText("CloudEvents attribute id", ce.id, maxKeyLength); e != nil {
		return ceInvalid(api.CodeInvalidField, "%v", e)
	}
	if ce.source, err = str("source"); err != nil {
		return err
	}
	if e := checkText("CloudEvents attribute source", ce.source, maxCESourceBytes); e != nil {
		return ceInvalid(api.CodeInvalidField, "%v", e)
	}
	if ce.typ, err = str("type"); err != nil {
		return err
	}
	if e := checkText("CloudEvents attribute type", ce.typ, maxType); e != nil {
		return ceInvalid(api.CodeInvalidField, "%v", e)
	}
	if v, ok := ce.attrs["time"]; ok {
		s, _ := v.(string)
		t, e := time.Parse(time.RFC3339Nano, s)
		if e != nil {
			return ceInvalid(api.CodeInvalidField, "CloudEvents attribute time: %q is not an RFC 3339 timestamp", s)
		}
		ce.time = t
	}
	if v, ok := ce.attrs["datacontenttype"].(string); ok && v != "" {
		if mt, _, e := mime.ParseMediaType(v); e != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return &ceError{code: api.CodeUnsupportedMediaType,
				message: fmt.Sprintf("CloudEvents datacontenttype %q: postbox stores JSON data; send application/json", v)}
		}
	}
	// The distributed tracing extension.
	ce.trace[0], _ = ce.attrs["traceparent"].(string)
	ce.trace[1], _ = ce.attrs["tracestate"].(string)
	return nil
}

// The trace context's headers in canonical form, so that looking them up
// does not canonicalise (and allocate) each time.
var (
	traceParentHeader = http.CanonicalHeaderKey(tracing.HeaderTraceParent)
	traceStateHeader  = http.CanonicalHeaderKey(tracing.HeaderTraceState)
)

// webhookTrace returns the trace context a webhook brings: its traceparent
// and tracestate headers, else a CloudEvent's distributed tracing
// extension. One that is not valid is ignored, as W3C Trace Context asks
// of a receiver (the webhook then starts no trace of its own).
func webhookTrace(r *http.Request, ce *cloudEvent) (traceparent, tracestate string) {
	traceparent, tracestate = r.Header.Get(traceParentHeader), r.Header.Get(traceStateHeader)
	if traceparent == "" && ce != nil {
		traceparent, tracestate = ce.trace[0], ce.trace[1]
	}
	if traceparent == "" || postbox.CheckTraceParent(traceparent) != nil {
		return "", ""
	}
	if postbox.CheckTraceState(tracestate) != nil {
		tracestate = ""
	}
	return traceparent, tracestate
}

// withWebhookExtras adds a webhook's trace context and CloudEvent
// attributes to the metadata webhookMetadata made.
func withWebhookExtras(meta json.RawMessage, traceparent, tracestate string, ce *cloudEvent) json.RawMessage {
	if traceparent == "" && ce == nil {
		return meta
	}
	var m map[string]any
	if json.Unmarshal(meta, &m) != nil {
		m = map[string]any{}
	}
	if traceparent != "" {
		m[tracing.HeaderTraceParent] = traceparent
		if tracestate != "" {
			m[tracing.HeaderTraceState] = tracestate
		}
	}
	if ce != nil {
		m["cloudevents"] = ce.attrs
	}
	out, _ := json.Marshal(m)
	return out
}

// Before postbox keyed CloudEvents by source and id, their key was the
// id alone. A store that held webhooks then (markerCloudEventsByID) may
// hold such events, and a CloudEvent sent again after the upgrade is
// looked for under its id too, so that it stays the duplicate it is.
const (
	markerCloudEventsBySource = "cloudevents-keyed-by-source"
	markerCloudEventsByID     = "cloudevents-keyed-by-id-before"
)

// cloudEventsKeys records, the first time this version runs on a store,
// whether the store is older (it made its default webhook source before),
// and sets s.wh.ceByID from the record.
func (s *Server) cloudEventsKeys(ctx context.Context) error {
	err := s.delivery.Once(ctx, markerCloudEventsBySource, func(ctx context.Context) error {
		older, err := s.delivery.Marked(ctx, markerWebhookSource)
		if err != nil || !older {
			return err
		}
		return s.delivery.Once(ctx, markerCloudEventsByID, func(context.Context) error { return nil })
	})
	if err != nil {
		return fmt.Errorf("cloudevents keys: %w", err)
	}
	byID, err := s.delivery.Marked(ctx, markerCloudEventsByID)
	if err != nil {
		return fmt.Errorf("cloudevents keys: %w", err)
	}
	s.wh.ceByID.Store(byID)
	return nil
}

// cloudEventByID returns the event of source stored under ce's id alone
// by an older postbox, when it is this CloudEvent (its source is ce's).
func (s *Server) cloudEventByID(ctx context.Context, source string, ce *cloudEvent) (stream.StoredEvent, bool, error) {
	prev, err := s.streams.Lookup(ctx, source, ce.id, "")
	if errors.Is(err, stream.ErrNotFound) || errors.Is(err, stream.ErrStreamNotFound) {
		return stream.StoredEvent{}, false, nil
	}
	if err != nil {
		return stream.StoredEvent{}, false, err
	}
	var meta struct {
		CE struct {
			ID     string `json:"id"`
			Source string `json:"source"`
		} `json:"cloudevents"`
	}
	if json.Unmarshal(prev.Metadata, &meta) != nil || meta.CE.ID != ce.id || meta.CE.Source != ce.source {
		return stream.StoredEvent{}, false, nil // another source's, or a webhook's key
	}
	return prev, true, nil
}

// storedAgain is what appending ev again under prev's key reports: a
// duplicate when its type and payload are prev's (the payload's
// whitespace aside, as for every webhook), else the conflict it is.
func storedAgain(prev stream.StoredEvent, ev stream.Event) stream.AppendResult {
	switch {
	case prev.Type != ev.Type:
		return stream.AppendResult{Err: &stream.ConflictError{Field: stream.FieldType}}
	case !bytes.Equal(postbox.AppendCompact(nil, prev.Payload), postbox.AppendCompact(nil, ev.Payload)):
		return stream.AppendResult{Err: &stream.ConflictError{Field: stream.FieldPayload}}
	}
	return stream.AppendResult{Offset: prev.Offset, StoredAt: prev.StoredAt, Duplicate: true}
}
