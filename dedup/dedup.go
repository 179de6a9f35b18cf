// Package dedup makes a redelivered event a no-op for a handler that has
// already handled it, for events and commands alike. It records
// "handler H handled id X" in an inbox table, in the same database
// transaction as the handler's own writes, on PostgreSQL or SQLite.
//
// Handle (database/sql) and HandlePgx (pgx) open a transaction, first insert
// (id, handler) into the inbox with ON CONFLICT DO NOTHING, and only when
// that inserted a row call the handler's function with the transaction and
// commit. The record and the handler's writes commit together or not at
// all, so:
//
//   - a delivery of an id the handler has already handled inserts nothing,
//     is rolled back, and does not call the function;
//   - a function that fails or panics leaves neither its writes nor the
//     record, so the next delivery runs it again;
//   - two deliveries of one id at the same time serialize on the inbox's
//     primary key: the second waits for the first transaction and then
//     inserts nothing (if it committed) or goes ahead (if it rolled back).
//     Inserting first, rather than checking and then inserting, is what
//     closes that race.
//
// The guarantee is therefore effectively-once per handler for effects that
// are writes in the same transaction. Effects outside the database (an
// HTTP call, an e-mail) still happen at least once: the function may run,
// call out, and then fail to commit.
//
// The table (PostgresSchema, SQLiteSchema) is an inbox keyed by
// (id, handler_name), not by id alone: one event can be handled by several
// handlers, each once. And id is TEXT, not UUID: it holds postbox event ids
// ("evt_<ULID>"), webhook idempotency keys and command ids alike.
//
// Commands use the same table: the handler is the command
// handler's name ("worker_orchestrator") and the id the command_id, so a
// retried dispatch starts one workflow (see ExampleHandle).
//
// The inbox grows by one row per handled id; Forget deletes old records.
package dedup

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PostgresSchema creates the inbox table and its index on PostgreSQL if they
// are missing, in the connection's search_path. Migrate runs it; it is
// exported for services that run their own migrations. It takes the
// advisory lock outboxpg.Migrate takes, until the end of the transaction
// it runs in (run as one string, its own), so that services starting at
// once do not race on CREATE ... IF NOT EXISTS.
const PostgresSchema = `SELECT pg_advisory_xact_lock(hashtext('postbox_migrations'));
CREATE TABLE IF NOT EXISTS inbox (
	id           TEXT NOT NULL,
	handler_name TEXT NOT NULL,
	processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY (id, handler_name)
);
CREATE INDEX IF NOT EXISTS inbox_processed_at ON inbox (processed_at);
`

// SQLiteSchema creates the inbox table and its index on SQLite if they are
// missing. processed_at is UTC text with milliseconds
// ("2026-11-21T10:00:00.123Z"), so that text order is time order.
const SQLiteSchema = `CREATE TABLE IF NOT EXISTS inbox (
	id           TEXT NOT NULL,
	handler_name TEXT NOT NULL,
	processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
	PRIMARY KEY (id, handler_name)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS inbox_processed_at ON inbox (processed_at);
`

// sqliteTime is SQLiteSchema's processed_at layout.
const sqliteTime = "2006-01-02T15:04:05.000Z"

// MaxKeyBytes bounds a handler name and an id, each: room for a postbox
// event id (128 bytes), a webhook idempotency key (255) or a UUID.
const MaxKeyBytes = 255

// ErrInvalidKey is wrapped by the error Handle and HandlePgx return for an
// empty, too long or non-text handler name or id. Nothing is written.
var ErrInvalidKey = errors.New("dedup: invalid key")

// pgx's database/sql driver and modernc.org/sqlite (which binds $N to the
// Nth argument) both read $1, $2 as the first and second argument, so one
// statement serves both databases.
const (
	insertSQL = `INSERT INTO inbox (id, handler_name) VALUES ($1, $2) ON CONFLICT DO NOTHING`
	forgetSQL = `DELETE FROM inbox WHERE processed_at < $1`
)

// Migrate creates the inbox table in db if it is missing (PostgresSchema or
// SQLiteSchema, whichever db is). Running it again, or from several
// processes at once, is harmless.
func Migrate(ctx context.Context, db *sql.DB) error {
	d, err := dialectOf(ctx, db)
	if err != nil {
		return fmt.Errorf("dedup migrate: %w", err)
	}
	schema := PostgresSchema
	if d == sqlite {
		schema = SQLiteSchema
	}
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("dedup migrate: %w", err)
	}
	return nil
}

