package server_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/kafkatest"
	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/stream/streamkafka"
)

// TestConsumerReset: POST /v1/consumers/{name}/reset moves a
// subscription's consumer back and its subscription materialises from
// there again, making items only of events it has no item of; forwards
// skips events. GET /v1/consumers/{name} shows the consumer and
// GET /v1/consumers/{name}/commits its commits and resets, newest first.
// Items carry the envelope's seq as source_sequence.
func TestConsumerReset(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	if status, v := call(t, ts, "POST", "/v1/subscriptions", `{"name": "r", "source": "devices", "start": "earliest"}`); status != 201 {
		t.Fatalf("create: %d %v", status, v)
	}
	c := dial(t, ts.WS, client.Options{})
	var msgs []client.Message
	for i := 1; i <= 6; i++ {
		e := envelope(fmt.Sprintf("evt_%d", i), "pi-1", `{}`)
		seq := int64(100 + i)
		e.Seq = &seq
		msgs = append(msgs, message(t, e))
	}
	send(t, c, msgs...)
	items := func() []any {
		_, v := call(t, ts, "GET", "/v1/inboxes/r/items?limit=100", "")
		l, _ := v["items"].([]any)
		return l
	}
	waitFor(t, 10*time.Second, "6 items", func() bool { return len(items()) == 6 })
	first := items()[0].(map[string]any)
	if first["source_sequence"] != 101.0 || first["occurred_at"] != testTS {
		t.Errorf("item of evt_1: source_sequence %v occurred_at %v, want 101 and %s", first["source_sequence"], first["occurred_at"], testTS)
	}
	waitFor(t, 10*time.Second, "the consumer at 7", func() bool {
		status, v := call(t, ts, "GET", "/v1/consumers/r", "")
		return status == 200 && v["next_offset"] == 7.0 && v["lag"] == 0.0 && v["stream"] == "devices"
	})

	// Delete two items' worth of history: retention took them.
	err := ts.Store().Update(testCtx(t, 10*time.Second), func(tx *sql.Tx) error {
		_, err := tx.Exec(`DELETE FROM inbox_items WHERE subscription_id = 'r' AND "offset" IN (3, 4)`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	status, v := call(t, ts, "POST", "/v1/consumers/r/reset", `{"to_offset": 2}`)
	if status != 200 || v["previous_next_offset"] != 7.0 || v["next_offset"] != 2.0 || v["lag"] != 5.0 {
		t.Fatalf("reset to 2: %d %v", status, v)
	}
	if st, _ := v["start"].(map[string]any); st["policy"] != "at_offset" || st["offset"] != 2.0 {
		t.Errorf("reset to 2: start %v", v["start"])
	}
	waitFor(t, 10*time.Second, "the consumer at 7 again", func() bool {
		_, v := call(t, ts, "GET", "/v1/consumers/r", "")
		return v["next_offset"] == 7.0
	})
	if n := len(items()); n != 6 {
		t.Errorf("after a reset to 2: %d items, want 6 (3 and 4 made again, the others kept once)", n)
	}

	status, v = call(t, ts, "POST", "/v1/consumers/r/reset", `{"latest": true}`)
	if status != 200 || v["next_offset"] != 7.0 || v["lag"] != 0.0 {
		t.Fatalf("reset to latest: %d %v", status, v)
	}
	status, v = call(t, ts, "POST", "/v1/consumers/r/reset", `{"to_time": "2000-01-01T00:00:00Z"}`)
	if status != 200 || v["next_offset"] != 1.0 {
		t.Fatalf("reset to a time before everything: %d %v", status, v)
	}
	status, v = call(t, ts, "POST", "/v1/consumers/r/reset", `{"earliest": true}`)
	if status != 200 || v["next_offset"] != 1.0 {
		t.Fatalf("reset to earliest: %d %v", status, v)
	}
	waitFor(t, 10*time.Second, "the consumer at 7 again", func() bool {
		_, v := call(t, ts, "GET", "/v1/consumers/r", "")
		return v["next_offset"] == 7.0
	})

	// The stream consumer follows the position: its commit comes right
	// after.
	waitFor(t, 10*time.Second, "a commit after the last reset", func() bool {
		status, v = call(t, ts, "GET", "/v1/consumers/r/commits?limit=1000", "")
		l, _ := v["commits"].([]any)
		return status == 200 && len(l) > 0 && l[0].(map[string]any)["kind"] == "commit"
	})
	if v["consumer"] != "r" || v["stream"] != "devices" {
		t.Fatalf("commits: %d %v", status, v)
	}
	var kinds []string
	for _, m := range v["commits"].([]any) {
		m := m.(map[string]any)
		k := m["kind"].(string)
		if k == "reset" {
			k += "@" + fmt.Sprint(m["next_offset"]) + "/" + m["start"].(map[string]any)["policy"].(string)
		}
		if m["next_offset"].(float64) != m["offset"].(float64)+1 || m["at"] == nil {
			t.Errorf("commit %v: next_offset is not offset + 1, or no time", m)
		}
		kinds = append(kinds, k)
	}
	var resets []string
	for _, k := range kinds {
		if k != "commit" {
			resets = append(resets, k)
		}
	}
	// Newest first: the loop's commit after the last reset, the resets
	// (and the loop's commits between them), and the commits before.
	if got := strings.Join(resets, " "); got != "reset@1/earliest reset@1/at_time reset@7/latest reset@2/at_offset" ||
		kinds[0] != "commit" || kinds[len(kinds)-1] != "commit" {
		t.Errorf("commits, newest first: %s", strings.Join(kinds, " "))
	}
	if status, v = call(t, ts, "GET", "/v1/consumers/r/commits?limit=1", ""); status != 200 || len(v["commits"].([]any)) != 1 {
		t.Errorf("commits?limit=1: %d %v", status, v)
	}
}

// TestConsumerResetBadInput: a reset names exactly one position; anything
// else is 400 naming the field, and an unknown consumer is 404.
func TestConsumerResetBadInput(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	if status, v := call(t, ts, "POST", "/v1/subscriptions", `{"name": "r", "source": "devices"}`); status != 201 {
		t.Fatalf("create: %d %v", status, v)
	}
	for _, c := range []struct {
		method, path, body string
		status             int
		code, mentions     string
	}{
		{"POST", "/v1/consumers/r/reset", `{}`, 400, "missing_field", "to_offset"},
		{"POST", "/v1/consumers/r/reset", ``, 400, "invalid_json", "empty"},
		{"POST", "/v1/consumers/r/reset", `{"to_offset": 1, "earliest": true}`, 400, "invalid_field", "to_offset, earliest"},
		{"POST", "/v1/consumers/r/reset", `{"to_offset": 0}`, 400, "invalid_field", "to_offset"},
		{"POST", "/v1/consumers/r/reset", `{"to_offset": 99}`, 400, "invalid_field", "to_offset 99"},
		{"POST", "/v1/consumers/r/reset", `{"to_offset": "3"}`, 400, "invalid_json", "to_offset"},
		{"POST", "/v1/consumers/r/reset", `{"to_time": "yesterday"}`, 400, "invalid_field", "to_time"},
		{"POST", "/v1/consumers/r/reset", `{"earliest": false}`, 400, "invalid_field", "earliest"},
		{"POST", "/v1/consumers/r/reset", `{"latest": true, "from": 1}`, 400, "unknown_field", "from"},
		{"POST", "/v1/consumers/nope/reset", `{"latest": true}`, 404, "not_found", "nope"},
		{"GET", "/v1/consumers/nope", ``, 404, "not_found", "nope"},
		{"GET", "/v1/consumers/nope/commits", ``, 404, "not_found", "nope"},
		{"GET", "/v1/consumers/r/commits?limit=0", ``, 400, "invalid_field", "limit"},
	} {
		status, v := call(t, ts, c.method, c.path, c.body)
		e, _ := v["error"].(map[string]any)
		msg, _ := e["message"].(string)
		if status != c.status || e["code"] != c.code || !strings.Contains(msg, c.mentions) {
			t.Errorf("%s %s %s: %d %v, want %d %s naming %q", c.method, c.path, c.body, status, v, c.status, c.code, c.mentions)
		}
	}
}

// TestConsumerResetOtherBackends: on JetStream (in-process NATS), Kafka
// (kfake) and a backend that is nothing but a stream.Backend, a reset
// moves the consumer and its subscription materialises again; their
// history is 501 not_kept.
func TestConsumerResetOtherBackends(t *testing.T) {
	t.Run("plain", func(t *testing.T) {
		ts, _ := startPlain(t, server.Config{})
		checkResetWithoutHistory(t, ts)
	})
	t.Run("nats", func(t *testing.T) {
		checkResetWithoutHistory(t, startNATS(t, natstest.Start(t), "RESET_", server.Config{}))
	})
	t.Run("kafka", func(t *testing.T) {
		c := kafkatest.Start(t, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		kb, err := streamkafka.Open(ctx, streamkafka.Config{Brokers: c.Brokers(), Index: filepath.Join(t.TempDir(), "index.db"), Prefix: "reset."})
		if err != nil {
			t.Fatal(err)
		}
		checkResetWithoutHistory(t, start(t, server.Config{Streams: kb}, nil))
	})
}

func checkResetWithoutHistory(t *testing.T, ts *testServer) {
	t.Helper()
	if status, v := call(t, ts, "POST", "/v1/subscriptions", `{"name": "r", "source": "devices", "start": "earliest"}`); status != 201 {
		t.Fatalf("create: %d %v", status, v)
	}
	c := dial(t, ts.WS, client.Options{})
	send(t, c, message(t, envelope("evt_a", "pi-1", `{}`)), message(t, envelope("evt_b", "pi-1", `{}`)))
	waitFor(t, 10*time.Second, "the consumer at 3", func() bool {
		_, v := call(t, ts, "GET", "/v1/consumers/r", "")
		return v["next_offset"] == 3.0
	})
	status, v := call(t, ts, "POST", "/v1/consumers/r/reset", `{"to_offset": 1}`)
	if status != 200 || v["next_offset"] != 1.0 || v["previous_next_offset"] != 3.0 {
		t.Fatalf("reset: %d %v", status, v)
	}
	waitFor(t, 10*time.Second, "the consumer at 3 again", func() bool {
		_, v := call(t, ts, "GET", "/v1/consumers/r", "")
		return v["next_offset"] == 3.0
	})
	status, v = call(t, ts, "POST", "/v1/consumers/r/reset", `{"latest": true}`)
	if status != 200 || v["next_offset"] != 3.0 {
		t.Fatalf("reset to latest: %d %v", status, v)
	}
	status, v = call(t, ts, "GET", "/v1/consumers/r/commits", "")
	if e, _ := v["error"].(map[string]any); status != 501 || e["code"] != "not_kept" {
		t.Fatalf("commits on a backend without an audit: %d %v", status, v)
	}
}
