package outbox_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/dedup"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxpg"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

// The contract of docs/OUTBOX.md, held against the real migrations: its
// column tables must name the columns the migrations make, each of its
// SQL blocks must run on a migrated database, and what the blocks write
// must be what the relay's own store hands out (and what package dedup
// reads), field by field.

// contractDoc is docs/OUTBOX.md.
func contractDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "OUTBOX.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var docBlock = regexp.MustCompile("(?ms)^```sql ([a-z-]+)\n(.*?)^```")

// docSQL returns the text of the ```sql TAG blocks of doc, by tag, in the
// order they appear.
func docSQL(t *testing.T, doc string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, m := range docBlock.FindAllStringSubmatch(doc, -1) {
		out[m[1]] = append(out[m[1]], m[2])
	}
	if len(out) == 0 {
		t.Fatal("docs/OUTBOX.md has no ```sql TAG blocks")
	}
	return out
}

// docOne returns the one block of tag.
func docOne(t *testing.T, blocks map[string][]string, tag string) string {
	t.Helper()
	if len(blocks[tag]) != 1 {
		t.Fatalf("docs/OUTBOX.md has %d ```sql %s blocks, want 1", len(blocks[tag]), tag)
	}
	return blocks[tag][0]
}

// docColumns returns the column table after <!-- columns MARKER -->:
// each row's name and type.
func docColumns(t *testing.T, doc, marker string) map[string]string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "<!-- columns "+marker+" -->\n")
	if !ok {
		t.Fatalf("docs/OUTBOX.md has no <!-- columns %s --> table", marker)
	}
	cols := map[string]string{}
	for i, line := range strings.Split(rest, "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(line, "|")
		if i < 2 || len(cells) < 4 {
			continue // the header and its rule
		}
		cols[strings.Trim(strings.TrimSpace(cells[1]), "`")] = strings.Trim(strings.TrimSpace(cells[2]), "`")
	}
	return cols
}

func sameColumns(t *testing.T, what string, doc, real map[string]string) {
	t.Helper()
	for name, typ := range real {
		switch d, ok := doc[name]; {
		case !ok:
			t.Errorf("%s: column %s (%s) is not in docs/OUTBOX.md", what, name, typ)
		case !strings.EqualFold(d, typ):
			t.Errorf("%s: column %s is %s, docs/OUTBOX.md says %s", what, name, typ, d)
		}
	}
	for name := range doc {
		if _, ok := real[name]; !ok {
			t.Errorf("%s: docs/OUTBOX.md names column %s, which the migrations do not make", what, name)
		}
	}
}

