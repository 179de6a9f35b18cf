package outboxnats

import (
	"testing"

	"github.com/postbox-events/postbox/outbox"
)

// TestTraceHeaders: a message's trace context becomes the traceparent and
// tracestate headers; without one there are none.
func TestTraceHeaders(t *testing.T) {
	m := outbox.Message{EventID: "e", Type: "t"}
	if h := header(m); h.Get(HeaderTraceParent) != "" {
		t.Errorf("no trace context: %v", h)
	}
	m.TraceParent, m.TraceState = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v"
	if h := header(m); h.Get("traceparent") != m.TraceParent || h.Get("tracestate") != "k=v" {
		t.Errorf("headers %v, want traceparent and tracestate", h)
	}
}
