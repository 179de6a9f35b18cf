package streamsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

// Update runs fn in a write transaction of the writer, in the next group
// commit, and returns its error once the transaction committed (fn's
// changes are in) or with the error that undid them. fn runs in a
// savepoint: its failure undoes its own writes only. fn runs on the writer
// goroutine, so it must be short and must not call the Backend's write
// methods (that would wait for the writer it holds).
func (b *Backend) Update(ctx context.Context, fn func(tx *sql.Tx) error) error {
	it := &item{fn: fn}
	if err := b.writer.Do(ctx, []*item{it}); err != nil {
		return err
	}
	return it.fnErr
}

// EnsureConsumer implements stream.Backend.
func (b *Backend) EnsureConsumer(ctx context.Context, cfg stream.ConsumerConfig) (stream.Consumer, error) {
	if cfg.ID == "" {
		return stream.Consumer{}, errors.New("ensure consumer: empty id")
	}
	if err := cfg.Start.Validate(); err != nil {
		return stream.Consumer{}, fmt.Errorf("ensure consumer %s: %w", cfg.ID, err)
	}
	st, err := b.stream(cfg.StreamID)
	if err != nil {
		return stream.Consumer{}, err
	}
	var c stream.Consumer
	err = b.Update(ctx, func(tx *sql.Tx) error {
		var err error
		c, err = b.consumerTx(ctx, tx, cfg.ID)
		switch {
		case err == nil && c.StreamID != cfg.StreamID:
			return fmt.Errorf("%w: %s is on stream %s", stream.ErrConsumerExists, cfg.ID, c.StreamID)
		case !errors.Is(err, stream.ErrConsumerNotFound):
			return err
		}
		next, err := b.startOffset(ctx, tx, st, cfg.Start)
		if err != nil {
			return err
		}
		now := b.now().UTC().Format(sqlitedb.Time)
		policy, startOffset, startTime := startColumns(cfg.Start)
		if _, err := tx.ExecContext(ctx, `INSERT INTO consumers (consumer_id, stream_id, subscription_id, consumer_key,
			start_policy, start_offset, start_time, next_offset, created_at, updated_at) VALUES (?1, ?2, ?1, ?3, ?4, ?5, ?6, ?7, ?8, ?8)`,
			cfg.ID, st.ID, st.ID+"/"+cfg.ID, policy, startOffset, startTime, next, now); err != nil {
			return fmt.Errorf("ensure consumer %s: %w", cfg.ID, err)
		}
		c, err = b.consumerTx(ctx, tx, cfg.ID)
		return err
	})
	return c, err
}

// Consumer implements stream.Backend.
func (b *Backend) Consumer(ctx context.Context, id string) (stream.Consumer, error) {
	return scanConsumer(b.read.QueryRowContext(ctx, consumerQuery, id), id)
}

