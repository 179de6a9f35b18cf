// Package sqlitedb opens SQLite databases the way every postbox store wants
// them (WAL, synchronous=FULL unless told otherwise, busy_timeout, foreign
// keys) and applies embedded migrations.
//
// The modernc.org/sqlite driver reads pragmas only in the
// _pragma=name(value) DSN form, and applies them on every new connection,
// so they hold for each connection of a pool.
package sqlitedb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/postbox-events/postbox/internal/migrate"
)

// Synchronous modes an Options may ask for.
const (
	SyncFull   = "FULL"
	SyncNormal = "NORMAL"
)

// Options configure Open.
type Options struct {
	// Synchronous is FULL (the default: a commit survives power loss) or
	// NORMAL (a commit survives a process crash, not always power loss).
	Synchronous string
	// MaxConns bounds the pool. 1 makes a writer connection. Defaults to 1.
	MaxConns int
	// ReadOnly opens connections that refuse writes.
	ReadOnly bool
	// AutoCheckpoint is the size of the WAL, in pages, from which a
	// committing connection checkpoints it itself (PRAGMA
	// wal_autocheckpoint). Zero keeps SQLite's default, 1000 pages; a
	// negative value turns the connection's checkpoints off, for a log
	// another process checkpoints (Litestream).
	AutoCheckpoint int
}

// Open opens (creating if needed) the SQLite database at path and its
// directory.
func Open(path string, opts Options) (*sql.DB, error) {
	if path == "" {
		return nil, fmt.Errorf("open sqlite: empty path")
	}
	sync := strings.ToUpper(opts.Synchronous)
	if sync == "" {
		sync = SyncFull
	}
	if sync != SyncFull && sync != SyncNormal {
		return nil, fmt.Errorf("open sqlite: synchronous must be FULL or NORMAL, not %q", opts.Synchronous)
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = 1
	}
	if dir := filepath.Dir(path); dir != "" && !opts.ReadOnly {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("open sqlite: %w", err)
		}
	}
	// Pages stay SQLite's 4 KiB: with 16 KiB pages, webhooks (small
	// commits, rows indexed by random keys) wrote twice the bytes and ran
	// 15% slower, though large ingest batches ran 7-15% faster
	// (BENCHMARKS.md).
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+sync+")")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Add("_txlock", "immediate")
	if opts.MaxConns == 1 && !opts.ReadOnly {
		// A writer runs callers' functions in savepoints; SQLite keeps a
		// savepoint's copies of pages in a sub-journal, by default a temp
		// file written with a syscall per page. In memory, materialising
		// inbox items during ingest went from 48k to 61k events/s
		// (BENCHMARKS.md).
		q.Add("_pragma", "temp_store(MEMORY)")
	}
	if opts.ReadOnly {
		q.Add("_pragma", "query_only(1)")
	}
	if opts.AutoCheckpoint != 0 {
		q.Add("_pragma", "wal_autocheckpoint("+strconv.Itoa(max(opts.AutoCheckpoint, 0))+")")
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	db.SetMaxOpenConns(opts.MaxConns)
	db.SetMaxIdleConns(opts.MaxConns)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	return db, nil
}

// Pragmas reads back the pragmas Open sets, as the connection sees them.
func Pragmas(ctx context.Context, db *sql.DB) (journalMode string, synchronous int, busyTimeout int, err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return "", 0, 0, err
	}
	defer conn.Close()
	if err = conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&journalMode); err != nil {
		return
	}
	if err = conn.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&synchronous); err != nil {
		return
	}
	err = conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busyTimeout)
	return
}

