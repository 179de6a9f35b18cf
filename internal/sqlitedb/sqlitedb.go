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
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
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
	// ManualCheckpoint turns off the automatic WAL checkpoint that SQLite
	// runs inside a committing writer; the caller runs Checkpoint from
	// another connection instead, off the writer's path.
	ManualCheckpoint bool
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
	q := url.Values{}
	q.Add("_pragma", "page_size(16384)")
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+sync+")")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Add("_txlock", "immediate")
	if opts.ReadOnly {
		q.Add("_pragma", "query_only(1)")
	}
	if opts.ManualCheckpoint {
		q.Add("_pragma", "wal_autocheckpoint(0)")
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

// Migrate applies the migrations in fsys that db has not seen yet, in
// order, each in its own transaction. A migration is a file named
// NNNN_name.sql; PRAGMA user_version records the last one applied.
func Migrate(ctx context.Context, db *sql.DB, fsys fs.FS) error {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("migrate: no *.sql files")
	}
	sort.Strings(names)
	var current int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&current); err != nil {
		return fmt.Errorf("migrate: read version: %w", err)
	}
	for _, name := range names {
		n, err := strconv.Atoi(strings.SplitN(name, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("migrate: %s: name must start with a number", name)
		}
		if n <= current {
			continue
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return err
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("migrate %s: %w", name, err)
		}
		if _, err := tx.ExecContext(ctx, string(body)); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate %s: %w", name, err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", n)); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate %s: %w", name, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migrate %s: %w", name, err)
		}
		current = n
	}
	return nil
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
