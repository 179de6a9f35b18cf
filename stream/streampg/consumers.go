package streampg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-events/postbox/stream"
)

const consumerColumns = `consumer_id, stream_id, consumer_key, next_offset, start_policy, start_offset, start_time, created_at, updated_at`

func scanConsumer(row pgx.Row, id string) (stream.Consumer, error) {
	var c stream.Consumer
	var startOffset *int64
	var startTime *time.Time
	err := row.Scan(&c.ID, &c.StreamID, &c.Key, &c.NextOffset, &c.Start.Policy, &startOffset, &startTime, &c.CreatedAt, &c.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, fmt.Errorf("%w: %s", stream.ErrConsumerNotFound, id)
	}
	if err != nil {
		return c, fmt.Errorf("consumer %s: %w", id, err)
	}
	if startOffset != nil {
		c.Start.Offset = *startOffset
	}
	if startTime != nil {
		c.Start.Time = startTime.UTC()
	}
	c.CreatedAt, c.UpdatedAt = c.CreatedAt.UTC(), c.UpdatedAt.UTC()
	return c, nil
}

// consumer reads the consumer id; lock adds FOR UPDATE.
func (b *Backend) consumer(ctx context.Context, q queryer, id string, lock bool) (stream.Consumer, error) {
	query := `SELECT ` + consumerColumns + ` FROM {s}.consumers WHERE consumer_id = $1`
	if lock {
		query += ` FOR UPDATE`
	}
	return scanConsumer(q.QueryRow(ctx, b.q(query), id), id)
}

// Consumer implements stream.Backend.
func (b *Backend) Consumer(ctx context.Context, id string) (stream.Consumer, error) {
	return b.consumer(ctx, b.pool, id, false)
}

// EnsureConsumer implements stream.Backend. Callers racing to create one
// consumer all get the one that won.
func (b *Backend) EnsureConsumer(ctx context.Context, cfg stream.ConsumerConfig) (stream.Consumer, error) {
	if cfg.ID == "" {
		return stream.Consumer{}, errors.New("ensure consumer: empty id")
	}
	if err := cfg.Start.Validate(); err != nil {
		return stream.Consumer{}, fmt.Errorf("ensure consumer %s: %w", cfg.ID, err)
	}
	c, err := b.Consumer(ctx, cfg.ID)
	if errors.Is(err, stream.ErrConsumerNotFound) {
		var next int64
		next, err = b.startOffset(ctx, b.pool, cfg.StreamID, cfg.Start)
		if err != nil {
			return stream.Consumer{}, fmt.Errorf("ensure consumer %s: %w", cfg.ID, err)
		}
		policy, startOffset, startTime := startColumns(cfg.Start)
		if _, err := b.pool.Exec(ctx, b.q(`INSERT INTO {s}.consumers (consumer_id, stream_id, consumer_key,
			start_policy, start_offset, start_time, next_offset) VALUES ($1, $2, $3, $4, $5, $6, $7)
			ON CONFLICT (consumer_id) DO NOTHING`),
			cfg.ID, cfg.StreamID, cfg.StreamID+"/"+cfg.ID, policy, startOffset, startTime, next); err != nil {
			return stream.Consumer{}, fmt.Errorf("ensure consumer %s: %w", cfg.ID, err)
		}
		c, err = b.Consumer(ctx, cfg.ID)
	}
	if err != nil {
		return stream.Consumer{}, err
	}
	if c.StreamID != cfg.StreamID {
		return stream.Consumer{}, fmt.Errorf("%w: %s is on stream %s", stream.ErrConsumerExists, cfg.ID, c.StreamID)
	}
	return c, nil
}

