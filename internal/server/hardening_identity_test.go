package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/server"
)

// TestIdentityIsPerDevice: an event's identity is (device_id, event_id).
// Two devices sending one event_id with different payloads both have
// their event stored and ACKed as new; each one's redelivery is a
// duplicate of its own event; a change of payload or type under one
// device's identity is a conflict naming the field.
func TestIdentityIsPerDevice(t *testing.T) {
	t.Parallel()
	tokens := ingress.Tokens{}
	tokens.Add("token-a", "pi-a")
	tokens.Add("token-b", "pi-b")
	ts := start(t, server.Config{Tokens: tokens}, nil)
	a := dial(t, ts.WS, client.Options{Token: "token-a"})
	b := dial(t, ts.WS, client.Options{Token: "token-b"})

	fromA := envelope("evt-shared", "pi-a", `{"from":"a"}`)
	fromB := envelope("evt-shared", "pi-b", `{"from":"b"}`)
	ra := send(t, a, message(t, fromA))[0]
	rb := send(t, b, message(t, fromB))[0]
	for name, r := range map[string]postbox.Reply{"pi-a": ra, "pi-b": rb} {
		if !r.OK() || r.Duplicate || r.EventID != "evt-shared" {
			t.Errorf("%s's first evt-shared: %+v, want an ACK of a new event naming evt-shared", name, r)
		}
	}
	rows := ts.rows(t, "evt-shared")
	if len(rows) != 2 {
		t.Fatalf("%d rows stored for evt-shared, want one per device: %+v", len(rows), rows)
	}
	payloads := map[string]bool{rows[0].Payload: true, rows[1].Payload: true}
	if !payloads[`{"from":"a"}`] || !payloads[`{"from":"b"}`] {
		t.Errorf("stored payloads %+v, want both devices' payloads", rows)
	}

	// B's redelivery is a duplicate of B's event, with B's ack_ts.
	again := send(t, b, message(t, fromB))[0]
	if !again.OK() || !again.Duplicate || again.AckTS != rb.AckTS || again.EventID != "evt-shared" {
		t.Errorf("pi-b's redelivery: %+v, want a duplicate ACK with pi-b's ack_ts %s", again, rb.AckTS)
	}
	if n := ts.queryInt(t, `SELECT attempt_count FROM stream_events WHERE source_native_id = 'evt-shared' AND event_variant = 'pi-b'`); n != 2 {
		t.Errorf("pi-b's row counts %d deliveries, want 2", n)
	}
	if n := ts.queryInt(t, `SELECT attempt_count FROM stream_events WHERE source_native_id = 'evt-shared' AND event_variant = 'pi-a'`); n != 1 {
		t.Errorf("pi-a's row counts %d deliveries, want 1", n)
	}

	// Under one device's identity, another payload or another type is a
	// conflict, never a duplicate.
	changed := fromA
	changed.Payload = []byte(`{"from":"changed"}`)
	retyped := fromA
	retyped.Type = "admin.grant"
	for _, c := range []struct {
		name  string
		env   postbox.Envelope
		field string
	}{{"another payload", changed, "payload"}, {"another type", retyped, "type"}} {
		r := send(t, a, message(t, c.env))[0]
		if r.Status != postbox.StatusNack || r.Code != postbox.CodeConflict || r.Field != c.field || r.Retryable ||
			!strings.HasPrefix(r.Message, c.field+":") || r.EventID != "evt-shared" {
			t.Errorf("pi-a's evt-shared with %s: %+v, want a non-retryable conflict NACK naming %s", c.name, r, c.field)
		}
	}
	if rows := ts.rows(t, "evt-shared"); len(rows) != 2 {
		t.Errorf("after the conflicts %d rows for evt-shared, want 2", len(rows))
	}
	if n := ts.queryInt(t, `SELECT count(*) FROM stream_events WHERE event_type <> 'sensor.reading'`); n != 0 {
		t.Errorf("%d events stored with the conflicting type", n)
	}
}

