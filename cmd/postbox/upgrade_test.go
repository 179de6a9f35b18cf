package main_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/migrate"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// The upgrade fixtures are databases an earlier postbox wrote, which this
// one must open keeping every row. testdata/upgrade/0.1.0 holds serve's
// database and an agent's outbox as the 0.1.0 binary writes them;
// testdata/upgrade/older holds the same rows in the schema of an earlier
// migration of each component (olderSchema). Regenerate them with the
// binary of the release they stand for:
//
//	POSTBOX_WRITE_UPGRADE_FIXTURES=0.1.0 go test ./cmd/postbox/ -run TestWriteUpgradeFixtures
//
// which writes testdata/upgrade/0.1.0 (the version given) and
// testdata/upgrade/older.
const upgradeFixtures = "testdata/upgrade"

// olderSchema is how many migrations of each component the older fixture
// has applied: the components' first ones, so that migrate up and serve
// have some to apply.
var olderSchema = map[string]int{"streams": 3, "server": 1, "delivery": 11, intake.Component: 1, "outbox": 3}

// TestWriteUpgradeFixtures writes the fixtures with the binary of this
// tree: a serve with a webhook source and device events, a subscription
// of each with items in every state (pending, processing, completed,
// failed, pending again after a nack) and its consumer's offset, and an
// agent's outbox with rows pending, its server gone.
func TestWriteUpgradeFixtures(t *testing.T) {
	release := os.Getenv("POSTBOX_WRITE_UPGRADE_FIXTURES")
	if release == "" {
		t.Skip("writes the upgrade fixtures of a release with POSTBOX_WRITE_UPGRADE_FIXTURES=VERSION (0.1.0)")
	}
	dir := t.TempDir()
	db, outboxDB := filepath.Join(dir, "postbox.db"), filepath.Join(dir, "outbox.db")
	addr, listen := freePort(t), freePort(t)
	api := "http://" + addr
	srv := start(t, "serve", "--addr", addr, "--db", db, "--log-level", "warn")
	waitHTTP(t, api+"/ready", srv)
	mustRun := func(args ...string) string {
		t.Helper()
		out, code := run(t, args...)
		if code != 0 {
			t.Fatalf("postbox %s: exit %d, %s", strings.Join(args, " "), code, out)
		}
		return out
	}
	mustRun("sources", "create", "hooks", "--kind", "webhook", "--server", api)
	mustRun("subscriptions", "create", "hooks-sub", "--source", "hooks", "--start", "earliest", "--server", api)
	mustRun("subscriptions", "create", "devices-sub", "--source", "devices", "--start", "earliest", "--server", api)
	for i := range 8 {
		req, _ := http.NewRequest("POST", api+"/webhooks/hooks", strings.NewReader(fmt.Sprintf(`{"id":"wh_%d","type":"order.created","n":%d}`, i, i)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("wh_%d", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("webhook %d: %s %s", i, resp.Status, body)
		}
	}
	a := start(t, "agent", "--server", "ws://"+addr, "--outbox", filepath.Join(dir, "sent.db"), "--device-id", "pi-01", "--listen", listen)
	waitHTTP(t, "http://"+listen+"/health", a)
	mustRun("send", "--agent", "http://"+listen, "--type", "reading.taken", "--payload", `{"celsius":21.5}`, "--count", "20")
	drained(t, map[string]*proc{"http://" + listen: a})
	stop(t, a)

	// Items in every state: lease 6 of devices-sub (processing), then ack
	// 2 (completed), nack 2 (pending, due later), and dead-letter 1
	// (failed); the rest stay pending. hooks-sub's stay pending.
	var lease struct {
		Lease string `json:"lease"`
		Items []struct {
			ID json.Number `json:"id"`
		} `json:"items"`
	}
	out := mustRun("inbox", "lease", "devices-sub", "--max", "6", "--wait", "10s", "--visibility", "1h", "--json", "--server", api)
	if err := json.Unmarshal([]byte(out), &lease); err != nil || len(lease.Items) != 6 {
		t.Fatalf("lease: %v, %s", err, out)
	}
	ids := make([]string, len(lease.Items))
	for i, it := range lease.Items {
		ids[i] = it.ID.String()
	}
	mustRun(append([]string{"inbox", "ack", "devices-sub", "--lease", lease.Lease, "--server", api}, ids[0:2]...)...)
	mustRun(append([]string{"inbox", "nack", "devices-sub", "--lease", lease.Lease, "--delay", "1h", "--server", api}, ids[2:4]...)...)
	mustRun("inbox", "nack", "devices-sub", "--lease", lease.Lease, "--dead", "--reason", "fixture", "--server", api, ids[4])
	stop(t, srv)

	// An agent whose server is gone keeps its events pending.
	gone := freePort(t)
	pending := start(t, "agent", "--server", "ws://"+gone, "--outbox", outboxDB, "--device-id", "pi-02", "--listen", listen)
	waitHTTP(t, "http://"+listen+"/health", pending)
	mustRun("send", "--agent", "http://"+listen, "--type", "reading.taken", "--payload", `{"celsius":19}`, "--count", "5")
	stop(t, pending)

	want := filepath.Join(upgradeFixtures, release)
	older := filepath.Join(upgradeFixtures, "older")
	for _, d := range []string{want, older} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	compact(t, db, filepath.Join(want, "postbox.db"))
	compact(t, outboxDB, filepath.Join(want, "outbox.db"))
	serveComponents := map[string]fstest.MapFS{}
	for name, fsys := range map[string]fs.FS{"streams": streamsqlite.Migrations, "server": server.Migrations(),
		"delivery": delivery.Migrations(false), intake.Component: intake.Migrations(false)} {
		serveComponents[name] = firstMigrations(t, fsys, olderSchema[name])
	}
	downgrade(t, filepath.Join(want, "postbox.db"), filepath.Join(older, "postbox.db"), []string{"streams", "server", "delivery", intake.Component}, serveComponents)
	downgrade(t, filepath.Join(want, "outbox.db"), filepath.Join(older, "outbox.db"), []string{"outbox"},
		map[string]fstest.MapFS{"outbox": firstMigrations(t, outboxsqlite.Migrations, olderSchema["outbox"])})
}

// stop ends p as an operator does (SIGTERM) and waits for it.
func stop(t *testing.T, p *proc) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("%v; its log:\n%s", err, p.log)
	}
	p.cmd = nil
}

