package server_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/stream"
)

// ceKey is the idempotency key postbox gives the CloudEvent (source, id),
// as docs/API.md says to compute it: the JSON array ["source","id"], or
// for a longer one than 255 bytes cloudevents-sha256: and its hex SHA-256.
func ceKey(source, id string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode([]string{source, id})
	k := strings.TrimSuffix(b.String(), "\n")
	if len(k) > 255 {
		sum := sha256.Sum256([]byte(k))
		return "cloudevents-sha256:" + hex.EncodeToString(sum[:])
	}
	return k
}

// ceRequest is a CloudEvent (source, id) with data in binary or
// structured mode, as post sends it.
func ceRequest(mode, source, id, data string) (body string, headers map[string]string) {
	if mode == "binary" {
		return data, map[string]string{"ce-specversion": "1.0", "ce-id": id, "ce-source": source, "ce-type": "t.created"}
	}
	b, _ := json.Marshal(map[string]any{"specversion": "1.0", "id": id, "source": source, "type": "t.created", "data": json.RawMessage(data)})
	return string(b), map[string]string{"Content-Type": "application/cloudevents+json"}
}

// TestCloudEventsKeyedBySource: the CloudEvents spec makes source and id
// together unique, so the same id from two sources is two events, each a
// duplicate of itself only, in binary and structured mode; pairs that a
// plain concatenation would merge stay apart, and a source and id too
// long for an array key are keyed by their digest.
func TestCloudEventsKeyedBySource(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	long := "https://shop.example/" + strings.Repeat("s", 300)
	for _, mode := range []string{"binary", "structured"} {
		t.Run(mode, func(t *testing.T) {
			id := "order-1-" + mode
			pairs := []struct{ source, id string }{
				{"https://a.example/orders", id},
				{"https://b.example/orders", id},
				{"/ab", "c-" + mode}, {"/a", "bc-" + mode}, // "/abc-…" both, concatenated
				{`/q","x`, "y-" + mode}, {"/q", `x","y-` + mode}, // one array, written without escapes
				{long, id},
			}
			for i, p := range pairs {
				body, headers := ceRequest(mode, p.source, p.id, `{"n":`+string(rune('0'+i))+`}`)
				status, ans, _ := post(t, ts, body, headers)
				if status != http.StatusAccepted || ans["idempotency_key"] != ceKey(p.source, p.id) {
					t.Fatalf("%q from %.40q: %d %v, want 202 stored under %.60q", p.id, p.source, status, ans, ceKey(p.source, p.id))
				}
				status, again, _ := post(t, ts, body, headers)
				if status != http.StatusOK || again["id"] != ans["id"] {
					t.Fatalf("%q from %.40q sent again: %d %v, want 200 and %v", p.id, p.source, status, again, ans["id"])
				}
				ev, err := ts.Srv.Streams().Lookup(testCtx(t, 10*time.Second), server.WebhookSource, ceKey(p.source, p.id), "")
				if err != nil || string(ev.Payload) != `{"n":`+string(rune('0'+i))+`}` {
					t.Fatalf("%q from %.40q stored: %v %s", p.id, p.source, err, ev.Payload)
				}
			}
			if k := ceKey(long, id); !strings.HasPrefix(k, "cloudevents-sha256:") || len(k) > 255 {
				t.Fatalf("the long pair's key %q", k)
			}
			// Another payload under a used (source, id) is the conflict it is.
			body, headers := ceRequest(mode, pairs[0].source, pairs[0].id, `{"n":"other"}`)
			if status, ans, _ := post(t, ts, body, headers); status != http.StatusConflict {
				t.Fatalf("another payload: %d %v, want 409", status, ans)
			}
		})
	}
	// The batched mode is refused, not read (see TestCloudEventsRefused).
	status, body, _ := post(t, ts, `[]`, map[string]string{"Content-Type": "application/cloudevents-batch+json"})
	if status != http.StatusUnsupportedMediaType {
		t.Fatalf("batched mode: %d %v, want 415", status, body)
	}
}

// TestCloudEventsKeyedByIDBefore: a store that an older postbox wrote
// holds CloudEvents keyed by their id alone. After the upgrade, one of
// them sent again is still a duplicate (or a conflict) of the stored
// event, and the same id from another source is a new event.
func TestCloudEventsKeyedByIDBefore(t *testing.T) {
	ts := servertest.Start(t, server.Config{}, nil)
	ts.Stop()
	// What the older postbox left: its markers but the new one, and a
	// CloudEvent stored under its id, with its attributes in the metadata.
	db, err := server.OpenSQLite(server.Config{DBPath: ts.DBPath})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- db.Run(ctx) }() // its writer
	meta := `{"cloudevents":{"id":"legacy-1","source":"https://a.example/orders","specversion":"1.0","type":"t.created"},"headers":{},"remote_addr":"127.0.0.1:1"}`
	res, err := db.Append(testCtx(t, 10*time.Second), server.WebhookSource, []stream.Event{
		{NativeID: "legacy-1", Type: "t.created", OccurredAt: time.Now(), Metadata: json.RawMessage(meta), Payload: json.RawMessage(`{"n":1}`)},
		{NativeID: "plain-1", Type: "t.created", OccurredAt: time.Now(), Metadata: json.RawMessage(`{"headers":{}}`), Payload: json.RawMessage(`{"n":1}`)},
	})
	if err != nil || res[0].Err != nil || res[0].Duplicate {
		t.Fatalf("the older event: %v %v", err, res)
	}
	if err := db.Update(testCtx(t, 10*time.Second), func(tx *sql.Tx) error {
		_, err := tx.Exec(`DELETE FROM store_markers WHERE marker = 'cloudevents-keyed-by-source'`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	db.Close()

	for run := range 2 { // the upgrade, and the start after it
		ts = servertest.Start(t, server.Config{DBPath: ts.DBPath}, nil)
		for _, mode := range []string{"binary", "structured"} {
			body, headers := ceRequest(mode, "https://a.example/orders", "legacy-1", `{"n":1}`)
			status, ans := srcCall(t, ts, "POST", "/webhooks", body, headers)
			if status != http.StatusOK || ans["idempotency_key"] != "legacy-1" || ans["id"] != "wh_1" {
				t.Fatalf("start %d, %s: the CloudEvent stored before, sent again: %d %v, want 200 wh_1 under legacy-1", run, mode, status, ans)
			}
			body, headers = ceRequest(mode, "https://a.example/orders", "legacy-1", `{"n":2}`)
			if status, ans := srcCall(t, ts, "POST", "/webhooks", body, headers); status != http.StatusConflict {
				t.Fatalf("start %d, %s: it with another payload: %d %v, want 409", run, mode, status, ans)
			}
			// A key that is not a CloudEvent's is not taken for one.
			body, headers = ceRequest(mode, "https://a.example/orders", "plain-1", `{"n":1}`)
			if status, ans := srcCall(t, ts, "POST", "/webhooks", body, headers); status/100 != 2 || ans["idempotency_key"] != ceKey("https://a.example/orders", "plain-1") {
				t.Fatalf("start %d, %s: a CloudEvent whose id a plain webhook used: %d %v, want it stored under its own key", run, mode, status, ans)
			}
		}
		body, headers := ceRequest("binary", "https://b.example/orders", "legacy-1", `{"n":1}`)
		status, ans := srcCall(t, ts, "POST", "/webhooks", body, headers)
		if want := ceKey("https://b.example/orders", "legacy-1"); status/100 != 2 || ans["idempotency_key"] != want {
			t.Fatalf("start %d: the same id from another source: %d %v, want it stored under %s", run, status, ans, want)
		}
		ts.Stop()
	}
}
