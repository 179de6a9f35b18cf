package delivery

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The items of each inbox and subscription are counted by state as they
// move, in the table item_counts: every transaction that inserts items,
// moves them from one state to another or deletes them inserts one row of
// signed amounts per inbox and subscription it touched (a tally), and a
// count is the sum of the rows. Rows are inserted, never updated, so the
// transactions of several processes moving items of one inbox never wait
// for each other on a counter; foldCounts sums them into one row per inbox
// and subscription once enough accumulated. A transaction writes one row
// per inbox and subscription whatever the number of items it moved.

// foldEvery is how many count rows this process writes before the reap
// loop folds the table; a read of the counts sums at most a few times
// this many rows between folds.
const foldEvery = 1000

// countKey is what a row of item_counts counts: the items of one
// subscription (by uid: a name reused is another subscription) in one
// inbox.
type countKey struct{ inbox, sub string }

// counts is the number of items in each state: pending, processing,
// completed, failed, in that order. In a tally the numbers are changes.
type counts [4]int64

// stateIndex is the index of state in counts; -1 for none (an item
// inserted or deleted).
func stateIndex(state string) int {
	switch state {
	case StatePending:
		return 0
	case StateProcessing:
		return 1
	case StateCompleted:
		return 2
	case StateFailed:
		return 3
	}
	return -1
}

// tally is what one transaction changes of the kept counts.
type tally map[countKey]*counts

// move records that n items of subscription sub in inbox went from state
// from to state to: from "" is an insert, to "" a delete.
func (t tally) move(inbox, sub, from, to string, n int64) {
	if from == to || n == 0 {
		return
	}
	k := countKey{inbox, sub}
	c := t[k]
	if c == nil {
		c = &counts{}
		t[k] = c
	}
	if i := stateIndex(from); i >= 0 {
		c[i] -= n
	}
	if i := stateIndex(to); i >= 0 {
		c[i] += n
	}
}

// countInsert is the statement that writes rows of item_counts, less its
// values.
const countInsert = `INSERT INTO item_counts (inbox_id, subscription_uid, pending, processing, completed, failed) VALUES `

// write writes t inside tx: one row per inbox and subscription whose
// counts changed.
func (t tally) write(ctx context.Context, d *Delivery, tx conn) error {
	keys := slices.SortedFunc(maps.Keys(t), func(a, b countKey) int {
		if c := strings.Compare(a.inbox, b.inbox); c != 0 {
			return c
		}
		return strings.Compare(a.sub, b.sub)
	})
	args := make([]any, 0, 6*len(keys))
	for _, k := range keys {
		if c := t[k]; *c != (counts{}) {
			args = append(args, k.inbox, k.sub, c[0], c[1], c[2], c[3])
		}
	}
	if len(args) == 0 {
		return nil
	}
	n := len(args) / 6
	if _, err := tx.ExecContext(ctx, countInsert+strings.Repeat(",(?,?,?,?,?,?)", n)[1:], args...); err != nil {
		return fmt.Errorf("count items: %w", err)
	}
	d.countRows.Add(int64(n))
	return nil
}

// foldCounts replaces the rows of item_counts by one per inbox and
// subscription, their sum (none where it is zero), when this process
// wrote foldEvery rows since it last did (or always, with force). It
// deletes exactly the rows it sums, so rows other transactions insert
// meanwhile stay to be summed.
func (d *Delivery) foldCounts(ctx context.Context, force bool) error {
	if !force && d.countRows.Load() < foldEvery {
		return nil
	}
	return d.update(ctx, func(tx conn) error {
		rows, err := tx.QueryContext(ctx, `DELETE FROM item_counts RETURNING inbox_id, subscription_uid, pending, processing, completed, failed`)
		if err != nil {
			return err
		}
		sums := tally{}
		for rows.Next() {
			var k countKey
			var c counts
			if err := rows.Scan(&k.inbox, &k.sub, &c[0], &c[1], &c[2], &c[3]); err != nil {
				rows.Close()
				return err
			}
			s := sums[k]
			if s == nil {
				s = &counts{}
				sums[k] = s
			}
			for i := range c {
				s[i] += c[i]
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if err := sums.write(ctx, d, tx); err != nil {
			return err
		}
		d.countRows.Store(0)
		return nil
	})
}

// keptCounts reads the kept counts of every inbox and subscription in
// tx: a sum over item_counts, whose size does not grow with the items.
func keptCounts(ctx context.Context, tx conn) (map[countKey]counts, error) {
	rows, err := tx.QueryContext(ctx, `SELECT inbox_id, subscription_uid, CAST(sum(pending) AS BIGINT), CAST(sum(processing) AS BIGINT),
		CAST(sum(completed) AS BIGINT), CAST(sum(failed) AS BIGINT) FROM item_counts GROUP BY inbox_id, subscription_uid`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[countKey]counts{}
	for rows.Next() {
		var k countKey
		var c counts
		if err := rows.Scan(&k.inbox, &k.sub, &c[0], &c[1], &c[2], &c[3]); err != nil {
			return nil, err
		}
		out[k] = c
	}
	return out, rows.Err()
}
