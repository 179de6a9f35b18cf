package sqlitedb_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/postbox-events/postbox/internal/migrate"
	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// TestMigrateComponents: two components keep their tables in one file,
// each at its own version; re-running applies nothing; a file from before
// schema_migrations hands its user_version to the first component.
func TestMigrateComponents(t *testing.T) {
	ctx := context.Background()
	db, err := sqlitedb.Open(filepath.Join(t.TempDir(), "m.db"), sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// A file of the old scheme: its one migration recorded in user_version.
	if _, err := db.Exec(`CREATE TABLE a1 (x INTEGER); PRAGMA user_version = 1`); err != nil {
		t.Fatal(err)
	}
	a := fstest.MapFS{
		"0001_first.sql":  {Data: []byte(`CREATE TABLE a1 (x INTEGER);`)},
		"0002_second.sql": {Data: []byte(`CREATE TABLE a2 (x INTEGER);`)},
	}
	b := fstest.MapFS{"0001_only.sql": {Data: []byte(`CREATE TABLE b1 (x INTEGER);`)}}
	for range 2 {
		if err := sqlitedb.Migrate(ctx, db, "a", a); err != nil {
			t.Fatal(err)
		}
		if err := sqlitedb.Migrate(ctx, db, "b", b); err != nil {
			t.Fatal(err)
		}
	}
	versions := map[string]int{}
	rows, err := db.Query(`SELECT component, version FROM schema_migrations`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var c string
		var v int
		rows.Scan(&c, &v)
		versions[c] = v
	}
	rows.Close()
	if versions["a"] != 2 || versions["b"] != 1 || len(versions) != 2 {
		t.Fatalf("versions %v, want a:2 b:1", versions)
	}
	var tables int
	db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('a1', 'a2', 'b1')`).Scan(&tables)
	if tables != 3 {
		t.Fatalf("%d of the 3 tables exist", tables)
	}
	bad := fstest.MapFS{"0002_broken.sql": {Data: []byte(`CREATE TABLE nonsense (`)}}
	if err := sqlitedb.Migrate(ctx, db, "b", bad); err == nil {
		t.Fatal("a broken migration was accepted")
	}
	if err := db.QueryRow(`SELECT version FROM schema_migrations WHERE component = 'b'`).Scan(&tables); err != nil || tables != 1 {
		t.Fatalf("after a failed migration b is at %d (%v), want 1", tables, err)
	}
}

// TestMigrateAnotherProgramsFile: a service's own database, whose
// user_version is its own, gets every migration of the component (its
// user_version was once taken for the component's, and the outbox table
// never created); a schema_migrations table of another tool is named.
func TestMigrateAnotherProgramsFile(t *testing.T) {
	ctx := context.Background()
	db, err := sqlitedb.Open(filepath.Join(t.TempDir(), "app.db"), sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER); PRAGMA user_version = 2`); err != nil {
		t.Fatal(err)
	}
	outbox := fstest.MapFS{
		"0001_outbox.sql": {Data: []byte(`CREATE TABLE IF NOT EXISTS "outbox" (x INTEGER);`)},
		"0002_more.sql":   {Data: []byte(`ALTER TABLE outbox ADD COLUMN y INTEGER;`)},
		"0003_index.sql":  {Data: []byte(`CREATE INDEX outbox_y ON outbox (y);`)},
	}
	if err := sqlitedb.Migrate(ctx, db, "outbox", outbox); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := db.QueryRow(`SELECT version FROM schema_migrations WHERE component = 'outbox'`).Scan(&v); err != nil || v != 3 {
		t.Fatalf("outbox at %d (%v), want 3", v, err)
	}

	other, err := sqlitedb.Open(filepath.Join(t.TempDir(), "migrate.db"), sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Exec(`CREATE TABLE schema_migrations (version INTEGER, dirty INTEGER)`); err != nil {
		t.Fatal(err)
	}
	if err := sqlitedb.Migrate(ctx, other, "outbox", outbox); err == nil || !strings.Contains(err.Error(), "another program") {
		t.Fatalf("Migrate beside another tool's schema_migrations: %v, want an error naming the clash", err)
	}
}

// TestParseTime: the fast path agrees with time.Parse, and everything it
// does not handle falls back to it.
func TestParseTime(t *testing.T) {
	for _, s := range []string{
		"2026-11-21T10:00:00.000000Z", "1999-12-31T23:59:59.999999Z", "2024-02-29T12:34:56.000001Z",
		"2026-11-21T10:00:00Z", "2026-11-21T10:00:00.5+02:00", // other RFC 3339 forms
	} {
		want, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sqlitedb.ParseTime(s)
		if err != nil || !got.Equal(want) {
			t.Errorf("%s: %v %v, want %v", s, got, err, want)
		}
		if got, err := sqlitedb.ParseTime([]byte(s)); err != nil || !got.Equal(want) {
			t.Errorf("%s as bytes: %v %v", s, got, err)
		}
	}
	for _, s := range []string{"2026-02-30T10:00:00.000000Z", "2026-13-01T10:00:00.000000Z", "2026-11-21T25:00:00.000000Z", "2026-11-21Tab:00:00.000000Z", ""} {
		if _, err := sqlitedb.ParseTime(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
}

// TestMigrateRefusesNewer: a component a newer postbox migrated further
// than the files given is refused, naming both versions, and nothing is
// applied; Versions reads what the file records.
func TestMigrateRefusesNewer(t *testing.T) {
	ctx := context.Background()
	db, err := sqlitedb.Open(filepath.Join(t.TempDir(), "m.db"), sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if v, err := sqlitedb.Versions(ctx, db); err != nil || len(v) != 0 {
		t.Fatalf("Versions of a new file: %v, %v; want none", v, err)
	}
	a := fstest.MapFS{
		"0001_first.sql":  {Data: []byte(`CREATE TABLE a1 (x INTEGER);`)},
		"0002_second.sql": {Data: []byte(`CREATE TABLE a2 (x INTEGER);`)},
	}
	if err := sqlitedb.Migrate(ctx, db, "a", a); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE schema_migrations SET version = 4 WHERE component = 'a'`); err != nil {
		t.Fatal(err)
	}
	a["0003_third.sql"] = &fstest.MapFile{Data: []byte(`CREATE TABLE a3 (x INTEGER);`)}
	err = sqlitedb.Migrate(ctx, db, "a", a)
	var tooNew *migrate.TooNewError
	if !errors.As(err, &tooNew) || tooNew.Have != 4 || tooNew.Know != 3 || !strings.Contains(err.Error(), "database holds a schema 4;") {
		t.Fatalf("Migrate of a newer file: %v, want a *migrate.TooNewError of a at 4, knowing 3", err)
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name = 'a3'`).Scan(&n)
	if v, err := sqlitedb.Versions(ctx, db); err != nil || v["a"] != 4 || n != 0 {
		t.Fatalf("after the refusal: versions %v (%v), a3 made %d times; want a at 4, no a3", v, err, n)
	}
}