// DeleteConsumer implements stream.Backend. The consumer's commit audit
// goes with it.
func (b *Backend) DeleteConsumer(ctx context.Context, id string) error {
	return b.Update(ctx, func(tx *sql.Tx) error {
		r, err := tx.ExecContext(ctx, `DELETE FROM consumers WHERE consumer_id = ?`, id)
		if err != nil {
			return fmt.Errorf("delete consumer %s: %w", id, err)
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return fmt.Errorf("%w: %s", stream.ErrConsumerNotFound, id)
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM consumer_commits WHERE consumer_id = ?`, id)
		return err
	})
}

// Commit implements stream.Backend.
func (b *Backend) Commit(ctx context.Context, consumerID string, offset int64) (stream.Consumer, error) {
	var c stream.Consumer
	err := b.Update(ctx, func(tx *sql.Tx) error {
		var err error
		c, err = b.commitTx(ctx, tx, consumerID, offset)
		return err
	})
	return c, err
}

// Reset implements stream.Backend.
func (b *Backend) Reset(ctx context.Context, consumerID string, start stream.Start) (stream.Consumer, error) {
	if err := start.Validate(); err != nil {
		return stream.Consumer{}, fmt.Errorf("reset %s: %w", consumerID, err)
	}
	var c stream.Consumer
	err := b.Update(ctx, func(tx *sql.Tx) error {
		var err error
		if c, err = b.consumerTx(ctx, tx, consumerID); err != nil {
			return err
		}
		st, err := b.stream(c.StreamID)
		if err != nil {
			return err
		}
		next, err := b.startOffset(ctx, tx, st, start)
		if err != nil {
			return err
		}
		policy, startOffset, startTime := startColumns(start)
		if err := b.moveConsumer(ctx, tx, c, next, &start, `start_policy = ?, start_offset = ?, start_time = ?,`, policy, startOffset, startTime); err != nil {
			return err
		}
		c, err = b.consumerTx(ctx, tx, consumerID)
		return err
	})
	return c, err
}

// commitTx commits consumerID at offset inside tx.
func (b *Backend) commitTx(ctx context.Context, tx *sql.Tx, consumerID string, offset int64) (stream.Consumer, error) {
	c, err := b.consumerTx(ctx, tx, consumerID)
	if err != nil {
		return c, err
	}
	st, err := b.stream(c.StreamID)
	if err != nil {
		return c, err
	}
	switch {
	case offset == c.NextOffset-1:
		return c, nil // committed already
	case offset < c.NextOffset-1:
		return c, fmt.Errorf("%w: %s is at %d, commit of %d", stream.ErrCommitBehind, consumerID, c.NextOffset, offset)
	case offset > st.last:
		return c, fmt.Errorf("%w: commit of %d past the high watermark %d of %s", stream.ErrOffsetOutOfRange, offset, st.last, st.ID)
	}
	if err := b.moveConsumer(ctx, tx, c, offset+1, nil, ""); err != nil {
		return c, err
	}
	return b.consumerTx(ctx, tx, consumerID)
}

// auditKept is how many commits per consumer consumer_commits keeps.
const auditKept = 1000

// moveConsumer sets c's next offset (and the columns in set, a list of
// "column = ?," with their args) and records it in the audit table: as a
// reset to start, or as a commit when start is nil.
func (b *Backend) moveConsumer(ctx context.Context, tx *sql.Tx, c stream.Consumer, next int64, start *stream.Start, set string, args ...any) error {
	now := b.now().UTC().Format(sqlitedb.Time)
	args = append(args, next, now, c.ID)
	if _, err := tx.ExecContext(ctx, `UPDATE consumers SET `+set+` next_offset = ?, updated_at = ? WHERE consumer_id = ?`, args...); err != nil {
		return fmt.Errorf("commit %s: %w", c.ID, err)
	}
	kind, startJSON := stream.MoveCommit, any(nil)
	if start != nil {
		j, err := start.MarshalJSON()
		if err != nil {
			return fmt.Errorf("reset %s: %w", c.ID, err)
		}
		kind, startJSON = stream.MoveReset, string(j)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO consumer_commits (commit_id, consumer_id, stream_id, committed_offset, committed_at, kind, start_json)
		VALUES (?, ?, ?, ?, ?, ?, ?)`, "cc_"+ulid.Make().String(), c.ID, c.StreamID, next-1, now, kind, startJSON); err != nil {
		return fmt.Errorf("commit %s: audit: %w", c.ID, err)
	}
	if b.commitCount++; b.commitCount%256 == 0 {
		_, err := tx.ExecContext(ctx, `DELETE FROM consumer_commits WHERE consumer_id = ?1 AND commit_id <
			(SELECT commit_id FROM consumer_commits WHERE consumer_id = ?1 ORDER BY commit_id DESC LIMIT 1 OFFSET ?2)`, c.ID, auditKept-1)
		if err != nil {
			return fmt.Errorf("commit %s: prune audit: %w", c.ID, err)
		}
	}
	return nil
}

// Moves implements stream.Auditor: the newest moves of consumerID from
// consumer_commits, which keeps about the newest 1000 per consumer.
func (b *Backend) Moves(ctx context.Context, consumerID string, limit int) ([]stream.Move, error) {
	if _, err := b.Consumer(ctx, consumerID); err != nil {
		return nil, err
	}
	rows, err := b.read.QueryContext(ctx, `SELECT consumer_id, stream_id, kind, committed_offset, start_json, committed_at
		FROM consumer_commits WHERE consumer_id = ? ORDER BY commit_id DESC LIMIT ?`, consumerID, max(limit, 1))
	if err != nil {
		return nil, fmt.Errorf("moves of %s: %w", consumerID, err)
	}
	defer rows.Close()
	var out []stream.Move
	for rows.Next() {
		var m stream.Move
		var start sql.NullString
		var at string
		if err := rows.Scan(&m.ConsumerID, &m.StreamID, &m.Kind, &m.Offset, &start, &at); err != nil {
			return nil, fmt.Errorf("moves of %s: %w", consumerID, err)
		}
		if start.Valid {
			m.Start = new(stream.Start)
			if err := m.Start.UnmarshalJSON([]byte(start.String)); err != nil {
				return nil, fmt.Errorf("moves of %s: start %q: %w", consumerID, start.String, err)
			}
		}
		m.At, _ = sqlitedb.ParseTime(at)
		out = append(out, m)
	}
	return out, rows.Err()
}

// startOffset returns the next offset of a consumer of st starting at
// start. It runs on the writer goroutine, where st.last is current.
func (b *Backend) startOffset(ctx context.Context, tx *sql.Tx, st *streamState, start stream.Start) (int64, error) {
	if start.Policy == "" || start.Policy == stream.StartLatest {
		return st.last + 1, nil
	}
	first, err := firstOffset(ctx, tx, st)
	if err != nil {
		return 0, err
	}
	switch start.Policy {
	case stream.StartEarliest:
		return first, nil
	case stream.StartAtOffset:
		if start.Offset > st.last+1 {
			return 0, fmt.Errorf("%w: start at %d, past the next offset %d of %s", stream.ErrOffsetOutOfRange, start.Offset, st.last+1, st.ID)
		}
		return max(start.Offset, first), nil // what retention deleted is gone
	case stream.StartAtTime:
		return b.offsetAt(ctx, tx, st, first, st.last, start.Time)
	}
	return 0, stream.ErrInvalidStart
}

// firstOffset returns the oldest offset st holds, or the next one to be
// written when it holds none.
func firstOffset(ctx context.Context, q querier, st *streamState) (int64, error) {
	var pos sql.NullInt64
	if err := q.QueryRowContext(ctx, `SELECT min(pos) FROM stream_events WHERE pos BETWEEN ? AND ?`, st.base+1, st.base+maxOffset).Scan(&pos); err != nil {
		return 0, fmt.Errorf("first offset of %s: %w", st.ID, err)
	}
	if !pos.Valid {
		return st.last + 1, nil
	}
	return pos.Int64 - st.base, nil
}

// offsetAt returns the first offset of st stored at or after t, or
// last+1. Stored times never decrease along a stream,
// so it is a binary search over offsets: about 20 lookups for a million
// events, and no index by time on the write path.
func (b *Backend) offsetAt(ctx context.Context, tx querier, st *streamState, first, last int64, t time.Time) (int64, error) {
	want := t.UTC().Format(sqlitedb.Time)
	lo, hi := first, last+1 // the answer is in [lo, hi]
	for lo < hi {
		mid := lo + (hi-lo)/2
		var pos int64
		var created string
		err := tx.QueryRowContext(ctx, `SELECT pos, created_at FROM stream_events WHERE pos BETWEEN ? AND ? ORDER BY pos LIMIT 1`,
			st.base+mid, st.base+maxOffset).Scan(&pos, &created)
		if errors.Is(err, sql.ErrNoRows) {
			hi = mid
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("offset at %s in %s: %w", want, st.ID, err)
		}
		if created >= want {
			hi = min(mid, pos-st.base)
		} else {
			lo = pos - st.base + 1
		}
	}
	return lo, nil
}

func startColumns(s stream.Start) (policy string, offset, t any) {
	policy = s.Policy
	if policy == "" {
		policy = stream.StartLatest
	}
	switch policy {
	case stream.StartAtOffset:
		offset = s.Offset
	case stream.StartAtTime:
		t = s.Time.UTC().Format(sqlitedb.Time)
	}
	return policy, offset, t
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

const consumerQuery = `SELECT consumer_id, stream_id, consumer_key, next_offset, start_policy, start_offset, start_time,
	created_at, updated_at FROM consumers WHERE consumer_id = ?`

func (b *Backend) consumerTx(ctx context.Context, tx *sql.Tx, id string) (stream.Consumer, error) {
	return scanConsumer(tx.QueryRowContext(ctx, consumerQuery, id), id)
}

func scanConsumer(row *sql.Row, id string) (stream.Consumer, error) {
	var c stream.Consumer
	var startOffset sql.NullInt64
	var startTime sql.NullString
	var created, updated string
	err := row.Scan(&c.ID, &c.StreamID, &c.Key, &c.NextOffset, &c.Start.Policy, &startOffset, &startTime, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return c, fmt.Errorf("%w: %s", stream.ErrConsumerNotFound, id)
	}
	if err != nil {
		return c, fmt.Errorf("consumer %s: %w", id, err)
	}
	c.Start.Offset = startOffset.Int64
	if startTime.Valid {
		c.Start.Time, _ = sqlitedb.ParseTime(startTime.String)
	}
	c.CreatedAt, _ = sqlitedb.ParseTime(created)
	c.UpdatedAt, _ = sqlitedb.ParseTime(updated)
	return c, nil
}

// Migrate applies the migrations of another component (see
// sqlitedb.Migrate) to this database, so that its tables can be written in
// the same group commits as the streams' (Update).
func (b *Backend) Migrate(ctx context.Context, component string, fsys fs.FS) error {
	if err := sqlitedb.Migrate(ctx, b.write, component, fsys); err != nil {
		return err
	}
	return b.wal.Sync()
}

// Trim implements stream.Trimmer. The high watermark is recorded in streams.last_offset first, so offsets
// are never reused after the newest events are deleted.
func (b *Backend) Trim(ctx context.Context, streamID string, t time.Time, limit int) (int, error) {
	st, err := b.stream(streamID)
	if err != nil {
		return 0, err
	}
	var n int64
	err = b.Update(ctx, func(tx *sql.Tx) error {
		first, err := firstOffset(ctx, tx, st)
		if err != nil {
			return err
		}
		end, err := b.offsetAt(ctx, tx, st, first, st.last, t) // the first offset stored at or after t
		if err != nil {
			return err
		}
		var read sql.NullInt64 // the lowest next offset of the stream's consumers
		if err := tx.QueryRowContext(ctx, `SELECT min(next_offset) FROM consumers WHERE stream_id = ?`, streamID).Scan(&read); err != nil {
			return err
		}
		if read.Valid {
			end = min(end, read.Int64)
		}
		if end <= first {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE streams SET last_offset = max(last_offset, ?) WHERE stream_id = ?`, st.last, streamID); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM stream_events WHERE pos >= ? AND pos < ? AND pos < ?`,
			st.base+first, st.base+end, st.base+first+int64(limit))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("trim %s: %w", streamID, err)
	}
	return int(n), nil
}
