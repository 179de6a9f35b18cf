package feed

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Store is the SQLite database StoreCheckpoints keeps checkpoints in:
// streamsqlite.Backend, whose Update runs in its single writer.
type Store interface {
	Update(ctx context.Context, fn func(tx *sql.Tx) error) error
	Migrate(ctx context.Context, component string, fsys fs.FS) error
	ReadDB() *sql.DB
}

// StoreCheckpoints keeps checkpoints in a table of a SQLite Store.
type StoreCheckpoints struct {
	db  Store
	now func() time.Time
}

var _ Checkpoints = (*StoreCheckpoints)(nil)

// NewStoreCheckpoints migrates db's checkpoint table and returns the
// checkpoints kept in it.
func NewStoreCheckpoints(ctx context.Context, db Store) (*StoreCheckpoints, error) {
	sub, _ := fs.Sub(migrations, "migrations")
	if err := db.Migrate(ctx, "feed", sub); err != nil {
		return nil, fmt.Errorf("feed checkpoints: %w", err)
	}
	return &StoreCheckpoints{db: db, now: time.Now}, nil
}

// Load implements Checkpoints.
func (c *StoreCheckpoints) Load(ctx context.Context, name string) (int64, error) {
	var off int64
	err := c.db.ReadDB().QueryRowContext(ctx, `SELECT last_offset FROM feed_checkpoints WHERE name = ?`, name).Scan(&off)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("load checkpoint %s: %w", name, err)
	}
	return off, nil
}

// Save implements Checkpoints: the checkpoint only moves forward.
func (c *StoreCheckpoints) Save(ctx context.Context, name string, offset int64) error {
	err := c.db.Update(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO feed_checkpoints (name, last_offset, updated_at) VALUES (?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET last_offset = max(last_offset, excluded.last_offset), updated_at = excluded.updated_at`,
			name, offset, c.now().UTC().Format(time.RFC3339Nano))
		return err
	})
	if err != nil {
		return fmt.Errorf("save checkpoint %s: %w", name, err)
	}
	return nil
}
