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
