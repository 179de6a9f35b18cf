package sqlitedb_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// TestStmtCache runs queries in the SQLite writer's transactions the way
// delivery and intake do: a query seen twice is prepared on the writer's connection
// and then run from its statement, with the same results as text.
func TestStmtCache(t *testing.T) {
	b, err := streamsqlite.Open(filepath.Join(t.TempDir(), "p.db"), streamsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; b.Close() })

	c := sqlitedb.NewStmtCache(b)
	if c == nil {
		t.Fatal("no cache for a SQLite writer")
	}
	if sqlitedb.NewStmtCache(b.ReadDB()) != nil {
		t.Fatal("a cache for a database that prepares no writer's statements")
	}
	update := func(fn func(tx sqlitedb.Conn) error) {
		t.Helper()
		if err := b.Update(ctx, func(tx *sql.Tx) error { return fn(sqlitedb.Conn{Tx: tx, Stmts: c}) }); err != nil {
			t.Fatal(err)
		}
	}
	cached := c.Cached
	update(func(tx sqlitedb.Conn) error {
		_, err := tx.ExecContext(ctx, `CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT NOT NULL)`)
		return err
	})

	const insert = `INSERT INTO kv (k, v) VALUES (?, ?) RETURNING k`
	const read = `SELECT v FROM kv WHERE k = ?`
	for i := 1; i <= 4; i++ {
		update(func(tx sqlitedb.Conn) error {
			var k int
			if err := tx.QueryRowContext(ctx, insert, i, fmt.Sprint("v", i)).Scan(&k); err != nil || k != i {
				return fmt.Errorf("insert %d: got %d, %v", i, k, err)
			}
			if _, err := tx.ExecContext(ctx, `UPDATE kv SET v = v || '!' WHERE k = ?`, i); err != nil {
				return err
			}
			rows, err := tx.QueryContext(ctx, read, i)
			if err != nil {
				return err
			}
			defer rows.Close()
			var v string
			if !rows.Next() {
				return fmt.Errorf("read %d: no row", i)
			}
			if err := rows.Scan(&v); err != nil || v != fmt.Sprint("v", i, "!") {
				return fmt.Errorf("read %d: %q, %v", i, v, err)
			}
			return rows.Err()
		})
		if i == 1 && (cached(insert) || cached(read)) {
			t.Fatal("a query run once was prepared")
		}
		if i == 2 {
			// Prepared by a goroutine once the writer's connection is free.
			testenv.Eventually(t, 10*time.Second, "the queries run twice prepared", func() bool {
				return cached(insert) && cached(read)
			})
		}
	}

	// A failed statement from the cache fails its function only.
	err = b.Update(ctx, func(tx *sql.Tx) error {
		_, err := sqlitedb.Conn{Tx: tx, Stmts: c}.ExecContext(ctx, insert, 1, "again")
		return err
	})
	if err == nil {
		t.Fatal("a duplicate key through the cached statement: no error")
	}
	update(func(tx sqlitedb.Conn) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM kv`).Scan(&n); err != nil || n != 4 {
			return fmt.Errorf("rows: %d, %v; want 4", n, err)
		}
		return nil
	})

	// Past maxCachedStmts queries, new ones stay text.
	for i := range sqlitedb.MaxCachedStmts + 10 {
		q := fmt.Sprintf(`SELECT %d`, i)
		for range 2 {
			update(func(tx sqlitedb.Conn) error { return tx.QueryRowContext(ctx, q).Scan(new(int)) })
		}
	}
	if n := c.Seen(); n > sqlitedb.MaxCachedStmts {
		t.Fatalf("%d queries seen, want at most %d", n, sqlitedb.MaxCachedStmts)
	}
}
