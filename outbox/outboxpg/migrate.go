package outboxpg

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations holds the SQL files that create and upgrade the outbox table,
// numbered in the order they apply, for users who run migrations with
// their own tool (copy them, or embed this fs.FS). Migrate applies them.
var Migrations fs.FS = mustSub(migrations, "migrations")

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

// Beginner starts a transaction: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate creates or upgrades the outbox table (and its notify trigger) in
// the connection's search_path. It records what it applied in
// postbox_migrations and holds an advisory lock while it works, so that
// several relays starting at once migrate once.
func Migrate(ctx context.Context, db Beginner) error {
	if _, err := Exists(ctx, db); err != nil {
		return fmt.Errorf("migrate outbox: %w", err)
	}
	return migrate(ctx, db, "outbox", Migrations)
}

func migrate(ctx context.Context, db Beginner, component string, fsys fs.FS) error {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil || len(names) == 0 {
		return fmt.Errorf("migrate %s: no *.sql files (%v)", component, err)
	}
	sort.Strings(names)
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", component, err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('postbox_migrations'))`); err != nil {
		return fmt.Errorf("migrate %s: lock: %w", component, err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS postbox_migrations (
		component TEXT PRIMARY KEY, version INTEGER NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("migrate %s: %w", component, err)
	}
	var current int
	err = tx.QueryRow(ctx, `SELECT version FROM postbox_migrations WHERE component = $1`, component).Scan(&current)
	if err != nil && err != pgx.ErrNoRows {
		return fmt.Errorf("migrate %s: read version: %w", component, err)
	}
	for _, name := range names {
		n, err := strconv.Atoi(strings.SplitN(name, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("migrate %s: %s: name must start with a number", component, name)
		}
		if n <= current {
			continue
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, string(body)); err != nil {
			return fmt.Errorf("migrate %s: %s: %w", component, name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO postbox_migrations (component, version) VALUES ($1, $2)
			ON CONFLICT (component) DO UPDATE SET version = excluded.version, applied_at = now()`, component, n); err != nil {
			return fmt.Errorf("migrate %s: %w", component, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate %s: commit: %w", component, err)
	}
	return nil
}
