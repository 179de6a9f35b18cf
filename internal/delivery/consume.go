package delivery

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

// retryDelay is how long a loop waits after a failed read or commit.
const retryDelay = time.Second

// consume runs s's consumption loop until ctx ends or s is deleted.
func (d *Delivery) consume(ctx context.Context, s Subscription) {
	log := d.log.With("subscription", s.Name)
	m := newMatcher(s)
	var c stream.Consumer
	for {
		var err error
		c, err = d.b.EnsureConsumer(ctx, stream.ConsumerConfig{ID: s.Name, StreamID: s.Stream, Start: s.Start})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		log.Error("delivery: cannot create the consumer; retrying", "err", err)
		if !sleep(ctx, retryDelay) {
			return
		}
	}
	next := c.NextOffset
	items := make([]pendingItem, 0, d.cfg.BatchSize)
	batches := 0
	for ctx.Err() == nil {
		batch, err := d.b.Read(ctx, s.Name, next, d.cfg.BatchSize)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, stream.ErrConsumerNotFound) {
				return
			}
			log.Error("delivery: read failed; retrying", "offset", next, "err", err)
			sleep(ctx, retryDelay)
			continue
		}
		if len(batch.Events) == 0 {
			if err := d.b.Wait(ctx, s.Stream, next-1); err != nil {
				return
			}
			continue
		}
		items = items[:0]
		for i := range batch.Events {
			if m.match(&batch.Events[i]) {
				items = append(items, pendingItem{ev: &batch.Events[i]})
			}
		}
		last := batch.Events[len(batch.Events)-1].Offset
		batches++
		_, err = d.b.CommitWith(ctx, s.Name, last, func(tx *sql.Tx) error {
			if err := d.materialise(ctx, tx, s, items, batch.Events[0].Offset, last); err != nil {
				return err
			}
			if batches%256 == 0 {
				return pruneActivations(ctx, tx, s.Name)
			}
			return nil
		})
		switch {
		case err == nil:
			next = last + 1
			if len(items) > 0 {
				d.inboxes.notify(s.Inbox)
			}
			d.cfg.Metrics.materialised(s.Name, len(batch.Events), len(items))
		case errors.Is(err, stream.ErrCommitBehind):
			// Someone else moved the consumer (a reset): follow it.
			if c, err := d.b.Consumer(ctx, s.Name); err == nil {
				next = c.NextOffset
			}
		case errors.Is(err, stream.ErrConsumerNotFound) || ctx.Err() != nil:
			return
		default:
			log.Error("delivery: materialising a batch failed; retrying", "from", batch.Events[0].Offset, "to", last, "err", err)
			sleep(ctx, retryDelay)
		}
	}
}

type pendingItem struct{ ev *stream.StoredEvent }

// itemChunk is how many items one INSERT writes: the SQLite driver binds
// arguments in time quadratic in their number, so statements stay small.
const itemChunk = 4

const itemInsert = `INSERT INTO inbox_items (inbox_id, subscription_id, subscription_uid, stream_id, "offset",
	source_native_id, event_type, occurred_at, stored_at, metadata_json, payload_json, delivery_handle_json,
	next_attempt_at, created_at, updated_at) VALUES `

const itemRow = `(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`