// TestContractSQLite runs the SQLite blocks of docs/OUTBOX.md on a file
// migrated by outboxsqlite.Migrate, then reads the row back with the
// relay's store, and checks the dedup blocks against package dedup.
func TestContractSQLite(t *testing.T) {
	ctx := context.Background()
	doc := contractDoc(t)
	blocks := docSQL(t, doc)
	path := filepath.Join(t.TempDir(), "service.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := outboxsqlite.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	real := map[string]string{}
	rows, err := db.QueryContext(ctx, `SELECT name, type FROM pragma_table_info('outbox')`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			t.Fatal(err)
		}
		real[name] = typ
	}
	rows.Close()
	sameColumns(t, "SQLite outbox", docColumns(t, doc, "sqlite outbox"), real)

	insert := docOne(t, blocks, "sqlite")
	if _, err := db.ExecContext(ctx, insert); err != nil {
		t.Fatalf("the SQLite insert of docs/OUTBOX.md: %v\n%s", err, insert)
	}
	if _, err := db.ExecContext(ctx, insert); err != nil { // the same id again: nothing happens
		t.Fatalf("the SQLite insert of docs/OUTBOX.md, again: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	store, err := outboxsqlite.Open(path, outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := store.Due(ctx, time.Now().Add(time.Second), 0, 10)
	store.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 {
		t.Fatalf("the relay's store hands out %d rows, want the 1 the document wrote: %+v", len(msgs), msgs)
	}
	m := msgs[0]
	want := outbox.Message{Seq: m.Seq, EventID: "evt_01JDQ4ZJ3C6Y7F0S8N2W5K9MAE", Type: "order.placed", Body: []byte(`{"order_id":44}`),
		CorrelationID: "checkout-7f3c", TenantID: "acme", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	checkMessage(t, m, want)
	if time.Since(m.CreatedAt).Abs() > time.Minute {
		t.Errorf("CreatedAt %v, want about now (occurred_at as the document writes it)", m.CreatedAt)
	}
	if env := m.Envelope(); env.Validate(postbox.Limits{}) != nil {
		err := env.Validate(postbox.Limits{})
		t.Errorf("the row does not make a valid envelope: %v", err)
	}

	db, err = sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	checkDedup(t, blocks, "sqlite", strings.TrimSpace(dedup.SQLiteSchema), "evt_01JDQ4ZJ3C6Y7F0S8N2W5K9MAE",
		func(q string) error { _, err := db.ExecContext(ctx, q); return err },
		func(handler, id string, fn func() error) (bool, error) {
			return dedup.Handle(ctx, db, handler, id, func(*sql.Tx) error { return fn() })
		})
}

// TestContractPostgres runs the PostgreSQL blocks of docs/OUTBOX.md on a
// schema migrated by outboxpg.Migrate: the relay hears the notification,
// and its store hands out the rows the document wrote, payload byte for
// byte; the dedup blocks work on package dedup's table.
func TestContractPostgres(t *testing.T) {
	ctx := context.Background()
	doc := contractDoc(t)
	blocks := docSQL(t, doc)
	dsn := testenv.PostgresSchema(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := outboxpg.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	real := map[string]string{}
	rows, err := pool.Query(ctx, `SELECT column_name::text, data_type::text FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'outbox'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			t.Fatal(err)
		}
		real[name] = typ
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sameColumns(t, "PostgreSQL outbox", docColumns(t, doc, "postgres outbox"), real)

	listener, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, docOne(t, blocks, "postgres-listen")); err != nil {
		t.Fatal(err)
	}
	inserts := blocks["postgres"]
	if len(inserts) != 2 {
		t.Fatalf("docs/OUTBOX.md has %d ```sql postgres blocks, want 2 (one event, many)", len(inserts))
	}
	for _, q := range inserts {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("a PostgreSQL insert of docs/OUTBOX.md: %v\n%s", err, q)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := listener.WaitForNotification(wctx)
		cancel()
		if err != nil || n.Channel != outboxpg.Channel {
			t.Fatalf("after an insert of docs/OUTBOX.md: notification %+v, %v; want one on %s", n, err, outboxpg.Channel)
		}
	}

	store, err := outboxpg.New(pool, outboxpg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := store.Due(ctx, time.Now(), 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []outbox.Message{
		{EventID: "evt_01JDQ4ZJ3C6Y7F0S8N2W5K9MAB", Type: "order.placed", Body: []byte(`{"order_id": 42, "total": "19.90"}`),
			CorrelationID: "checkout-7f3a", TenantID: "acme",
			TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", TraceState: "congo=t61rcWkgMzE"},
		{EventID: "evt_01JDQ4ZJ3C6Y7F0S8N2W5K9MAC", Type: "order.placed", Body: []byte(`{"order_id": 43}`), CorrelationID: "checkout-7f3b"},
		{EventID: "evt_01JDQ4ZJ3C6Y7F0S8N2W5K9MAD", Type: "order.paid", Body: []byte(`{"order_id":43,"amount":1990}`), CorrelationID: "checkout-7f3b"},
	}
	if len(msgs) != len(want) {
		t.Fatalf("the relay's store hands out %d rows, want the %d the document wrote: %+v", len(msgs), len(want), msgs)
	}
	for i, m := range msgs {
		w := want[i]
		w.Seq, w.CreatedAt, w.Lease = m.Seq, m.CreatedAt, m.Lease
		checkMessage(t, m, w)
	}
	// The same statements again: ON CONFLICT makes them no-ops.
	for _, q := range inserts {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 3 {
			t.Fatalf("outbox rows: %d, %v", n, err)
		}
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("a PostgreSQL insert of docs/OUTBOX.md, again: %v", err)
		}
	}

	checkDedup(t, blocks, "postgres", strings.TrimSpace(dedup.PostgresSchema), "evt_01JDQ4ZJ3C6Y7F0S8N2W5K9MAB",
		func(q string) error { _, err := pool.Exec(ctx, q); return err },
		func(handler, id string, fn func() error) (bool, error) {
			return dedup.HandlePgx(ctx, pool, handler, id, func(pgx.Tx) error { return fn() })
		})
}

// checkDedup checks the dedup blocks of dialect: the schema is package
// dedup's, and after the document's protocol recorded (id, "shipping"),
// package dedup skips it for that handler and runs it for another.
func checkDedup(t *testing.T, blocks map[string][]string, dialect, schema, id string,
	exec func(string) error, handle func(handler, id string, fn func() error) (bool, error)) {
	t.Helper()
	doc := strings.TrimSpace(docOne(t, blocks, dialect+"-inbox-schema"))
	if doc != schema {
		t.Errorf("the %s inbox schema of docs/OUTBOX.md is not dedup's:\n%s\nwant\n%s", dialect, doc, schema)
	}
	for _, tag := range []string{"-inbox-schema", "-dedup", "-dedup", "-forget"} {
		if err := exec(docOne(t, blocks, dialect+tag)); err != nil {
			t.Fatalf("the %s%s block of docs/OUTBOX.md: %v", dialect, tag, err)
		}
	}
	called := 0
	fn := func() error { called++; return nil }
	if ran, err := handle("shipping", id, fn); err != nil || ran || called != 0 {
		t.Errorf("dedup after the document recorded (%s, shipping): ran %v, %v, called %d; want skipped", id, ran, err, called)
	}
	if ran, err := handle("billing", id, fn); err != nil || !ran || called != 1 {
		t.Errorf("dedup of another handler: ran %v, %v, called %d; want it run once", ran, err, called)
	}
}

func checkMessage(t *testing.T, got, want outbox.Message) {
	t.Helper()
	if got.EventID != want.EventID || got.Type != want.Type || string(got.Body) != string(want.Body) ||
		got.CorrelationID != want.CorrelationID || got.TenantID != want.TenantID ||
		got.TraceParent != want.TraceParent || got.TraceState != want.TraceState || got.Attempts != 0 {
		t.Errorf("the relay's store hands out\n%+v (body %s)\nwant\n%+v (body %s)", got, got.Body, want, want.Body)
	}
}
