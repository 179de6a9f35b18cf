package delivery

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
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
	ID            int64
	Inbox         string
	Subscription  string
	Stream        string
	Offset        int64
	StreamEventID string
	EventID       string // the source's id of the event
	Type          string
	OccurredAt    time.Time // the source's time of the event
	// SourceSequence is the source's own sequence number of the event
	// (an envelope's sequence), nil when it sent none.
	SourceSequence *int64
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
	FailedAt       *time.Time // when it became a dead letter
	ReplayedAt     *time.Time // when an operator last replayed it
	Replays        int
	// OrderKey is the item's key in an ordered subscription (see
	// Subscription.OrderBy), nil in an unordered one.
	OrderKey *string
}

const itemColumns = `item_id, inbox_id, subscription_id, stream_id, "offset", source_native_id, event_type,
	occurred_at, stored_at, metadata_json, payload_json, delivery_handle_json, state, attempts, next_attempt_at,
	lease_expires_at, last_error, created_at, updated_at, failed_at, replayed_at, replays, source_sequence, order_key`

const itemSelect = `SELECT ` + itemColumns + ` FROM inbox_items`

const itemReturning = ` RETURNING ` + itemColumns

func scanItems(rows *sql.Rows) ([]Item, error) { return scanItemsWith(rows, nil, nil) }

// scanItemsWith reads items from rows whose columns are itemColumns and
// then extra, which each row is scanned into; each is called after each
// row (nil: not).
func scanItemsWith(rows *sql.Rows, extra []any, each func(it *Item)) ([]Item, error) {
	defer rows.Close()
	var items []Item
	for rows.Next() {
		var it Item
		var occurred, stored, next, created, updated string
		var lease, lastErr, failed, replayed, key sql.NullString
		var handle []byte
		var seq sql.NullInt64
		if err := rows.Scan(append([]any{&it.ID, &it.Inbox, &it.Subscription, &it.Stream, &it.Offset, &it.EventID, &it.Type,
			&occurred, &stored, (*[]byte)(&it.Metadata), (*[]byte)(&it.Payload), &handle, &it.State, &it.Attempts, &next,
			&lease, &lastErr, &created, &updated, &failed, &replayed, &it.Replays, &seq, &key}, extra...)...); err != nil {
			return nil, fmt.Errorf("read items: %w", err)
		}
		it.StreamEventID = fmt.Sprintf("%s/%d", it.Stream, it.Offset)
		if seq.Valid {
			it.SourceSequence = &seq.Int64
		}
		it.OccurredAt, _ = sqlitedb.ParseTime(occurred)
		it.StoredAt, _ = sqlitedb.ParseTime(stored)
		it.NextAttemptAt, _ = sqlitedb.ParseTime(next)
		it.CreatedAt, _ = sqlitedb.ParseTime(created)
		it.UpdatedAt, _ = sqlitedb.ParseTime(updated)
		if len(handle) > 0 {
			it.DeliveryHandle = handle
		}
		it.LeaseExpiresAt = nullTime(lease)
		it.FailedAt = nullTime(failed)
		it.ReplayedAt = nullTime(replayed)
		if lastErr.Valid {
			it.LastError = &lastErr.String
		}
		if key.Valid {
			it.OrderKey = &key.String
		}
		if each != nil {
			each(&it)
		}
		items = append(items, it)
	}
	return items, rows.Err()
}

