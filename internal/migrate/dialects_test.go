package migrate_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-events/postbox/internal/pgmigrate"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
)

// dialectPair is a component whose migrations are written twice, once for
// SQLite and once for PostgreSQL, that must end with the same tables,
// columns, primary keys and index names in both.
type dialectPair struct {
	component string
	// The migration directories, from this package's directory.
	sqlite, postgres string
	// allow lists the differences that are meant, each with the reason:
	// a difference reported and not here fails the test, and so does
	// an entry here that is no longer reported.
	allow map[string]string
}

// dialectPairs are the components checked. The streams' (streamsqlite,
// streampg) and the outbox's (outboxsqlite, outboxpg) are not: each
// backend has a layout of its own (a row id and text times on SQLite, an
// offset key and timestamptz on PostgreSQL), read by its own queries.
var dialectPairs = []dialectPair{
	{component: "delivery", sqlite: "../delivery/migrations", postgres: "../delivery/pgmigrations", allow: map[string]string{
		"table delivery_leases: only in postgres": "the leases of the processes sharing a PostgreSQL store; " +
			"a SQLite store has one process, which holds the file's lock",
		"column item_counts.count_id: only in sqlite": "SQLite's rowid, named; no query reads it, " +
			"and rows are only inserted and deleted whole",
		"table endpoint_rates: only in postgres": "the rate of an endpoint over the processes sharing a PostgreSQL store; " +
			"a SQLite store has one process, which counts it in memory",
		"table endpoint_slots: only in postgres": "the concurrency of an endpoint over the processes sharing a PostgreSQL store; " +
			"a SQLite store has one process, which counts it in memory",
		"table item_counts: primary key (count_id) in sqlite, () in postgres": "the same rowid",
	}},
	{component: "intake", sqlite: "../intake/migrations", postgres: "../intake/pgmigrations", allow: map[string]string{
		"table intake_rates: only in postgres": "the intake rate limits over the processes sharing a PostgreSQL store; " +
			"a SQLite store has one process, which keeps its buckets in memory (internal/intakerate)",
	}},
	{component: "streamkafka", sqlite: "../../stream/streamkafka/migrations/sqlite", postgres: "../../stream/streamkafka/migrations/postgres", allow: map[string]string{}},
}

// TestDialectsAgree migrates a fresh SQLite database and a fresh
// PostgreSQL schema with each pair's migrations and compares what they
// made, table by table and column by column (name, type family, NOT
// NULL), with primary keys and index names: a column added to one dialect
// and forgotten in the other fails here, not in production.
func TestDialectsAgree(t *testing.T) {
	for _, p := range dialectPairs {
		t.Run(p.component, func(t *testing.T) {
			ctx := context.Background()
			lite := openSQLite(t, p)
			pg := openPostgres(t, p)
			got := diffSchemas(readSQLite(t, lite), readPostgres(t, pg))
			for _, d := range got {
				if _, ok := p.allow[d]; !ok {
					t.Errorf("%s: %s\n\tadd it to the other dialect's migrations, or to dialectPairs' allow-list with the reason it is meant", p.component, d)
				}
			}
			for d := range p.allow {
				if !slices.Contains(got, d) {
					t.Errorf("%s: the allowed difference %q is gone: remove it from the allow-list", p.component, d)
				}
			}

			// The check can fail: a column or an index added to one side
			// only, or a column whose type differs, is reported.
			t.Run("a column in one dialect only is reported", func(t *testing.T) {
				table := firstTable(t, lite)
				if _, err := lite.ExecContext(ctx, `ALTER TABLE "`+table+`" ADD COLUMN schema_check_lite TEXT`); err != nil {
					t.Fatal(err)
				}
				if _, err := pg.Exec(ctx, `ALTER TABLE "`+table+`" ADD COLUMN schema_check_pg BIGINT NOT NULL DEFAULT 0`); err != nil {
					t.Fatal(err)
				}
				if _, err := lite.ExecContext(ctx, `ALTER TABLE "`+table+`" ADD COLUMN schema_check_both TEXT`); err != nil {
					t.Fatal(err)
				}
				if _, err := pg.Exec(ctx, `ALTER TABLE "`+table+`" ADD COLUMN schema_check_both BOOLEAN`); err != nil {
					t.Fatal(err)
				}
				if _, err := pg.Exec(ctx, `CREATE INDEX schema_check_index ON "`+table+`" (schema_check_pg)`); err != nil {
					t.Fatal(err)
				}
				got := diffSchemas(readSQLite(t, lite), readPostgres(t, pg))
				for _, want := range []string{
					"column " + table + ".schema_check_lite: only in sqlite",
					"column " + table + ".schema_check_pg: only in postgres",
					"column " + table + ".schema_check_both: text in sqlite, bool in postgres",
					"index schema_check_index on " + table + ": only in postgres",
				} {
					if !slices.Contains(got, want) {
						t.Errorf("differences %q, want among them %q", got, want)
					}
				}
			})
		})
	}
}

