package delivery

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// Item states.
const (
	StatePending    = "pending"
	StateProcessing = "processing"
	StateCompleted  = "completed"
	StateFailed     = "failed"
)

// Item is one inbox item.
type Item struct {
	ID             int64
	Inbox          string
	Subscription   string
	Stream         string
	Offset         int64
	StreamEventID  string
	EventID        string // the source's id of the event
	Type           string
	OccurredAt     time.Time
	StoredAt       time.Time
	Metadata       json.RawMessage
	Payload        json.RawMessage
	DeliveryHandle json.RawMessage // nil when the event has none
	State          string
	Attempts       int
	NextAttemptAt  time.Time
	LeaseExpiresAt *time.Time
	LastError      *string
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

const itemSelect = `SELECT item_id, inbox_id, subscription_id, stream_id, "offset", source_native_id, event_type,
	occurred_at, stored_at, metadata_json, payload_json, delivery_handle_json, state, attempts, next_attempt_at,
	lease_expires_at, last_error, created_at, updated_at FROM inbox_items`

const itemReturning = ` RETURNING item_id, inbox_id, subscription_id, stream_id, "offset", source_native_id, event_type,
	occurred_at, stored_at, metadata_json, payload_json, delivery_handle_json, state, attempts, next_attempt_at,
	lease_expires_at, last_error, created_at, updated_at`

func scanItems(rows *sql.Rows) ([]Item, error) {
	defer rows.Close()
	var items []Item
	for rows.Next() {
		var it Item
		var occurred, stored, next, created, updated string
		var lease, lastErr sql.NullString
		var handle []byte
		if err := rows.Scan(&it.ID, &it.Inbox, &it.Subscription, &it.Stream, &it.Offset, &it.EventID, &it.Type,
			&occurred, &stored, (*[]byte)(&it.Metadata), (*[]byte)(&it.Payload), &handle, &it.State, &it.Attempts, &next,
			&lease, &lastErr, &created, &updated); err != nil {
			return nil, fmt.Errorf("read items: %w", err)
		}
		it.StreamEventID = fmt.Sprintf("%s/%d", it.Stream, it.Offset)
		it.OccurredAt, _ = sqlitedb.ParseTime(occurred)
		it.StoredAt, _ = sqlitedb.ParseTime(stored)
		it.NextAttemptAt, _ = sqlitedb.ParseTime(next)
		it.CreatedAt, _ = sqlitedb.ParseTime(created)
		it.UpdatedAt, _ = sqlitedb.ParseTime(updated)
		if len(handle) > 0 {
			it.DeliveryHandle = handle
		}
		if lease.Valid {
			t, _ := sqlitedb.ParseTime(lease.String)
			it.LeaseExpiresAt = &t
		}
		if lastErr.Valid {
			it.LastError = &lastErr.String
		}
		items = append(items, it)
	}
	return items, rows.Err()
}

// ValidState reports whether s is an item state.
func ValidState(s string) bool {
	return s == StatePending || s == StateProcessing || s == StateCompleted || s == StateFailed
}

// List returns up to limit items of inbox with an id above after, in id
// order, in state (every state when empty).
func (d *Delivery) List(ctx context.Context, inbox, state string, after int64, limit int) ([]Item, error) {
	q := itemSelect + ` WHERE inbox_id = ? AND item_id > ?`
	args := []any{inbox, after}
	if state != "" {
		q += ` AND state = ?`
		args = append(args, state)
	}
	rows, err := d.db.QueryContext(ctx, q+` ORDER BY item_id LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", inbox, err)
	}
	return scanItems(rows)
}

// Item returns item id of inbox, or ErrNotFound.
func (d *Delivery) Item(ctx context.Context, inbox string, id int64) (Item, error) {
	return d.oneItem(ctx, ` WHERE item_id = ? AND inbox_id = ?`, []any{id, inbox}, "item %d: not in inbox %q", id, inbox)
}

// ItemOf returns the item subscription made of the event at offset of its
// stream, or ErrNotFound (not materialised yet, or not matching).
func (d *Delivery) ItemOf(ctx context.Context, subscription string, offset int64) (Item, error) {
	sub, err := d.Subscription(ctx, subscription)
	if err != nil {
		return Item{}, err
	}
	return d.oneItem(ctx, ` WHERE subscription_uid = ? AND "offset" = ?`, []any{sub.UID, offset}, "no item of %s for offset %d", subscription, offset)
}

// oneItem returns the item where selects, or ErrNotFound with the message
// notFound.
func (d *Delivery) oneItem(ctx context.Context, where string, args []any, notFound string, fmtArgs ...any) (Item, error) {
	rows, err := d.db.QueryContext(ctx, itemSelect+where, args...)
	if err != nil {
		return Item{}, err
	}
	items, err := scanItems(rows)
	if err != nil {
		return Item{}, err
	}
	if len(items) == 0 {
		return Item{}, errorf(ErrNotFound, notFound, fmtArgs...)
	}
	return items[0], nil
}

// InboxCounts is how many items an inbox holds in each state.
type InboxCounts struct {
	Inbox                                  string
	Pending, Processing, Completed, Failed int64
}

// Inboxes returns the item counts of every inbox that has items or a
// subscription.
func (d *Delivery) Inboxes(ctx context.Context) ([]InboxCounts, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT inbox_id, state, count(*) FROM inbox_items GROUP BY inbox_id, state
		UNION ALL SELECT DISTINCT inbox_id, '', 0 FROM subscriptions`)
	if err != nil {
		return nil, fmt.Errorf("inboxes: %w", err)
	}
	defer rows.Close()
	by := map[string]*InboxCounts{}
	for rows.Next() {
		var inbox, state string
		var n int64
		if err := rows.Scan(&inbox, &state, &n); err != nil {
			return nil, err
		}
		c := by[inbox]
		if c == nil {
			c = &InboxCounts{Inbox: inbox}
			by[inbox] = c
		}
		switch state {
		case StatePending:
			c.Pending = n
		case StateProcessing:
			c.Processing = n
		case StateCompleted:
			c.Completed = n
		case StateFailed:
			c.Failed = n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]InboxCounts, 0, len(by))
	for _, c := range by {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b InboxCounts) int { return strings.Compare(a.Inbox, b.Inbox) })
	return out, nil
}

