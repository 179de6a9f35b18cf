package delivery

import (
	"context"
	"fmt"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

// cleanupBatch is how many rows one retention transaction deletes, so that
// the writer is never held long.
const cleanupBatch = 1000

// Cleaned is what one Cleanup deleted.
type Cleaned struct {
	Items  int // completed and failed inbox items, with their replies
	Events int // stream events
}

// Cleanup deletes, in batches of 1000, the completed and failed items that
// reached that state before cutoff (never pending or processing ones)
// with their attempt log and their replies, and,
// when the stream backend is a stream.Trimmer, the stream events stored
// before cutoff that every consumer of their stream has read: no
// subscription needs them any more, since items carry their own copy of
// the event. A consumer follows its subscription's position, so it never
// claims more than the subscription has materialised.
func (d *Delivery) Cleanup(ctx context.Context, cutoff time.Time) (Cleaned, error) {
	var c Cleaned
	before := cutoff.UTC().Format(sqlitedb.Time)
	for {
		var n int64
		err := d.update(ctx, func(tx conn) error {
			// The state is checked again on the row deleted: on PostgreSQL
			// an item replayed after the subquery read it, and before the
			// delete locked it, is pending by then and stays.
			rows, err := tx.QueryContext(ctx, `DELETE FROM inbox_items WHERE item_id IN (SELECT item_id FROM inbox_items
				WHERE state IN ('completed', 'failed') AND updated_at < ?1 LIMIT ?2)
				AND state IN ('completed', 'failed') AND updated_at < ?1 RETURNING item_id, inbox_id, state, subscription_uid`, before, cleanupBatch)
			if err != nil {
				return err
			}
			var gone []move
			t := tally{}
			for rows.Next() {
				var m move
				var inbox string
				if err := rows.Scan(&m.id, &inbox, &m.from, &m.sub); err != nil {
					rows.Close()
					return err
				}
				gone = append(gone, m)
				t.move(inbox, m.sub, m.from, "", 1)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			n = int64(len(gone))
			if n == 0 {
				return nil
			}
			if err := t.write(ctx, d, tx); err != nil {
				return err
			}
			// Their attempt log and their replies go with them.
			if err := execIn(ctx, tx, `DELETE FROM delivery_attempts WHERE item_id IN (%s)`, gone); err != nil {
				return err
			}
			return deleteReplies(ctx, tx, gone)
		})
		if err != nil {
			return c, fmt.Errorf("retention: items: %w", err)
		}
		c.Items += int(n)
		if n < cleanupBatch {
			break
		}
	}
	trimmer, ok := d.streams.(stream.Trimmer)
	if !ok {
		d.cfg.Metrics.cleaned(c)
		return c, nil
	}
	streams, err := d.streams.Streams(ctx)
	if err != nil {
		return c, fmt.Errorf("retention: %w", err)
	}
	for _, st := range streams {
		for {
			n, err := trimmer.Trim(ctx, st.ID, cutoff, cleanupBatch)
			if err != nil {
				return c, fmt.Errorf("retention: %w", err)
			}
			c.Events += n
			if n < cleanupBatch {
				break
			}
		}
	}
	d.cfg.Metrics.cleaned(c)
	return c, nil
}

// retain runs Cleanup every CleanupInterval until ctx ends.
func (d *Delivery) retain(ctx context.Context) {
	if d.cfg.Retention < 0 {
		return
	}
	t := time.NewTicker(d.cfg.CleanupInterval)
	defer t.Stop()
	for {
		cutoff := d.now().Add(-d.cfg.Retention)
		var c Cleaned
		var err error
		if d.leads() { // one process of a shared store
			c, err = d.Cleanup(ctx, cutoff)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			d.log.Error("delivery: retention failed; trying again at the next interval", "err", err)
		case c.Items > 0 || c.Events > 0:
			d.log.Info("delivery: retention deleted old items and events", "items", c.Items, "events", c.Events,
				"before", cutoff.UTC().Format(time.RFC3339))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