func openSQLite(t *testing.T, p dialectPair) *sql.DB {
	t.Helper()
	db, err := sqlitedb.Open(filepath.Join(t.TempDir(), "schema.db"), sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := sqlitedb.Migrate(context.Background(), db, p.component, os.DirFS(p.sqlite)); err != nil {
		t.Fatal(err)
	}
	return db
}

func openPostgres(t *testing.T, p dialectPair) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.PostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	if err := pgmigrate.Apply(ctx, conn, p.component, os.DirFS(p.postgres), ""); err != nil {
		t.Fatal(err)
	}
	return conn
}

// column is one column as both dialects can say it.
type column struct {
	family  string // text, integer, real, blob, bool, timestamp, json, or the type as declared
	notNull bool   // a primary key's columns are not null
}

// schema is the tables of a database, less the migrations' own.
type schema struct {
	columns map[string]map[string]column // by table, by column
	keys    map[string][]string          // primary key columns by table, in order
	indexes map[string]string            // the table of each index made by CREATE INDEX
}

func newSchema() schema {
	return schema{columns: map[string]map[string]column{}, keys: map[string][]string{}, indexes: map[string]string{}}
}

func (s schema) add(table, name, declared string, notNull bool) {
	if s.columns[table] == nil {
		s.columns[table] = map[string]column{}
	}
	s.columns[table][name] = column{family: family(declared), notNull: notNull}
}

// family is the kind of a column's declared type, as each dialect spells it.
func family(declared string) string {
	t := strings.ToLower(strings.TrimSpace(declared))
	switch {
	case strings.Contains(t, "interval"):
		return "interval"
	case strings.Contains(t, "int") || strings.HasSuffix(t, "serial"):
		return "integer"
	case strings.Contains(t, "bool"):
		return "bool"
	case strings.Contains(t, "timestamp") || t == "date" || strings.HasPrefix(t, "time"):
		return "timestamp"
	case strings.Contains(t, "json"):
		return "json"
	case strings.Contains(t, "char") || strings.Contains(t, "text") || strings.Contains(t, "clob"):
		return "text"
	case t == "" || strings.Contains(t, "blob") || t == "bytea":
		return "blob"
	case strings.Contains(t, "real") || strings.Contains(t, "floa") || strings.Contains(t, "doub") ||
		strings.Contains(t, "numeric") || strings.Contains(t, "decimal"):
		return "real"
	}
	return t
}

// migrationTables are where the appliers record versions.
var migrationTables = []string{"schema_migrations", "postbox_migrations"}

