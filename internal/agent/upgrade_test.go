package agent_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"testing/fstest"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/agent"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
)

// An agent upgraded over an outbox file whose rows an older postbox
// queued as whole envelopes relays them, and the server stores exactly
// what it stores for those envelopes, as the rows hold them, sent to it
// directly.
func TestAgentRelaysAnOutboxOfAnOlderVersion(t *testing.T) {
	seq := int64(41)
	envs := []postbox.Envelope{
		{SchemaVersion: 1, EventID: "evt-old-1", Type: "sensor.reading", TS: "2026-03-04T05:06:07.123456789Z",
			SessionID: "sess_old", DeviceID: device, Payload: json.RawMessage(`{"n":1}`)},
		{SchemaVersion: 1, EventID: "evt-old-2", Type: "door.opened", TS: "2026-03-04T07:06:07.5+02:00",
			SessionID: `sess "é"`, DeviceID: device, Seq: &seq, Payload: json.RawMessage(`{"html":"<b>&</b>","esc":"\u00e9\/","n":[1.50e+10,-0]}`)},
	}
	path := filepath.Join(t.TempDir(), "outbox.db")
	writeOldOutbox(t, path, envs)

	upgraded := startServer(t, server.Config{})
	ta := startAgent(t, agent.Config{Server: "ws://" + upgraded.addr, OutboxPath: path})
	testenv.Eventually(t, 30*time.Second, "the old rows at the server and an empty outbox", func() bool {
		return upgraded.has(t, int64(len(envs))) && ta.empty(t)
	})

	direct := startServer(t, server.Config{})
	conn, err := client.Dial(context.Background(), "ws://"+direct.addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msgs := make([]client.Message, len(envs))
	for i, env := range envs {
		body, err := json.Marshal(env) // the envelope as the old rows hold it
		if err != nil {
			t.Fatal(err)
		}
		msgs[i] = client.Message{EventID: env.EventID, Envelope: body}
	}
	replies, err := conn.Send(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range replies {
		if !r.OK() {
			t.Fatalf("sent directly: %+v", r)
		}
	}

	got, want := storedEvents(t, upgraded.srv.Store().ReadDB()), storedEvents(t, direct.srv.Store().ReadDB())
	if len(got) != len(envs) || !reflect.DeepEqual(got, want) {
		t.Fatalf("relayed from the old outbox, the server stores\n%q\nsent directly\n%q", got, want)
	}
}

// writeOldOutbox creates an outbox at path with the first schema of
// outboxsqlite only, holding envs as that schema's code queued them: the
// envelope JSON as payload_json.
func writeOldOutbox(t *testing.T, path string, envs []postbox.Envelope) {
	t.Helper()
	first, err := os.ReadFile(filepath.Join("..", "..", "outbox", "outboxsqlite", "migrations", "0001_outbox.sql"))
	if err != nil {
		t.Fatal(err)
	}
	db, err := sqlitedb.Open(path, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqlitedb.Migrate(context.Background(), db, "outbox", fstest.MapFS{"0001_outbox.sql": {Data: first}}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Format(sqlitedb.Time)
	for _, env := range envs {
		body, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`INSERT INTO outbox (event_id, event_type, payload_json, created_at, next_attempt_at) VALUES (?, ?, ?, ?, ?)`,
			env.EventID, env.Type, string(body), now, now); err != nil {
			t.Fatal(err)
		}
	}
}

// storedEvents returns what a server stores of each event, but for its
// position and the server's own times, ordered by event id.
func storedEvents(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT source_native_id, event_variant, event_type, occurred_at, metadata_json, raw_payload_json,
		hex(payload_sha256), coalesce(source_sequence, -1) FROM stream_events ORDER BY source_native_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, variant, typ, occurred, meta, payload, sum string
		var seq int64
		if err := rows.Scan(&id, &variant, &typ, &occurred, &meta, &payload, &sum, &seq); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s|%s|%s|%s|%s|%s|%s|%d", id, variant, typ, occurred, meta, payload, sum, seq))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
