package delivery

import (
	"context"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/postbox-events/postbox/internal/tracing"
	"github.com/postbox-events/postbox/stream"
)

// sendTraced is send inside a "postbox.deliver" HTTP client span, a child
// of the trace context the item's event was stored with, while tracing is
// on; the span ends with the target's status, or the error.
func (d *Delivery) sendTraced(ctx context.Context, ep *endpoint, it *Item) (*Attempt, error) {
	if !tracing.Enabled() {
		return d.send(ctx, ep, it)
	}
	tp, ts := tracing.FromMetadata(it.Metadata)
	ctx, span := tracing.Tracer().Start(tracing.WithRemote(ctx, tp, ts), "postbox.deliver",
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("http.request.method", http.MethodPost),
			attribute.String("url.full", ep.url),
			attribute.String("postbox.inbox", it.Inbox),
			attribute.String("postbox.subscription", it.Subscription),
			attribute.Int64("postbox.item", it.ID),
			attribute.Int("postbox.attempt", it.Attempts),
			attribute.String("messaging.message.id", it.EventID),
		))
	defer span.End()
	rec, err := d.send(ctx, ep, it)
	if rec != nil && rec.Status != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", rec.Status))
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	return rec, err
}

// setTrace sets the traceparent (and tracestate) header of a delivery:
// the attempt's span while tracing is on, else the trace context the
// item's event was stored with, unchanged.
func setTrace(ctx context.Context, h http.Header, meta []byte) {
	tp, ts := tracing.Format(trace.SpanContextFromContext(ctx))
	if tp == "" {
		tp, ts = tracing.FromMetadata(meta)
	}
	if tp == "" {
		return
	}
	h.Set(tracing.HeaderTraceParent, tp)
	if ts != "" {
		h.Set(tracing.HeaderTraceState, ts)
	} else {
		h.Del(tracing.HeaderTraceState)
	}
}

// materialiseSpan starts the "postbox.materialise" span of a batch of
// events sub turns into inbox items, linked to each
// event's trace; nil while tracing is off.
func materialiseSpan(sub string, events []stream.StoredEvent) trace.Span {
	if !tracing.Enabled() || len(events) == 0 {
		return nil
	}
	links := make([]trace.Link, 0, len(events))
	for _, ev := range events {
		if sc, ok := tracing.Remote(tracing.FromMetadata(ev.Metadata)); ok {
			links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.Int64("postbox.offset", ev.Offset)}})
		}
	}
	_, span := tracing.Tracer().Start(context.Background(), "postbox.materialise", trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String("postbox.subscription", sub),
			attribute.Int("postbox.events", len(events)),
			attribute.String("postbox.offsets", strconv.FormatInt(events[0].Offset, 10)+"-"+strconv.FormatInt(events[len(events)-1].Offset, 10)),
		))
	return span
}

// endMaterialise ends a materialise span (nil while tracing is off) with
// the items added, or the error.
func endMaterialise(span trace.Span, added int, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.Int("postbox.items", added))
	}
	span.End()
}
