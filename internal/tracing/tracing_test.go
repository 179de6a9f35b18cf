package tracing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/internal/tracing"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestSetupNone: without an OTLP endpoint, or with the SDK disabled,
// Setup installs nothing and tracing stays off.
func TestSetupNone(t *testing.T) {
	for _, e := range []map[string]string{
		{},
		{"OTEL_SERVICE_NAME": "x"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"},
	} {
		shutdown, err := tracing.Setup(context.Background(), "postbox-test", env(e))
		if err != nil || tracing.Enabled() {
			t.Errorf("%v: err %v, enabled %v; want nothing set up", e, err, tracing.Enabled())
		}
		if err := shutdown(context.Background()); err != nil {
			t.Errorf("%v: shutdown: %v", e, err)
		}
	}
	if _, err := tracing.Setup(context.Background(), "postbox-test", env(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})); err == nil {
		t.Error("protocol http/json: want an error naming it")
	}
}

// TestSetupExports: with OTEL_EXPORTER_OTLP_ENDPOINT set, spans reach the
// collector over OTLP/HTTP, at the latest when shutdown flushes them.
func TestSetupExports(t *testing.T) {
	var posts atomic.Int32
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/traces" {
			posts.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL) // the exporter reads the process's environment
	shutdown, err := tracing.Setup(context.Background(), "postbox-test", env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL}))
	if err != nil {
		t.Fatal(err)
	}
	if !tracing.Enabled() {
		t.Fatal("tracing is off after Setup with an endpoint")
	}
	_, span := tracing.Tracer().Start(context.Background(), "test")
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the collector to get the span", func() bool { return posts.Load() > 0 })
	if tracing.Enabled() {
		t.Error("tracing still on after shutdown")
	}
}

func TestFromMetadata(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct{ meta, tp, ts string }{
		{`{"device_id":"d","traceparent":"` + tp + `","tracestate":"a=b"}`, tp, "a=b"},
		{`{"headers":{"x":"\"traceparent\":\"x"},"device_id":"d"}`, "", ""},
		{`{"device_id":"d"}`, "", ""},
		{``, "", ""},
	} {
		gotTP, gotTS := tracing.FromMetadata([]byte(tc.meta))
		if gotTP != tc.tp || gotTS != tc.ts {
			t.Errorf("%s: %q %q, want %q %q", tc.meta, gotTP, gotTS, tc.tp, tc.ts)
		}
	}
}
