package outboxpg_test

import (
	"context"
	"io/fs"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-events/postbox/internal/pgmigrate"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxpg"
)

// An outbox made before payloads were kept as text (jsonb, migrations 1
// and 2) is migrated in place: its rows stay, relayed with jsonb's text
// of their payload, and rows inserted after keep their bytes.
func TestMigrateKeepsRowsOfAJSONBOutbox(t *testing.T) {
	dsn := testenv.PostgresSchema(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	old := fstest.MapFS{}
	for _, name := range []string{"0001_outbox.sql", "0002_trace.sql"} {
		b, err := fs.ReadFile(outboxpg.Migrations, name)
		if err != nil {
			t.Fatal(err)
		}
		old[name] = &fstest.MapFile{Data: b}
	}
	if err := pgmigrate.Apply(ctx, pool, "outbox", old, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (event_id, event_type, payload, correlation_id)
		VALUES ('old', 'order.created', '{"zeta":1,"a":2,"a":3}'::jsonb, 'old')`); err != nil {
		t.Fatal(err)
	}
	if err := outboxpg.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var typ string
	if err := pool.QueryRow(ctx, `SELECT data_type FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'outbox' AND column_name = 'payload'`).Scan(&typ); err != nil {
		t.Fatal(err)
	}
	if typ != "text" {
		t.Fatalf("payload is %s after Migrate, want text", typ)
	}
	const raw = `{"zeta":1,"a":2,"a":3}`
	insertEvents(t, pool, outbox.Event{ID: "new", Type: "order.created", Payload: []byte(raw)})
	s, err := outboxpg.New(pool, outboxpg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := s.Due(ctx, time.Now(), 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"old": `{"a": 3, "zeta": 1}`, "new": raw}
	if len(msgs) != len(want) {
		t.Fatalf("Due handed out %d rows, want 2", len(msgs))
	}
	for _, m := range msgs {
		if string(m.Body) != want[m.EventID] {
			t.Errorf("%s: Body %s, want %s", m.EventID, m.Body, want[m.EventID])
		}
	}
}
