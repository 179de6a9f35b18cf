package server_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
)

// TestEnvelopeTraceparent: with tracing off, an envelope's traceparent and
// tracestate are stored in its event's metadata and a target gets them
// unchanged; a malformed one is NACKed naming the field.
func TestEnvelopeTraceparent(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tg := newHookTarget(t, 204)
	ts := start(t, server.Config{}, nil)
	if st, got := call(t, ts, "POST", "/v1/subscriptions", `{"name":"dev","source":"devices","target":"`+tg.URL+`"}`); st != 201 {
		t.Fatalf("create: %d %v", st, got)
	}
	c := dial(t, ts.WS, client.Options{})
	good := envelope("evt-trace-1", "pi-1", `{"a":1}`)
	good.TraceParent, good.TraceState = tp, "vendor=x"
	bad := envelope("evt-trace-2", "pi-1", `{"a":2}`)
	bad.TraceParent = "01-nope"
	rs := send(t, c, message(t, good), message(t, bad))
	if !rs[0].OK() {
		t.Fatalf("the envelope with a traceparent: %+v", rs[0])
	}
	if rs[1].OK() || rs[1].Field != "traceparent" {
		t.Fatalf("a malformed traceparent: %+v, want a NACK naming traceparent", rs[1])
	}
	ev, err := ts.Srv.Streams().Lookup(testCtx(t, 10*time.Second), server.DeviceSource, "evt-trace-1", "pi-1")
	if err != nil {
		t.Fatal(err)
	}
	var meta map[string]any
	json.Unmarshal(ev.Metadata, &meta)
	if meta["traceparent"] != tp || meta["tracestate"] != "vendor=x" {
		t.Errorf("metadata %s: want the traceparent and tracestate", ev.Metadata)
	}
	waitFor(t, 20*time.Second, "the target to get the event", func() bool { return tg.calls() == 1 })
	tg.mu.Lock()
	h := tg.got[0].Header
	tg.mu.Unlock()
	if h.Get("traceparent") != tp || h.Get("tracestate") != "vendor=x" {
		t.Errorf("the target got traceparent %q, tracestate %q; want them as sent", h.Get("traceparent"), h.Get("tracestate"))
	}
}
