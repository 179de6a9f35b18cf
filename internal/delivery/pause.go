package delivery

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// Pausing. An operator pauses a subscription's delivery with Pause: the
// subscription's row records when (paused_at) and why, and every lease,
// the push workers' and a runtime's (Lease), skips the items of a paused
// subscription, in the lease's own query, so that it holds in every
// process of a shared store from the commit on. Its loop keeps reading
// its stream and filling its inbox; the items wait pending and count no
// attempt. Items leased before the pause finish their attempt. Resume
// clears it and wakes the inbox's dispatchers and runtimes.
//
// Pausing is the operator's word and is kept until they resume; a
// breaker (flow.go) is the endpoint's health and closes by itself.

// maxPauseReason bounds the reason a pause records, in bytes.
const maxPauseReason = 500

// notPaused is the condition a lease adds for the items it takes from
// inbox ?4: none of a paused subscription (by uid: the items of an older
// subscription of the name are not its). The items of a paused
// subscription are read and passed over; a lease of an inbox whose
// subscriptions are all paused reads none (allPaused).
const notPaused = ` AND subscription_uid NOT IN (SELECT subscription_uid FROM subscriptions WHERE inbox_id = ?4 AND paused_at IS NOT NULL)`

// allPausedSQL says whether inbox ?1 has a paused subscription and no
// other: a lease of it takes nothing, and need not read its items (a
// paused backlog of a million items would be read by every lease). A
// lease asks it only after a lease of the inbox took nothing.
// Items of deleted subscriptions of such an inbox wait too.
const allPausedSQL = `SELECT EXISTS (SELECT 1 FROM subscriptions WHERE inbox_id = ?1 AND paused_at IS NOT NULL)
	AND NOT EXISTS (SELECT 1 FROM subscriptions WHERE inbox_id = ?1 AND paused_at IS NULL)`

// allPaused reports whether every subscription of inbox is paused (and
// it has one), on a reader.
func (d *Delivery) allPaused(ctx context.Context, inbox string) (bool, error) {
	var held bool
	err := d.db.QueryRowContext(ctx, allPausedSQL, inbox).Scan(&held)
	return held, err
}

// Pause pauses the delivery of subscription name, recording reason (may
// be empty), and returns the subscription. Pausing a paused subscription
// keeps its time and takes the new reason when one is given.
func (d *Delivery) Pause(ctx context.Context, name, reason string) (Subscription, error) {
	if len(reason) > maxPauseReason || !utf8.ValidString(reason) {
		return Subscription{}, errorf(ErrInvalid, "reason: at most %d bytes of UTF-8", maxPauseReason)
	}
	now := d.now().UTC().Truncate(time.Microsecond).Format(sqlitedb.Time)
	var n int64
	err := d.update(ctx, func(tx conn) error {
		res, err := tx.ExecContext(ctx, `UPDATE subscriptions SET paused_at = COALESCE(paused_at, ?),
			paused_reason = CASE WHEN ? = '' AND paused_at IS NOT NULL THEN paused_reason ELSE ? END
			WHERE subscription_id = ?`, now, reason, nullString(reason), name)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return Subscription{}, fmt.Errorf("pause subscription %s: %w", name, err)
	}
	if n == 0 {
		return Subscription{}, errorf(ErrNotFound, "subscription %q: no such subscription", name)
	}
	s, err := d.Subscription(ctx, name)
	if err != nil {
		return s, err
	}
	d.log.Info("delivery: subscription paused", setAttrs("subscription", name, "inbox", s.Inbox, "reason", reason)...)
	return s, nil
}

// Resume resumes the delivery of subscription name, paused or not, and
// returns the subscription: its waiting items are leased again at once.
func (d *Delivery) Resume(ctx context.Context, name string) (Subscription, error) {
	var n int64
	err := d.update(ctx, func(tx conn) error {
		res, err := tx.ExecContext(ctx, `UPDATE subscriptions SET paused_at = NULL, paused_reason = NULL WHERE subscription_id = ?`, name)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return Subscription{}, fmt.Errorf("resume subscription %s: %w", name, err)
	}
	if n == 0 {
		return Subscription{}, errorf(ErrNotFound, "subscription %q: no such subscription", name)
	}
	s, err := d.Subscription(ctx, name)
	if err != nil {
		return s, err
	}
	d.inboxes.notify(s.Inbox)
	d.broadcast(ctx, "inbox:"+s.Inbox)
	d.log.Info("delivery: subscription resumed", "subscription", name, "inbox", s.Inbox)
	return s, nil
}
