package pgmigrate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/internal/migrate"
	"github.com/postbox-events/postbox/internal/pgmigrate"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestApplyOnceAndAllOrNothing: callers starting at once apply each file
// once; a failing file leaves neither itself nor the files before it of
// the same call, and the version stays where it was.
func TestApplyOnceAndAllOrNothing(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.URL(t, testenv.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// A schema of this run's own: another test run on the same database
	// drops and creates its own, not this one.
	schema := fmt.Sprintf("pgmigrate_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	drop := func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	}
	drop() // left by a run that was killed
	t.Cleanup(drop)
	v1 := fstest.MapFS{
		"0001_a.sql": {Data: []byte(`CREATE TABLE a (n INT); INSERT INTO a VALUES (1);`)},
	}
	var g errgroup.Group
	for range 4 {
		g.Go(func() error { return pgmigrate.Apply(ctx, pool, "test", v1, schema) })
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("concurrent Apply: %v", err)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.a`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("0001 applied %d times (%v), want once", rows, err)
	}
	v2 := fstest.MapFS{
		"0001_a.sql":   v1["0001_a.sql"],
		"0002_b.sql":   {Data: []byte(`CREATE TABLE b (n INT);`)},
		"0003_bad.sql": {Data: []byte(`CREATE TABLE broken (;`)},
	}
	if err := pgmigrate.Apply(ctx, pool, "test", v2, schema); err == nil || !strings.Contains(err.Error(), "0003_bad.sql") {
		t.Fatalf("Apply with a bad file: %v, want an error naming 0003_bad.sql", err)
	}
	var b *string
	pool.QueryRow(ctx, `SELECT to_regclass($1)::text`, schema+".b").Scan(&b)
	var version int
	pool.QueryRow(ctx, `SELECT version FROM `+schema+`.postbox_migrations WHERE component = 'test'`).Scan(&version)
	if b != nil || version != 1 {
		t.Fatalf("after a failed 0003: table b %v, version %d; want no table b and version 1", b, version)
	}
}

// TestApplyRefusesNewer: a component a newer postbox migrated further
// than the files given is refused, naming both versions, and nothing is
// applied; Versions reads what the schema records, and none where there
// is no postbox_migrations.
func TestApplyRefusesNewer(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.PostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	if v, err := pgmigrate.Versions(ctx, conn, ""); err != nil || len(v) != 0 {
		t.Fatalf("Versions of an empty schema: %v, %v; want none", v, err)
	}
	if v, err := pgmigrate.Versions(ctx, conn, "no_such_schema_here"); err != nil || len(v) != 0 {
		t.Fatalf("Versions of a schema not there: %v, %v; want none", v, err)
	}
	a := fstest.MapFS{
		"0001_first.sql":  {Data: []byte(`CREATE TABLE a1 (x INTEGER);`)},
		"0002_second.sql": {Data: []byte(`CREATE TABLE a2 (x INTEGER);`)},
	}
	if err := pgmigrate.Apply(ctx, conn, "a", a, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE postbox_migrations SET version = 4 WHERE component = 'a'`); err != nil {
		t.Fatal(err)
	}
	a["0003_third.sql"] = &fstest.MapFile{Data: []byte(`CREATE TABLE a3 (x INTEGER);`)}
	err = pgmigrate.Apply(ctx, conn, "a", a, "")
	var tooNew *migrate.TooNewError
	if !errors.As(err, &tooNew) || tooNew.Have != 4 || tooNew.Know != 3 || !strings.Contains(err.Error(), "database holds a schema 4;") {
		t.Fatalf("Apply to a newer schema: %v, want a *migrate.TooNewError of a at 4, knowing 3", err)
	}
	var a3 bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('a3') IS NOT NULL`).Scan(&a3); err != nil {
		t.Fatal(err)
	}
	if v, err := pgmigrate.Versions(ctx, conn, ""); err != nil || v["a"] != 4 || a3 {
		t.Fatalf("after the refusal: versions %v (%v), a3 made %v; want a at 4, no a3", v, err, a3)
	}
}
