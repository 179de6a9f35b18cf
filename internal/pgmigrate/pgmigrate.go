// Package pgmigrate applies a component's embedded SQL migrations to
// PostgreSQL, once, however many processes start at the same time.
//
// Files are named NNNN_what.sql and apply in the order of their number
// (planned by internal/migrate).
// The version each component reached is in the table postbox_migrations;
// an advisory lock, held until the transaction ends, makes concurrent
// callers take turns, and every file of a call applies in that one
// transaction or none does.
package pgmigrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-events/postbox/internal/migrate"
)

// Beginner starts a transaction: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Dir returns the directory dir of f, the embedded migrations of a
// package; a dir that is not there is a programming error, and panics.
func Dir(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

// Apply applies the *.sql files of fsys that component has not applied
// yet. With a schema, it creates the schema if needed and applies the
// files and keeps postbox_migrations there; without one, in the
// connection's search_path. A component whose recorded version is above
// the last file of fsys, written by a newer postbox, is refused with a
// *migrate.TooNewError and nothing is applied.
func Apply(ctx context.Context, db Beginner, component string, fsys fs.FS, schema string) error {
	all, err := migrate.Read(fsys)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", component, err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", component, err)
	}
	defer tx.Rollback(ctx)
	steps := []string{`SELECT pg_advisory_xact_lock(hashtext('postbox_migrations'))`}
	if schema != "" {
		q := pgx.Identifier{schema}.Sanitize()
		steps = append(steps, `CREATE SCHEMA IF NOT EXISTS `+q, `SET LOCAL search_path TO `+q)
	}
	steps = append(steps, `CREATE TABLE IF NOT EXISTS postbox_migrations (
		component TEXT PRIMARY KEY, version INTEGER NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`)
	for _, s := range steps {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("migrate %s: %w", component, err)
		}
	}
	var current int
	err = tx.QueryRow(ctx, `SELECT version FROM postbox_migrations WHERE component = $1`, component).Scan(&current)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("migrate %s: read version: %w", component, err)
	}
	if err := migrate.Check(component, all, current); err != nil {
		return err
	}
	for _, m := range migrate.Pending(all, current) {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("migrate %s: %s: %w", component, m.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO postbox_migrations (component, version) VALUES ($1, $2)
			ON CONFLICT (component) DO UPDATE SET version = excluded.version, applied_at = now()`, component, m.Version); err != nil {
			return fmt.Errorf("migrate %s: %w", component, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate %s: commit: %w", component, err)
	}
	return nil
}

// Querier runs a query: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Versions returns the version each component recorded in
// postbox_migrations in schema (the search_path without one), changing
// nothing: none where the table is not there.
func Versions(ctx context.Context, db Querier, schema string) (map[string]int, error) {
	table := "postbox_migrations"
	if schema != "" {
		table = pgx.Identifier{schema, table}.Sanitize()
	}
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
		return nil, fmt.Errorf("read versions: %w", err)
	}
	out := map[string]int{}
	if !exists {
		return out, nil
	}
	rows, err := db.Query(ctx, `SELECT component, version FROM `+table)
	if err != nil {
		return nil, fmt.Errorf("read versions: %w", err)
	}
	for rows.Next() {
		var c string
		var v int
		if err := rows.Scan(&c, &v); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read versions: %w", err)
		}
		out[c] = v
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read versions: %w", err)
	}
	return out, nil
}
