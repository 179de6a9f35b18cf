package main_test

import (
	"context"
	"errors"
	"maps"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestMigrateUsage: migrate's help, and its bad invocations each with a
// clear error and exit status 2.
func TestMigrateUsage(t *testing.T) {
	for _, args := range [][]string{{"migrate", "--help"}, {"migrate", "status", "--help"}, {"migrate", "up", "--help"}} {
		if out, code := run(t, args...); code != 0 || !strings.Contains(out, "Usage: postbox migrate") || !strings.Contains(out, "--dry-run") {
			t.Errorf("postbox %s: exit %d, %s", strings.Join(args, " "), code, out)
		}
	}
	db := copyFixture(t, "0.1.0/postbox.db")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"migrate"}, 2, "migrate: no command given (status, up)"},
		{[]string{"migrate", "--db", db}, 2, "migrate: no command given (status, up)"},
		{[]string{"migrate", "down"}, 2, `migrate: unknown command "down" (status, up)`},
		{[]string{"migrate", "status", "--dry-run", "--db", db}, 2, "--dry-run is up's"},
		{[]string{"migrate", "up", "--outbox", db, "--db", db}, 2, "--outbox and --db name two databases"},
		{[]string{"migrate", "status", "--store", "mysql://x"}, 2, "--store"},
		{[]string{"migrate", "status", "--db", filepath.Join(t.TempDir(), "none.db")}, 1, "no database there"},
	} {
		if out, code := run(t, tc.args...); code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("postbox %s: exit %d, %s\nwant exit %d and %q", strings.Join(tc.args, " "), code, out, tc.code, tc.want)
		}
	}

	// up refuses a file another process holds (a running serve), and
	// applies nothing.
	older := copyFixture(t, "older/postbox.db")
	lock, err := sqlitedb.Lock(older)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Unlock()
	versions := schemaVersions(t, older)
	if out, code := run(t, "migrate", "up", "--db", older); code != 1 || !strings.Contains(out, "in use by another process") {
		t.Errorf("migrate up of a file in use: exit %d, %s", code, out)
	}
	if got := schemaVersions(t, older); !maps.Equal(got, versions) {
		t.Errorf("migrate up of a file in use changed the versions: %v, were %v", got, versions)
	}
}

// TestMigratePostgres: migrate status, up --dry-run and up on serve's
// PostgreSQL store and streams (?schema=) and on a relay's PostgreSQL
// outbox (its search_path), then the refusal of a component a newer
// postbox migrated, by migrate and by serve.
func TestMigratePostgres(t *testing.T) {
	base := testenv.PostgresSchema(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	schema := u.Query().Get("search_path")
	q := u.Query()
	q.Set("schema", schema)
	u.RawQuery = q.Encode()
	store := u.String()
	serveArgs := []string{"--store", store, "--streams", store}

	out, code := run(t, append([]string{"migrate", "status"}, serveArgs...)...)
	if code != 0 || !strings.Contains(out, "schema "+schema) || !strings.Contains(out, "0001_streams.sql") ||
		!strings.Contains(out, "0001_delivery.sql") || !strings.Contains(out, "0001_intake.sql") {
		t.Fatalf("migrate status of an empty schema: exit %d, %s", code, out)
	}
	if out, code = run(t, append([]string{"migrate", "up", "--dry-run"}, serveArgs...)...); code != 0 || !strings.Contains(out, "would apply delivery 0001_delivery.sql") {
		t.Fatalf("migrate up --dry-run: exit %d, %s", code, out)
	}
	if out, code = run(t, append([]string{"migrate", "status"}, serveArgs...)...); code != 0 || !strings.Contains(out, "0001_delivery.sql") {
		t.Fatalf("migrate status after --dry-run: exit %d, %s (--dry-run applied something?)", code, out)
	}
	if out, code = run(t, append([]string{"migrate", "up"}, serveArgs...)...); code != 0 || !strings.Contains(out, "applied streams 0001_streams.sql") ||
		!strings.Contains(out, "applied delivery 0001_delivery.sql") {
		t.Fatalf("migrate up: exit %d, %s", code, out)
	}
	if out, code = run(t, append([]string{"migrate", "status"}, serveArgs...)...); code != 0 || strings.Contains(out, ".sql") {
		t.Fatalf("migrate status after up: exit %d, pending left:\n%s", code, out)
	}
	if out, code = run(t, "migrate", "up", "--outbox", base); code != 0 || !strings.Contains(out, "applied outbox 0001_") {
		t.Fatalf("migrate up --outbox postgres: exit %d, %s", code, out)
	}
	if out, code = run(t, "migrate", "status", "--outbox", base); code != 0 || strings.Contains(out, ".sql") || !strings.Contains(out, "outbox") {
		t.Fatalf("migrate status --outbox postgres after up: exit %d, %s", code, out)
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var latest int
	if err := conn.QueryRow(ctx, `UPDATE postbox_migrations SET version = version + 2 WHERE component = 'delivery' RETURNING version - 2`).Scan(&latest); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE postbox_migrations SET version = version + 2 WHERE component = 'outbox'`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"relay", "--db", base, "--migrate=false", "--to", "ws://127.0.0.1:1", "--listen", ""},
		{"relay", "--db", base, "--to", "ws://127.0.0.1:1", "--listen", ""},
	} {
		// Bounded: a relay that took the outbox would run on, waiting
		// for its target.
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		b, err := exec.CommandContext(cctx, binary, args...).CombinedOutput()
		cancel()
		out, code := string(b), 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		if code != 1 || !strings.Contains(out, "database holds outbox schema") || !strings.Contains(out, "written by a newer postbox") {
			t.Errorf("postbox %s on a newer outbox: exit %d, %s", strings.Join(args, " "), code, out)
		}
	}
	for _, args := range [][]string{
		append([]string{"migrate", "up"}, serveArgs...),
		append([]string{"serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(t.TempDir(), "p.db")}, serveArgs...),
	} {
		out, code := run(t, args...)
		want := "database holds delivery schema " + strconv.Itoa(latest+2) + "; this postbox ("
		if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, "knows up to "+strconv.Itoa(latest)) {
			t.Errorf("postbox %s on a newer store: exit %d, %s\nwant exit 1 and %q", args[0], code, out, want)
		}
	}
}