// Migrate applies the migrations of component in fsys that db has not
// seen yet, in order, each in its own transaction. A file whose recorded
// version is above the last migration of fsys, written by a newer
// postbox, is refused with a *migrate.TooNewError before anything is
// applied. A migration is a file
// named NNNN_name.sql (planned by internal/migrate); the table
// schema_migrations records the last one applied per component, so
// several packages can keep their tables in one file (the control
// plane's streams and inbox items share a transaction).
//
// Files written before schema_migrations existed recorded one component's
// version in PRAGMA user_version: the first component to migrate such a
// file takes that version over, when the file holds the tables its first
// migration creates. A file of another program's (a service's own
// database, with its own user_version) is migrated from the start.
func Migrate(ctx context.Context, db *sql.DB, component string, fsys fs.FS) error {
	all, err := migrate.Read(fsys)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", component, err)
	}
	current, err := migrationVersion(ctx, db, component, createdTables(all[0].SQL))
	if err != nil {
		return fmt.Errorf("migrate %s: read version: %w", component, err)
	}
	if err := migrate.Check(component, all, current); err != nil {
		return err
	}
	for _, m := range migrate.Pending(all, current) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("migrate %s: %w", m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate %s: %w", m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (component, version) VALUES (?, ?)
			ON CONFLICT (component) DO UPDATE SET version = excluded.version`, component, m.Version); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate %s: %w", m.Name, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migrate %s: %w", m.Name, err)
		}
	}
	return nil
}

// Versions returns the version each component recorded in db's
// schema_migrations, without changing the file: none for a file without
// the table. A file older than that table, which recorded one component's
// version in PRAGMA user_version, reads as none too; Migrate takes that
// version over.
func Versions(ctx context.Context, db *sql.DB) (map[string]int, error) {
	out := map[string]int{}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'`).Scan(&n); err != nil {
		return nil, fmt.Errorf("read versions: %w", err)
	}
	if n == 0 {
		return out, nil
	}
	rows, err := db.QueryContext(ctx, `SELECT component, version FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("read versions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var c string
		var v int
		if err := rows.Scan(&c, &v); err != nil {
			return nil, fmt.Errorf("read versions: %w", err)
		}
		out[c] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read versions: %w", err)
	}
	return out, nil
}

// createTable finds the tables a migration creates.
var createTable = regexp.MustCompile(`(?i)\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?"?(\w+)"?`)

// createdTables returns the names of the tables migration creates.
func createdTables(migration string) []string {
	var names []string
	for _, m := range createTable.FindAllStringSubmatch(migration, -1) {
		names = append(names, m[1])
	}
	return names
}

// migrationVersion returns the last migration of component applied to
// db, creating schema_migrations if needed. A legacy user_version is
// taken over only when the tables of the component's first migration,
// firstTables, exist.
func migrationVersion(ctx context.Context, db *sql.DB, component string, firstTables []string) (int, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	has := func(table string) (bool, error) {
		var n int
		err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, table).Scan(&n)
		return n > 0, err
	}
	exists, err := has("schema_migrations")
	if err != nil {
		return 0, err
	}
	if exists {
		var ours int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info('schema_migrations') WHERE name IN ('component', 'version')`).Scan(&ours); err != nil {
			return 0, err
		}
		if ours != 2 {
			return 0, errors.New("the file has a table schema_migrations of another program (a migration tool's?), " +
				"where postbox records its own migrations: give postbox a database file of its own")
		}
	}
	if !exists {
		if _, err := tx.ExecContext(ctx, `CREATE TABLE schema_migrations (component TEXT PRIMARY KEY, version INTEGER NOT NULL)`); err != nil {
			return 0, err
		}
		var legacy int
		if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&legacy); err != nil {
			return 0, err
		}
		for _, table := range firstTables {
			if legacy == 0 {
				break
			}
			if ok, err := has(table); err != nil {
				return 0, err
			} else if !ok {
				legacy = 0 // not a file this component wrote: its user_version is someone else's
			}
		}
		if legacy > 0 {
			if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (component, version) VALUES (?, ?)`, component, legacy); err != nil {
				return 0, err
			}
		}
	}
	var v int
	err = tx.QueryRowContext(ctx, `SELECT version FROM schema_migrations WHERE component = ?`, component).Scan(&v)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, err
	}
	return v, tx.Commit()
}

// Checkpoint modes: who checkpoints a store's write-ahead log into its
// database file.
const (
	// CheckpointAuto: the store checkpoints its log itself, as SQLite
	// users expect. The default.
	CheckpointAuto = "auto"
	// CheckpointLitestream: the store never checkpoints its log, and
	// leaves it to Litestream, which replicates the log and checkpoints
	// it once it has shipped it (Litestream's advice: PRAGMA
	// wal_autocheckpoint = 0 in the application). Without Litestream
	// running the log grows without bound.
	CheckpointLitestream = "litestream"
)

// CheckCheckpointMode returns an error naming mode when it is not one of
// the checkpoint modes ("" is CheckpointAuto).
func CheckCheckpointMode(mode string) error {
	switch mode {
	case "", CheckpointAuto, CheckpointLitestream:
		return nil
	}
	return fmt.Errorf("WAL checkpoint mode %q: use %s or %s", mode, CheckpointAuto, CheckpointLitestream)
}

// Time is the text form postbox stores times in: UTC, fixed width, so that
// text order is time order.
const Time = "2006-01-02T15:04:05.000000Z"

// Checkpoint copies committed WAL pages into the database file without
// blocking writers or readers (PRAGMA wal_checkpoint(PASSIVE)).
func Checkpoint(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)")
	return err
}

// ParseTime parses a time written in the Time layout; other RFC 3339 forms
// are accepted too, more slowly.
func ParseTime[T ~string | ~[]byte](s T) (time.Time, error) {
	if len(s) != len(Time) || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[19] != '.' || s[26] != 'Z' {
		return time.Parse(time.RFC3339Nano, string(s))
	}
	num := func(from, to int) int {
		n := 0
		for i := from; i < to; i++ {
			c := s[i] - '0'
			if c > 9 {
				return -1
			}
			n = n*10 + int(c)
		}
		return n
	}
	year, month, day := num(0, 4), num(5, 7), num(8, 10)
	hour, minute, sec, micro := num(11, 13), num(14, 16), num(17, 19), num(20, 26)
	if year < 0 || month < 1 || month > 12 || day < 1 || day > 31 || hour < 0 || hour > 23 ||
		minute < 0 || minute > 59 || sec < 0 || sec > 59 || micro < 0 {
		return time.Parse(time.RFC3339Nano, string(s))
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, micro*1000, time.UTC)
	if t.Day() != day { // February 30th and the like
		return time.Parse(time.RFC3339Nano, string(s))
	}
	return t, nil
}
