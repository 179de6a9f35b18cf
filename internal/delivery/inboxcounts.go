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

// InboxCounts is how many items an inbox holds in each state.
type InboxCounts struct {
	Inbox                                  string
	Pending, Processing, Completed, Failed int64
	OldestPending                          time.Time // created_at of the oldest pending item; zero when none
}

// inboxNames lists every inbox that has items, one index lookup an inbox
// (the (inbox_id, state, item_id) index, skipped from one inbox to the
// next), and every inbox a subscription fills.
const inboxNames = `WITH RECURSIVE names(inbox_id) AS (
		SELECT min(inbox_id) FROM inbox_items
		UNION ALL
		SELECT (SELECT min(i.inbox_id) FROM inbox_items i WHERE i.inbox_id > names.inbox_id) FROM names WHERE names.inbox_id IS NOT NULL)
	SELECT inbox_id FROM names WHERE inbox_id IS NOT NULL
	UNION SELECT inbox_id FROM subscriptions`

// Inboxes returns the item counts of every inbox that has items or a
// subscription. None of it grows with the completed items an inbox holds:
// pending, processing and failed are counted in the inbox's ranges of the
// (inbox_id, state, item_id) index, in time proportional to them (the
// queue and the dead letters), and completed is the sum of the inbox's
// rows in inbox_tallies, which the transactions that complete, replay and
// delete items write (tally.go). The counts are read in one snapshot of
// the store.
func (d *Delivery) Inboxes(ctx context.Context) ([]InboxCounts, error) {
	opts := &sql.TxOptions{ReadOnly: true}
	if d.pg {
		opts.Isolation = sql.LevelRepeatableRead // one snapshot for every statement
	}
	sqlTx, err := d.store.ReadDB().BeginTx(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("inboxes: %w", err)
	}
	defer sqlTx.Rollback()
	out, err := inboxCounts(ctx, conn{Tx: sqlTx, PostgreSQL: d.pg})
	if err != nil {
		return nil, fmt.Errorf("inboxes: %w", err)
	}
	return out, nil
}

func inboxCounts(ctx context.Context, tx conn) ([]InboxCounts, error) {
	rows, err := tx.QueryContext(ctx, inboxNames)
	if err != nil {
		return nil, err
	}
	var out []InboxCounts
	for rows.Next() {
		var c InboxCounts
		if err := rows.Scan(&c.Inbox); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	completed := map[string]int64{}
	rows, err = tx.QueryContext(ctx, `SELECT inbox_id, CAST(sum(completed) AS BIGINT) FROM inbox_tallies GROUP BY inbox_id`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var inbox string
		var n int64
		if err := rows.Scan(&inbox, &n); err != nil {
			rows.Close()
			return nil, err
		}
		completed[inbox] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range out {
		c := &out[i]
		c.Completed = completed[c.Inbox]
		rows, err := tx.QueryContext(ctx, `SELECT state, count(*) FROM inbox_items
			WHERE inbox_id = ? AND state IN ('pending', 'processing', 'failed') GROUP BY state`, c.Inbox)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var state string
			var n int64
			if err := rows.Scan(&state, &n); err != nil {
				rows.Close()
				return nil, err
			}
			switch state {
			case StatePending:
				c.Pending = n
			case StateProcessing:
				c.Processing = n
			case StateFailed:
				c.Failed = n
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if c.Pending > 0 {
			var created string
			if err := tx.QueryRowContext(ctx, `SELECT created_at FROM inbox_items WHERE inbox_id = ? AND state = 'pending'
				ORDER BY item_id LIMIT 1`, c.Inbox).Scan(&created); err != nil {
				return nil, err
			}
			c.OldestPending, _ = sqlitedb.ParseTime(created)
		}
	}
	slices.SortFunc(out, func(a, b InboxCounts) int { return strings.Compare(a.Inbox, b.Inbox) })
	return out, nil
}
