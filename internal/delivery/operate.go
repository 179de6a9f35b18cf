package delivery

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// An operator's acts on items: cancel one that waits (it becomes a dead
// letter, which can be replayed), and discard items for good (one, or
// the dead letters a selection names). A processing item is left alone:
// its attempt is under way and its handler's ack or nack settles it.

// CancelReason is the last error of an item an operator cancelled.
const CancelReason = "cancelled by an operator"

// Cancel moves the pending item id of inbox to failed (a dead letter) at
// once, with CancelReason (and reason, when given) as its last error:
// it is not attempted again unless it is replayed. ErrNotFound: no such
// item in inbox; ErrInvalidState: it is not pending.
func (d *Delivery) Cancel(ctx context.Context, inbox string, id int64, reason string) (Item, error) {
	if len(reason) > maxPauseReason {
		return Item{}, errorf(ErrInvalid, "reason: at most %d bytes", maxPauseReason)
	}
	msg := CancelReason
	if reason != "" {
		msg += ": " + reason
	}
	now := d.now().UTC().Truncate(time.Microsecond).Format(sqlitedb.Time)
	var state string
	err := d.update(ctx, func(tx conn) error {
		var sub string
		state = ""
		err := tx.QueryRowContext(ctx, `SELECT state, subscription_uid FROM inbox_items WHERE item_id = ? AND inbox_id = ?`+d.forUpdate(), id, inbox).Scan(&state, &sub)
		if err != nil || state != StatePending {
			return err
		}
		if _, err = tx.ExecContext(ctx, `UPDATE inbox_items SET state = 'failed', failed_at = ?1, updated_at = ?1, last_error = ?2
			WHERE item_id = ?3 AND state = 'pending'`, now, msg, id); err != nil {
			return err
		}
		t := tally{}
		t.move(inbox, sub, StatePending, StateFailed, 1)
		return t.write(ctx, d, tx)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Item{}, errorf(ErrNotFound, "item %d: no such item in inbox %q", id, inbox)
	case err != nil:
		return Item{}, fmt.Errorf("cancel item %d: %w", id, err)
	case state != StatePending:
		return Item{}, errorf(ErrInvalidState, "item %d is %s: only a pending item is cancelled", id, state)
	}
	d.log.Info("delivery: item cancelled", "inbox", inbox, "item", id, "reason", reason)
	return d.Item(ctx, inbox, id)
}

// DiscardItem deletes item id of inbox, with its attempt log, for good:
// a pending, completed or failed one. ErrNotFound: no such item in
// inbox; ErrInvalidState: it is processing (an attempt is under way).
func (d *Delivery) DiscardItem(ctx context.Context, inbox string, id int64) (Item, error) {
	it, err := d.Item(ctx, inbox, id)
	if err != nil {
		return it, err
	}
	var state string
	err = d.update(ctx, func(tx conn) error {
		var sub string
		state = ""
		err := tx.QueryRowContext(ctx, `SELECT state, subscription_uid FROM inbox_items WHERE item_id = ? AND inbox_id = ?`+d.forUpdate(), id, inbox).Scan(&state, &sub)
		if err != nil || state == StateProcessing {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM inbox_items WHERE item_id = ?`, id); err != nil {
			return err
		}
		t := tally{}
		t.move(inbox, sub, state, "", 1)
		if err := t.write(ctx, d, tx); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM delivery_attempts WHERE item_id = ?`, id); err != nil {
			return err
		}
		return deleteReplies(ctx, tx, []move{{id: id}})
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Item{}, errorf(ErrNotFound, "item %d: no such item in inbox %q", id, inbox)
	case err != nil:
		return Item{}, fmt.Errorf("discard item %d: %w", id, err)
	case state == StateProcessing:
		return Item{}, errorf(ErrInvalidState, "item %d is processing: an attempt is under way; cancel or discard it once it settles", id)
	}
	it.State = state
	d.inboxes.notify(inbox) // a dead letter that held back its key no longer does
	d.log.Info("delivery: item discarded", "inbox", inbox, "item", id, "state", state)
	return it, nil
}

// Discard deletes the dead letters f selects, with their attempt logs,
// for good, in batches of 1000, and returns the ids it deleted.
func (d *Delivery) Discard(ctx context.Context, f DeadLetters) ([]int64, error) {
	var all []int64
	inboxes := map[string]bool{} // whose keys a dead letter held back, perhaps
	defer func() {
		for inbox := range inboxes {
			d.inboxes.notify(inbox)
		}
	}()
	for {
		where, args := f.where()
		var ids []int64
		err := d.update(ctx, func(tx conn) error {
			ids = ids[:0]
			// The state is checked again on the row deleted: a dead letter
			// replayed meanwhile is pending and stays.
			rows, err := tx.QueryContext(ctx, `DELETE FROM inbox_items WHERE state = 'failed' AND item_id IN (
				SELECT item_id FROM inbox_items`+where+` ORDER BY item_id LIMIT 1000) RETURNING item_id, inbox_id, subscription_uid`, args...)
			if err != nil {
				return err
			}
			var gone []move
			t := tally{}
			for rows.Next() {
				var id int64
				var inbox, sub string
				if err := rows.Scan(&id, &inbox, &sub); err != nil {
					rows.Close()
					return err
				}
				ids, gone = append(ids, id), append(gone, move{id: id})
				t.move(inbox, sub, StateFailed, "", 1)
				inboxes[inbox] = true
			}
			rows.Close()
			if err := rows.Err(); err != nil || len(gone) == 0 {
				return err
			}
			if err := t.write(ctx, d, tx); err != nil {
				return err
			}
			if err := execIn(ctx, tx, `DELETE FROM delivery_attempts WHERE item_id IN (%s)`, gone); err != nil {
				return err
			}
			return deleteReplies(ctx, tx, gone)
		})
		if err != nil {
			return all, fmt.Errorf("discard dead letters: %w", err)
		}
		all = append(all, ids...)
		if len(ids) < 1000 {
			break
		}
		for _, id := range ids {
			f.After = max(f.After, id)
		}
	}
	if len(all) > 0 {
		var id any
		if f.ID != 0 {
			id = f.ID
		}
		d.log.Info("delivery: dead letters discarded", setAttrs("items", len(all), "id", id, "inbox", f.Inbox,
			"subscription", f.Subscription, "from", f.From, "to", f.To)...)
	}
	return all, nil
}

// TestType is the type of the event SendTest delivers.
const TestType = "postbox.test"

// SendTest delivers a synthetic event of type TestType to the target of
// subscription name, through the workers' own request (the endpoint's
// headers, signature, format, timeout and the server's target address
// policy), and returns what the endpoint answered: the attempt, with its
// status, latency, error and the start of the body. The event is stored
// nowhere, counts no attempt of any item and leaves the breaker as it
// is; its webhook-id and Idempotency-Key are its own id, test_<ULID>.
// ErrInvalid: the subscription has no target.
func (d *Delivery) SendTest(ctx context.Context, name string) (TestResult, error) {
	s, err := d.Subscription(ctx, name)
	if err != nil {
		return TestResult{}, err
	}
	if s.Target == "" {
		return TestResult{}, errorf(ErrInvalid, "subscription %q has no target: runtimes lease its inbox, there is no endpoint to test", name)
	}
	ep, err := d.endpoint(ctx, s.Inbox, s.Target)
	if err != nil {
		return TestResult{}, err
	}
	now := d.now().UTC().Truncate(time.Microsecond)
	id := "test_" + ulid.Make().String()
	payload, _ := json.Marshal(map[string]any{"type": TestType, "subscription": name, "id": id,
		"message": "a test event sent by an operator from postbox", "sent_at": now})
	it := &Item{Inbox: s.Inbox, Subscription: name, Stream: s.Stream, StreamEventID: id, EventID: id, Type: TestType,
		OccurredAt: now, StoredAt: now, Metadata: json.RawMessage(`{}`), Payload: payload, State: StateProcessing,
		Attempts: 1, CreatedAt: now, UpdatedAt: now}
	tctx, cancel := context.WithTimeout(ctx, ep.timeout)
	defer cancel()
	start := time.Now()
	rec, err := d.send(tctx, ep, it)
	rec.Latency = time.Since(start)
	rec.Inbox = s.Inbox
	if err != nil {
		rec.Error = truncate(err.Error(), 1000)
	}
	d.log.Info("delivery: test event sent", "subscription", name, "target", s.Target, "status", rec.Status, "err", rec.Error)
	return TestResult{EventID: id, Attempt: *rec}, nil
}

// TestResult is what SendTest sent and what the endpoint answered.
type TestResult struct {
	EventID string // test_<ULID>
	Attempt Attempt
}