func readSQLite(t *testing.T, db *sql.DB) schema {
	t.Helper()
	ctx := context.Background()
	rows, err := db.QueryContext(ctx, `SELECT m.name, c.name, c.type, c."notnull", c.pk
		FROM sqlite_master m, pragma_table_info(m.name) c
		WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite\_%' ESCAPE '\'
		ORDER BY m.name, c.pk, c.cid`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	s := newSchema()
	for rows.Next() {
		var table, name, declared string
		var notNull bool
		var pk int
		if err := rows.Scan(&table, &name, &declared, &notNull, &pk); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(migrationTables, table) {
			continue
		}
		s.add(table, name, declared, notNull || pk > 0)
		if pk > 0 {
			s.keys[table] = append(s.keys[table], name)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// Indexes of their own, not those of a key or a UNIQUE constraint.
	rows, err = db.QueryContext(ctx, `SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, table string
		if err := rows.Scan(&name, &table); err != nil {
			t.Fatal(err)
		}
		s.indexes[name] = table
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

func readPostgres(t *testing.T, conn *pgx.Conn) schema {
	t.Helper()
	ctx := context.Background()
	s := newSchema()
	rows, err := conn.Query(ctx, `SELECT c.table_name, c.column_name, c.data_type, c.is_nullable = 'NO'
		FROM information_schema.columns c
		JOIN information_schema.tables t USING (table_schema, table_name)
		WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
		ORDER BY c.table_name, c.ordinal_position`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var table, name, declared string
		var notNull bool
		if err := rows.Scan(&table, &name, &declared, &notNull); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(migrationTables, table) {
			s.add(table, name, declared, notNull)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows, err = conn.Query(ctx, `SELECT k.table_name, k.column_name
		FROM information_schema.table_constraints c
		JOIN information_schema.key_column_usage k USING (constraint_schema, constraint_name, table_name)
		WHERE c.table_schema = current_schema() AND c.constraint_type = 'PRIMARY KEY'
		ORDER BY k.table_name, k.ordinal_position`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var table, name string
		if err := rows.Scan(&table, &name); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(migrationTables, table) {
			s.keys[table] = append(s.keys[table], name)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// Indexes of their own, not those of a key or a UNIQUE constraint.
	rows, err = conn.Query(ctx, `SELECT indexname, tablename FROM pg_indexes i
		WHERE schemaname = current_schema() AND NOT EXISTS (
			SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname AND c.connamespace = current_schema()::regnamespace)`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name, table string
		if err := rows.Scan(&name, &table); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(migrationTables, table) {
			s.indexes[name] = table
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

// diffSchemas returns how lite and pg differ, one line a difference, sorted.
func diffSchemas(lite, pg schema) []string {
	var out []string
	for table, cols := range lite.columns {
		other, ok := pg.columns[table]
		if !ok {
			out = append(out, "table "+table+": only in sqlite")
			continue
		}
		for name, c := range cols {
			o, ok := other[name]
			where := "column " + table + "." + name + ": "
			switch {
			case !ok:
				out = append(out, where+"only in sqlite")
				continue
			case c.family != o.family:
				out = append(out, fmt.Sprintf("%s%s in sqlite, %s in postgres", where, c.family, o.family))
			}
			if c.notNull != o.notNull {
				out = append(out, fmt.Sprintf("%sNOT NULL %s in sqlite, %s in postgres", where, yesNo(c.notNull), yesNo(o.notNull)))
			}
		}
		for name := range other {
			if _, ok := cols[name]; !ok {
				out = append(out, "column "+table+"."+name+": only in postgres")
			}
		}
		if a, b := lite.keys[table], pg.keys[table]; !slices.Equal(a, b) {
			out = append(out, fmt.Sprintf("table %s: primary key (%s) in sqlite, (%s) in postgres", table, strings.Join(a, ", "), strings.Join(b, ", ")))
		}
	}
	for table := range pg.columns {
		if _, ok := lite.columns[table]; !ok {
			out = append(out, "table "+table+": only in postgres")
		}
	}
	for name, table := range lite.indexes {
		if other, ok := pg.indexes[name]; !ok {
			out = append(out, "index "+name+" on "+table+": only in sqlite")
		} else if other != table {
			out = append(out, fmt.Sprintf("index %s: on %s in sqlite, on %s in postgres", name, table, other))
		}
	}
	for name, table := range pg.indexes {
		if _, ok := lite.indexes[name]; !ok {
			out = append(out, "index "+name+" on "+table+": only in postgres")
		}
	}
	slices.Sort(out)
	return out
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// firstTable returns a table of db, the first by name.
func firstTable(t *testing.T, db *sql.DB) string {
	t.Helper()
	var name string
	err := db.QueryRow(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\'
		AND name NOT IN ('schema_migrations') ORDER BY name LIMIT 1`).Scan(&name)
	if err != nil {
		t.Fatal(err)
	}
	return name
}