// compact writes the database at from to the one file to, its WAL
// folded in and its free pages dropped.
func compact(t *testing.T, from, to string) {
	t.Helper()
	os.Remove(to)
	db, err := sqlitedb.Open(from, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`VACUUM INTO ?`, to); err != nil {
		t.Fatal(err)
	}
}

// firstMigrations returns the first n migrations of fsys, as a planner's
// input that a database at an earlier version was migrated with.
func firstMigrations(t *testing.T, fsys fs.FS, n int) fstest.MapFS {
	t.Helper()
	all, err := migrate.Read(fsys)
	if err != nil {
		t.Fatal(err)
	}
	out := fstest.MapFS{}
	for _, m := range all[:n] {
		out[m.Name] = &fstest.MapFile{Data: []byte(m.SQL)}
	}
	return out
}

// downgrade writes to a database at the schema of migrations (the
// components in order) holding every row of from: each table's rows, in
// the columns both schemas have.
func downgrade(t *testing.T, from, to string, order []string, migrations map[string]fstest.MapFS) {
	t.Helper()
	ctx := context.Background()
	os.Remove(to)
	db, err := sqlitedb.Open(to, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, c := range order {
		if err := sqlitedb.Migrate(ctx, db, c, migrations[c]); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{`PRAGMA foreign_keys = OFF`, `ATTACH DATABASE '` + from + `' AS newer`} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range tables(t, conn, "main") {
		if table == "schema_migrations" {
			continue
		}
		cols := slices.DeleteFunc(columns(t, conn, "main", table), func(c string) bool {
			return !slices.Contains(columns(t, conn, "newer", table), c)
		})
		if len(cols) == 0 {
			continue
		}
		list := `"` + strings.Join(cols, `", "`) + `"`
		if _, err := conn.ExecContext(ctx, `INSERT OR REPLACE INTO main."`+table+`" (`+list+`) SELECT `+list+` FROM newer."`+table+`"`); err != nil {
			t.Fatalf("copy %s: %v", table, err)
		}
	}
	if _, err := conn.ExecContext(ctx, `DETACH DATABASE newer`); err != nil {
		t.Fatal(err)
	}
}

// queryer is a *sql.DB or a *sql.Conn.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func strings1(t *testing.T, db queryer, q string, args ...any) []string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// tables are the tables of schema, but SQLite's own.
func tables(t *testing.T, db queryer, schema string) []string {
	return strings1(t, db, `SELECT name FROM "`+schema+`".sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\' ORDER BY name`)
}

func columns(t *testing.T, db queryer, schema, table string) []string {
	return strings1(t, db, `SELECT name FROM pragma_table_info(?, ?) ORDER BY cid`, table, schema)
}

// TestUpgrade opens the databases an earlier postbox wrote with this
// one, by postbox migrate up and by the programs that open them (serve,
// agent): every row of every table is kept, every event, item, state and
// consumer offset among them.
func TestUpgrade(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fixture string
		outbox  bool
		by      string   // migrate, serve or agent
		pending []string // what migrate up --dry-run lists
	}{
		{name: "0.1.0 store by migrate up", fixture: "0.1.0/postbox.db", by: "migrate",
			pending: []string{"streams 0005_events_by_type.sql", "delivery 0015_item_search.sql"}},
		{name: "older store by migrate up", fixture: "older/postbox.db", by: "migrate",
			pending: []string{"streams 0004_commit_kinds.sql", "streams 0005_events_by_type.sql", "delivery 0012_webhook_keys.sql", "delivery 0015_item_search.sql"}},
		{name: "older store by serve", fixture: "older/postbox.db", by: "serve"},
		{name: "0.1.0 outbox by migrate up", fixture: "0.1.0/outbox.db", outbox: true, by: "migrate"},
		{name: "older outbox by migrate up", fixture: "older/outbox.db", outbox: true, by: "migrate",
			pending: []string{"outbox 0004_rejected_index.sql"}},
		{name: "older outbox by agent", fixture: "older/outbox.db", outbox: true, by: "agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := copyFixture(t, tc.fixture)
			before := snapshot(t, path)
			if tc.outbox {
				if n := len(before["outbox"].rows); n != 5 {
					t.Fatalf("the fixture holds %d outbox rows, want 5", n)
				}
			} else {
				checkServeFixture(t, path)
			}
			target := []string{"--db", path}
			if tc.outbox {
				target = []string{"--outbox", path}
			}
			switch tc.by {
			case "migrate":
				out, code := run(t, append([]string{"migrate", "up", "--dry-run"}, target...)...)
				if code != 0 {
					t.Fatalf("migrate up --dry-run: exit %d, %s", code, out)
				}
				for _, p := range tc.pending {
					if !strings.Contains(out, "would apply "+p) {
						t.Errorf("migrate up --dry-run does not list %s:\n%s", p, out)
					}
				}
				if len(tc.pending) == 0 && !strings.Contains(out, "up to date") {
					t.Errorf("migrate up --dry-run of a database at the latest schema:\n%s", out)
				}
				if got := snapshot(t, path); !maps.EqualFunc(got, before, func(a, b tableRows) bool {
					return slices.Equal(a.cols, b.cols) && slices.Equal(a.rows, b.rows)
				}) {
					t.Fatal("migrate up --dry-run changed the database")
				}
				if out, code = run(t, append([]string{"migrate", "up"}, target...)...); code != 0 {
					t.Fatalf("migrate up: exit %d, %s", code, out)
				}
				for _, p := range tc.pending {
					if !strings.Contains(out, "applied "+p) {
						t.Errorf("migrate up does not say it applied %s:\n%s", p, out)
					}
				}
				out, code = run(t, append([]string{"migrate", "status"}, target...)...)
				if code != 0 || strings.Contains(out, ".sql") {
					t.Fatalf("migrate status after up: exit %d, pending left:\n%s", code, out)
				}
			case "serve":
				addr := freePort(t)
				srv := start(t, "serve", "--addr", addr, "--db", path, "--log-level", "warn")
				waitHTTP(t, "http://"+addr+"/ready", srv)
				stop(t, srv)
			case "agent":
				listen := freePort(t)
				a := start(t, "agent", "--server", "ws://"+freePort(t), "--outbox", path, "--device-id", "pi-02", "--listen", listen)
				waitHTTP(t, "http://"+listen+"/health", a)
				stop(t, a)
			}
			switch tc.by {
			case "serve":
				// A server that ran writes rows of its own (keys,
				// probes, markers): the rows kept are those of the
				// tables that hold the events, the items and the
				// offsets.
				keep := []string{"stream_events", "streams", "inbox_items", "consumers", "subscriptions", "sources"}
				maps.DeleteFunc(before, func(table string, _ tableRows) bool { return !slices.Contains(keep, table) })
				// and a server that starts ends the leases of the one
				// before it (the item leased is pending again): each
				// item is kept, for its event.
				cols := []string{"item_id", "subscription_uid", "offset", "source_native_id", "payload_json"}
				before["inbox_items"] = tableRows{cols, rowsOf(t, openFixtureFor(t, tc.fixture), "inbox_items", cols)}
			case "agent":
				// An agent that ran tried to send its rows (attempts,
				// last error): what is kept is each event, pending.
				before = map[string]tableRows{"outbox": {cols: []string{"seq", "event_id", "state"}}}
				before["outbox"] = tableRows{before["outbox"].cols, rowsOf(t, openFixtureFor(t, tc.fixture), "outbox", before["outbox"].cols)}
			}
			// Tables a migration replaces or drops on purpose:
			// inbox_tallies kept the completed items' counts; item_counts
			// keeps every state's, counted afresh from the items (which
			// are kept). activations recorded the loop's batches and
			// nothing read them.
			delete(before, "inbox_tallies")
			delete(before, "activations")
			checkKept(t, path, before)
			versions := schemaVersions(t, path)
			for c, v := range versions {
				if latest := latestVersion(t, c); v != latest {
					t.Errorf("after %s, %s is at version %d, want %d", tc.by, c, v, latest)
				}
			}
		})
	}
}

