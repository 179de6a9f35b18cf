package server

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/postbox-events/postbox/internal/tracing"
)

// startWebhookIntake starts the intake span of a webhook of source, a
// child of the trace context it brought, and returns it with its own
// trace context, which the stored event then carries.
func startWebhookIntake(source, key, typ, traceparent, tracestate string) (trace.Span, string, string) {
	ctx := tracing.WithRemote(context.Background(), traceparent, tracestate)
	_, span := tracing.Tracer().Start(ctx, "postbox.intake", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "postbox"),
			attribute.String("messaging.destination.name", source),
			attribute.String("messaging.message.id", key),
			attribute.String("postbox.event.type", typ),
		))
	if tp, ts := tracing.Format(span.SpanContext()); tp != "" {
		traceparent, tracestate = tp, ts
	}
	return span, traceparent, tracestate
}
