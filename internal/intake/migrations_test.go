package intake_test

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"testing"
	"testing/fstest"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/migrate"
)

// oldDelivery holds the two of delivery's migrations, per dialect, as
// they were while they created the tables sources, source_checkpoints
// (SQLite's 0005, PostgreSQL's 0003) and webhook_digests (0012, 0010).
//
//go:embed testdata/olddelivery
var oldDelivery embed.FS

// oldMigrations returns delivery's migrations of kind as they were before
// intake took its tables over: today's, with the two that created them as
// they were.
func oldMigrations(t testing.TB, kind storeKind) fs.FS {
	t.Helper()
	old, dir := fstest.MapFS{}, "testdata/olddelivery/migrations"
	if kind == postgresStore {
		dir = "testdata/olddelivery/pgmigrations"
	}
	for _, fsys := range []fs.FS{delivery.Migrations(kind == postgresStore), subFS(t, oldDelivery, dir)} {
		err := fs.WalkDir(fsys, ".", func(name string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			data, err := fs.ReadFile(fsys, name)
			old[name] = &fstest.MapFile{Data: data}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return old
}

// TestMigrationsCarryOver: a database whose sources, checkpoints and
// webhook digests delivery's older migrations made keeps them once
// intake's migrations take the tables over, and delivery's current
// migrations find nothing to do in it.
func TestMigrationsCarryOver(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		created := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
		before := func(t testing.TB, state delivery.Store) {
			if err := state.Migrate(context.Background(), "delivery", oldMigrations(t, kind)); err != nil {
				t.Fatalf("the old migrations: %v", err)
			}
			exec(t, kind, state, `INSERT INTO sources (source_id, kind, stream_id, settings_json, created_at) VALUES (?, ?, ?, ?, ?)`,
				"gh", "poll", "gh", `{"url":"http://x/e"}`, created.Format("2006-01-02T15:04:05.000000Z"))
			exec(t, kind, state, `INSERT INTO source_checkpoints (source_id, next_cursor, last_error, updated_at) VALUES (?, ?, ?, ?)`,
				"gh", "c-42", "upstream said 503", created.Format("2006-01-02T15:04:05.000000Z"))
			exec(t, kind, state, `INSERT INTO webhook_digests (source_id, digest, native_id, expires_at) VALUES (?, ?, ?, ?)`,
				"hooks", "d1", "delivery-1", "2999-01-01T00:00:00.000000Z")
		}
		e := open(t, kind, openOptions{before: before})
		ctx := context.Background()
		src, err := e.st.Source(ctx, "gh")
		if err != nil || src.Kind != intake.KindPoll || string(src.Settings) != `{"url":"http://x/e"}` || !src.CreatedAt.Equal(created) {
			t.Fatalf("the source after intake's migrations: %+v %v", src, err)
		}
		if cp := src.Checkpoint; cp.Cursor != "c-42" || cp.LastError != "upstream said 503" || !cp.UpdatedAt.Equal(created) {
			t.Fatalf("its checkpoint: %+v", cp)
		}
		if owner, err := e.st.ClaimDigest(ctx, "hooks", "d1", "replay-1", time.Hour); err != nil || owner != "delivery-1" {
			t.Fatalf("a digest claimed before: owner %q %v, want delivery-1", owner, err)
		}
		if err := e.st.SaveCheckpoint(ctx, "gh", src.CreatedAt, intake.Checkpoint{Cursor: "c-43"}); err != nil {
			t.Fatalf("SaveCheckpoint: %v", err)
		}
		if n := e.count(t, `SELECT count(*) FROM source_checkpoints WHERE source_id = ? AND next_cursor = ?`, "gh", "c-43"); n != 1 {
			t.Fatalf("%d checkpoints of gh at c-43, want 1", n)
		}
		checkVersions(t, e)
	})
}

// TestMigrationsFreshDatabase: on a new database delivery's migrations
// no longer create intake's tables, and intake's create them whether they
// run after delivery's (as the server runs them) or before.
func TestMigrationsFreshDatabase(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		for _, intakeFirst := range []bool{false, true} {
			e := open(t, kind, openOptions{intakeFirst: intakeFirst})
			ctx := context.Background()
			src, created, err := e.st.CreateSource(ctx, intake.Source{Name: "gh", Kind: intake.KindWebhook, Settings: json.RawMessage(`{}`)})
			if err != nil || !created {
				t.Fatalf("intake first %v: CreateSource: %+v %v %v", intakeFirst, src, created, err)
			}
			if _, err := e.st.ClaimDigest(ctx, "gh", "d", "k", time.Hour); err != nil {
				t.Fatalf("intake first %v: ClaimDigest: %v", intakeFirst, err)
			}
			checkVersions(t, e)
			if tables := freshDeliveryTables(t, kind); tables != 0 {
				t.Fatalf("delivery's migrations alone created %d of sources, source_checkpoints and webhook_digests, want none", tables)
			}
			e.stop()
		}
	})
}

// checkVersions checks that delivery and intake recorded their latest
// migrations.
func checkVersions(t *testing.T, e *env) {
	t.Helper()
	q := `SELECT version FROM schema_migrations WHERE component = ?`
	if e.kind == postgresStore {
		q = `SELECT version FROM postbox_migrations WHERE component = ?`
	}
	all, err := migrate.Read(delivery.Migrations(e.kind == postgresStore))
	if err != nil {
		t.Fatal(err)
	}
	wantDelivery := migrate.Latest(all)
	mine, err := migrate.Read(intake.Migrations(e.kind == postgresStore)) // PostgreSQL's 0002: intake_rates
	if err != nil {
		t.Fatal(err)
	}
	for c, want := range map[string]int{"delivery": wantDelivery, intake.Component: migrate.Latest(mine)} {
		if v := e.count(t, q, c); v != want {
			t.Errorf("%s is at version %d, want %d", c, v, want)
		}
	}
}

// freshDeliveryTables returns how many of intake's tables delivery's
// migrations create in a new database of kind.
func freshDeliveryTables(t *testing.T, kind storeKind) int {
	t.Helper()
	e := &env{kind: kind}
	var n int
	before := func(t testing.TB, state delivery.Store) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if _, err := delivery.New(ctx, nil, state, delivery.Config{}); err != nil {
			t.Fatal(err)
		}
		e.state = state
		q := `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('sources', 'source_checkpoints', 'webhook_digests')`
		if kind == postgresStore {
			q = `SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name IN ('sources', 'source_checkpoints', 'webhook_digests')`
		}
		n = e.count(t, q)
	}
	open(t, kind, openOptions{before: before})
	return n
}