// TestNewerDatabaseRefused: a database a newer postbox wrote (here, a
// component's version above this binary's last migration, while another
// component has one pending) is refused by migrate, serve and agent with
// a message naming the component and both versions, and left as it was:
// nothing applied, not even the other component's pending migration.
func TestNewerDatabaseRefused(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fixture   string
		component string
		args      func(path string) []string
	}{
		{"migrate up", "older/postbox.db", "delivery", func(p string) []string { return []string{"migrate", "up", "--db", p} }},
		{"migrate status", "older/postbox.db", "delivery", func(p string) []string { return []string{"migrate", "status", "--db", p} }},
		{"serve", "older/postbox.db", "delivery", func(p string) []string {
			return []string{"serve", "--db", p, "--addr", "127.0.0.1:0", "--log-level", "warn"}
		}},
		{"migrate up --outbox", "0.1.0/outbox.db", "outbox", func(p string) []string { return []string{"migrate", "up", "--outbox", p} }},
		{"relay", "0.1.0/outbox.db", "outbox", func(p string) []string {
			return []string{"relay", "--db", p, "--to", "ws://127.0.0.1:1", "--listen", ""}
		}},
		{"agent", "0.1.0/outbox.db", "outbox", func(p string) []string {
			return []string{"agent", "--server", "ws://127.0.0.1:1", "--outbox", p, "--device-id", "pi-02", "--listen", "127.0.0.1:0"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := copyFixture(t, tc.fixture)
			newer := latestVersion(t, tc.component) + 2
			setVersion(t, path, tc.component, newer)
			versions := schemaVersions(t, path)
			sum := fileSum(t, path)
			out, code := run(t, tc.args(path)...)
			want := fmt.Sprintf("database holds %s schema %d; this postbox (", tc.component, newer)
			wantKnows := fmt.Sprintf("knows up to %d: it was written by a newer postbox", latestVersion(t, tc.component))
			if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, wantKnows) {
				t.Fatalf("postbox %s: exit %d, %s\nwant exit 1 and %q ... %q", tc.name, code, out, want, wantKnows)
			}
			if got := fileSum(t, path); got != sum {
				t.Error("the refused database's file changed")
			}
			if got := schemaVersions(t, path); !maps.Equal(got, versions) {
				t.Errorf("versions after the refusal %v, want %v as before", got, versions)
			}
		})
	}
}

