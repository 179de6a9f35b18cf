package delivery

import (
	"context"
	"fmt"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// failUncounted records a failed attempt of items of inbox that does not
// count (a handler's retry.Transient error: not the item's fault): each
// goes back to pending with its attempts as before the attempt, due after
// f.delay of the attempt that failed, with f.reason as its last error.
// Neither f.maxAttempts nor f.dead applies: an outage, however long,
// dead-letters nothing, and the wait does not grow during it.
func (d *Delivery) failUncounted(ctx context.Context, inbox string, ids []int64, lease string, f failure) ([]Result, error) {
	now := d.now().UTC()
	var reason any
	if f.reason != "" {
		reason = f.reason
	}
	st := &settlement{inbox: inbox, ids: ids, lease: lease, to: StatePending, log: f.log}
	st.apply = func(tx conn, nowText string, moves []move) error {
		for _, m := range moves {
			next := now.Add(f.delay(m.attempts)).Format(sqlitedb.Time)
			if _, err := tx.ExecContext(ctx, `UPDATE inbox_items SET state = 'pending', attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,
				lease_token = NULL, lease_expires_at = NULL, updated_at = ?1, next_attempt_at = ?2, last_error = coalesce(?3, last_error)
				WHERE item_id = ?4`, nowText, next, reason, m.id); err != nil {
				return err
			}
		}
		return nil
	}
	if err := d.settleAll(ctx, st); err != nil {
		return nil, fmt.Errorf("settle items of %s: %w", inbox, err)
	}
	d.inboxes.notify(inbox)
	return st.results, nil
}