// DeleteConsumer implements stream.Backend. The consumer's moves in
// consumer_commits go with it.
func (b *Backend) DeleteConsumer(ctx context.Context, id string) error {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("delete consumer %s: %w", id, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	ct, err := tx.Exec(ctx, b.q(`DELETE FROM {s}.consumers WHERE consumer_id = $1`), id)
	if err != nil {
		return fmt.Errorf("delete consumer %s: %w", id, err)
	}
	if ct.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s", stream.ErrConsumerNotFound, id)
	}
	if _, err := tx.Exec(ctx, b.q(`DELETE FROM {s}.consumer_commits WHERE consumer_id = $1`), id); err != nil {
		return fmt.Errorf("delete consumer %s: audit: %w", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("delete consumer %s: commit: %w", id, err)
	}
	return nil
}

// Moves implements stream.Auditor: the newest moves of consumerID from
// consumer_commits, which keeps about the newest 1000 per consumer.
func (b *Backend) Moves(ctx context.Context, consumerID string, limit int) ([]stream.Move, error) {
	if _, err := b.Consumer(ctx, consumerID); err != nil {
		return nil, err
	}
	rows, err := b.pool.Query(ctx, b.q(`SELECT consumer_id, stream_id, kind, committed_offset, start_json, committed_at
		FROM {s}.consumer_commits WHERE consumer_id = $1 ORDER BY commit_id DESC LIMIT $2`), consumerID, max(limit, 1))
	if err != nil {
		return nil, fmt.Errorf("moves of %s: %w", consumerID, err)
	}
	defer rows.Close()
	var out []stream.Move
	for rows.Next() {
		var m stream.Move
		var start *string
		if err := rows.Scan(&m.ConsumerID, &m.StreamID, &m.Kind, &m.Offset, &start, &m.At); err != nil {
			return nil, fmt.Errorf("moves of %s: %w", consumerID, err)
		}
		if start != nil {
			m.Start = new(stream.Start)
			if err := m.Start.UnmarshalJSON([]byte(*start)); err != nil {
				return nil, fmt.Errorf("moves of %s: start %q: %w", consumerID, *start, err)
			}
		}
		m.At = m.At.UTC()
		out = append(out, m)
	}
	return out, rows.Err()
}

// Commit implements stream.Backend.
func (b *Backend) Commit(ctx context.Context, consumerID string, offset int64) (stream.Consumer, error) {
	return b.moveConsumer(ctx, consumerID, nil, func(tx pgx.Tx, c stream.Consumer) (int64, string, []any, error) {
		switch {
		case offset == c.NextOffset-1:
			return 0, "", nil, errUnchanged // committed already
		case offset < c.NextOffset-1:
			return 0, "", nil, fmt.Errorf("%w: %s is at %d, commit of %d", stream.ErrCommitBehind, consumerID, c.NextOffset, offset)
		}
		_, last, err := b.highWatermark(ctx, tx, c.StreamID) // on tx: a second connection could exhaust the pool
		if err != nil {
			return 0, "", nil, err
		}
		if offset > last {
			return 0, "", nil, fmt.Errorf("%w: commit of %d past the high watermark %d of %s", stream.ErrOffsetOutOfRange, offset, last, c.StreamID)
		}
		return offset + 1, "", nil, nil
	})
}

// Reset implements stream.Backend.
func (b *Backend) Reset(ctx context.Context, consumerID string, start stream.Start) (stream.Consumer, error) {
	if err := start.Validate(); err != nil {
		return stream.Consumer{}, fmt.Errorf("reset %s: %w", consumerID, err)
	}
	return b.moveConsumer(ctx, consumerID, &start, func(tx pgx.Tx, c stream.Consumer) (int64, string, []any, error) {
		next, err := b.startOffset(ctx, tx, c.StreamID, start)
		if err != nil {
			return 0, "", nil, fmt.Errorf("reset %s: %w", consumerID, err)
		}
		policy, startOffset, startTime := startColumns(start)
		return next, `start_policy = $3, start_offset = $4, start_time = $5,`, []any{policy, startOffset, startTime}, nil
	})
}

var errUnchanged = errors.New("unchanged")

// auditKept is how many moves per consumer consumer_commits keeps.
const auditKept = 1000

// moveConsumer locks consumerID and sets its next offset (and the columns
// in set, "column = $3, ...", with their args) to what decide returns, and
// records the move in consumer_commits: a reset to start, or a commit when
// start is nil.
func (b *Backend) moveConsumer(ctx context.Context, consumerID string, start *stream.Start,
	decide func(tx pgx.Tx, c stream.Consumer) (next int64, set string, args []any, err error)) (stream.Consumer, error) {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return stream.Consumer{}, fmt.Errorf("consumer %s: %w", consumerID, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	c, err := b.consumer(ctx, tx, consumerID, true)
	if err != nil {
		return c, err
	}
	next, set, args, err := decide(tx, c)
	if errors.Is(err, errUnchanged) {
		return c, tx.Commit(ctx)
	}
	if err != nil {
		return c, err
	}
	c, err = scanConsumer(tx.QueryRow(ctx, b.q(`UPDATE {s}.consumers SET `+set+` next_offset = $2, updated_at = clock_timestamp()
		WHERE consumer_id = $1 RETURNING `+consumerColumns), append([]any{consumerID, next}, args...)...), consumerID)
	if err != nil {
		return c, err
	}
	kind, startJSON := stream.MoveCommit, (*string)(nil)
	if start != nil {
		j, err := start.MarshalJSON()
		if err != nil {
			return c, fmt.Errorf("reset %s: %w", consumerID, err)
		}
		kind, startJSON = stream.MoveReset, new(string(j))
	}
	if _, err := tx.Exec(ctx, b.q(`INSERT INTO {s}.consumer_commits (consumer_id, stream_id, committed_offset, kind, start_json)
		VALUES ($1, $2, $3, $4, $5)`), consumerID, c.StreamID, next-1, kind, startJSON); err != nil {
		return c, fmt.Errorf("consumer %s: audit: %w", consumerID, err)
	}
	if b.moves.Add(1)%256 == 0 {
		if _, err := tx.Exec(ctx, b.q(`DELETE FROM {s}.consumer_commits WHERE consumer_id = $1 AND commit_id <
			(SELECT commit_id FROM {s}.consumer_commits WHERE consumer_id = $1 ORDER BY commit_id DESC OFFSET $2 LIMIT 1)`),
			consumerID, auditKept-1); err != nil {
			return c, fmt.Errorf("consumer %s: prune audit: %w", consumerID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return c, fmt.Errorf("consumer %s: commit: %w", consumerID, err)
	}
	return c, nil
}

// startOffset returns the next offset of a consumer of streamID starting
// at start.
func (b *Backend) startOffset(ctx context.Context, q queryer, streamID string, start stream.Start) (int64, error) {
	var last int64
	var first, atTime *int64
	var t *time.Time
	if start.Policy == stream.StartAtTime {
		t = &start.Time
	}
	err := q.QueryRow(ctx, b.q(`SELECT s.last_offset,
		(SELECT min(event_offset) FROM {s}.stream_events WHERE stream_id = s.stream_id),
		(SELECT min(event_offset) FROM {s}.stream_events WHERE stream_id = s.stream_id AND $2::timestamptz IS NOT NULL AND stored_at >= $2)
		FROM {s}.streams s WHERE s.stream_id = $1`), streamID, t).Scan(&last, &first, &atTime)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w: %s", stream.ErrStreamNotFound, streamID)
	}
	if err != nil {
		return 0, fmt.Errorf("start offset in %s: %w", streamID, err)
	}
	oldest := last + 1 // the next offset when the stream holds nothing
	if first != nil {
		oldest = *first
	}
	switch start.Policy {
	case "", stream.StartLatest:
		return last + 1, nil
	case stream.StartEarliest:
		return oldest, nil
	case stream.StartAtOffset:
		if start.Offset > last+1 {
			return 0, fmt.Errorf("%w: start at %d, past the next offset %d of %s", stream.ErrOffsetOutOfRange, start.Offset, last+1, streamID)
		}
		return max(start.Offset, oldest), nil // what Trim deleted is gone
	case stream.StartAtTime:
		if atTime == nil {
			return last + 1, nil
		}
		return *atTime, nil
	}
	return 0, stream.ErrInvalidStart
}

func startColumns(s stream.Start) (policy string, offset *int64, t *time.Time) {
	policy = s.Policy
	if policy == "" {
		policy = stream.StartLatest
	}
	switch policy {
	case stream.StartAtOffset:
		offset = &s.Offset
	case stream.StartAtTime:
		t = &s.Time
	}
	return policy, offset, t
}

// Trim implements stream.Trimmer. It holds the stream's lock (FOR NO KEY
// UPDATE, the lock an append's UPDATE takes), so it never runs beside an
// append of the stream; the high watermark stays in streams.last_offset, so offsets
// are never reused.
func (b *Backend) Trim(ctx context.Context, streamID string, t time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("trim %s: %w", streamID, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var last int64
	err = tx.QueryRow(ctx, b.q(`SELECT last_offset FROM {s}.streams WHERE stream_id = $1 FOR NO KEY UPDATE`), streamID).Scan(&last)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w: %s", stream.ErrStreamNotFound, streamID)
	}
	if err != nil {
		return 0, fmt.Errorf("trim %s: %w", streamID, err)
	}
	// end: the first offset kept, the lowest of the first stored at or
	// after t and every consumer's next offset.
	var end int64
	err = tx.QueryRow(ctx, b.q(`SELECT least(
		coalesce((SELECT min(event_offset) FROM {s}.stream_events WHERE stream_id = $1 AND stored_at >= $2), $3),
		coalesce((SELECT min(next_offset) FROM {s}.consumers WHERE stream_id = $1), $3))`), streamID, t, last+1).Scan(&end)
	if err != nil {
		return 0, fmt.Errorf("trim %s: %w", streamID, err)
	}
	ct, err := tx.Exec(ctx, b.q(`DELETE FROM {s}.stream_events WHERE stream_id = $1 AND event_offset IN (
		SELECT event_offset FROM {s}.stream_events WHERE stream_id = $1 AND event_offset < $2 ORDER BY event_offset LIMIT $3)`),
		streamID, end, limit)
	if err != nil {
		return 0, fmt.Errorf("trim %s: %w", streamID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("trim %s: commit: %w", streamID, err)
	}
	return int(ct.RowsAffected()), nil
}