// copyFixture copies the fixture at name to a temporary directory.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(upgradeFixtures, name))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), filepath.Base(name))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + "-wal"); err == nil {
		w, _ := os.ReadFile(path + "-wal")
		b = append(b, w...)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}

// openFixtureFor opens a fresh copy of the fixture at name, closed with
// the test.
func openFixtureFor(t *testing.T, name string) *sql.DB {
	t.Helper()
	db := openFixture(t, copyFixture(t, name))
	t.Cleanup(func() { db.Close() })
	return db
}

func openFixture(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sqlitedb.Open(path, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// snapshot returns every row of every table of the database at path but
// schema_migrations, by table, with the table's columns.
func snapshot(t *testing.T, path string) map[string]tableRows {
	t.Helper()
	db := openFixture(t, path)
	defer db.Close()
	out := map[string]tableRows{}
	for _, table := range tables(t, db, "main") {
		if table == "schema_migrations" {
			continue
		}
		cols := columns(t, db, "main", table)
		out[table] = tableRows{cols, rowsOf(t, db, table, cols)}
	}
	return out
}

// tableRows are the rows of a table, each as text, in the order of the
// text, in the columns cols.
type tableRows struct {
	cols, rows []string
}

func rowsOf(t *testing.T, db queryer, table string, cols []string) []string {
	t.Helper()
	quoted := make([]string, len(cols))
	for i, c := range cols {
		quoted[i] = `quote("` + c + `")`
	}
	rows := strings1(t, db, `SELECT json_array(`+strings.Join(quoted, ", ")+`) FROM "`+table+`" ORDER BY 1`)
	if rows == nil {
		rows = []string{}
	}
	return rows
}

// checkKept checks that the database at path holds every row of before,
// in the columns before had: a column a migration added is not a change.
func checkKept(t *testing.T, path string, before map[string]tableRows) {
	t.Helper()
	db := openFixture(t, path)
	defer db.Close()
	for table, want := range before {
		if !slices.Contains(tables(t, db, "main"), table) {
			t.Errorf("table %s is gone", table)
			continue
		}
		// A column a migration made derived (generated) is still read as
		// it was: table_xinfo lists generated columns, table_info does not.
		have := strings1(t, db, `SELECT name FROM pragma_table_xinfo(?, 'main') WHERE hidden <> 1 ORDER BY cid`, table)
		if missing := slices.DeleteFunc(slices.Clone(want.cols), func(c string) bool { return slices.Contains(have, c) }); len(missing) > 0 {
			t.Errorf("table %s: columns %v are gone", table, missing)
			continue
		}
		got := rowsOf(t, db, table, want.cols)
		if gone := slices.DeleteFunc(slices.Clone(want.rows), func(r string) bool { return slices.Contains(got, r) }); len(gone) > 0 || len(got) != len(want.rows) {
			t.Errorf("table %s: %d rows, were %d; rows not kept as they were: %v", table, len(got), len(want.rows), gone)
		}
	}
}

// checkServeFixture checks that the serve fixture holds what the upgrade
// must keep: events of two sources, items in four states, and consumers
// past their first offset.
func checkServeFixture(t *testing.T, path string) {
	t.Helper()
	db := openFixture(t, path)
	defer db.Close()
	for q, want := range map[string]string{
		`SELECT count(*) FROM stream_events WHERE stream_id = 'devices'`:                                      "20",
		`SELECT count(*) FROM stream_events WHERE stream_id = 'hooks'`:                                        "8",
		`SELECT group_concat(DISTINCT state) FROM (SELECT state FROM inbox_items ORDER BY state)`:             "completed,failed,pending,processing",
		`SELECT group_concat(next_offset) FROM (SELECT next_offset FROM consumers ORDER BY next_offset DESC)`: "21,9,1",
	} {
		if got := strings1(t, db, q); len(got) != 1 || got[0] != want {
			t.Fatalf("the fixture: %s = %v, want %s", q, got, want)
		}
	}
}

func schemaVersions(t *testing.T, path string) map[string]int {
	t.Helper()
	db := openFixture(t, path)
	defer db.Close()
	v, err := sqlitedb.Versions(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func setVersion(t *testing.T, path, component string, version int) {
	t.Helper()
	db := openFixture(t, path)
	defer db.Close()
	if _, err := db.Exec(`UPDATE schema_migrations SET version = ? WHERE component = ?`, version, component); err != nil {
		t.Fatal(err)
	}
}

// latestVersion is the last migration of a SQLite component this binary
// embeds.
func latestVersion(t *testing.T, component string) int {
	t.Helper()
	fsys := map[string]fs.FS{"streams": streamsqlite.Migrations, "server": server.Migrations(), "delivery": delivery.Migrations(false),
		intake.Component: intake.Migrations(false), "outbox": outboxsqlite.Migrations}[component]
	all, err := migrate.Read(fsys)
	if err != nil {
		t.Fatal(err)
	}
	return migrate.Latest(all)
}
