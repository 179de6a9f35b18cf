package delivery

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The completed items of each inbox are counted as they change, in the
// table inbox_tallies: every transaction that moves items into or out of
// completed (an ack, a replay, retention) inserts one signed row per
// inbox, and an inbox's count is the sum of its rows. Rows are inserted,
// never updated, so transactions of several processes acking items of one
// inbox never wait for each other on a counter; foldTallies sums them
// into one row per inbox once enough accumulated. The item insert of the
// ingest path writes nothing here.

// foldEvery is how many tally rows this process writes before the reap
// loop folds the table; a read of the counts sums at most a few times
// this many rows between folds.
const foldEvery = 1000

// tally adds to the completed count of each inbox in by, inside tx.
func (d *Delivery) tally(ctx context.Context, tx conn, by map[string]int64) error {
	inboxes := slices.Sorted(maps.Keys(by))
	args := make([]any, 0, 2*len(inboxes))
	for _, inbox := range inboxes {
		if by[inbox] != 0 {
			args = append(args, inbox, by[inbox])
		}
	}
	if len(args) == 0 {
		return nil
	}
	n := len(args) / 2
	if _, err := tx.ExecContext(ctx, `INSERT INTO inbox_tallies (inbox_id, completed) VALUES `+
		strings.Repeat(",(?,?)", n)[1:], args...); err != nil {
		return fmt.Errorf("count completed items: %w", err)
	}
	d.tallies.Add(int64(n))
	return nil
}

// completedMoves is how many of moves went to completed.
func completedMoves(moves []move) int64 {
	var n int64
	for _, m := range moves {
		if m.to == StateCompleted {
			n++
		}
	}
	return n
}

// foldTallies replaces the tally rows by one per inbox, their sum, when
// this process wrote foldEvery rows since it last did (or always, with
// force). It deletes exactly the rows it sums, so rows other
// transactions insert meanwhile stay to be summed.
func (d *Delivery) foldTallies(ctx context.Context, force bool) error {
	if !force && d.tallies.Load() < foldEvery {
		return nil
	}
	return d.update(ctx, func(tx conn) error {
		rows, err := tx.QueryContext(ctx, `DELETE FROM inbox_tallies RETURNING inbox_id, completed`)
		if err != nil {
			return err
		}
		sums := map[string]int64{}
		for rows.Next() {
			var inbox string
			var n int64
			if err := rows.Scan(&inbox, &n); err != nil {
				rows.Close()
				return err
			}
			sums[inbox] += n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if err := d.tally(ctx, tx, sums); err != nil {
			return err
		}
		d.tallies.Store(0)
		return nil
	})
}