func nullTime(s sql.NullString) *time.Time {
	if !s.Valid {
		return nil
	}
	t, _ := sqlitedb.ParseTime(s.String)
	return &t
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

// Item returns item id of inbox (of any inbox when inbox is ""), or
// ErrNotFound.
func (d *Delivery) Item(ctx context.Context, inbox string, id int64) (Item, error) {
	if inbox == "" {
		return d.oneItem(ctx, ` WHERE item_id = ?`, []any{id}, "item %d: no such item", id)
	}
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

// Backlog is the work inboxes hold, as Recover reports it at startup.
type Backlog struct {
	Recovered     int       // items a previous process left processing, returned to pending (or failed)
	Pending       int64     // pending items of every inbox
	Failed        int64     // dead letters of every inbox
	OldestPending time.Time // created_at of the oldest pending item; zero when none
}

// Recover returns the items a previous process left processing to
// pending, due now (to failed when that was their last attempt), and
// reports what the inboxes hold: what a restart finds. On a shared store
// it returns only those whose lease expired: the others may be held by
// live processes. Run it before the server says it is ready, and before
// Run.
func (d *Delivery) Recover(ctx context.Context) (Backlog, error) {
	var b Backlog
	// Items of a shared store may be held by other processes: only those
	// whose lease ran out are returned.
	where := `1 = 1`
	if d.shared != nil {
		where = `lease_expires_at <= ?1`
	}
	n, _, err := d.interrupt(ctx, where, "interrupted: the process stopped during this attempt")
	if err != nil {
		return b, fmt.Errorf("recover processing items: %w", err)
	}
	b.Recovered = n
	inboxes, err := d.Inboxes(ctx)
	if err != nil {
		return b, err
	}
	for _, in := range inboxes {
		b.Pending += in.Pending
		b.Failed += in.Failed
		if !in.OldestPending.IsZero() && (b.OldestPending.IsZero() || in.OldestPending.Before(b.OldestPending)) {
			b.OldestPending = in.OldestPending
		}
	}
	return b, nil
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
// visibility, counting an attempt on each: those whose lease expired
// first, then pending ones due longest first (by next_attempt_at, then
// id: oldest first, as an item is due when it is made unless its event
// was scheduled for later). When none is
// ready it waits up to wait for one, or until ctx ends (then it returns
// no items and no error).
func (d *Delivery) Lease(ctx context.Context, inbox string, max int, visibility, wait time.Duration) (Lease, error) {
	if visibility <= 0 {
		visibility = DefaultVisibilityTimeout
	}
	deadline := time.Now().Add(min(wait, MaxWait))
	for {
		changed := d.inboxes.channel(inbox) // before looking, so no wake-up is missed
		l, err := d.lease(ctx, inbox, max, visibility, d.cfg.MaxAttempts)
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

// lease leases up to max items of inbox for visibility; an item whose
// lease expired is leased again only when it has had fewer than
// maxAttempts attempts.
func (d *Delivery) lease(ctx context.Context, inbox string, max int, visibility time.Duration, maxAttempts int) (Lease, error) {
	now := d.now().UTC()
	token := newToken()
	l := Lease{Token: token, ExpiresAt: now.Add(visibility).Truncate(time.Microsecond)}
	nowText, expires := now.Format(sqlitedb.Time), l.ExpiresAt.Format(sqlitedb.Time)
	if _, idle := d.empty.Load(inbox); idle {
		held, err := d.allPaused(ctx, inbox)
		switch {
		case err != nil:
			return Lease{}, fmt.Errorf("lease from %s: %w", inbox, err)
		case held:
			return l, nil
		}
	}
	var err error
	if d.pg {
		err = d.update(ctx, func(tx conn) error {
			rows, err := tx.QueryContext(ctx, leasePostgres, token, expires, nowText, inbox, max, maxAttempts)
			if err != nil {
				return err
			}
			var sub, was string
			t := tally{}
			l.Items, err = scanItemsWith(rows, []any{&sub, &was}, func(*Item) { t.move(inbox, sub, was, StateProcessing, 1) })
			if err != nil {
				return err
			}
			return t.write(ctx, d, tx)
		})
	} else {
		l.Items, err = d.leaseSQLite(ctx, inbox, max, maxAttempts, token, expires, nowText)
	}
	if err != nil {
		return Lease{}, fmt.Errorf("lease from %s: %w", inbox, err)
	}
	if len(l.Items) == 0 {
		d.empty.Store(inbox, true)
	} else {
		d.empty.Delete(inbox)
	}
	if len(l.Items) > 0 && l.Items[0].OrderKey != nil {
		d.ordered.Store(inbox, true)
	}
	slices.SortFunc(l.Items, func(a, b Item) int { return int(a.ID - b.ID) })
	d.cfg.Metrics.leased(inbox, len(l.Items))
	return l, nil
}

// leaseSQLite is lease on SQLite. The single writer, which every write
// of the process waits for, only marks the items and returns their ids
// and attempts; the items are read afterwards on a reader, on another
// core. Returning whole items from the UPDATE took a third of a
// lease's time on the writer (copying out and converting every column).
// What the lease set is taken from the UPDATE: a change made to an item
// after the lease committed (an operator's ack) does not show.
func (d *Delivery) leaseSQLite(ctx context.Context, inbox string, max, maxAttempts int, token, expires, nowText string) ([]Item, error) {
	var ids []int64
	attempts := map[int64]int{}
	err := d.update(ctx, func(tx conn) error {
		ids, attempts = ids[:0], map[int64]int{} // a retried fn starts again
		t := tally{}
		// Leases that expired first, then pending items: each statement
		// knows the state its items leave, for the kept counts.
		for _, from := range []string{StateProcessing, StatePending} {
			q := leaseDueSQLite
			if from == StateProcessing {
				q = leaseExpiredSQLite
			}
			rows, err := tx.QueryContext(ctx, q, token, expires, nowText, inbox, max-len(ids), maxAttempts)
			if err != nil {
				return err
			}
			for rows.Next() {
				var id int64
				var n int
				var sub string
				if err := rows.Scan(&id, &n, &sub); err != nil {
					rows.Close()
					return err
				}
				ids, attempts[id] = append(ids, id), n
				t.move(inbox, sub, from, StateProcessing, 1)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			if len(ids) >= max {
				break
			}
		}
		return t.write(ctx, d, tx)
	})
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	list, arg := idList(false, ids)
	rows, err := d.db.QueryContext(ctx, itemSelect+` WHERE item_id IN (`+list+`)`, arg)
	if err != nil {
		return nil, err
	}
	items, err := scanItems(rows)
	if err != nil {
		return nil, err
	}
	leaseEnd, _ := sqlitedb.ParseTime(expires)
	updated, _ := sqlitedb.ParseTime(nowText)
	for i := range items {
		it := &items[i]
		it.State, it.Attempts, it.UpdatedAt = StateProcessing, attempts[it.ID], updated
		it.LeaseExpiresAt = &leaseEnd
	}
	return items, nil
}

// leaseExpiredSQLite leases up to ?5 processing items of inbox ?4 whose
// lease expired by ?3 before the reaper saw it and that have attempts left
// (?6); leaseDueSQLite up to ?5 pending ones due by ?3, those due
// longest first. Neither takes an item of a paused subscription. SQLite
// runs one writer at a time. The expired ones are found by the index of
// leases by their end, where there are usually none: by the inbox's index
// of states, every lease read every item the workers held. The due ones
// are found by the index of pending items by when they are due
// (inbox_items_due), which holds those due later (scheduled, or waiting
// for a retry) after those due now: by the index of states, in id order,
// a lease read every item scheduled for later that came before the due
// ones. Its plan (TestLeasePlanSkipsLaterItems):
//
//	SEARCH inbox_items USING INDEX inbox_items_due (inbox_id=? AND next_attempt_at<?)
const (
	leaseExpiredSQLite = `UPDATE inbox_items SET state = 'processing', attempts = attempts + 1,
	lease_token = ?1, lease_expires_at = ?2, updated_at = ?3
	WHERE item_id IN (SELECT item_id FROM inbox_items INDEXED BY inbox_items_leases
		WHERE state = 'processing' AND lease_expires_at <= ?3 AND inbox_id = ?4 AND attempts < ?6` + notPaused + orderFree + `
		ORDER BY item_id LIMIT ?5) RETURNING item_id, attempts, subscription_uid`
	leaseDueSQLite = `UPDATE inbox_items SET state = 'processing', attempts = attempts + 1,
	lease_token = ?1, lease_expires_at = ?2, updated_at = ?3
	WHERE item_id IN (SELECT item_id FROM inbox_items INDEXED BY inbox_items_due
		WHERE inbox_id = ?4 AND state = 'pending' AND next_attempt_at <= ?3` + notPaused + orderFree + `
		ORDER BY next_attempt_at, item_id LIMIT ?5) RETURNING item_id, attempts, subscription_uid`
)

// leasePostgres is the SQLite lease in one statement for processes
// leasing from one inbox at once: each locks the rows it takes and skips
// those another holds, so that concurrent leases get different items and
// wait for none. It returns each item's subscription uid and the state it
// left, for the kept counts.
const leasePostgres = `WITH expired AS (
		SELECT item_id FROM inbox_items WHERE inbox_id = ?4 AND state = 'processing' AND lease_expires_at <= ?3 AND attempts < ?6` + notPaused + orderFree + `
		ORDER BY item_id LIMIT ?5 FOR UPDATE SKIP LOCKED),
	due AS (
		SELECT item_id FROM inbox_items WHERE inbox_id = ?4 AND state = 'pending' AND next_attempt_at <= ?3` + notPaused + orderFree + `
		ORDER BY next_attempt_at, item_id LIMIT ?5 FOR UPDATE SKIP LOCKED),
	ready AS (
		SELECT item_id AS ready_id, was FROM (SELECT item_id, 'processing' AS was FROM expired
			UNION ALL SELECT item_id, 'pending' AS was FROM due) AS r
		ORDER BY item_id LIMIT ?5)
	UPDATE inbox_items SET state = 'processing', attempts = attempts + 1,
		lease_token = ?1, lease_expires_at = ?2, updated_at = ?3
	FROM ready WHERE item_id = ready_id` + itemReturning + `, subscription_uid, was`

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
//
// In an inbox whose leases took ordered items it wakes the leases
// waiting for its items: the next item of an acked one's key may go now.
func (d *Delivery) Ack(ctx context.Context, inbox string, ids []int64, lease string) ([]Result, error) {
	res, err := d.settle(ctx, inbox, ids, lease, StateCompleted, complete(ctx))
	if _, ordered := d.ordered.Load(inbox); ordered && err == nil {
		d.inboxes.notify(inbox)
	}
	return res, err
}

// complete is the apply of a settle that acks.
func complete(ctx context.Context) func(tx conn, now string, moves []move) error {
	return func(tx conn, now string, moves []move) error {
		return execIn(ctx, tx, `UPDATE inbox_items SET state = 'completed', lease_token = NULL, lease_expires_at = NULL,
			completed_at = ?1, updated_at = ?1 WHERE item_id IN (%s)`, moves, now)
	}
}

// Extend moves the lease end of items of inbox that hold lease to now +
// visibility (a runtime's heartbeat for a job that runs long), and returns
// that end. Only a live lease moves: an item whose lease expired, or that
// another lease, an ack or a nack took since, gets ErrLeaseLost (the
// runtime lost it and must not complete it). It counts no attempt.
func (d *Delivery) Extend(ctx context.Context, inbox string, ids []int64, lease string, visibility time.Duration) ([]Result, time.Time, error) {
	if lease == "" {
		return nil, time.Time{}, errorf(ErrInvalid, "extend: a lease token is required")
	}
	if visibility <= 0 {
		visibility = DefaultVisibilityTimeout
	}
	expires := d.now().UTC().Add(visibility).Truncate(time.Microsecond)
	res, err := d.settle(ctx, inbox, ids, lease, StateProcessing, func(tx conn, now string, moves []move) error {
		return execIn(ctx, tx, `UPDATE inbox_items SET lease_expires_at = ?1, updated_at = ?2 WHERE item_id IN (%s)`,
			moves, expires.Format(sqlitedb.Time), now)
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	return res, expires, nil
}

// Nack records a failed attempt of items of inbox: each goes back to
// pending, due after delay, with reason as its last error, or, when it has
// had Config.MaxAttempts attempts, to failed: a dead letter.
func (d *Delivery) Nack(ctx context.Context, inbox string, ids []int64, lease string, delay time.Duration, reason string) ([]Result, error) {
	res, err := d.fail(ctx, inbox, ids, lease, failure{reason: reason, delay: func(int) time.Duration { return max(delay, 0) }, maxAttempts: d.cfg.MaxAttempts})
	d.logNacked(ctx, res, err, reason)
	return res, err
}

// NackDead records a failed attempt of items of inbox that no further
// attempt can help (a runtime's permanent error): each becomes failed, a
// dead letter, at once, with reason as its last error.
func (d *Delivery) NackDead(ctx context.Context, inbox string, ids []int64, lease string, reason string) ([]Result, error) {
	res, err := d.fail(ctx, inbox, ids, lease, failure{reason: reason, dead: true, maxAttempts: d.cfg.MaxAttempts})
	d.logNacked(ctx, res, err, reason)
	return res, err
}

// logNacked logs each item a runtime's nack settled (res), with its
// event's identity, as the workers log a failed attempt: a retry at INFO,
// a dead letter at ERROR. It reads the items back: a failure is rare
// beside the attempts that succeed.
func (d *Delivery) logNacked(ctx context.Context, res []Result, err error, reason string) {
	if err != nil || !d.log.Enabled(ctx, slog.LevelError) {
		return
	}
	var ids []int64
	for _, r := range res {
		if r.Err == nil && (r.State == StatePending || r.State == StateFailed) {
			ids = append(ids, r.ID)
		}
	}
	if len(ids) == 0 {
		return
	}
	in, arg := idList(d.pg, ids)
	rows, err := d.db.QueryContext(ctx, `SELECT inbox_id, item_id, stream_id, "offset", source_native_id, event_type, attempts, state
		FROM inbox_items WHERE item_id IN (`+in+`)`, arg)
	if err != nil {
		d.log.Warn("delivery: reading nacked items for the log failed", "items", len(ids), "err", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var it Item
		if err := rows.Scan(&it.Inbox, &it.ID, &it.Stream, &it.Offset, &it.EventID, &it.Type, &it.Attempts, &it.State); err != nil {
			d.log.Warn("delivery: reading nacked items for the log failed", "items", len(ids), "err", err)
			return
		}
		at := append(jobAttrs(job{inbox: it.Inbox, item: it}), "err", reason)
		if it.State == StateFailed {
			d.log.Error("delivery: the runtime nacked the item; it is a dead letter", at...)
		} else {
			d.log.Info("delivery: the runtime nacked the item; retry scheduled", at...)
		}
	}
}

// failure is how a failed attempt ends.
type failure struct {
	reason string
	// delay is the wait before the next attempt of an item that has had
	// attempts attempts.
	delay func(attempts int) time.Duration
	dead  bool // dead-letter at once, whatever the attempts
	// maxAttempts dead-letters an item that has had that many.
	maxAttempts int
	log         []Attempt // recorded in the same transaction
}

// fail records a failed attempt of items of inbox (see Nack).
func (d *Delivery) fail(ctx context.Context, inbox string, ids []int64, lease string, f failure) ([]Result, error) {
	now := d.now().UTC()
	var reason any
	if f.reason != "" {
		reason = f.reason
	}
	st := &settlement{inbox: inbox, ids: ids, lease: lease, to: StatePending, log: f.log}
	st.apply = func(tx conn, nowText string, moves []move) error {
		var dead []move
		for i := range moves {
			m := &moves[i]
			if f.dead || m.attempts >= f.maxAttempts {
				m.to = StateFailed
				dead = append(dead, *m)
				continue
			}
			next := now.Add(f.delay(m.attempts)).Format(sqlitedb.Time)
			if _, err := tx.ExecContext(ctx, `UPDATE inbox_items SET state = 'pending', lease_token = NULL, lease_expires_at = NULL,
				updated_at = ?1, next_attempt_at = ?2, last_error = coalesce(?3, last_error) WHERE item_id = ?4`,
				nowText, next, reason, m.id); err != nil {
				return err
			}
		}
		if len(dead) == 0 {
			return nil
		}
		return execIn(ctx, tx, `UPDATE inbox_items SET state = 'failed', lease_token = NULL, lease_expires_at = NULL,
			failed_at = ?1, updated_at = ?1, last_error = coalesce(?2, last_error) WHERE item_id IN (%s)`, dead, nowText, reason)
	}
	if err := d.settleAll(ctx, st); err != nil {
		return nil, fmt.Errorf("settle items of %s: %w", inbox, err)
	}
	d.inboxes.notify(inbox)
	return st.results, nil
}

// move is an item settle may move, the state it is in (from) and the
// state it goes to, and its subscription's uid, for the kept counts.
type move struct {
	id       int64
	attempts int
	from, to string
	sub      string
}

// execIn runs query, whose %s is replaced by a list of the ids of moves
// (idList), its one parameter after args.
func execIn(ctx context.Context, tx conn, query string, moves []move, args ...any) error {
	ids := make([]int64, len(moves))
	for i, m := range moves {
		ids[i] = m.id
	}
	list, arg := idList(tx.PostgreSQL, ids)
	_, err := tx.ExecContext(ctx, fmt.Sprintf(query, list), append(args, arg)...)
	return err
}

// idList returns what stands inside IN (…) for ids, a subquery of one
// parameter, and that parameter: a JSON array read by json_each on
// SQLite, a bigint[] on PostgreSQL. The query's text is then the same
// whatever the number of ids, so that it is prepared once (sqlitedb's
// statement cache, pgx's) instead of parsed anew for every length, and
// one value is bound instead of one per id (modernc's driver binds in
// O(n²) of the parameters).
func idList(postgres bool, ids []int64) (string, any) {
	if postgres {
		return `SELECT unnest(?::bigint[])`, ids
	}
	b := make([]byte, 0, 8*len(ids)+2)
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return `SELECT value FROM json_each(?)`, string(append(b, ']'))
}

// settle moves the items of ids that may go to state to, in one
// transaction: one query reads their states, then apply updates those
// that may (now is the time to record; apply may send a move elsewhere
// than to). It returns one result per id.
func (d *Delivery) settle(ctx context.Context, inbox string, ids []int64, lease, to string, apply func(tx conn, now string, moves []move) error) ([]Result, error) {
	st := &settlement{inbox: inbox, ids: ids, lease: lease, to: to, apply: apply}
	if err := d.settleAll(ctx, st); err != nil {
		return nil, fmt.Errorf("settle items of %s: %w", inbox, err)
	}
	return st.results, nil
}

// settlement is the work of one settle, and its outcome.
type settlement struct {
	inbox     string
	ids       []int64
	lease, to string
	apply     func(tx conn, now string, moves []move) error
	log       []Attempt // attempts of these items to record with them

	results []Result
	moves   []move
}

// settleAll runs settlements in one transaction.
func (d *Delivery) settleAll(ctx context.Context, sts ...*settlement) error {
	nowText := d.now().UTC().Format(sqlitedb.Time)
	err := d.update(ctx, func(tx conn) error {
		t := tally{} // of every settlement: one row per inbox and subscription a commit
		for _, st := range sts {
			if err := st.check(ctx, tx, nowText, d.forUpdate()); err != nil {
				return err
			}
			if len(st.moves) > 0 {
				if err := st.apply(tx, nowText, st.moves); err != nil {
					return err
				}
				for _, m := range st.moves {
					t.move(st.inbox, m.sub, m.from, m.to, 1)
				}
			}
			if err := st.record(ctx, tx); err != nil {
				return err
			}
		}
		return t.write(ctx, d, tx)
	})
	if err != nil {
		return err
	}
	for _, st := range sts {
		for i := range st.results {
			if st.results[i].Err != nil || st.results[i].State != "" {
				continue
			}
			for _, m := range st.moves {
				if m.id == st.results[i].ID {
					st.results[i].State = m.to
					break
				}
			}
		}
		for _, m := range st.moves {
			if m.to != StateProcessing { // an extended lease settles nothing
				d.cfg.Metrics.settled(st.inbox, m.to, 1)
			}
		}
	}
	return nil
}

// check reads the states of st's items inside tx (locking their rows with
// lock) and decides which may move.
func (st *settlement) check(ctx context.Context, tx conn, nowText, lock string) error {
	// By item_id alone, the inbox compared below: with inbox_id in the
	// WHERE clause and more than a few ids, SQLite's planner walks the
	// inbox's index, every item of the inbox, instead of looking each id
	// up.
	list, arg := idList(tx.PostgreSQL, st.ids)
	rows, err := tx.QueryContext(ctx, `SELECT item_id, inbox_id, state, lease_token, lease_expires_at, attempts, subscription_uid FROM inbox_items
		WHERE item_id IN (`+list+`)`+lock, arg)
	if err != nil {
		return err
	}
	type current struct {
		state          string
		token, expires sql.NullString
		attempts       int
		sub            string
	}
	found := make(map[int64]current, len(st.ids))
	for rows.Next() {
		var id int64
		var inbox string
		var c current
		if err := rows.Scan(&id, &inbox, &c.state, &c.token, &c.expires, &c.attempts, &c.sub); err != nil {
			rows.Close()
			return err
		}
		if inbox == st.inbox {
			found[id] = c
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	st.results, st.moves = make([]Result, len(st.ids)), st.moves[:0]
	for i, id := range st.ids {
		st.results[i] = Result{ID: id}
		c, ok := found[id]
		switch {
		case !ok:
			st.results[i].Err = errorf(ErrNotFound, "item %d: not in inbox %q", id, st.inbox)
		case st.to == StateCompleted && c.state == StateCompleted:
			st.results[i].State = c.state // acked already
		case st.lease != "" && (c.state != StateProcessing || c.token.String != st.lease || c.expires.String <= nowText):
			st.results[i].Err = errorf(ErrLeaseLost, "item %d is %s and no longer holds this lease", id, c.state)
		case c.state != StatePending && c.state != StateProcessing:
			st.results[i].Err = errorf(ErrInvalidState, "item %d is %s", id, c.state)
		case !slices.ContainsFunc(st.moves, func(m move) bool { return m.id == id }): // not the same id twice
			st.moves = append(st.moves, move{id: id, attempts: c.attempts, from: c.state, to: st.to, sub: c.sub})
		}
	}
	return nil
}

// reap ends the leases that expired: their items go back to pending, or
// to failed after their last attempt.
func (d *Delivery) reap(ctx context.Context) error {
	now := d.now().UTC().Format(sqlitedb.Time)
	var probe int
	// Look first, on a reader, so that an idle server does not write.
	if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM inbox_items WHERE state = 'processing' AND lease_expires_at <= ?`, now).Scan(&probe); err != nil || probe == 0 {
		return err
	}
	n, inboxes, err := d.interrupt(ctx, `lease_expires_at <= ?1`, "lease expired: no ack or nack within the visibility timeout")
	if n > 0 {
		d.log.Info("delivery: leases expired; items are pending again (failed after their last attempt)", "items", n, "inboxes", inboxes)
	}
	return err
}

// interrupt ends the attempts of the processing items where (whose ?1 is
// now) with reason as their last error: they go back to pending, or to
// failed when they had their last attempt. It returns how many, and their
// inboxes.
func (d *Delivery) interrupt(ctx context.Context, where, reason string) (int, []string, error) {
	now := d.now().UTC().Format(sqlitedb.Time)
	var inboxes []string
	type key struct{ inbox, state string }
	var counts map[key]int
	err := d.update(ctx, func(tx conn) error {
		// An inbox with a target gets its endpoint's max attempts.
		rows, err := tx.QueryContext(ctx, `UPDATE inbox_items SET
			state = CASE WHEN attempts >= `+maxAttemptsOf+` THEN 'failed' ELSE 'pending' END,
			failed_at = CASE WHEN attempts >= `+maxAttemptsOf+` THEN ?1 END,
			lease_token = NULL, lease_expires_at = NULL, updated_at = ?1, next_attempt_at = ?1, last_error = ?3
			WHERE state = 'processing' AND `+where+` RETURNING inbox_id, state, subscription_uid`, now, d.cfg.MaxAttempts, reason)
		if err != nil {
			return err
		}
		inboxes, counts = inboxes[:0], map[key]int{}
		t := tally{}
		for rows.Next() {
			var inbox, state, sub string
			if err := rows.Scan(&inbox, &state, &sub); err != nil {
				rows.Close()
				return err
			}
			counts[key{inbox, state}]++
			t.move(inbox, sub, StateProcessing, state, 1)
			if !slices.Contains(inboxes, inbox) {
				inboxes = append(inboxes, inbox)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		return t.write(ctx, d, tx)
	})
	if err != nil {
		return 0, nil, err
	}
	for _, inbox := range inboxes {
		d.inboxes.notify(inbox)
	}
	n := 0
	for k, c := range counts {
		d.cfg.Metrics.settled(k.inbox, k.state, c)
		n += c
	}
	return n, inboxes, nil
}

// maxAttemptsOf is the max attempts of the inbox of a row of inbox_items:
// its endpoint's, else ?2.
const maxAttemptsOf = `coalesce((SELECT max(s.max_attempts) FROM subscriptions s
	WHERE s.inbox_id = inbox_items.inbox_id AND s.target_url IS NOT NULL), ?2)`

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
