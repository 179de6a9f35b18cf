package delivery

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

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

// ClaimDigest records that the webhook of source stored under key has a
// body of digest, for window: until then, a webhook of that body under
// another key is a replay. It returns the key that holds the digest: key
// when it was free, had expired or was key's already, else the other key,
// whose claim is left as it was. Claims are atomic in the store, so two
// processes of a shared store claiming one digest at once see one owner.
// Each claim deletes a few expired ones.
func (d *Delivery) ClaimDigest(ctx context.Context, source, digest, key string, window time.Duration) (owner string, err error) {
	now := d.now().UTC()
	err = d.update(ctx, func(tx conn) error {
		at := now.Format(sqlitedb.Time)
		if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_digests (source_id, digest, native_id, expires_at) VALUES (?1, ?2, ?3, ?4)
			ON CONFLICT (source_id, digest) DO UPDATE SET native_id = excluded.native_id, expires_at = excluded.expires_at
			WHERE webhook_digests.expires_at <= ?5`, source, digest, key, now.Add(window).Format(sqlitedb.Time), at); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, `SELECT native_id FROM webhook_digests WHERE source_id = ? AND digest = ?`, source, digest).Scan(&owner); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM webhook_digests WHERE (source_id, digest) IN
			(SELECT source_id, digest FROM webhook_digests WHERE expires_at <= ? LIMIT 16)`, at)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("webhook digest of %s: %w", source, err)
	}
	return owner, nil
}
