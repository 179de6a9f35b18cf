package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/stream"
)

// plain is a stream backend with nothing beyond stream.Backend: no writer
// of its own, no Waiter, no SQL. The server must run on it as on any
// other backend (through an appendq.Queue), keeping delivery state in its
// Store.
type plain struct {
	stream.Backend
	stop func() error // ends the SQLite writer under it
}

// Close stops the writer under the backend, then closes it, as a backend
// that needs no Run closes.
func (p plain) Close() error { return errors.Join(p.stop(), p.Backend.Close()) }

// startPlain runs a server whose streams are a plain backend over their
// own SQLite file and whose store is the SQLite file at DBPath, as
// postbox serve runs on a backend other than SQLite.
func startPlain(t *testing.T, cfg server.Config) (*testServer, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "streams.db")
	db, err := server.OpenSQLite(server.Config{DBPath: path})
	if err != nil {
		t.Fatal(err)
	}
	// The server runs the store's writer, not this backend's: it runs
	// here until the server closes the backend.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- db.Run(ctx) }()
	cfg.Streams = plain{Backend: db, stop: func() error { cancel(); return <-done }}
	return start(t, cfg, nil), path
}

// TestAnyStreamBackend: on a backend without a writer of its own, events
// are appended in group commits by the server's queue (/ready shows its
// bound), webhooks are stored and looked up, subscriptions materialise
// inbox items, and the events live in the stream backend, not the store.
func TestAnyStreamBackend(t *testing.T) {
	ts, _ := startPlain(t, server.Config{QueueSize: 50})
	if ts.Store() == nil {
		t.Fatal("servertest opened no store beside the given streams")
	}
	if status, body := call(t, ts, "GET", "/ready", ""); status != 200 || body["queue_capacity"] != float64(50) {
		t.Fatalf("/ready: %d %v, want 200 with the queue's capacity 50", status, body)
	}
	if status, body := call(t, ts, "POST", "/v1/subscriptions",
		`{"name":"all","source":"devices","types":["proposal.*"],"start":"earliest"}`); status != 201 {
		t.Fatalf("create: %d %v", status, body)
	}
	c := dial(t, ts.WS, client.Options{})
	var msgs []client.Message
	for i := range 12 {
		e := envelope(fmt.Sprintf("evt_plain_%02d", i), "pi-1", fmt.Sprintf(`{"i":%d}`, i))
		e.Type = "proposal.task"
		msgs = append(msgs, message(t, e))
	}
	for i, r := range send(t, c, msgs...) {
		if !r.OK() {
			t.Fatalf("reply %d: %+v, want an ACK", i, r)
		}
	}
	waitFor(t, 10*time.Second, "12 items in inbox all", func() bool {
		_, body := call(t, ts, "GET", "/v1/inboxes/all/items?state=pending", "")
		items, _ := body["items"].([]any)
		return len(items) == 12
	})

	key := map[string]string{"Idempotency-Key": "plain-1", "X-Event-Type": "invoice.paid"}
	status, body, _ := post(t, ts, `{"amount":1}`, key)
	if status != http.StatusAccepted {
		t.Fatalf("webhook: %d %v", status, body)
	}
	id := fmt.Sprint(body["id"])
	if status, again, _ := post(t, ts, `{"amount":1}`, key); status != http.StatusOK || again["id"] != id {
		t.Fatalf("webhook redelivery: %d %v, want 200 with id %s", status, again, id)
	}
	if status, got := call(t, ts, "GET", "/webhooks/"+id, ""); status != 200 || got["idempotency_key"] != "plain-1" {
		t.Fatalf("GET /webhooks/%s: %d %v", id, status, got)
	}
	if status, got := call(t, ts, "GET", "/webhooks?idempotency_key=plain-1", ""); status != 200 || got["id"] != id {
		t.Fatalf("GET /webhooks?idempotency_key=plain-1: %d %v", status, got)
	}
	_, streams := call(t, ts, "GET", "/v1/streams", "")
	if s := fmt.Sprint(streams["streams"]); !strings.Contains(s, "devices") || !strings.Contains(s, "webhooks") {
		t.Fatalf("/v1/streams: %v", streams)
	}

	ctx := testCtx(t, 10*time.Second)
	st, err := ts.Srv.Streams().Stats(ctx, server.DeviceSource)
	if err != nil || st.Events != 12 {
		t.Fatalf("the stream backend holds %d device events (%v), want 12", st.Events, err)
	}
	if _, err := ts.Store().Stats(ctx, server.DeviceSource); !errors.Is(err, stream.ErrStreamNotFound) {
		t.Fatalf("the store's own streams: %v, want no device stream (events belong to the stream backend)", err)
	}
	if m := ts.metrics(t); m["postbox_writer_batch_events_count"] < 1 || m["postbox_store_writable"] != 1 {
		t.Errorf("writer metrics: batch count %v, writable %v; want the queue's commits observed", m["postbox_writer_batch_events_count"], m["postbox_store_writable"])
	}
}

// TestAnyStreamBackendUnwritable: a failed append of the server's queue
// marks the store unwritable (/ready 503, postbox_store_writable 0), and
// the probe of the stream backend clears it once the backend answers.
func TestAnyStreamBackendUnwritable(t *testing.T) {
	ts, path := startPlain(t, server.Config{StoreProbeInterval: 20 * time.Millisecond})
	release := lockDB(t, path)
	status, body, _ := post(t, ts, `{}`, map[string]string{"Idempotency-Key": "locked"})
	if status == http.StatusAccepted || status == http.StatusOK {
		t.Fatalf("webhook stored while the streams database was locked: %d %v", status, body)
	}
	if v := ts.metrics(t)["postbox_writer_failures_total"]; v < 1 {
		t.Fatalf("postbox_writer_failures_total = %v after a failed append, want at least 1", v)
	}
	release()
	waitFor(t, 30*time.Second, "/ready to answer 200 again with no traffic", func() bool {
		status, _ := call(t, ts, "GET", "/ready", "")
		return status == 200
	})
	if status, body, _ := post(t, ts, `{}`, map[string]string{"Idempotency-Key": "locked"}); status != http.StatusAccepted {
		t.Fatalf("webhook after the lock was released: %d %v", status, body)
	}
}
