package intake_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/intake"
)

// binary is a CloudEvent in binary mode: its required attributes as ce-*
// headers, with extra ones ("" deletes one), and data as the body.
func binary(data string, extra map[string]string) webhook {
	h := map[string]string{"ce-specversion": "1.0", "ce-id": "evt-1", "ce-source": "/shop", "ce-type": "order.created"}
	for k, v := range extra {
		h[k] = v
	}
	return webhook{headers: h, body: data}
}

// structured is a CloudEvent in structured mode.
func structured(event string) webhook {
	return webhook{headers: map[string]string{"Content-Type": "application/cloudevents+json"}, body: event}
}

// TestParseCloudEventRefusals: a CloudEvent the request is not, in
// either mode, with its code and message.
func TestParseCloudEventRefusals(t *testing.T) {
	for _, c := range []struct {
		name string
		w    webhook
		code api.Code
		msg  string
	}{
		{"binary: no id", binary(`{}`, map[string]string{"ce-id": ""}), api.CodeMissingField, "CloudEvents attribute id: required"},
		{"binary: blank source", binary(`{}`, map[string]string{"ce-source": " "}), api.CodeMissingField, "CloudEvents attribute source: required, and empty"},
		{"binary: no type", binary(`{}`, map[string]string{"ce-type": ""}), api.CodeMissingField, "CloudEvents attribute type: required"},
		{"binary: no specversion", binary(`{}`, map[string]string{"ce-specversion": ""}), api.CodeMissingField, "CloudEvents attribute specversion: required"},
		{"binary: specversion 0.3", binary(`{}`, map[string]string{"ce-specversion": "0.3"}), api.CodeInvalidField,
			`CloudEvents attribute specversion: "0.3" is not supported (postbox reads 1.0)`},
		{"binary: id twice", binary(`{}`, map[string]string{"ce-id": "a\x00b"}), api.CodeInvalidField, "CloudEvents attribute id: the ce-id header is given 2 times"},
		{"binary: id too long", binary(`{}`, map[string]string{"ce-id": strings.Repeat("i", 256)}), api.CodeInvalidField, "CloudEvents attribute id: 256 bytes, at most 255"},
		{"binary: source too long", binary(`{}`, map[string]string{"ce-source": strings.Repeat("s", 4097)}), api.CodeInvalidField,
			"CloudEvents attribute source: 4097 bytes, at most 4096"},
		{"binary: type with a control character", binary(`{}`, map[string]string{"ce-type": "a\x7fb"}), api.CodeInvalidField,
			"CloudEvents attribute type: holds the control character U+007F"},
		{"binary: time", binary(`{}`, map[string]string{"ce-time": "yesterday"}), api.CodeInvalidField,
			`CloudEvents attribute time: "yesterday" is not an RFC 3339 timestamp`},
		{"binary: a +json content type but not JSON data", binary(`{`, map[string]string{"Content-Type": "application/vnd+json"}), api.CodeInvalidJSON, "the body is not valid JSON"},
		{"structured: an array", structured(`[1]`), api.CodeInvalidJSON, "a structured CloudEvent is a JSON object: the body: want an object, got a JSON array"},
		{"structured: a string", structured(`"x"`), api.CodeInvalidJSON, "a structured CloudEvent is a JSON object: the body: want an object, got a JSON string"},
		{"structured: null", structured(`null`), api.CodeMissingField, "CloudEvents attribute specversion: required"},
		{"structured: id twice", structured(`{"specversion":"1.0","id":"a","id":"b","source":"/s","type":"t"}`), api.CodeInvalidJSON,
			`a structured CloudEvent is a JSON object: field "id" appears twice`},
		{"structured: id a number", structured(`{"specversion":"1.0","id":1,"source":"/s","type":"t"}`), api.CodeInvalidField,
			"CloudEvents attribute id: must be a string"},
		{"structured: an object attribute", structured(`{"specversion":"1.0","id":"a","source":"/s","type":"t","ext":{}}`), api.CodeInvalidField,
			"CloudEvents attribute ext: must be a string, number or boolean"},
		{"structured: data and data_base64", structured(`{"specversion":"1.0","id":"a","source":"/s","type":"t","data":1,"data_base64":"MQ=="}`), api.CodeInvalidField,
			"CloudEvents data and data_base64: give one of them"},
		{"structured: data_base64 a number", structured(`{"specversion":"1.0","id":"a","source":"/s","type":"t","data_base64":1}`), api.CodeInvalidField,
			"CloudEvents data_base64: must be a string"},
		{"structured: data_base64 not base64", structured(`{"specversion":"1.0","id":"a","source":"/s","type":"t","data_base64":"%%"}`), api.CodeInvalidField,
			"CloudEvents data_base64: illegal base64 data at input byte 0"},
		{"structured: data_base64 not JSON", structured(`{"specversion":"1.0","id":"a","source":"/s","type":"t","data_base64":"PHhtbC8+"}`), api.CodeUnsupportedMediaType,
			"CloudEvents data_base64: postbox stores JSON data; this is not JSON"},
		{"structured: XML data", structured(`{"specversion":"1.0","id":"a","source":"/s","type":"t","datacontenttype":"text/xml","data":"<a/>"}`), api.CodeUnsupportedMediaType,
			`CloudEvents datacontenttype "text/xml": postbox stores JSON data; send application/json`},
		{"batched", webhook{headers: map[string]string{"Content-Type": "application/cloudevents-batch+json"}, body: `[]`}, api.CodeUnsupportedMediaType,
			"CloudEvents batched mode is not supported: send one event per request, in binary or structured mode"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, ref, _ := parse(t, intake.WebhookSettings{}, c.w)
			if ref == nil {
				t.Fatalf("taken as %q of type %q; want %s %q", p.Key, p.Type, c.code, c.msg)
			}
			if ref.Code != c.code || !matches(ref.Message, c.msg) {
				t.Fatalf("refused %s %q, want %s %q", ref.Code, ref.Message, c.code, c.msg)
			}
		})
	}
}