// TestRefusedText: text the decoder would have to rewrite (invalid UTF-8,
// a lone surrogate), blank or padded ids, duplicate keys and an empty
// array frame are each answered with a non-retryable NACK naming what is
// wrong, and nothing is stored.
func TestRefusedText(t *testing.T) {
	t.Parallel()
	ts := start(t, server.Config{}, nil)
	c := rawDial(t, ts.WS, nil)
	const rest = `"type":"t","ts":"2026-02-16T23:10:21Z","session_id":"s","device_id":"d","payload":{}`
	for _, tc := range []struct {
		name, frame string
		id          string // the NACK's event_id
		code        postbox.Code
		field       string
	}{
		{"invalid UTF-8 in event_id", "{\"schema_version\":1,\"event_id\":\"evt-\xff\"," + rest + "}", "", postbox.CodeInvalidField, "event_id"},
		{"a lone surrogate in event_id", `{"schema_version":1,"event_id":"evt-\ud800",` + rest + "}", "", postbox.CodeInvalidField, "event_id"},
		{"invalid UTF-8 in type", "{\"schema_version\":1,\"event_id\":\"evt-t\",\"type\":\"t\xc3\",\"ts\":\"2026-02-16T23:10:21Z\",\"session_id\":\"s\",\"device_id\":\"d\",\"payload\":{}}", "evt-t", postbox.CodeInvalidField, "type"},
		{"invalid UTF-8 in the payload", "{\"schema_version\":1,\"event_id\":\"evt-p\",\"type\":\"t\",\"ts\":\"2026-02-16T23:10:21Z\",\"session_id\":\"s\",\"device_id\":\"d\",\"payload\":{\"k\":\"\xed\xa0\x80\"}}", "evt-p", postbox.CodeInvalidField, "payload"},
		{"a blank event_id", `{"schema_version":1,"event_id":"   ",` + rest + "}", "   ", postbox.CodeInvalidField, "event_id"},
		{"a padded event_id", `{"schema_version":1,"event_id":"evt-pad ",` + rest + "}", "evt-pad ", postbox.CodeInvalidField, "event_id"},
		{"a duplicate key", `{"schema_version":1,"event_id":"evt-dup","type":"a",` + rest + "}", "evt-dup", postbox.CodeInvalidField, "type"},
		{"an empty array", `[]`, "", postbox.CodeInvalidJSON, ""},
	} {
		writeFrame(t, c, tc.frame)
		rs := readReplies(t, c, 1, tc.name)
		if len(rs) != 1 {
			t.Fatalf("%s: %d replies, want 1", tc.name, len(rs))
		}
		r := rs[0]
		if r.Status != postbox.StatusNack || r.Code != tc.code || r.Field != tc.field || r.Retryable ||
			r.EventID != tc.id || !strings.HasPrefix(r.Message, tc.field) || r.Message == "" {
			t.Errorf("%s: %+v, want a non-retryable %s NACK of %q naming %q", tc.name, r, tc.code, tc.id, tc.field)
		}
	}
	if n := ts.queryInt(t, `SELECT count(*) FROM stream_events`); n != 0 {
		t.Errorf("%d refused events were stored", n)
	}
}

// TestTargetKeyIsPerDevice: two devices' events with one event_id reach a
// target with two Idempotency-Keys, so a target that skips what it has
// done does not skip one device's event for the other's.
func TestTargetKeyIsPerDevice(t *testing.T) {
	t.Parallel()
	tg := newHookTarget(t, 200)
	ts := start(t, server.Config{}, nil)
	if st, got := call(t, ts, "POST", "/v1/subscriptions", `{"name":"fleet","source":"devices","start":"earliest","target":"`+tg.URL+`"}`); st != 201 {
		t.Fatalf("create: %d %v", st, got)
	}
	c := dial(t, ts.WS, client.Options{})
	for _, device := range []string{"pi-a", "pi/a"} {
		if r := send(t, c, message(t, envelope("evt-shared", device, `{}`)))[0]; !r.OK() || r.Duplicate {
			t.Fatalf("%s's evt-shared: %+v", device, r)
		}
	}
	waitFor(t, 10*time.Second, "both events to reach the target", func() bool { return tg.calls() == 2 })
	tg.mu.Lock()
	defer tg.mu.Unlock()
	keys := map[string]bool{}
	for _, r := range tg.got {
		keys[r.Header.Get("Idempotency-Key")] = true
	}
	if !keys["pi-a/evt-shared"] || !keys["pi%2Fa/evt-shared"] {
		t.Errorf("the target got keys %v, want pi-a/evt-shared and pi%%2Fa/evt-shared", keys)
	}
}

// TestWebhookConflictNamesWhatDiffers: a webhook's key sent again with
// another type is a conflict like another payload, and the 409 says which.
func TestWebhookConflictNamesWhatDiffers(t *testing.T) {
	t.Parallel()
	ts := start(t, server.Config{}, nil)
	if st, body, _ := post(t, ts, `{"n":1}`, map[string]string{"Idempotency-Key": "k-1", "X-Event-Type": "a"}); st != 202 {
		t.Fatalf("first: %d %v", st, body)
	}
	for field, h := range map[string]map[string]string{
		"type":    {"Idempotency-Key": "k-1", "X-Event-Type": "admin.grant"},
		"payload": {"Idempotency-Key": "k-1", "X-Event-Type": "a"},
	} {
		payload := `{"n":1}`
		if field == "payload" {
			payload = `{"n":2}`
		}
		st, body, _ := post(t, ts, payload, h)
		msg, _ := body["error"].(map[string]any)["message"].(string)
		if st != 409 || errorCode(body) != "conflict" || !strings.Contains(msg, "different "+field) {
			t.Errorf("k-1 with another %s: %d %v, want 409 naming the %s", field, st, body, field)
		}
	}
}
