package delivery

import (
	"context"
	"fmt"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// Once runs fn unless the store records that marker was done, and then
// records it: what fn creates is created once in the store's life, and
// what an operator deletes afterwards stays deleted. fn must be safe to
// run again (a crash before the record runs it at the next start), and
// to run in two processes at once on a shared store.
func (d *Delivery) Once(ctx context.Context, marker string, fn func(ctx context.Context) error) error {
	if done, err := d.Marked(ctx, marker); err != nil || done {
		return err
	}
	if err := fn(ctx); err != nil {
		return err
	}
	return d.update(ctx, func(tx conn) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO store_markers (marker, created_at) VALUES (?, ?) ON CONFLICT (marker) DO NOTHING`,
			marker, d.now().UTC().Format(sqlitedb.Time))
		return err
	})
}

// Marked reports whether the store records marker (see Once).
func (d *Delivery) Marked(ctx context.Context, marker string) (bool, error) {
	var n int
	if err := d.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM store_markers WHERE marker = ?`, marker).Scan(&n); err != nil {
		return false, fmt.Errorf("read marker %s: %w", marker, err)
	}
	return n > 0, nil
}
