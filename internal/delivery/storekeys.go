package delivery

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// ReadersOf returns, in the transaction tx of the store, the names of the
// subscriptions that read the stream of source, by name: intake deletes
// no source they read (intake.StoreConfig.Readers).
func (d *Delivery) ReadersOf(ctx context.Context, tx *sql.Tx, source string) ([]string, error) {
	rows, err := conn{c: tx, pg: d.pg}.QueryContext(ctx, `SELECT subscription_id FROM subscriptions WHERE source_id = ? ORDER BY subscription_id`, source)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var subs []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		subs = append(subs, s)
	}
	return subs, rows.Err()
}

// Key returns the store's random 32-byte key of name, made the first
// time it is asked for and the same in every process of a shared store
// from then on. It is never shown: a key to derive identifiers from that
// say nothing of what they identify.
func (d *Delivery) Key(ctx context.Context, name string) ([]byte, error) {
	var h string
	err := d.db.QueryRowContext(ctx, `SELECT key_hex FROM store_keys WHERE name = ?`, name).Scan(&h)
	if errors.Is(err, sql.ErrNoRows) {
		err = d.update(ctx, func(tx conn) error {
			k := make([]byte, 32)
			rand.Read(k)
			if _, err := tx.ExecContext(ctx, `INSERT INTO store_keys (name, key_hex, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING`,
				name, hex.EncodeToString(k), d.now().UTC().Format(sqlitedb.Time)); err != nil {
				return err
			}
			return tx.QueryRowContext(ctx, `SELECT key_hex FROM store_keys WHERE name = ?`, name).Scan(&h) // another process's, if it came first
		})
	}
	if err != nil {
		return nil, fmt.Errorf("store key %s: %w", name, err)
	}
	k, err := hex.DecodeString(h)
	if err != nil || len(k) != 32 {
		return nil, fmt.Errorf("store key %s: not 32 bytes in hex", name)
	}
	return k, nil
}

// Leads reports whether this process runs the work one process of a
// shared store runs (retention, the sources that read upstream): the
// leader of a shared store, or the only process.
func (d *Delivery) Leads() bool { return d.leads() }

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
