package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/postbox-events/postbox/internal/server"
)

// ceSend sends e to postbox's /webhooks with the CloudEvents SDK in the
// encoding ctx asks for and returns the HTTP status.
func ceSend(t *testing.T, ctx context.Context, ts *testServer, e cloudevents.Event) int {
	t.Helper()
	c, err := cloudevents.NewClientHTTP(cloudevents.WithTarget(ts.Base + "/webhooks"))
	if err != nil {
		t.Fatal(err)
	}
	res := c.Send(ctx, e)
	var hr *cehttp.Result
	if !errors.As(res, &hr) {
		t.Fatalf("send %s: %v", e.ID(), res)
	}
	return hr.StatusCode
}

// TestCloudEventsIntake: the CloudEvents SDK sends an event in binary and
// in structured mode; each is stored under its source and id with its type, its
// source in the metadata and its data as the payload, and sent again it is
// a duplicate.
func TestCloudEventsIntake(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	for _, mode := range []struct {
		name string
		ctx  context.Context
		data string // as the stored payload holds it
	}{
		{"binary", cloudevents.WithEncodingBinary(testCtx(t, 30*time.Second)), `{"order":42,"lines":[1,2]}`},
		{"structured", cloudevents.WithEncodingStructured(testCtx(t, 30*time.Second)), `{"order":42,"lines":[1,2]}`},
	} {
		t.Run(mode.name, func(t *testing.T) {
			e := cloudevents.NewEvent()
			e.SetID("ce-" + mode.name)
			e.SetSource("https://shop.example/orders")
			e.SetType("com.example.order.created")
			e.SetSubject("order-42")
			e.SetTime(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
			e.SetExtension("tenant", "acme")
			if err := e.SetData(cloudevents.ApplicationJSON, json.RawMessage(mode.data)); err != nil {
				t.Fatal(err)
			}
			if got := ceSend(t, mode.ctx, ts, e); got != http.StatusAccepted {
				t.Fatalf("first send: %d, want 202", got)
			}
			if got := ceSend(t, mode.ctx, ts, e); got != http.StatusOK {
				t.Fatalf("second send: %d, want 200 (a duplicate)", got)
			}
			ev, err := ts.Srv.Streams().Lookup(testCtx(t, 10*time.Second), server.WebhookSource, ceKey(e.Source(), e.ID()), "")
			if err != nil {
				t.Fatal(err)
			}
			if ev.Type != e.Type() || !ev.OccurredAt.Equal(e.Time()) {
				t.Errorf("stored type %q, occurred %v; want %q, %v", ev.Type, ev.OccurredAt, e.Type(), e.Time())
			}
			var payload, want any
			json.Unmarshal(ev.Payload, &payload)
			json.Unmarshal([]byte(mode.data), &want)
			if !jsonEqual(payload, want) {
				t.Errorf("stored payload %s, want %s", ev.Payload, mode.data)
			}
			var meta struct {
				CE map[string]any `json:"cloudevents"`
			}
			if err := json.Unmarshal(ev.Metadata, &meta); err != nil {
				t.Fatal(err)
			}
			if meta.CE["source"] != "https://shop.example/orders" || meta.CE["subject"] != "order-42" ||
				meta.CE["specversion"] != "1.0" || meta.CE["tenant"] != "acme" {
				t.Errorf("metadata.cloudevents %v: want source, subject, specversion and the extension", meta.CE)
			}
		})
	}
}

// TestCloudEventsBinaryBytes: binary mode stores the body exactly as
// received.
func TestCloudEventsBinaryBytes(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	body := "{ \"a\" :  1 }"
	status, resp, _ := post(t, ts, body, map[string]string{"ce-specversion": "1.0", "ce-id": "raw-1", "ce-source": "/x", "ce-type": "t.x"})
	if status != http.StatusAccepted {
		t.Fatalf("POST: %d %v", status, resp)
	}
	ev, err := ts.Srv.Streams().Lookup(testCtx(t, 10*time.Second), server.WebhookSource, ceKey("/x", "raw-1"), "")
	if err != nil {
		t.Fatal(err)
	}
	if string(ev.Payload) != body {
		t.Errorf("stored %q, want the body as received %q", ev.Payload, body)
	}
}

// TestCloudEventsRefused: a CloudEvent without a required attribute is
// refused with 400 naming it, in either mode.
func TestCloudEventsRefused(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	full := map[string]string{"specversion": "1.0", "id": "bad-1", "source": "/s", "type": "t"}
	for _, attr := range []string{"specversion", "id", "source", "type"} {
		headers := map[string]string{}
		fields := map[string]any{"data": map[string]int{"a": 1}}
		for k, v := range full {
			if k != attr {
				headers["ce-"+k] = v
				fields[k] = v
			}
		}
		status, body, _ := post(t, ts, `{"a":1}`, headers)
		if status != http.StatusBadRequest || !strings.Contains(errorMessage(body), "CloudEvents attribute "+attr+": required") {
			t.Errorf("binary mode without %s: %d %v", attr, status, body)
		}
		structured, _ := json.Marshal(fields)
		status, body, _ = post(t, ts, string(structured), map[string]string{"Content-Type": "application/cloudevents+json"})
		if status != http.StatusBadRequest || !strings.Contains(errorMessage(body), "CloudEvents attribute "+attr+": required") {
			t.Errorf("structured mode without %s: %d %v", attr, status, body)
		}
	}
	for _, tc := range []struct {
		name    string
		headers map[string]string
		body    string
		status  int
		want    string
	}{
		{"specversion 0.3", map[string]string{"ce-specversion": "0.3", "ce-id": "x", "ce-source": "/s", "ce-type": "t"}, `{}`, 400, "specversion"},
		{"bad time", map[string]string{"ce-specversion": "1.0", "ce-id": "x", "ce-source": "/s", "ce-type": "t", "ce-time": "yesterday"}, `{}`, 400, "time"},
		{"batch", map[string]string{"Content-Type": "application/cloudevents-batch+json"}, `[]`, 415, "batched"},
		{"text data", map[string]string{"Content-Type": "application/cloudevents+json"},
			`{"specversion":"1.0","id":"x","source":"/s","type":"t","datacontenttype":"text/plain","data":"hi"}`, 415, "datacontenttype"},
	} {
		status, body, _ := post(t, ts, tc.body, tc.headers)
		if status != tc.status || !strings.Contains(errorMessage(body), tc.want) {
			t.Errorf("%s: %d %v, want %d naming %s", tc.name, status, body, tc.status, tc.want)
		}
	}
}

// TestWebhookTraceparent: a webhook's traceparent header is stored with
// its event (an invalid one is ignored, as W3C Trace Context asks).
func TestWebhookTraceparent(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct{ key, header, want string }{
		{"tp-1", tp, tp},
		{"tp-2", "00-nope", ""},
	} {
		status, body, _ := post(t, ts, `{"a":1}`, map[string]string{"Idempotency-Key": tc.key, "traceparent": tc.header, "tracestate": "k=v"})
		if status != http.StatusAccepted {
			t.Fatalf("POST: %d %v", status, body)
		}
		ev, err := ts.Srv.Streams().Lookup(testCtx(t, 10*time.Second), server.WebhookSource, tc.key, "")
		if err != nil {
			t.Fatal(err)
		}
		var meta map[string]any
		json.Unmarshal(ev.Metadata, &meta)
		if got, _ := meta["traceparent"].(string); got != tc.want {
			t.Errorf("%s: metadata traceparent %q, want %q (%s)", tc.key, got, tc.want, ev.Metadata)
		}
	}
}

// TestRequestID: X-Request-ID is echoed when given and made up when not.
func TestRequestID(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	_, _, h := post(t, ts, `{"a":1}`, map[string]string{"Idempotency-Key": "rid-1", "X-Request-ID": "req-abc-123"})
	if got := h.Get("X-Request-ID"); got != "req-abc-123" {
		t.Errorf("echoed X-Request-ID %q, want req-abc-123", got)
	}
	resp, err := ts.HTTP.Get(ts.Base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Request-ID"); len(got) != 32 {
		t.Errorf("generated X-Request-ID %q, want 32 hex digits", got)
	}
	_, _, h = post(t, ts, `{"a":1}`, map[string]string{"Idempotency-Key": "rid-2", "X-Request-ID": strings.Repeat("x", 300)})
	if got := h.Get("X-Request-ID"); len(got) != 32 {
		t.Errorf("a 300-byte X-Request-ID is replaced: got %q", got)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// TestCloudEventsDelivery: an endpoint of format cloudevents is delivered
// CloudEvents the CloudEvents SDK receives: a webhook's id, type, source
// and data, a CloudEvent webhook's own source and subject; the format is
// shown and reset over the API.
func TestCloudEventsDelivery(t *testing.T) {
	var mu sync.Mutex
	var got []cloudevents.Event
	// The SDK reads each request as its receivers do. Not its
	// NewHTTPReceiveHandler: that pairs requests with the goroutines that
	// handle them through one channel, and two deliveries at once can
	// leave one request waiting forever (a handler that took the other's
	// event answers it, and its own request ends unread).
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e, err := cloudevents.NewEventFromHTTPRequest(r)
		if err == nil {
			err = e.Validate()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, *e)
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(tg.Close)
	ts := start(t, server.Config{}, nil)
	st, sub := call(t, ts, "POST", "/v1/subscriptions", `{"name":"ce","source":"webhooks","target":"`+tg.URL+`","format":"cloudevents"}`)
	if st != 201 || sub["format"] != "cloudevents" {
		t.Fatalf("create: %d %v", st, sub)
	}
	if st, body := call(t, ts, "POST", "/v1/subscriptions", `{"name":"bad","source":"webhooks","target":"`+tg.URL+`","format":"xml"}`); st != 400 ||
		!strings.Contains(errorMessage(body), "format") {
		t.Errorf("format xml: %d %v", st, body)
	}
	post(t, ts, `{"amount":7}`, map[string]string{"Idempotency-Key": "inv-1", "X-Event-Type": "invoice.paid"})
	ce := cloudevents.NewEvent()
	ce.SetID("order-9")
	ce.SetSource("https://shop.example/orders")
	ce.SetType("com.example.order.created")
	ce.SetSubject("order-9")
	ce.SetData(cloudevents.ApplicationJSON, map[string]int{"order": 9})
	if st := ceSend(t, cloudevents.WithEncodingStructured(testCtx(t, 30*time.Second)), ts, ce); st != http.StatusAccepted {
		t.Fatalf("send: %d", st)
	}
	waitFor(t, 20*time.Second, "both events to reach the receiver", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	byID := map[string]cloudevents.Event{}
	for _, e := range got {
		byID[e.ID()] = e
	}
	inv, order := byID["inv-1"], byID["order-9"]
	if inv.Type() != "invoice.paid" || inv.Source() != "/sources/webhooks" || inv.SpecVersion() != "1.0" || inv.Time().IsZero() ||
		string(inv.Data()) != `{"amount":7}` {
		t.Errorf("the webhook arrived as %v", inv)
	}
	if order.Type() != ce.Type() || order.Source() != ce.Source() || order.Subject() != "order-9" || string(order.Data()) != `{"order":9}` {
		t.Errorf("the CloudEvent arrived as %v", order)
	}
	if st, sub := call(t, ts, "PATCH", "/v1/subscriptions/ce", `{"format":null}`); st != 200 || sub["format"] != "postbox" {
		t.Errorf("reset the format: %d %v", st, sub)
	}
}