// Lease is what Lease hands a runtime.
type Lease struct {
	Token     string
	ExpiresAt time.Time
	Items     []Item
}

// MaxWait bounds how long Lease waits for items.
const MaxWait = time.Minute

// Lease marks up to max ready items of inbox processing until now +
// visibility, oldest first, counting an attempt on each. When none is
// ready it waits up to wait for one, or until ctx ends (then it returns
// no items and no error).
func (d *Delivery) Lease(ctx context.Context, inbox string, max int, visibility, wait time.Duration) (Lease, error) {
	if visibility <= 0 {
		visibility = DefaultVisibilityTimeout
	}
	deadline := time.Now().Add(min(wait, MaxWait))
	for {
		changed := d.inboxes.channel(inbox) // before looking, so no wake-up is missed
		l, err := d.lease(ctx, inbox, max, visibility)
		if err != nil || len(l.Items) > 0 {
			return l, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return l, nil
		}
		// Items due later (a nack's delay) wake no one: look again at least
		// every second.
		t := time.NewTimer(min(left, time.Second))
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done(): // the caller left, or the server is stopping
			t.Stop()
			return l, nil
		}
		t.Stop()
	}
}

func (d *Delivery) lease(ctx context.Context, inbox string, max int, visibility time.Duration) (Lease, error) {
	now := d.now().UTC()
	token := newToken()
	l := Lease{Token: token, ExpiresAt: now.Add(visibility).Truncate(time.Microsecond)}
	nowText := now.Format(sqlitedb.Time)
	err := d.b.Update(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `UPDATE inbox_items SET state = 'processing', attempts = attempts + 1,
			lease_token = ?1, lease_expires_at = ?2, updated_at = ?3
			WHERE item_id IN (
				SELECT item_id FROM inbox_items WHERE inbox_id = ?4 AND state = 'processing' AND lease_expires_at <= ?3
				UNION ALL
				SELECT item_id FROM inbox_items WHERE inbox_id = ?4 AND state = 'pending' AND next_attempt_at <= ?3
				ORDER BY item_id LIMIT ?5)`+itemReturning,
			token, l.ExpiresAt.Format(sqlitedb.Time), nowText, inbox, max)
		if err != nil {
			return err
		}
		l.Items, err = scanItems(rows)
		return err
	})
	if err != nil {
		return Lease{}, fmt.Errorf("lease from %s: %w", inbox, err)
	}
	slices.SortFunc(l.Items, func(a, b Item) int { return int(a.ID - b.ID) })
	d.cfg.Metrics.leased(len(l.Items))
	return l, nil
}

func newToken() string {
	var b [12]byte
	rand.Read(b[:])
	return "lease_" + hex.EncodeToString(b[:])
}

// Result is the outcome of acking or nacking one item.
type Result struct {
	ID    int64
	State string // the item's state after the call, when Err is nil
	Err   error  // ErrNotFound, ErrLeaseLost or ErrInvalidState
}

// Ack marks items of inbox completed. With a lease token, each item must
// hold that lease; without one (an operator), any pending or processing
// item may be acked. Acking a completed item again changes nothing.
func (d *Delivery) Ack(ctx context.Context, inbox string, ids []int64, lease string) ([]Result, error) {
	return d.settle(ctx, inbox, ids, lease, StateCompleted,
		`state = 'completed', lease_token = NULL, lease_expires_at = NULL, completed_at = ?1, updated_at = ?1`)
}

