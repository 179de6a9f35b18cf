package main_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
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
//	POSTBOX_WRITE_UPGRADE_FIXTURES=1 go test ./cmd/postbox/ -run TestWriteUpgradeFixtures
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
	if os.Getenv("POSTBOX_WRITE_UPGRADE_FIXTURES") == "" {
		t.Skip("writes the upgrade fixtures with POSTBOX_WRITE_UPGRADE_FIXTURES=1")
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

	want := filepath.Join(upgradeFixtures, "0.1.0")
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
