package streamsqlite_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// TestMigrateDeviceIdentity opens a file written when device events were
// stored under their event_id with an empty variant, and finds each of
// them under its device_id as variant, so that its redelivery is still a
// duplicate and another device's event with the same event_id is stored
// beside it. Other streams, and device rows without a device_id, keep the
// empty variant.
func TestMigrateDeviceIdentity(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sqlitedb.Open(path, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	old := fstest.MapFS{}
	for _, name := range []string{"0001_streams.sql", "0002_consumers.sql"} {
		body, err := os.ReadFile(filepath.Join("migrations", name))
		if err != nil {
			t.Fatal(err)
		}
		old[name] = &fstest.MapFile{Data: body}
	}
	if err := sqlitedb.Migrate(context.Background(), db, "streams", old); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO streams (stream_id, source_id, stream_key, backend, created_at, stream_no, last_offset) VALUES
		('devices', 'devices', 'devices', 'sqlite', '2026-01-01T00:00:00.000000Z', 1, 4),
		('webhooks', 'webhooks', 'webhooks', 'sqlite', '2026-01-01T00:00:00.000000Z', 2, 1)`); err != nil {
		t.Fatal(err)
	}
	rows := []struct {
		stream, id, meta, payload string
		pos                       int64
	}{
		{"devices", "evt-1", `{"device_id":"pi-1","session_id":"s","schema_version":1}`, `{"n":1}`, 1<<40 | 1},
		{"devices", "evt-2", `{"device_id":"pi-2","session_id":"s","schema_version":1}`, `{"n":2}`, 1<<40 | 2},
		{"devices", "evt-3", `{}`, `{"n":3}`, 1<<40 | 3},
		{"devices", "evt-4", `{"device_id":"pi-1"}`, `{"n":4}`, 1<<40 | 4},
		{"webhooks", "evt-1", `{"device_id":"pi-1","headers":{}}`, `{"n":1}`, 2<<40 | 1},
	}
	for _, r := range rows {
		sum := sha256.Sum256([]byte(r.payload))
		if _, err := db.Exec(`INSERT INTO stream_events (pos, stream_id, source_id, source_native_id, event_type, occurred_at,
			metadata_json, raw_payload_json, payload_sha256, created_at, last_seen_at) VALUES (?, ?, ?, ?, 't', ?, ?, ?, ?, ?, ?)`,
			r.pos, r.stream, r.stream, r.id, "2026-01-01T00:00:00.000000Z", r.meta, r.payload, sum[:],
			"2026-01-01T00:00:00.000000Z", "2026-01-01T00:00:00.000000Z"); err != nil {
			t.Fatal(err)
		}
	}
	// A row stored under its device already (as the ingress now stores
	// them) keeps the migration from giving evt-4's row the same identity.
	sum := sha256.Sum256([]byte(`{"n":5}`))
	if _, err := db.Exec(`INSERT INTO stream_events (pos, stream_id, source_id, source_native_id, event_variant, event_type, occurred_at,
		metadata_json, raw_payload_json, payload_sha256, created_at, last_seen_at) VALUES (?, 'devices', 'devices', 'evt-4', 'pi-1', 't', ?, '{}', '{"n":5}', ?, ?, ?)`,
		1<<40|5, "2026-01-01T00:00:00.000000Z", sum[:], "2026-01-01T00:00:00.000000Z", "2026-01-01T00:00:00.000000Z"); err != nil {
		t.Fatal(err)
	}
	db.Close()

	b := start(t, path, streamsqlite.Config{})
	defer b.Close()
	ctx := context.Background()
	for _, w := range []struct{ stream, id, variant string }{
		{"devices", "evt-1", "pi-1"},
		{"devices", "evt-2", "pi-2"},
		{"devices", "evt-3", ""},
		{"devices", "evt-4", ""},
		{"devices", "evt-4", "pi-1"},
		{"webhooks", "evt-1", ""},
	} {
		if _, err := b.Lookup(ctx, w.stream, w.id, w.variant); err != nil {
			t.Errorf("%s %s/%q after the migration: %v", w.stream, w.id, w.variant, err)
		}
	}
	if _, err := b.Lookup(ctx, "devices", "evt-1", ""); !errors.Is(err, stream.ErrNotFound) {
		t.Errorf("devices evt-1/\"\" after the migration: %v, want ErrNotFound", err)
	}

	again := event("evt-1", `{"n":1}`)
	again.Type, again.Variant = "t", "pi-1"
	other := again
	other.Variant = "pi-2"
	res, err := b.Append(ctx, "devices", []stream.Event{again, other})
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; !r.Duplicate || r.Err != nil || r.Offset != 1 {
		t.Errorf("pi-1's evt-1 again: %+v, want a duplicate of offset 1", r)
	}
	if r := res[1]; r.Duplicate || r.Err != nil || r.Offset != 6 {
		t.Errorf("pi-2's evt-1: %+v, want stored at offset 6", r)
	}
}