// TestParseCloudEvent: a CloudEvent's key is its source and id, its type
// and time its own, its payload its data as sent, and its attributes and
// trace context are kept in the metadata.
func TestParseCloudEvent(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	longSource := "/" + strings.Repeat("s", 300)
	sum := sha256.Sum256([]byte(`["` + longSource + `","evt-1"]`))
	for _, c := range []struct {
		name     string
		w        webhook
		key, typ string
		at       time.Time // zero: the time of parsing
		payload  string
		attrs    map[string]any // some of the metadata's cloudevents
		trace    string
	}{
		{"binary", binary(`{"order": 1}`, map[string]string{"ce-time": "2026-11-28T10:00:00.5Z", "ce-shopid": "7", "Idempotency-Key": "ignored"}),
			`["/shop","evt-1"]`, "order.created", time.Date(2026, 11, 28, 10, 0, 0, 500e6, time.UTC), `{"order": 1}`,
			map[string]any{"id": "evt-1", "source": "/shop", "shopid": "7", "datacontenttype": "application/json"}, ""},
		{"binary: a source with <&>", binary(`1`, map[string]string{"ce-source": "a<&>\"b"}),
			`["a<&>\"b","evt-1"]`, "order.created", time.Time{}, `1`, nil, ""},
		{"binary: a long source", binary(`1`, map[string]string{"ce-source": longSource}),
			"cloudevents-sha256:" + hex.EncodeToString(sum[:]), "order.created", time.Time{}, `1`, nil, ""},
		{"binary: the tracing extension", binary(`1`, map[string]string{"ce-traceparent": tp}),
			`["/shop","evt-1"]`, "order.created", time.Time{}, `1`, map[string]any{"traceparent": tp}, tp},
		{"structured", structured(`{"specversion":"1.0","id":"evt-2","source":"/s","type":"t.paid","time":"2026-01-02T03:04:05+01:00","n":1.50,"b":true,"nothing":null,"data": {"x" : [1, 2]}}`),
			`["/s","evt-2"]`, "t.paid", time.Date(2026, 1, 2, 2, 4, 5, 0, time.UTC), `{"x" : [1, 2]}`,
			map[string]any{"n": 1.5, "b": true, "type": "t.paid"}, ""},
		{"structured: data_base64", structured(`{"specversion":"1.0","id":"evt-3","source":"/s","type":"t","data_base64":"eyJhIjogMX0="}`),
			`["/s","evt-3"]`, "t", time.Time{}, `{"a": 1}`, nil, ""},
		{"structured: no data", structured(`{"specversion":"1.0","id":"evt-4","source":"/s","type":"t"}`),
			`["/s","evt-4"]`, "t", time.Time{}, `null`, nil, ""},
		{"structured: a JSON datacontenttype", structured(`{"specversion":"1.0","id":"evt-5","source":"/s","type":"t","datacontenttype":"application/vnd.x+json; charset=utf-8","data":{}}`),
			`["/s","evt-5"]`, "t", time.Time{}, `{}`, map[string]any{"datacontenttype": "application/vnd.x+json; charset=utf-8"}, ""},
		{"structured: the trace header before the extension", func() webhook {
			w := structured(`{"specversion":"1.0","id":"evt-6","source":"/s","type":"t","traceparent":"00-11111111111111111111111111111111-2222222222222222-01"}`)
			w.headers["traceparent"] = tp
			return w
		}(), `["/s","evt-6"]`, "t", time.Time{}, `null`, nil, tp},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, ref, _ := parse(t, intake.WebhookSettings{}, c.w)
			if ref != nil {
				t.Fatalf("refused %s %q", ref.Code, ref.Message)
			}
			ev := p.Event()
			at := c.at
			if at.IsZero() {
				at = now
			}
			if ev.NativeID != c.key || ev.Type != c.typ || !ev.OccurredAt.Equal(at) || string(ev.Payload) != c.payload {
				t.Fatalf("event %q %q at %v, payload %s; want %q %q at %v, payload %s", ev.NativeID, ev.Type, ev.OccurredAt, ev.Payload, c.key, c.typ, at, c.payload)
			}
			if p.CloudEvent == nil || p.CloudEvent.Type != c.typ || p.Key != c.key {
				t.Fatalf("CloudEvent %+v, key %q", p.CloudEvent, p.Key)
			}
			if p.Traceparent != c.trace {
				t.Fatalf("traceparent %q, want %q", p.Traceparent, c.trace)
			}
			var meta struct {
				CE          map[string]any    `json:"cloudevents"`
				Headers     map[string]string `json:"headers"`
				Traceparent string            `json:"traceparent"`
			}
			if err := json.Unmarshal(ev.Metadata, &meta); err != nil || meta.CE["specversion"] != "1.0" || meta.Traceparent != c.trace {
				t.Fatalf("metadata %s: %v", ev.Metadata, err)
			}
			if _, ok := meta.CE["data"]; ok {
				t.Fatalf("metadata keeps the data: %s", ev.Metadata)
			}
			for k, v := range c.attrs {
				if meta.CE[k] != v {
					t.Errorf("metadata cloudevents.%s = %v, want %v (%s)", k, meta.CE[k], v, ev.Metadata)
				}
			}
		})
	}
}
