package delivery

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// DeadLetters selects failed items: dead letters. Every field narrows the
// selection; the zero value selects them all.
type DeadLetters struct {
	ID           int64   // this item only
	IDs          []int64 // these items only (with ID: both must hold)
	Inbox        string
	Subscription string
	From, To     time.Time // failed at or after From, and before To
	After        int64     // item ids above After (paging)
	Limit        int       // at most Limit items (List only); 0: 100
}

// Empty reports whether f selects every dead letter.
func (f DeadLetters) Empty() bool {
	return f.ID == 0 && len(f.IDs) == 0 && f.Inbox == "" && f.Subscription == "" && f.From.IsZero() && f.To.IsZero() &&
		f.After == 0 && f.Limit == 0
}

// where returns the WHERE clause and its arguments.
func (f DeadLetters) where() (string, []any) {
	q := []string{`state = 'failed'`, `item_id > ?`}
	args := []any{f.After}
	if f.ID != 0 {
		q, args = append(q, `item_id = ?`), append(args, f.ID)
	}
	if len(f.IDs) > 0 {
		q = append(q, `item_id IN (`+strings.Repeat(",?", len(f.IDs))[1:]+`)`)
		for _, id := range f.IDs {
			args = append(args, id)
		}
	}
	if f.Inbox != "" {
		q, args = append(q, `inbox_id = ?`), append(args, f.Inbox)
	}
	if f.Subscription != "" {
		q, args = append(q, `subscription_id = ?`), append(args, f.Subscription)
	}
	if !f.From.IsZero() {
		q, args = append(q, `failed_at >= ?`), append(args, f.From.UTC().Format(sqlitedb.Time))
	}
	if !f.To.IsZero() {
		q, args = append(q, `failed_at < ?`), append(args, f.To.UTC().Format(sqlitedb.Time))
	}
	return ` WHERE ` + strings.Join(q, ` AND `), args
}

// ListDeadLetters returns the dead letters f selects, in id order.
func (d *Delivery) ListDeadLetters(ctx context.Context, f DeadLetters) ([]Item, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	where, args := f.where()
	rows, err := d.db.QueryContext(ctx, itemSelect+where+` ORDER BY item_id LIMIT ?`, append(args, f.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return scanItems(rows)
}

// Replay returns the dead letters f selects to pending, due now, with
// their attempts reset, recording when (replayed_at) and how often
// (replays); their last error stays for the record. It works in batches of
// 1000 and returns the ids it replayed.
func (d *Delivery) Replay(ctx context.Context, f DeadLetters) ([]int64, error) {
	var all []int64
	inboxes := map[string]int{}
	for {
		where, args := f.where()
		now := d.now().UTC().Format(sqlitedb.Time)
		var ids []int64
		var batchInboxes map[string]int
		err := d.update(ctx, func(tx conn) error {
			// The state is checked again on the row updated: on PostgreSQL
			// a dead letter another replay took after the subquery read it
			// is pending by then, and is not replayed twice.
			rows, err := tx.QueryContext(ctx, `UPDATE inbox_items SET state = 'pending', attempts = 0, next_attempt_at = ?1,
				failed_at = NULL, replayed_at = ?1, replays = replays + 1, updated_at = ?1
				WHERE state = 'failed' AND item_id IN (SELECT item_id FROM inbox_items`+where+` ORDER BY item_id LIMIT 1000)
				RETURNING item_id, inbox_id, subscription_uid`, append([]any{now}, args...)...)
			if err != nil {
				return err
			}
			ids, batchInboxes = ids[:0], map[string]int{} // a retried fn starts again
			t := tally{}
			for rows.Next() {
				var id int64
				var inbox, sub string
				if err := rows.Scan(&id, &inbox, &sub); err != nil {
					rows.Close()
					return err
				}
				ids = append(ids, id)
				batchInboxes[inbox]++
				t.move(inbox, sub, StateFailed, StatePending, 1)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			return t.write(ctx, d, tx)
		})
		if err != nil {
			return all, fmt.Errorf("replay dead letters: %w", err)
		}
		all = append(all, ids...)
		for inbox, n := range batchInboxes {
			inboxes[inbox] += n
		}
		if len(ids) < 1000 {
			break
		}
		for _, id := range ids { // RETURNING is in no set order; the batch was the lowest 1000
			f.After = max(f.After, id)
		}
	}
	for inbox, n := range inboxes {
		d.inboxes.notify(inbox)
		d.cfg.Metrics.replayed(inbox, n)
	}
	if len(all) > 0 {
		var id any // the filter's fields that are set
		if f.ID != 0 {
			id = f.ID
		}
		d.log.Info("delivery: dead letters replayed", setAttrs("items", len(all), "id", id, "inbox", f.Inbox,
			"subscription", f.Subscription, "from", f.From, "to", f.To)...)
	}
	return all, nil
}