// materialise writes items and their activation inside tx. An item that
// exists already (the batch was materialised before a crash took the
// commit with it: impossible on SQLite, where both are one transaction,
// but not on every backend) is skipped.
func (d *Delivery) materialise(ctx context.Context, tx *sql.Tx, s Subscription, items []pendingItem, first, last int64) error {
	if len(items) == 0 {
		return nil
	}
	now := d.now().UTC().Format(sqlitedb.Time)
	var full *sql.Stmt
	args := make([]any, 0, itemChunk*15)
	firstID := int64(0)
	for rest := items; len(rest) > 0; {
		part := rest[:min(itemChunk, len(rest))]
		rest = rest[len(part):]
		args = args[:0]
		for _, it := range part {
			ev := it.ev
			var handle any
			if len(ev.DeliveryHandle) > 0 {
				handle = string(ev.DeliveryHandle)
			}
			args = append(args, s.Inbox, s.Name, s.UID, ev.StreamID, ev.Offset, ev.NativeID, ev.Type,
				ev.OccurredAt.UTC().Format(sqlitedb.Time), ev.StoredAt.UTC().Format(sqlitedb.Time),
				string(ev.Metadata), string(ev.Payload), handle, now, now, now)
		}
		var stmt *sql.Stmt
		var err error
		if len(part) == itemChunk {
			if full == nil {
				if full, err = tx.PrepareContext(ctx, itemInsert+itemRow+strings.Repeat(","+itemRow, itemChunk-1)+` ON CONFLICT DO NOTHING`); err != nil {
					return fmt.Errorf("materialise: %w", err)
				}
				defer full.Close()
			}
			stmt = full
		} else {
			if stmt, err = tx.PrepareContext(ctx, itemInsert+itemRow+strings.Repeat(","+itemRow, len(part)-1)+` ON CONFLICT DO NOTHING`); err != nil {
				return fmt.Errorf("materialise: %w", err)
			}
			defer stmt.Close()
		}
		r, err := stmt.ExecContext(ctx, args...)
		if err != nil {
			return fmt.Errorf("materialise: %w", err)
		}
		if firstID == 0 {
			if n, _ := r.RowsAffected(); n > 0 {
				id, _ := r.LastInsertId()
				firstID = id - n + 1
			}
		}
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO activations (subscription_id, inbox_id, first_offset, last_offset, items, first_item_id, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)`, s.Name, s.Inbox, first, last, len(items), firstID, now)
	if err != nil {
		return fmt.Errorf("materialise: activation: %w", err)
	}
	return nil
}

// activationsKept is how many activations per subscription are kept.
const activationsKept = 1000

// pruneActivations deletes all but the newest activationsKept activations
// of sub.
func pruneActivations(ctx context.Context, tx *sql.Tx, sub string) error {
	_, err := tx.ExecContext(ctx, `DELETE FROM activations WHERE subscription_id = ?1 AND activation_id <
		(SELECT activation_id FROM activations WHERE subscription_id = ?1 ORDER BY activation_id DESC LIMIT 1 OFFSET ?2)`,
		sub, activationsKept-1)
	if err != nil {
		return fmt.Errorf("prune activations: %w", err)
	}
	return nil
}

// matcher decides which events a subscription takes.
type matcher struct {
	types    [][]string // each pattern split at its *s
	metadata map[string]string
}

func newMatcher(s Subscription) *matcher {
	m := &matcher{metadata: s.Metadata}
	for _, t := range s.Types {
		m.types = append(m.types, strings.Split(t, "*"))
	}
	return m
}

func (m *matcher) match(ev *stream.StoredEvent) bool {
	if len(m.types) > 0 {
		ok := false
		for _, p := range m.types {
			if globMatch(p, ev.Type) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(m.metadata) == 0 {
		return true
	}
	var meta map[string]json.RawMessage
	if json.Unmarshal(ev.Metadata, &meta) != nil {
		return false
	}
	for k, want := range m.metadata {
		if !jsonEquals(meta[k], want) {
			return false
		}
	}
	return true
}

// globMatch reports whether s matches the pattern whose parts were split
// at each *: the first part is a prefix, the last a suffix, and the ones
// between appear in order.
func globMatch(parts []string, s string) bool {
	if len(parts) == 1 {
		return s == parts[0]
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, parts[len(parts)-1])
}

// jsonEquals reports whether the JSON value v is the string want, or a
// number, boolean or null written as want.
func jsonEquals(v json.RawMessage, want string) bool {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return false
	}
	if v[0] == '"' {
		var s string
		return json.Unmarshal(v, &s) == nil && s == want
	}
	return string(v) == want
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
