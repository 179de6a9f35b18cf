package delivery

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// InboxCounts is how many items an inbox (or a subscription) holds in
// each state.
type InboxCounts struct {
	Inbox                                  string
	Pending, Processing, Completed, Failed int64
	OldestPending                          time.Time // created_at of the oldest pending item; zero when none (and for a subscription)
}

// Inboxes returns the item counts of every inbox that has items or a
// subscription. Reading them costs the same at no item and at millions:
// the counts are those the transactions that insert, move and delete
// items keep (counts.go), and the oldest pending item of an inbox is the
// first of its pending range in the (inbox_id, state, item_id) index. The
// counts are read in one snapshot of the store.
func (d *Delivery) Inboxes(ctx context.Context) ([]InboxCounts, error) {
	var out []InboxCounts
	err := d.snapshot(ctx, func(tx conn) error {
		kept, err := keptCounts(ctx, tx)
		if err != nil {
			return err
		}
		byInbox := map[string]*InboxCounts{}
		for k, c := range kept {
			in := byInbox[k.inbox]
			if in == nil {
				in = &InboxCounts{Inbox: k.inbox}
				byInbox[k.inbox] = in
			}
			in.add(c)
		}
		subscribed := map[string]bool{}
		rows, err := tx.QueryContext(ctx, `SELECT DISTINCT inbox_id FROM subscriptions`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var inbox string
			if err := rows.Scan(&inbox); err != nil {
				rows.Close()
				return err
			}
			subscribed[inbox] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for inbox := range subscribed {
			if byInbox[inbox] == nil {
				byInbox[inbox] = &InboxCounts{Inbox: inbox}
			}
		}
		for inbox, in := range byInbox {
			if !subscribed[inbox] && in.Pending == 0 && in.Processing == 0 && in.Completed == 0 && in.Failed == 0 {
				continue // no items left, and no subscription fills it
			}
			if in.Pending > 0 {
				var created string
				if err := tx.QueryRowContext(ctx, `SELECT created_at FROM inbox_items WHERE inbox_id = ? AND state = 'pending'
					ORDER BY item_id LIMIT 1`, inbox).Scan(&created); err != nil && err != sql.ErrNoRows {
					return err
				}
				in.OldestPending, _ = sqlitedb.ParseTime(created)
			}
			out = append(out, *in)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("inboxes: %w", err)
	}
	slices.SortFunc(out, func(a, b InboxCounts) int { return strings.Compare(a.Inbox, b.Inbox) })
	return out, nil
}

// SubscriptionCounts returns the item counts of every subscription, by
// uid (Subscription.UID), as kept (see Inboxes): a subscription with no
// item has none. A subscription's items stay in its inbox when it is
// deleted; they count there and not here.
func (d *Delivery) SubscriptionCounts(ctx context.Context) (map[string]InboxCounts, error) {
	out := map[string]InboxCounts{}
	err := d.snapshot(ctx, func(tx conn) error {
		kept, err := keptCounts(ctx, tx)
		if err != nil {
			return err
		}
		for k, c := range kept {
			s := out[k.sub]
			s.Inbox = k.inbox
			s.add(c)
			out[k.sub] = s
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("subscription counts: %w", err)
	}
	return out, nil
}

func (in *InboxCounts) add(c counts) {
	in.Pending += c[0]
	in.Processing += c[1]
	in.Completed += c[2]
	in.Failed += c[3]
}

// snapshot runs fn in a read-only transaction: one snapshot of the store
// for every statement.
func (d *Delivery) snapshot(ctx context.Context, fn func(tx conn) error) error {
	opts := &sql.TxOptions{ReadOnly: true}
	if d.pg {
		opts.Isolation = sql.LevelRepeatableRead
	}
	sqlTx, err := d.store.ReadDB().BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer sqlTx.Rollback()
	return fn(conn{Tx: sqlTx, PostgreSQL: d.pg})
}
