package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamnats"
)

// startNATS runs a server whose streams are JetStream streams of the
// in-process NATS at natsURL, under prefix, and whose delivery state is in
// a SQLite file, as postbox serve --streams nats://... runs.
func startNATS(t *testing.T, natsURL, prefix string, cfg server.Config) *testServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := streamnats.Open(ctx, streamnats.Config{URL: natsURL, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Streams = js // the server closes it
	ts := start(t, cfg, nil)
	if ts.Store() == nil {
		t.Fatal("servertest opened no SQLite store beside the JetStream streams")
	}
	return ts
}

// TestNATSControlPlane: on JetStream streams, with delivery state in
// SQLite, the control plane works as on SQLite: device events reach a
// subscription's inbox and are leased and acked; webhooks are stored once
// (202, then 200, 409 for another payload) and looked up; a target that
// always fails leaves dead letters that a replay makes pending again; the
// streams API shows the JetStream streams; the metrics show the writer and
// the lag.
func TestNATSControlPlane(t *testing.T) {
	natsURL := natstest.Start(t)
	tg := newHookTarget(t, http.StatusInternalServerError)
	ts := startNATS(t, natsURL, "CP_", server.Config{
		Delivery: delivery.Config{MaxAttempts: 2, RetryBaseDelay: 20 * time.Millisecond, RetryMaxDelay: 50 * time.Millisecond},
	})

	t.Run("device events to an inbox", func(t *testing.T) {
		if status, body := call(t, ts, "POST", "/v1/subscriptions",
			`{"name":"pi7","source":"devices","types":["proposal.*"],"metadata":{"device_id":"pi-7"},"start":"earliest"}`); status != 201 {
			t.Fatalf("create: %d %v", status, body)
		}
		c := dial(t, ts.WS, client.Options{})
		var msgs []client.Message
		for i := range 12 {
			e := envelope(fmt.Sprintf("evt_nats_%02d", i), []string{"pi-7", "pi-8"}[i%2], fmt.Sprintf(`{"i":%d}`, i))
			e.Type = "proposal.task"
			if i%3 == 0 {
				e.Type = "telemetry.cpu"
			}
			msgs = append(msgs, message(t, e))
		}
		for i, r := range send(t, c, msgs...) {
			if !r.OK() {
				t.Fatalf("reply %d: %+v, want an ACK", i, r)
			}
		}
		// The same envelopes again are duplicates: nothing new is stored.
		for i, r := range send(t, c, msgs...) {
			if !r.OK() || !r.Duplicate {
				t.Fatalf("resent reply %d: %+v, want a duplicate ACK", i, r)
			}
		}
		// Events 2, 4, 8, 10 are pi-7 proposals (0 and 6 are telemetry).
		waitFor(t, 10*time.Second, "4 items in inbox pi7", func() bool {
			_, body := call(t, ts, "GET", "/v1/inboxes/pi7/items?state=pending", "")
			items, _ := body["items"].([]any)
			return len(items) == 4
		})
		_, body := call(t, ts, "GET", "/v1/inboxes/pi7/items", "")
		for i, raw := range body["items"].([]any) {
			it := raw.(map[string]any)
			want := fmt.Sprintf("evt_nats_%02d", []int{2, 4, 8, 10}[i])
			if it["event_id"] != want || it["stream"] != "devices" || it["offset"] != float64([]int{3, 5, 9, 11}[i]) {
				t.Fatalf("item %d: %v, want event %s at offset %d", i, it, want, []int{3, 5, 9, 11}[i])
			}
		}
		status, lease := call(t, ts, "POST", "/v1/inboxes/pi7/lease", `{"max":3,"visibility_timeout":"1m"}`)
		items, _ := lease["items"].([]any)
		if status != 200 || len(items) != 3 {
			t.Fatalf("lease: %d %v", status, lease)
		}
		id := func(i int) any { return items[i].(map[string]any)["id"] }
		ack := fmt.Sprintf(`{"ids":[%v,%v,%v],"lease":%q}`, id(0), id(1), id(2), lease["lease"])
		if status, body := call(t, ts, "POST", "/v1/inboxes/pi7/ack", ack); status != 200 || strings.Count(fmt.Sprint(body), "state:completed") != 3 {
			t.Fatalf("ack: %d %v", status, body)
		}
		waitFor(t, 10*time.Second, "consumer pi7 at lag 0, next offset 13", func() bool {
			_, consumers := call(t, ts, "GET", "/v1/consumers", "")
			for _, raw := range consumers["consumers"].([]any) {
				if c := raw.(map[string]any); c["subscription"] == "pi7" {
					return c["lag"] == float64(0) && c["next_offset"] == float64(13)
				}
			}
			return false
		})
		// The backend consumer follows the subscription, so JetStream's
		// side shows the lag too.
		lag, err := ts.Srv.Streams().Lag(testCtx(t, 10*time.Second), "pi7")
		if err != nil || lag.Events != 0 || lag.NextOffset != 13 {
			t.Fatalf("JetStream consumer pi7: %+v, %v; want next offset 13, lag 0", lag, err)
		}
	})

	t.Run("webhooks", func(t *testing.T) {
		key := map[string]string{"Idempotency-Key": "nats-1", "X-Event-Type": "invoice.paid"}
		status, body, _ := post(t, ts, `{"amount": 42}`, key)
		if status != http.StatusAccepted || !strings.HasPrefix(fmt.Sprint(body["id"]), "wh_") {
			t.Fatalf("new webhook: %d %v", status, body)
		}
		id := fmt.Sprint(body["id"])
		if status, again, _ := post(t, ts, `{"amount":42}`, key); status != http.StatusOK || again["id"] != id || again["created_at"] != body["created_at"] {
			t.Fatalf("redelivery: %d %v, want 200 with id %s", status, again, id)
		}
		if status, again, _ := post(t, ts, `{"amount": 43}`, key); status != http.StatusConflict || errorCode(again) != "conflict" {
			t.Fatalf("same key, another payload: %d %v, want 409 conflict", status, again)
		}
		if status, got := call(t, ts, "GET", "/webhooks/"+id, ""); status != 200 || got["idempotency_key"] != "nats-1" || got["type"] != "invoice.paid" {
			t.Fatalf("GET /webhooks/%s: %d %v", id, status, got)
		}
		if status, got := call(t, ts, "GET", "/webhooks?idempotency_key=nats-1", ""); status != 200 || got["id"] != id {
			t.Fatalf("GET /webhooks?idempotency_key=nats-1: %d %v", status, got)
		}
		if status, got := call(t, ts, "GET", "/webhooks?idempotency_key=nope", ""); status != 404 {
			t.Fatalf("GET /webhooks?idempotency_key=nope: %d %v, want 404", status, got)
		}
		st, err := ts.Srv.Streams().Stats(testCtx(t, 10*time.Second), server.WebhookSource)
		if err != nil || st.Events != 1 {
			t.Fatalf("the JetStream stream webhooks holds %d events (%v), want 1", st.Events, err)
		}
	})

	t.Run("dead letters and replay", func(t *testing.T) {
		if status, body := call(t, ts, "POST", "/v1/subscriptions",
			`{"name":"failing","source":"devices","types":["alarm.*"],"start":"latest","target":"`+tg.URL+`"}`); status != 201 {
			t.Fatalf("create: %d %v", status, body)
		}
		c := dial(t, ts.WS, client.Options{})
		e := envelope("evt_nats_alarm", "pi-7", `{"level":"high"}`)
		e.Type = "alarm.fire"
		if r := send(t, c, message(t, e)); !r[0].OK() {
			t.Fatalf("reply: %+v", r[0])
		}
		var list map[string]any
		waitFor(t, 20*time.Second, "a dead letter of subscription failing", func() bool {
			_, list = call(t, ts, "GET", "/v1/dead-letters?subscription=failing", "")
			items, _ := list["items"].([]any)
			return len(items) == 1
		})
		item := list["items"].([]any)[0].(map[string]any)
		itemID := fmt.Sprint(item["id"])
		if item["state"] != delivery.StateFailed || item["attempts"] != float64(2) || item["event_id"] != "evt_nats_alarm" ||
			!strings.Contains(fmt.Sprint(item["last_error"]), "500") {
			t.Fatalf("dead letter: %v, want failed after 2 attempts answered 500", item)
		}
		if tg.calls() != 2 {
			t.Fatalf("the target got %d requests, want 2 (MaxAttempts)", tg.calls())
		}
		status, got := call(t, ts, "POST", "/v1/dead-letters/"+itemID+"/replay", "")
		if status != 200 || got["replays"] != float64(1) || got["state"] == delivery.StateFailed {
			t.Fatalf("replay: %d %v, want the item pending again", status, got)
		}
		if _, got := call(t, ts, "GET", "/v1/dead-letters?subscription=failing", ""); len(got["items"].([]any)) != 0 {
			t.Fatalf("dead letters after the replay: %v, want none", got)
		}
		// Replayed, it fails twice more and is a dead letter again.
		waitFor(t, 20*time.Second, "the replayed item to fail again", func() bool {
			_, got = call(t, ts, "GET", "/v1/dead-letters/"+itemID, "")
			return got["state"] == delivery.StateFailed
		})
		if tg.calls() != 4 || got["replays"] != float64(1) {
			t.Fatalf("after the replay: %d requests, item %v; want 4 requests, 1 replay", tg.calls(), got)
		}
	})

	t.Run("streams API", func(t *testing.T) {
		status, body := call(t, ts, "GET", "/v1/streams", "")
		if status != 200 {
			t.Fatalf("/v1/streams: %d %v", status, body)
		}
		got := map[string]map[string]any{}
		for _, raw := range body["streams"].([]any) {
			s := raw.(map[string]any)
			got[fmt.Sprint(s["stream"])] = s
		}
		for name, events := range map[string]float64{"devices": 13, "webhooks": 1} {
			if s := got[name]; s == nil || s["backend"] != streamnats.BackendName || s["events"] != events || s["last_offset"] != events {
				t.Errorf("/v1/streams %s: %v, want backend %q with %v events", name, s, streamnats.BackendName, events)
			}
		}
		if status, s := call(t, ts, "GET", "/v1/streams/devices", ""); status != 200 || s["backend"] != streamnats.BackendName {
			t.Errorf("/v1/streams/devices: %d %v", status, s)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		ts.wantMetrics(t, map[string]float64{
			`postbox_subscription_lag_events{stream="devices",subscription="pi7"}`:     0,
			`postbox_subscription_lag_events{stream="devices",subscription="failing"}`: 0,
			`postbox_subscription_items_total{subscription="pi7"}`:                     4,
			`postbox_inbox_settled_total{inbox="pi7",state="completed"}`:               3,
			`postbox_ingress_events_total{result="stored",source="webhooks"}`:          1,
			`postbox_ingress_events_total{result="duplicate",source="webhooks"}`:       1,
			`postbox_ingress_events_total{result="conflict",source="webhooks"}`:        1,
			`postbox_store_writable`: 1,
		})
		m := ts.metrics(t)
		if m["postbox_writer_batch_events_count"] < 1 || m["postbox_writer_commit_seconds_count"] < 1 || m["postbox_writer_queue_capacity"] < 1 {
			t.Errorf("writer metrics: batches %v, commits %v, queue capacity %v; want the JetStream appends observed",
				m["postbox_writer_batch_events_count"], m["postbox_writer_commit_seconds_count"], m["postbox_writer_queue_capacity"])
		}
	})

	t.Run("a webhook over max_payload", func(t *testing.T) {
		// A body under --webhook-max-bytes but, with its headers, over the
		// NATS server's max_payload: 413 for it alone, the store stays
		// ready and the next webhook is stored.
		big := `{"blob":"` + strings.Repeat("a", server.DefaultWebhookMaxBytes-100) + `"}`
		if status, got, _ := post(t, ts, big, map[string]string{"Idempotency-Key": "nats-big"}); status != http.StatusRequestEntityTooLarge ||
			errorCode(got) != "too_large" || !strings.Contains(fmt.Sprint(got), "max_payload") {
			t.Fatalf("a webhook over max_payload: %d %v, want 413 too_large naming max_payload", status, got)
		}
		if status, got := call(t, ts, "GET", "/ready", ""); status != http.StatusOK {
			t.Fatalf("/ready after a webhook over max_payload: %d %v, want 200", status, got)
		}
		if status, got, _ := post(t, ts, `{"after": "big"}`, map[string]string{"Idempotency-Key": "nats-after-big"}); status != http.StatusAccepted {
			t.Fatalf("the webhook after it: %d %v, want 202", status, got)
		}
		st, err := ts.Srv.Streams().Stats(testCtx(t, 10*time.Second), server.WebhookSource)
		if err != nil || st.Events != 2 {
			t.Fatalf("the JetStream stream webhooks holds %d events (%v), want 2: the first webhook and the one after the big one", st.Events, err)
		}
		ts.wantMetrics(t, map[string]float64{
			`postbox_ingress_events_total{result="rejected",source="webhooks"}`: 1,
			`postbox_store_writable`: 1,
		})
	})
}

// TestNATSRetention: retention trims from a JetStream stream the events
// every consumer has read, and only those; offsets go on from where they
// were, never reused.
func TestNATSRetention(t *testing.T) {
	natsURL := natstest.Start(t)
	ts := startNATS(t, natsURL, "RET_", server.Config{
		Delivery: delivery.Config{Retention: time.Millisecond, CleanupInterval: 20 * time.Millisecond},
	})
	ctx := testCtx(t, 60*time.Second)
	js := ts.Srv.Streams()
	if status, body := call(t, ts, "POST", "/v1/subscriptions", `{"name":"all","source":"devices","start":"earliest"}`); status != 201 {
		t.Fatalf("create: %d %v", status, body)
	}
	// holder is a consumer that reads nothing: it keeps every event.
	if _, err := js.EnsureStream(ctx, server.DeviceSource); err != nil {
		t.Fatal(err)
	}
	if _, err := js.EnsureConsumer(ctx, stream.ConsumerConfig{ID: "holder", StreamID: server.DeviceSource, Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, ts.WS, client.Options{})
	sendN := func(from, n int) {
		t.Helper()
		var msgs []client.Message
		for i := from; i < from+n; i++ {
			msgs = append(msgs, message(t, envelope(fmt.Sprintf("evt_ret_%02d", i), "pi-1", fmt.Sprintf(`{"i":%d}`, i))))
		}
		for i, r := range send(t, c, msgs...) {
			if !r.OK() || r.Duplicate {
				t.Fatalf("reply %d: %+v, want a new event's ACK", i, r)
			}
		}
	}
	stats := func() stream.Stats {
		t.Helper()
		st, err := js.Stats(ctx, server.DeviceSource)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	sendN(0, 10)
	waitFor(t, 20*time.Second, "subscription all to read the 10 events", func() bool {
		lag, err := js.Lag(ctx, "all")
		return err == nil && lag.NextOffset == 11
	})
	// A webhook completed now is deleted by a later cleanup, which trims
	// the streams after it: once it is gone, a trim ran with all at 11.
	status, body, _ := post(t, ts, `{}`, map[string]string{"Idempotency-Key": "ret-1"})
	if status != http.StatusAccepted {
		t.Fatalf("webhook: %d %v", status, body)
	}
	var lease map[string]any
	waitFor(t, 10*time.Second, "the webhook in its inbox", func() bool {
		_, lease = call(t, ts, "POST", "/v1/inboxes/webhooks/lease", `{"max":1}`)
		items, _ := lease["items"].([]any)
		return len(items) == 1
	})
	whItem := lease["items"].([]any)[0].(map[string]any)["id"]
	call(t, ts, "POST", "/v1/inboxes/webhooks/ack", fmt.Sprintf(`{"ids":[%v],"lease":%q}`, whItem, lease["lease"]))
	waitFor(t, 20*time.Second, "retention to delete the completed webhook item", func() bool {
		status, _ := call(t, ts, "GET", fmt.Sprintf("/v1/inboxes/webhooks/items/%v", whItem), "")
		return status == http.StatusNotFound
	})
	if st := stats(); st.Events != 10 || st.FirstOffset != 1 {
		t.Fatalf("with consumer holder at offset 1: %+v, want all 10 events kept", st)
	}

	if _, err := js.Commit(ctx, "holder", 6); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the events holder read (1..6) to be trimmed", func() bool {
		st := stats()
		return st.Events == 4 && st.FirstOffset == 7
	})
	if err := js.DeleteConsumer(ctx, "holder"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "every event all read to be trimmed", func() bool { return stats().Events == 0 })
	if st := stats(); st.LastOffset != 10 {
		t.Fatalf("after the trim: %+v, want last offset 10 kept", st)
	}
	// The webhook was read by subscription webhooks: trimmed too.
	waitFor(t, 20*time.Second, "the webhook to be trimmed", func() bool {
		st, err := js.Stats(ctx, server.WebhookSource)
		return err == nil && st.Events == 0 && st.LastOffset == 1
	})
	ts.wantMetrics(t, map[string]float64{`postbox_retention_deleted_total{kind="events"}`: 11}) // 10 device events, 1 webhook

	// New events go on at offset 11; the subscription gets each once.
	sendN(10, 3)
	waitFor(t, 20*time.Second, "3 new items in inbox all", func() bool {
		_, body := call(t, ts, "GET", "/v1/inboxes/all/items?limit=100", "")
		items, _ := body["items"].([]any)
		return len(items) == 13
	})
	_, items := call(t, ts, "GET", "/v1/inboxes/all/items?limit=100", "")
	for i, raw := range items["items"].([]any) {
		it := raw.(map[string]any)
		if it["offset"] != float64(i+1) || it["event_id"] != fmt.Sprintf("evt_ret_%02d", i) {
			t.Fatalf("item %d: %v, want event evt_ret_%02d at offset %d", i, it, i, i+1)
		}
	}

}
