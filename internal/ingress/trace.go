package ingress

import (
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/tracing"
	"github.com/postbox-events/postbox/stream"
)

// Intake spans: one per accepted envelope, from its decoding to its
// commit (or its refusal by the store), a child of the envelope's
// traceparent. One span per event rather than per frame or commit, so
// that each event's trace holds its own intake: frames and commits mix
// events of many traces. They are made only while tracing.Enabled; the
// envelope's traceparent is then replaced by the intake span's, so that
// what the event causes later (materialisation, deliveries) nests under
// it. With tracing off the envelope's traceparent is stored as sent.

// startIntake starts the intake span of a valid envelope of streamID and
// makes it the envelope's trace context.
func startIntake(env *postbox.Envelope, streamID string) trace.Span {
	span, tp, ts := tracing.StartIntake(env.TraceParent, env.TraceState, streamID, env.EventID, env.Type,
		attribute.String("postbox.device_id", env.DeviceID))
	env.TraceParent, env.TraceState = tp, ts
	return span
}

// endIntake ends the intake spans of events with their append results, or
// with err when the append failed as a whole. spans is nil while tracing
// is off.
func endIntake(spans []trace.Span, results []stream.AppendResult, err error) {
	for i, span := range spans {
		switch {
		case err != nil:
			span.SetStatus(codes.Error, err.Error())
		case i < len(results) && results[i].Err != nil:
			span.SetStatus(codes.Error, results[i].Err.Error())
		case i < len(results):
			span.SetAttributes(attribute.Int64("postbox.offset", results[i].Offset), attribute.Bool("postbox.duplicate", results[i].Duplicate))
		}
		span.End()
	}
}

// errNotQueued ends the spans of events the connection dropped before the
// store's queue took them.
var errNotQueued = errors.New("not stored: the connection ended first")
