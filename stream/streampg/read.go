package streampg

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-events/postbox/stream"
)

const eventColumns = `e.event_offset, e.native_id, e.variant, e.event_type, e.occurred_at, e.source_sequence,
	e.metadata, e.payload, e.delivery_handle, e.stored_at`

// scanEvent scans eventColumns into an event of streamID/sourceID.
func scanEvent(row pgx.Row, streamID, sourceID string) (stream.StoredEvent, error) {
	var e stream.StoredEvent
	var meta, payload, handle []byte
	if err := row.Scan(&e.Offset, &e.NativeID, &e.Variant, &e.Type, &e.OccurredAt, &e.Sequence,
		&meta, &payload, &handle, &e.StoredAt); err != nil {
		return e, err
	}
	e.ID = streamID + "/" + strconv.FormatInt(e.Offset, 10)
	e.StreamID, e.SourceID = streamID, sourceID
	e.OccurredAt, e.StoredAt = e.OccurredAt.UTC(), e.StoredAt.UTC()
	e.Metadata, e.Payload = meta, payload
	if len(handle) > 0 {
		e.DeliveryHandle = handle
	}
	return e, nil
}

// ReadFrom implements stream.Scanner: ReadStream.
func (b *Backend) ReadFrom(ctx context.Context, streamID string, from int64, limit int) ([]stream.StoredEvent, error) {
	if from < 1 {
		return nil, fmt.Errorf("%w: read from %d", stream.ErrOffsetOutOfRange, from)
	}
	return b.ReadStream(ctx, streamID, from, limit)
}

// ReadStream returns up to limit events of streamID at or after offset
// from, in offset order: Read without a consumer.
func (b *Backend) ReadStream(ctx context.Context, streamID string, from int64, limit int) ([]stream.StoredEvent, error) {
	s, err := b.streamRow(ctx, b.pool, streamID)
	if err != nil {
		return nil, err
	}
	return b.readEvents(ctx, s, from, limit)
}

func (b *Backend) readEvents(ctx context.Context, s stream.Stream, from int64, limit int) ([]stream.StoredEvent, error) {
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	limit = min(limit, MaxReadLimit)
	rows, err := b.pool.Query(ctx, b.q(`SELECT `+eventColumns+` FROM {s}.stream_events e
		WHERE e.stream_id = $1 AND e.event_offset >= $2 ORDER BY e.event_offset LIMIT $3`), s.ID, from, limit)
	if err != nil {
		return nil, fmt.Errorf("read %s from %d: %w", s.ID, from, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stream.StoredEvent, error) {
		return scanEvent(r, s.ID, s.SourceID)
	})
	if err != nil {
		return nil, fmt.Errorf("read %s from %d: %w", s.ID, from, err)
	}
	return out, nil
}

// Read implements stream.Backend.
func (b *Backend) Read(ctx context.Context, consumerID string, from int64, limit int) (stream.Batch, error) {
	c, err := b.Consumer(ctx, consumerID)
	if err != nil {
		return stream.Batch{}, err
	}
	if from == 0 {
		from = c.NextOffset
	}
	if from < 1 {
		return stream.Batch{}, fmt.Errorf("%w: read from %d", stream.ErrOffsetOutOfRange, from)
	}
	s, hw, err := b.highWatermark(ctx, b.pool, c.StreamID)
	if err != nil {
		return stream.Batch{}, err
	}
	events, err := b.readEvents(ctx, s, from, limit)
	if err != nil {
		return stream.Batch{}, err
	}
	if n := len(events); n > 0 {
		hw = max(hw, events[n-1].Offset) // an append committed between the two reads
	}
	return stream.Batch{Consumer: c, Events: events, HighWatermark: hw}, nil
}

// highWatermark returns streamID and its last offset, read on q.
func (b *Backend) highWatermark(ctx context.Context, q queryer, streamID string) (stream.Stream, int64, error) {
	var s stream.Stream
	var last int64
	err := q.QueryRow(ctx, b.q(`SELECT stream_id, source_id, backend, created_at, last_offset FROM {s}.streams WHERE stream_id = $1`), streamID).
		Scan(&s.ID, &s.SourceID, &s.Backend, &s.CreatedAt, &last)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, 0, fmt.Errorf("%w: %s", stream.ErrStreamNotFound, streamID)
	}
	if err != nil {
		return s, 0, fmt.Errorf("stream %s: %w", streamID, err)
	}
	s.CreatedAt = s.CreatedAt.UTC()
	return s, last, nil
}

// Event implements stream.Backend.
func (b *Backend) Event(ctx context.Context, streamID string, offset int64) (stream.StoredEvent, error) {
	return b.eventWhere(ctx, streamID, "offset "+strconv.FormatInt(offset, 10), `e.event_offset = $2`, offset)
}