// Handle runs fn in a transaction on db unless handler has already handled
// id, and records that it has in the same transaction.
//
// It returns true when fn ran and the transaction committed, and false
// with a nil error, without calling fn, when the inbox already records
// (id, handler). An error from fn is returned as it is, after rolling back
// fn's writes and the record, so a redelivery runs fn again; a panic in fn
// rolls back too and goes on up. Any other error (beginning, inserting,
// committing) is wrapped.
//
// fn must do its writes through tx: a write on db itself is outside the
// transaction, and on a one-connection pool (a SQLite writer) it would wait
// for ever. The transaction has db's default isolation level. On
// PostgreSQL under REPEATABLE READ or SERIALIZABLE the loser of two
// concurrent deliveries gets a serialization failure instead of false;
// treat it like any error, as a delivery to retry. On SQLite, open db with
// a busy timeout (_pragma=busy_timeout(5000)) so that concurrent deliveries
// wait for each other instead of failing with SQLITE_BUSY.
func Handle(ctx context.Context, db *sql.DB, handler, id string, fn func(*sql.Tx) error) (ran bool, err error) {
	if err := checkKey(handler, id); err != nil {
		return false, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("dedup %s: begin: %w", handler, err)
	}
	defer tx.Rollback() // after Commit, a no-op
	res, err := tx.ExecContext(ctx, insertSQL, id, handler)
	if err != nil {
		return false, fmt.Errorf("dedup %s: record %s: %w", handler, id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("dedup %s: record %s: %w", handler, id, err)
	}
	if n == 0 {
		return false, nil
	}
	if err := fn(tx); err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("dedup %s: commit %s: %w", handler, id, err)
	}
	return true, nil
}

// Beginner starts a pgx transaction: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx (whose Begin makes a savepoint, so that the record commits with the
// outer transaction).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// HandlePgx is Handle for pgx on PostgreSQL.
func HandlePgx(ctx context.Context, db Beginner, handler, id string, fn func(pgx.Tx) error) (ran bool, err error) {
	if err := checkKey(handler, id); err != nil {
		return false, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("dedup %s: begin: %w", handler, err)
	}
	defer tx.Rollback(ctx) // after Commit, a no-op
	tag, err := tx.Exec(ctx, insertSQL, id, handler)
	if err != nil {
		return false, fmt.Errorf("dedup %s: record %s: %w", handler, id, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	if err := fn(tx); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("dedup %s: commit %s: %w", handler, id, err)
	}
	return true, nil
}

// Forget deletes the records of ids handled before the given time and
// returns how many it deleted, so that the inbox does not grow for ever.
//
// A forgotten id is new again: a delivery of it after Forget runs the
// handler again. Choose before older than the longest time an event can
// take to be redelivered (retries, replays, a sender's outbox backlog), for
// example now minus a week. On SQLite, times compare to the millisecond.
func Forget(ctx context.Context, db *sql.DB, before time.Time) (int64, error) {
	d, err := dialectOf(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("dedup forget: %w", err)
	}
	var arg any = before
	if d == sqlite {
		arg = before.UTC().Format(sqliteTime)
	}
	res, err := db.ExecContext(ctx, forgetSQL, arg)
	if err != nil {
		return 0, fmt.Errorf("dedup forget: %w", err)
	}
	return res.RowsAffected()
}

// ForgetPgx is Forget for pgx on PostgreSQL; db is a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx.
func ForgetPgx(ctx context.Context, db interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, before time.Time) (int64, error) {
	tag, err := db.Exec(ctx, forgetSQL, before)
	if err != nil {
		return 0, fmt.Errorf("dedup forget: %w", err)
	}
	return tag.RowsAffected(), nil
}

func checkKey(handler, id string) error {
	for _, f := range [...]struct{ name, v string }{{"handler", handler}, {"id", id}} {
		switch {
		case f.v == "":
			return fmt.Errorf("%w: %s is empty", ErrInvalidKey, f.name)
		case len(f.v) > MaxKeyBytes:
			return fmt.Errorf("%w: %s is %d bytes, over %d", ErrInvalidKey, f.name, len(f.v), MaxKeyBytes)
		case !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0:
			// PostgreSQL's TEXT refuses both; SQLite would store them.
			return fmt.Errorf("%w: %s is not UTF-8 text without NUL bytes", ErrInvalidKey, f.name)
		}
	}
	return nil
}

type dialect int

const (
	postgres dialect = iota + 1
	sqlite
)

// dialectOf asks db which database it is, rather than looking at its
// driver's type, so that a driver wrapped for tracing or metrics works too.
// Only Migrate and Forget need to know; Handle's SQL is the same on both.
func dialectOf(ctx context.Context, db *sql.DB) (dialect, error) {
	// version() first: SQLite refuses it without a trace, whereas
	// PostgreSQL would log sqlite_version() as an error on every call.
	var v string
	if err := db.QueryRowContext(ctx, `SELECT version()`).Scan(&v); err == nil {
		if strings.HasPrefix(v, "PostgreSQL ") {
			return postgres, nil
		}
		return 0, fmt.Errorf("database %q is neither PostgreSQL nor SQLite", v)
	}
	if err := db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&v); err != nil {
		return 0, fmt.Errorf("database is neither PostgreSQL nor SQLite: %w", err)
	}
	return sqlite, nil
}
