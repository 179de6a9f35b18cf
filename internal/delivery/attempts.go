package delivery

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// Attempt is one attempt of the workers to deliver an item to its
// target, as the attempt log keeps it.
type Attempt struct {
	ID      int64
	Item    int64
	Inbox   string
	Number  int // the item's attempt number, from 1
	At      time.Time
	URL     string        // the endpoint's
	Status  int           // the answer's status code; 0 when none came (a transport error or timeout)
	Latency time.Duration // from the request to the end of the answer (or the error)
	Error   string        // why the attempt failed; "" when it succeeded
	Excerpt string        // the first 1 KiB of the answer's body, as text
}

// record inserts st.log, the attempts of st's items that exist, in tx:
// the attempt log is written with the settlement, in its transaction. On
// PostgreSQL one statement of arrays takes every row, so that its text,
// and its prepared form, are the same whatever their number.
func (st *settlement) record(ctx context.Context, tx conn) error {
	if len(st.log) == 0 {
		return nil
	}
	n := 0
	for _, a := range st.log {
		if st.exists(a.Item) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if tx.PostgreSQL {
		items, numbers, statuses, latencies := make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
		ats, urls, errs, excerpts := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		for _, a := range st.log {
			if !st.exists(a.Item) {
				continue
			}
			items, numbers, statuses = append(items, a.Item), append(numbers, int64(a.Number)), append(statuses, int64(a.Status))
			latencies, ats = append(latencies, a.Latency.Microseconds()), append(ats, a.At.UTC().Format(sqlitedb.Time))
			urls, errs, excerpts = append(urls, a.URL), append(errs, a.Error), append(excerpts, a.Excerpt)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO delivery_attempts (item_id, inbox_id, attempt, attempted_at, endpoint_url,
			status_code, latency_us, error, response_excerpt)
			SELECT i, ?, n, at, u, s, l, NULLIF(e, ''), NULLIF(x, '')
			FROM unnest(?::bigint[], ?::bigint[], ?::text[], ?::text[], ?::bigint[], ?::bigint[], ?::text[], ?::text[]) AS a(i, n, at, u, s, l, e, x)`,
			st.inbox, items, numbers, ats, urls, statuses, latencies, errs, excerpts)
		return err
	}
	var b strings.Builder
	b.WriteString(`INSERT INTO delivery_attempts (item_id, inbox_id, attempt, attempted_at, endpoint_url, status_code, latency_us,
		error, response_excerpt) VALUES `)
	args := make([]any, 0, 9*n)
	for _, a := range st.log {
		if !st.exists(a.Item) {
			continue
		}
		if len(args) > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`(?, ?, ?, ?, ?, ?, ?, ?, ?)`)
		args = append(args, a.Item, st.inbox, a.Number, a.At.UTC().Format(sqlitedb.Time), a.URL, a.Status,
			a.Latency.Microseconds(), nullString(a.Error), nullString(a.Excerpt))
	}
	_, err := tx.ExecContext(ctx, b.String(), args...)
	return err
}

// exists reports whether check found item id.
func (st *settlement) exists(id int64) bool {
	for _, r := range st.results {
		if r.ID == id {
			return !errors.Is(r.Err, ErrNotFound)
		}
	}
	return false
}

// Attempts returns the attempt log of item id of inbox, oldest first, or
// ErrNotFound when the inbox has no such item.
func (d *Delivery) Attempts(ctx context.Context, inbox string, id int64) ([]Attempt, error) {
	if _, err := d.Item(ctx, inbox, id); err != nil {
		return nil, err
	}
	rows, err := d.db.QueryContext(ctx, `SELECT attempt_id, item_id, inbox_id, attempt, attempted_at, endpoint_url, status_code,
		latency_us, error, response_excerpt FROM delivery_attempts WHERE item_id = ? AND inbox_id = ? ORDER BY attempt_id`, id, inbox)
	if err != nil {
		return nil, fmt.Errorf("attempts of item %d: %w", id, err)
	}
	defer rows.Close()
	out := []Attempt{}
	for rows.Next() {
		var a Attempt
		var at string
		var latency int64
		var errText, excerpt sql.NullString
		if err := rows.Scan(&a.ID, &a.Item, &a.Inbox, &a.Number, &at, &a.URL, &a.Status, &latency, &errText, &excerpt); err != nil {
			return nil, fmt.Errorf("attempts of item %d: %w", id, err)
		}
		a.At, _ = sqlitedb.ParseTime(at)
		a.Latency = time.Duration(latency) * time.Microsecond
		a.Error, a.Excerpt = errText.String, excerpt.String
		out = append(out, a)
	}
	return out, rows.Err()
}

// completeHeld completes, in tx, the items of cs that still hold their
// lease (processing, the lease not expired at nowText, in their inbox),
// with one UPDATE … RETURNING for all of them whatever their inboxes and
// leases, records the attempts of those it completed in one INSERT, and
// adds the moves to t. It returns the indexes in cs of the items it did
// not complete: those settle the long way, which tells why (acked
// already, lease lost, gone).
func completeHeld(ctx context.Context, tx conn, nowText string, cs []completion, t tally) (left []int, _ error) {
	type key struct {
		id    int64
		inbox string
	}
	done := make(map[key]bool, len(cs))
	scan := func(rows *sql.Rows, err error) error {
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k key
			var sub string
			if err := rows.Scan(&k.id, &k.inbox, &sub); err != nil {
				return err
			}
			done[k] = true
			t.move(k.inbox, sub, StateProcessing, StateCompleted, 1)
		}
		return rows.Err()
	}
	if tx.PostgreSQL {
		ids, inboxes, leases := make([]int64, len(cs)), make([]string, len(cs)), make([]string, len(cs))
		for i, c := range cs {
			ids[i], inboxes[i], leases[i] = c.id, c.inbox, c.lease
		}
		if err := scan(tx.QueryContext(ctx, completeHeldPostgres, nowText, ids, inboxes, leases)); err != nil {
			return nil, err
		}
	} else {
		// One statement per lease (a batch holds a few), its ids a flat
		// JSON array: json_each reads its integers as they are, where
		// [id, inbox, lease] triples had each value parsed again.
		type group struct{ inbox, lease string }
		var order []group
		ids := map[group][]int64{}
		for _, c := range cs {
			g := group{c.inbox, c.lease}
			if ids[g] == nil {
				order = append(order, g)
			}
			ids[g] = append(ids[g], c.id)
		}
		for _, g := range order {
			_, list := idList(false, ids[g])
			if err := scan(tx.QueryContext(ctx, completeHeldSQLite, nowText, list, g.inbox, g.lease)); err != nil {
				return nil, err
			}
		}
	}
	var log []Attempt
	for i, c := range cs {
		if !done[key{c.id, c.inbox}] {
			left = append(left, i)
			continue
		}
		if c.rec != nil {
			a := *c.rec
			a.Inbox = c.inbox
			log = append(log, a)
		}
	}
	return left, recordAll(ctx, tx, log)
}

// completeHeldSQLite completes the items of the JSON array ?2 of ids
// that hold lease ?4 of inbox ?3 at ?1; completeHeldPostgres those of
// the arrays ?2 (ids), ?3 (inboxes), ?4 (leases). Both return each
// completed item's id, inbox and subscription uid.
const (
	completeHeldSQLite = `UPDATE inbox_items SET state = 'completed', lease_token = NULL, lease_expires_at = NULL,
		completed_at = ?1, updated_at = ?1
	WHERE item_id IN (SELECT value FROM json_each(?2)) AND inbox_id = ?3 AND state = 'processing' AND lease_token = ?4
		AND lease_expires_at > ?1
	RETURNING item_id, inbox_id, subscription_uid`
	completeHeldPostgres = `UPDATE inbox_items SET state = 'completed', lease_token = NULL, lease_expires_at = NULL,
		completed_at = ?1, updated_at = ?1
	FROM unnest(?2::bigint[], ?3::text[], ?4::text[]) AS c(c_id, c_inbox, c_lease)
	WHERE item_id = c_id AND inbox_id = c_inbox AND state = 'processing' AND lease_token = c_lease AND lease_expires_at > ?1
	RETURNING item_id, inbox_id, subscription_uid`
)

// recordAll inserts log, attempts of items that exist, each of its own
// inbox (Attempt.Inbox), in tx with one statement.
func recordAll(ctx context.Context, tx conn, log []Attempt) error {
	if len(log) == 0 {
		return nil
	}
	if tx.PostgreSQL {
		n := len(log)
		items, numbers, statuses, latencies := make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
		inboxes, ats, urls, errs, excerpts := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		for _, a := range log {
			items, numbers, statuses = append(items, a.Item), append(numbers, int64(a.Number)), append(statuses, int64(a.Status))
			latencies, ats, inboxes = append(latencies, a.Latency.Microseconds()), append(ats, a.At.UTC().Format(sqlitedb.Time)), append(inboxes, a.Inbox)
			urls, errs, excerpts = append(urls, a.URL), append(errs, a.Error), append(excerpts, a.Excerpt)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO delivery_attempts (item_id, inbox_id, attempt, attempted_at, endpoint_url,
			status_code, latency_us, error, response_excerpt)
			SELECT i, b, n, at, u, s, l, NULLIF(e, ''), NULLIF(x, '')
			FROM unnest(?::bigint[], ?::text[], ?::bigint[], ?::text[], ?::text[], ?::bigint[], ?::bigint[], ?::text[], ?::text[]) AS a(i, b, n, at, u, s, l, e, x)`,
			items, inboxes, numbers, ats, urls, statuses, latencies, errs, excerpts)
		return err
	}
	// On SQLite, rows of values: read out of JSON by ->>, the values
	// cost more than binding them.
	var b strings.Builder
	b.WriteString(`INSERT INTO delivery_attempts (item_id, inbox_id, attempt, attempted_at, endpoint_url, status_code, latency_us,
		error, response_excerpt) VALUES `)
	args := make([]any, 0, 9*len(log))
	for i, a := range log {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`(?, ?, ?, ?, ?, ?, ?, ?, ?)`)
		args = append(args, a.Item, a.Inbox, a.Number, a.At.UTC().Format(sqlitedb.Time), a.URL, a.Status,
			a.Latency.Microseconds(), nullString(a.Error), nullString(a.Excerpt))
	}
	_, err := tx.ExecContext(ctx, b.String(), args...)
	return err
}
