package outboxpg

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/postbox-events/postbox/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations holds the SQL files that create and upgrade the outbox table,
// numbered in the order they apply, for users who run migrations with
// their own tool (copy them, or embed this fs.FS). Migrate applies them.
var Migrations fs.FS = pgmigrate.Dir(migrations, "migrations")

// Beginner starts a transaction: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Beginner = pgmigrate.Beginner

// Migrate creates or upgrades the outbox table (and its notify trigger) in
// the connection's search_path. It records what it applied in
// postbox_migrations and holds an advisory lock while it works, so that
// several relays starting at once migrate once.
func Migrate(ctx context.Context, db Beginner) error {
	if _, err := Exists(ctx, db); err != nil {
		return fmt.Errorf("migrate outbox: %w", err)
	}
	return pgmigrate.Apply(ctx, db, "outbox", Migrations, "")
}
