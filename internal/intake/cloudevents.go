package intake

import (
	"bytes"
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
	"github.com/postbox-events/postbox/internal/schedule"
	"github.com/postbox-events/postbox/internal/tracing"
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

// CloudEvent is what a webhook's CloudEvent attributes give it.
type CloudEvent struct {
	ID, Source, Type string
	Time             time.Time // zero without a time attribute

	attrs map[string]any  // every attribute but data: kept in the metadata
	data  json.RawMessage // the payload
	trace [2]string       // traceparent, tracestate extension attributes
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
func parseCloudEvent(r *http.Request, body []byte, maxType int) (*CloudEvent, *Refusal) {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var ce *CloudEvent
	var ref *Refusal
	switch mt {
	case ceBatchMediaType:
		return nil, refuse(api.CodeUnsupportedMediaType,
			"CloudEvents batched mode is not supported: send one event per request, in binary or structured mode")
	case ceMediaType:
		ce, ref = structuredCloudEvent(body)
	default:
		ce, ref = binaryCloudEvent(r, body)
	}
	if ref != nil {
		return nil, ref
	}
	return ce, ce.check(maxType)
}

// binaryCloudEvent reads the ce-* headers; the body is the data.
func binaryCloudEvent(r *http.Request, body []byte) (*CloudEvent, *Refusal) {
	ce := &CloudEvent{attrs: map[string]any{}, data: body}
	for name, values := range r.Header {
		if len(name) <= 3 || !strings.EqualFold(name[:3], "ce-") {
			continue
		}
		attr := strings.ToLower(name[3:])
		if len(values) > 1 {
			return nil, refuse(api.CodeInvalidField, "CloudEvents attribute %s: the ce-%s header is given %d times", attr, attr, len(values))
		}
		ce.attrs[attr] = values[0]
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		ce.attrs["datacontenttype"] = ct
	}
	return ce, nil
}

// structuredCloudEvent reads an application/cloudevents+json body.
func structuredCloudEvent(body []byte) (*CloudEvent, *Refusal) {
	fields, msg := objectMembers(body)
	if msg != "" {
		return nil, refuse(api.CodeInvalidJSON, "a structured CloudEvent is a JSON object: %s", msg)
	}
	ce := &CloudEvent{attrs: map[string]any{}}
	for name, raw := range fields {
		switch name {
		case "data":
			ce.data = raw
			continue
		case "data_base64":
			var s string
			if json.Unmarshal(raw, &s) != nil {
				return nil, refuse(api.CodeInvalidField, "CloudEvents data_base64: must be a string")
			}
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return nil, refuse(api.CodeInvalidField, "CloudEvents data_base64: %v", err)
			}
			if !postbox.Valid(b) {
				return nil, refuse(api.CodeUnsupportedMediaType, "CloudEvents data_base64: postbox stores JSON data; this is not JSON")
			}
			ce.data = b
			continue
		}
		var v any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if dec.Decode(&v) != nil {
			return nil, refuse(api.CodeInvalidField, "CloudEvents attribute %s: not valid JSON", name)
		}
		switch v.(type) {
		case string, json.Number, bool, nil:
		default:
			return nil, refuse(api.CodeInvalidField, "CloudEvents attribute %s: must be a string, number or boolean", name)
		}
		if v != nil {
			ce.attrs[name] = v
		}
	}
	if _, ok := fields["data"]; ok {
		if _, ok := fields["data_base64"]; ok {
			return nil, refuse(api.CodeInvalidField, "CloudEvents data and data_base64: give one of them")
		}
	}
	if ce.data == nil {
		ce.data = json.RawMessage("null")
	}
	return ce, nil
}

// objectMembers returns the members of body, one valid JSON value, when
// it is an object whose names are each given once (null has none), else
// a message saying what it is instead, in the words of the operator
// API's errors on a body.
func objectMembers(body []byte) (map[string]json.RawMessage, string) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field == "" {
			return nil, "the body: want an object, got a JSON " + te.Value
		}
		return nil, "invalid JSON in the body" // valid JSON: not reached
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return fields, "" // null
	}
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, "invalid JSON in the body" // valid JSON: not reached
		}
		name, _ := t.(string)
		if seen[name] {
			return nil, fmt.Sprintf("field %q appears twice", name)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, "invalid JSON in the body"
		}
	}
	return fields, ""
}

// check validates the required attributes and sets ID, Source, Type and
// Time.
func (ce *CloudEvent) check(maxType int) *Refusal {
	str := func(name string) (string, *Refusal) {
		v, ok := ce.attrs[name]
		if !ok {
			return "", refuse(api.CodeMissingField, "CloudEvents attribute %s: required", name)
		}
		s, ok := v.(string)
		if !ok {
			return "", refuse(api.CodeInvalidField, "CloudEvents attribute %s: must be a string", name)
		}
		if strings.TrimSpace(s) == "" {
			return "", refuse(api.CodeMissingField, "CloudEvents attribute %s: required, and empty", name)
		}
		return s, nil
	}
	spec, ref := str("specversion")
	if ref != nil {
		return ref
	}
	if spec != ceSpecVersion {
		return refuse(api.CodeInvalidField, "CloudEvents attribute specversion: %q is not supported (postbox reads %s)", spec, ceSpecVersion)
	}
	if ce.ID, ref = str("id"); ref != nil {
		return ref
	}
	if e := CheckText("CloudEvents attribute id", ce.ID, maxKeyLength); e != nil {
		return refuse(api.CodeInvalidField, "%v", e)
	}
	if ce.Source, ref = str("source"); ref != nil {
		return ref
	}
	if e := CheckText("CloudEvents attribute source", ce.Source, maxCESourceBytes); e != nil {
		return refuse(api.CodeInvalidField, "%v", e)
	}
	if ce.Type, ref = str("type"); ref != nil {
		return ref
	}
	if e := CheckText("CloudEvents attribute type", ce.Type, maxType); e != nil {
		return refuse(api.CodeInvalidField, "%v", e)
	}
	if v, ok := ce.attrs["time"]; ok {
		s, _ := v.(string)
		t, e := time.Parse(time.RFC3339Nano, s)
		if e != nil {
			return refuse(api.CodeInvalidField, "CloudEvents attribute time: %q is not an RFC 3339 timestamp", s)
		}
		ce.Time = t
	}
	if v, ok := ce.attrs["datacontenttype"].(string); ok && v != "" {
		if mt, _, e := mime.ParseMediaType(v); e != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return refuse(api.CodeUnsupportedMediaType, "CloudEvents datacontenttype %q: postbox stores JSON data; send application/json", v)
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
func webhookTrace(r *http.Request, ce *CloudEvent) (traceparent, tracestate string) {
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
// attributes, and its delivery time (schedule.Key), to the metadata
// webhookMetadata made.
func withWebhookExtras(meta json.RawMessage, traceparent, tracestate string, ce *CloudEvent, deliverAt time.Time) json.RawMessage {
	if traceparent == "" && ce == nil && deliverAt.IsZero() {
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
	if !deliverAt.IsZero() {
		m[schedule.Key] = schedule.Format(deliverAt)
	}
	out, _ := json.Marshal(m)
	return out
}
