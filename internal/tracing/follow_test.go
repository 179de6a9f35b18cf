package tracing_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/internal/tracing"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

// TestTraceFollowsEvent follows one event with an in-memory exporter: a
// service inserts it into its transactional outbox inside a span, a relay
// publishes it to postbox serve, which stores it and delivers it to a
// target. One trace holds the relay's publish, the intake, the
// materialisation (by a link) and the delivery attempt, each the child of
// the one before, and the target's request carries a traceparent of that
// trace whose parent is the delivery attempt.
func TestTraceFollowsEvent(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	restore := tracing.Use(tp)
	t.Cleanup(func() { restore(); tp.Shutdown(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var mu sync.Mutex
	var got []http.Header
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(target.Close)

	ts := servertest.Start(t, server.Config{}, nil)
	resp, err := ts.HTTP.Post(ts.Base+"/v1/subscriptions", "application/json",
		strings.NewReader(`{"name":"orders","source":"devices","target":"`+target.URL+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create the subscription: %s", resp.Status)
	}

	// The service: a business write and its event in one transaction,
	// inside the span of the request that caused them.
	path := filepath.Join(t.TempDir(), "service.db")
	db, err := sqlitedb.Open(path, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := outboxsqlite.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	reqCtx, root := tp.Tracer("shop").Start(ctx, "POST /orders")
	tx, err := db.BeginTx(reqCtx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := outbox.Event{Type: "order.created", Payload: json.RawMessage(`{"order":42}`)}
	if err := outboxsqlite.Insert(reqCtx, tx, ev); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	root.End()
	traceID := root.SpanContext().TraceID()

	// The relay.
	store, err := outboxsqlite.Open(path, outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := client.NewPublisher(ts.WS, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { store.Run(relayCtx) })
	wg.Go(func() { relay.Run(relayCtx) })
	t.Cleanup(func() { stopRelay(); wg.Wait(); store.Close() })

	testenv.Eventually(t, 30*time.Second, "the target to get the event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0
	})
	mu.Lock()
	header := got[0]
	mu.Unlock()
	sc, ok := tracing.Remote(header.Get("traceparent"), header.Get("tracestate"))
	if !ok || sc.TraceID() != traceID {
		t.Fatalf("the target got traceparent %q; want one of trace %s", header.Get("traceparent"), traceID)
	}

	// The spans: publish ← intake ← deliver, in the service's trace.
	var spans map[string]tracetest.SpanStub
	testenv.Eventually(t, 10*time.Second, "the delivery attempt's span to end", func() bool {
		spans = map[string]tracetest.SpanStub{}
		for _, s := range exp.GetSpans() {
			spans[s.Name] = s
		}
		_, ok := spans["postbox.deliver"]
		return ok
	})
	parent := root.SpanContext()
	for _, name := range []string{"postbox.publish", "postbox.intake", "postbox.deliver"} {
		s, ok := spans[name]
		switch {
		case !ok:
			t.Fatalf("no %s span; got %v", name, names(spans))
		case s.SpanContext.TraceID() != traceID:
			t.Errorf("%s: trace %s, want %s", name, s.SpanContext.TraceID(), traceID)
		case s.Parent.SpanID() != parent.SpanID():
			t.Errorf("%s: parent %s, want %s", name, s.Parent.SpanID(), parent.SpanID())
		}
		parent = s.SpanContext
	}
	if sc.SpanID() != spans["postbox.deliver"].SpanContext.SpanID() {
		t.Errorf("the target's parent span is %s, want the delivery attempt %s", sc.SpanID(), spans["postbox.deliver"].SpanContext.SpanID())
	}
	if d := spans["postbox.deliver"]; d.SpanKind != trace.SpanKindClient || !hasAttr(d, "http.response.status_code", "204") {
		t.Errorf("the delivery attempt: kind %v, attributes %v; want a client span with status 204", d.SpanKind, d.Attributes)
	}
	m, ok := spans["postbox.materialise"]
	if !ok || len(m.Links) == 0 || m.Links[0].SpanContext.TraceID() != traceID {
		t.Errorf("the materialisation span links %v; want the event's trace %s", m.Links, traceID)
	}
}

func names(spans map[string]tracetest.SpanStub) []string {
	var out []string
	for n := range spans {
		out = append(out, n)
	}
	return out
}

func hasAttr(s tracetest.SpanStub, key, value string) bool {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key && kv.Value.Emit() == value {
			return true
		}
	}
	return false
}
