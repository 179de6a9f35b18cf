// Package tracing sets up OpenTelemetry tracing for postbox's commands and
// carries W3C trace context (traceparent, tracestate) with events.
//
// Setup installs a tracer provider that exports spans over OTLP when the
// standard OTEL_* environment variables ask for it, and nothing otherwise:
// then the global provider stays OpenTelemetry's no-op one, no goroutine is
// started, Enabled reports false and the hot paths skip span work
// altogether, passing a stored traceparent on unchanged.
//
// Spans postbox makes (all through Tracer):
//
//   - "postbox.intake" per accepted event, from decoding to its commit
//     (ingress envelopes and webhooks), a child of the event's traceparent;
//   - "postbox.materialise" per batch a subscription turns into inbox
//     items, linked to each event's trace;
//   - "postbox.deliver" per delivery attempt, an HTTP client span with
//     the target's status, a child of the event's stored trace context;
//   - "postbox.publish" per relayed message (package outbox), a producer
//     span, a child of the outbox row's traceparent.
package tracing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Name is the instrumentation scope of postbox's spans.
const Name = "github.com/postbox-events/postbox"

// enabled is set while a recording provider is installed.
var enabled atomic.Bool

// Enabled reports whether spans are recorded: Setup found an OTLP
// endpoint, or a test called Use. Hot paths check it before any span work.
func Enabled() bool { return enabled.Load() }

// Tracer returns postbox's tracer from the global provider.
func Tracer() trace.Tracer { return otel.Tracer(Name) }

// Configured reports whether the environment asks for trace export:
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set,
// OTEL_SDK_DISABLED is not "true" and OTEL_TRACES_EXPORTER is not "none".
func Configured(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") ||
		strings.EqualFold(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")), "none") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs the global tracer provider and the W3C trace context
// propagator for a command (service is the default service.name, e.g.
// "postbox-serve"; OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win).
// Without Configured, it installs nothing and returns a shutdown that does
// nothing. Otherwise spans are batched and exported over OTLP, HTTP/protobuf
// by default, gRPC when OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (or
// OTEL_EXPORTER_OTLP_PROTOCOL) is "grpc"; the exporter reads the other
// OTEL_EXPORTER_OTLP_* variables (headers, timeout, TLS) and the provider
// OTEL_TRACES_SAMPLER. shutdown flushes the spans not yet exported.
//
// getenv is os.Getenv but in tests; the exporter reads the process's
// environment itself.
func Setup(ctx context.Context, service string, getenv func(string) string) (shutdown func(context.Context) error, err error) {
	none := func(context.Context) error { return nil }
	if !Configured(getenv) {
		return none, nil
	}
	protocol := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp *otlptrace.Exporter
	switch strings.TrimSpace(protocol) {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return none, fmt.Errorf("tracing: OTEL_EXPORTER_OTLP_PROTOCOL %q: postbox exports traces over http/protobuf or grpc", protocol)
	}
	if err != nil {
		return none, fmt.Errorf("tracing: otlp exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return none, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	restore := Use(tp)
	return func(ctx context.Context) error {
		defer restore()
		if err := tp.Shutdown(ctx); err != nil {
			return fmt.Errorf("tracing: flush spans: %w", err)
		}
		return nil
	}, nil
}

// Use installs tp as the global tracer provider (and the W3C trace
// context propagator) and marks tracing enabled, for Setup and for tests
// with an in-memory exporter. restore installs a no-op provider (the
// global one cannot be put back) and marks tracing disabled.
func Use(tp trace.TracerProvider) (restore func()) {
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	enabled.Store(true)
	return func() {
		enabled.Store(false)
		otel.SetTracerProvider(noop.NewTracerProvider())
	}
}

// Header names of W3C trace context.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Remote returns the span context a traceparent (and tracestate) names,
// marked remote; ok is false when traceparent is empty or not valid.
func Remote(traceparent, tracestate string) (sc trace.SpanContext, ok bool) {
	if traceparent == "" {
		return sc, false
	}
	carrier := propagation.MapCarrier{HeaderTraceParent: traceparent}
	if tracestate != "" {
		carrier[HeaderTraceState] = tracestate
	}
	sc = trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
	return sc, sc.IsValid()
}

// WithRemote returns ctx with the remote span context traceparent names as
// its parent; ctx itself when traceparent is empty or not valid.
func WithRemote(ctx context.Context, traceparent, tracestate string) context.Context {
	if sc, ok := Remote(traceparent, tracestate); ok {
		return trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	return ctx
}

// Format returns the traceparent and tracestate of a span context; ""
// when it is not valid.
func Format(sc trace.SpanContext) (traceparent, tracestate string) {
	if !sc.IsValid() {
		return "", ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	return carrier[HeaderTraceParent], carrier[HeaderTraceState]
}

// FromMetadata returns the traceparent and tracestate a stream event's
// metadata holds at its top level, without decoding
// the rest. A JSON string value cannot hold an unescaped quote, so
// `"traceparent":"` only matches a key; a webhook's metadata also keeps
// the header under "headers", with the same value.
func FromMetadata(meta []byte) (traceparent, tracestate string) {
	return metaString(meta, `"traceparent":"`), metaString(meta, `"tracestate":"`)
}

func metaString(meta []byte, key string) string {
	i := bytes.Index(meta, []byte(key))
	if i < 0 {
		return ""
	}
	v := meta[i+len(key):]
	j := bytes.IndexByte(v, '"')
	if j < 0 || bytes.IndexByte(v[:j], '\\') >= 0 {
		return "" // escaped: not a value postbox wrote (both are plain ASCII)
	}
	return string(v[:j])
}

// StartIntake starts the intake span of an event accepted into stream,
// the child of the trace context it brought (traceparent, tracestate),
// with its id and type and attrs, and returns it with the span's own
// trace context, which the event carries from then on (what it causes
// later nests under its intake). Call it only while Enabled.
func StartIntake(traceparent, tracestate, stream, id, typ string, attrs ...attribute.KeyValue) (_ trace.Span, spanTraceparent, spanTracestate string) {
	ctx := WithRemote(context.Background(), traceparent, tracestate)
	_, span := Tracer().Start(ctx, "postbox.intake", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "postbox"),
			attribute.String("messaging.destination.name", stream),
			attribute.String("messaging.message.id", id),
			attribute.String("postbox.event.type", typ),
		),
		trace.WithAttributes(attrs...))
	if tp, ts := Format(span.SpanContext()); tp != "" {
		traceparent, tracestate = tp, ts
	}
	return span, traceparent, tracestate
}