// Nack returns items of inbox to pending, due after delay, with reason
// as their last error.
func (d *Delivery) Nack(ctx context.Context, inbox string, ids []int64, lease string, delay time.Duration, reason string) ([]Result, error) {
	next := d.now().UTC().Add(max(delay, 0)).Format(sqlitedb.Time)
	var lastErr any
	if reason != "" {
		lastErr = reason
	}
	res, err := d.settle(ctx, inbox, ids, lease, StatePending,
		`state = 'pending', lease_token = NULL, lease_expires_at = NULL, updated_at = ?1, next_attempt_at = ?2,
		last_error = coalesce(?3, last_error)`, next, lastErr)
	if err == nil {
		d.inboxes.notify(inbox)
	}
	return res, err
}

// settle moves the items of ids that may go to state to, in one
// transaction: one query reads their states, one UPDATE sets the columns
// in set (whose ?1 is now, ?2 and on are args) on those that may. It
// returns one result per id.
func (d *Delivery) settle(ctx context.Context, inbox string, ids []int64, lease, to, set string, args ...any) ([]Result, error) {
	results := make([]Result, len(ids))
	changed := 0
	nowText := d.now().UTC().Format(sqlitedb.Time)
	in := strings.Repeat(",?", len(ids))[1:]
	idArgs := make([]any, 0, len(ids)+1)
	idArgs = append(idArgs, inbox)
	for _, id := range ids {
		idArgs = append(idArgs, id)
	}
	type current struct {
		state          string
		token, expires sql.NullString
	}
	err := d.b.Update(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT item_id, state, lease_token, lease_expires_at FROM inbox_items
			WHERE inbox_id = ? AND item_id IN (`+in+`)`, idArgs...)
		if err != nil {
			return err
		}
		found := make(map[int64]current, len(ids))
		for rows.Next() {
			var id int64
			var c current
			if err := rows.Scan(&id, &c.state, &c.token, &c.expires); err != nil {
				rows.Close()
				return err
			}
			found[id] = c
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		update := append(make([]any, 0, len(args)+1+len(ids)), nowText)
		update = append(update, args...)
		first := len(update)
		for i, id := range ids {
			results[i] = Result{ID: id}
			c, ok := found[id]
			switch {
			case !ok:
				results[i].Err = errorf(ErrNotFound, "item %d: not in inbox %q", id, inbox)
				continue
			case to == StateCompleted && c.state == StateCompleted:
				results[i].State = c.state // acked already
				continue
			case lease != "" && (c.state != StateProcessing || c.token.String != lease || c.expires.String <= nowText):
				results[i].Err = errorf(ErrLeaseLost, "item %d is %s and no longer holds this lease", id, c.state)
				continue
			case c.state != StatePending && c.state != StateProcessing:
				results[i].Err = errorf(ErrInvalidState, "item %d is %s", id, c.state)
				continue
			case slices.Contains(update[first:], any(id)):
				results[i].State = to // the same id twice in one request
				continue
			}
			update = append(update, id)
			results[i].State = to
		}
		if n := len(update) - first; n > 0 {
			changed = n
			_, err := tx.ExecContext(ctx, `UPDATE inbox_items SET `+set+` WHERE item_id IN (`+strings.Repeat(",?", n)[1:]+`)`, update...)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("settle items of %s: %w", inbox, err)
	}
	d.cfg.Metrics.settled(to, changed)
	return results, nil
}

// reap returns the items whose lease expired to pending.
func (d *Delivery) reap(ctx context.Context) error {
	now := d.now().UTC().Format(sqlitedb.Time)
	var expired int
	var probe int
	// Look first, on a reader, so that an idle server does not write.
	if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM inbox_items WHERE state = 'processing' AND lease_expires_at <= ?`, now).Scan(&probe); err != nil || probe == 0 {
		return err
	}
	var inboxes []string
	err := d.b.Update(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `UPDATE inbox_items SET state = 'pending', lease_token = NULL, lease_expires_at = NULL, updated_at = ?1
			WHERE state = 'processing' AND lease_expires_at <= ?1 RETURNING inbox_id`, now)
		if err != nil {
			return err
		}
		defer rows.Close()
		inboxes = inboxes[:0]
		for rows.Next() {
			var inbox string
			if err := rows.Scan(&inbox); err != nil {
				return err
			}
			expired++
			if !slices.Contains(inboxes, inbox) {
				inboxes = append(inboxes, inbox)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return err
	}
	for _, inbox := range inboxes {
		d.inboxes.notify(inbox)
	}
	if expired > 0 {
		d.log.Info("delivery: leases expired; items are pending again", "items", expired, "inboxes", inboxes)
	}
	return nil
}

// notifier wakes the waiters of an inbox when it may have items to lease.
type notifier struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}

// channel returns a channel closed at the next notify of inbox.
func (n *notifier) channel(inbox string) <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = map[string]chan struct{}{}
	}
	c := n.ch[inbox]
	if c == nil {
		c = make(chan struct{})
		n.ch[inbox] = c
	}
	return c
}

func (n *notifier) notify(inbox string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c := n.ch[inbox]; c != nil {
		close(c)
		delete(n.ch, inbox)
	}
}