// Lookup implements stream.Backend.
func (b *Backend) Lookup(ctx context.Context, streamID, nativeID, variant string) (stream.StoredEvent, error) {
	return b.eventWhere(ctx, streamID, "identity "+nativeID+"/"+variant, `e.native_id = $2 AND e.variant = $3`, nativeID, variant)
}

// eventWhere returns the event of streamID matching cond (on $2...; what
// names it in errors), or
// ErrNotFound, or ErrStreamNotFound, in one query.
func (b *Backend) eventWhere(ctx context.Context, streamID, what, cond string, args ...any) (stream.StoredEvent, error) {
	var sourceID string
	var offset *int64
	var e stream.StoredEvent
	var meta, payload, handle []byte
	var native, variant, typ *string
	var occurred, storedAt *time.Time
	var seq *int64
	err := b.pool.QueryRow(ctx, b.q(`SELECT s.source_id, `+eventColumns+` FROM {s}.streams s
		LEFT JOIN {s}.stream_events e ON e.stream_id = s.stream_id AND `+cond+`
		WHERE s.stream_id = $1`), append([]any{streamID}, args...)...).
		Scan(&sourceID, &offset, &native, &variant, &typ, &occurred, &seq, &meta, &payload, &handle, &storedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return e, fmt.Errorf("%w: %s", stream.ErrStreamNotFound, streamID)
	}
	if err != nil {
		return e, fmt.Errorf("event of %s: %w", streamID, err)
	}
	if offset == nil {
		return e, fmt.Errorf("%w: %s in %s", stream.ErrNotFound, what, streamID)
	}
	e.Offset, e.NativeID, e.Variant, e.Type = *offset, *native, *variant, *typ
	e.OccurredAt, e.StoredAt = occurred.UTC(), storedAt.UTC()
	e.Sequence = seq
	e.Metadata, e.Payload = meta, payload
	if len(handle) > 0 {
		e.DeliveryHandle = handle
	}
	e.ID = streamID + "/" + strconv.FormatInt(e.Offset, 10)
	e.StreamID, e.SourceID = streamID, sourceID
	return e, nil
}

// Stats implements stream.Backend. A stream's offsets are dense from its
// oldest event (Trim deletes the oldest first), so it holds last - first
// + 1 events.
func (b *Backend) Stats(ctx context.Context, streamID string) (stream.Stats, error) {
	st := stream.Stats{StreamID: streamID}
	var first, last *int64
	var firstAt, lastAt *time.Time
	err := b.pool.QueryRow(ctx, b.q(`SELECT s.last_offset,
		(SELECT event_offset FROM {s}.stream_events WHERE stream_id = s.stream_id ORDER BY event_offset LIMIT 1),
		(SELECT stored_at FROM {s}.stream_events WHERE stream_id = s.stream_id ORDER BY event_offset LIMIT 1),
		(SELECT event_offset FROM {s}.stream_events WHERE stream_id = s.stream_id ORDER BY event_offset DESC LIMIT 1),
		(SELECT stored_at FROM {s}.stream_events WHERE stream_id = s.stream_id ORDER BY event_offset DESC LIMIT 1)
		FROM {s}.streams s WHERE s.stream_id = $1`), streamID).Scan(&st.LastOffset, &first, &firstAt, &last, &lastAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, fmt.Errorf("%w: %s", stream.ErrStreamNotFound, streamID)
	}
	if err != nil {
		return st, fmt.Errorf("stream stats %s: %w", streamID, err)
	}
	if first != nil && last != nil {
		st.FirstOffset = *first
		st.Events = *last - *first + 1
		st.FirstStoredAt, st.LastStoredAt = firstAt.UTC(), lastAt.UTC()
	}
	return st, nil
}

// Lag implements stream.Backend.
func (b *Backend) Lag(ctx context.Context, consumerID string) (stream.Lag, error) {
	l := stream.Lag{ConsumerID: consumerID}
	err := b.pool.QueryRow(ctx, b.q(`SELECT c.stream_id, c.next_offset, s.last_offset FROM {s}.consumers c
		JOIN {s}.streams s ON s.stream_id = c.stream_id WHERE c.consumer_id = $1`), consumerID).
		Scan(&l.StreamID, &l.NextOffset, &l.HighWatermark)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, fmt.Errorf("%w: %s", stream.ErrConsumerNotFound, consumerID)
	}
	if err != nil {
		return l, fmt.Errorf("lag of %s: %w", consumerID, err)
	}
	l.Events = stream.LagOf(l.NextOffset, l.HighWatermark)
	return l, nil
}
