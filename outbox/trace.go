package outbox

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/postbox-events/postbox"
)

// tracerName is the instrumentation scope of the Relay's spans.
const tracerName = "github.com/postbox-events/postbox/outbox"

// startPublish starts a "postbox.publish" producer span for each message
// of a batch, a child of the message's trace context, from OpenTelemetry's
// global tracer provider, and makes it the message's trace context, so
// that the receiver's spans nest under it. While no provider records
// spans (OpenTelemetry's default), it returns nil and leaves the messages
// as they are: their trace context is sent as it was stored.
func startPublish(msgs []Message) []trace.Span {
	if len(msgs) == 0 {
		return nil
	}
	tracer := otel.Tracer(tracerName)
	var spans []trace.Span
	for i := range msgs {
		m := &msgs[i]
		ctx := context.Background()
		if m.TraceParent != "" {
			carrier := propagation.MapCarrier{"traceparent": m.TraceParent, "tracestate": m.TraceState}
			ctx = propagation.TraceContext{}.Extract(ctx, carrier)
		}
		_, span := tracer.Start(ctx, "postbox.publish", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.message.id", m.EventID),
				attribute.String("postbox.event.type", m.Type),
				attribute.Int("messaging.batch.message_count", len(msgs)),
			))
		if !span.IsRecording() {
			span.End()
			if i == 0 {
				return nil // no provider records: none will
			}
			spans = append(spans, span)
			continue
		}
		carrier := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(trace.ContextWithSpan(context.Background(), span), carrier)
		m.TraceParent, m.TraceState = carrier["traceparent"], carrier["tracestate"]
		spans = append(spans, span)
	}
	return spans
}

// endPublish ends the publish spans of a batch with the receiver's
// replies, or with err when the transport failed.
func endPublish(spans []trace.Span, replies []postbox.Reply, err error) {
	for i, span := range spans {
		switch {
		case err != nil:
			span.SetStatus(codes.Error, err.Error())
		case i < len(replies) && !replies[i].OK():
			span.SetStatus(codes.Error, string(replies[i].Code)+": "+replies[i].Message)
		}
		span.End()
	}
}
