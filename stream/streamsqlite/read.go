package streamsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

var _ stream.Backend = (*Backend)(nil)
var _ stream.Waiter = (*Backend)(nil)
var _ stream.Scanner = (*Backend)(nil)
var _ stream.Auditor = (*Backend)(nil)

// DefaultReadLimit is the limit of a Read asked for 0 events; MaxReadLimit
// bounds every Read.
const (
	DefaultReadLimit = 1000
	MaxReadLimit     = 10000
)

// Read implements stream.Backend. It reads on the readers' connections,
// beside the writer.
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
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	limit = min(limit, MaxReadLimit)
	st, err := b.stream(c.StreamID)
	if err != nil {
		return stream.Batch{}, err
	}
	batch := stream.Batch{Consumer: c, HighWatermark: st.committed.Load()}
	events, err := b.ReadStream(ctx, c.StreamID, from, limit, nil)
	if err != nil {
		return stream.Batch{}, err
	}
	batch.Events = events
	if n := len(events); n > 0 {
		batch.HighWatermark = max(batch.HighWatermark, events[n-1].Offset)
	}
	return batch, nil
}

// ReadFrom implements stream.Scanner on the readers' connections: at
// most MaxReadLimit events, DefaultReadLimit for a limit ≤ 0.
func (b *Backend) ReadFrom(ctx context.Context, streamID string, from int64, limit int) ([]stream.StoredEvent, error) {
	if from < 1 {
		return nil, fmt.Errorf("%w: read from %d", stream.ErrOffsetOutOfRange, from)
	}
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	return b.ReadStream(ctx, streamID, from, min(limit, MaxReadLimit), nil)
}

// ReadStream appends to dst up to limit events of streamID at or after
// offset from, in offset order, and returns it: Read without a consumer.
func (b *Backend) ReadStream(ctx context.Context, streamID string, from int64, limit int, dst []stream.StoredEvent) ([]stream.StoredEvent, error) {
	st, err := b.stream(streamID)
	if err != nil {
		return dst, err
	}
	rows, err := b.readEvents.QueryContext(ctx, st.base+from, st.base+maxOffset, limit)
	if err != nil {
		return dst, fmt.Errorf("read %s from %d: %w", streamID, from, err)
	}
	if cap(dst)-len(dst) < limit {
		dst = slices.Grow(dst, min(limit, DefaultReadLimit))
	}
	return scanEvents(rows, st, dst)
}

// eventColumns are the columns scanEvents reads.
const eventColumns = `pos, source_native_id, event_variant, event_type, occurred_at,
	metadata_json, raw_payload_json, delivery_handle_json, source_sequence, created_at`

// scanEvents appends to dst the events of st that rows (of eventColumns)
// hold, and closes rows.
func scanEvents(rows *sql.Rows, st *streamState, dst []stream.StoredEvent) ([]stream.StoredEvent, error) {
	defer rows.Close()
	streamID := st.ID
	prefix := st.ID + "/"
	types := map[string]string{} // a stream has few types: one string each
	var native, variant, typ, occurred, created, meta, payload, handle sql.RawBytes
	for rows.Next() {
		var e stream.StoredEvent
		var pos int64
		var seq sql.NullInt64
		if err := rows.Scan(&pos, &native, &variant, &typ, &occurred, &meta, &payload, &handle, &seq, &created); err != nil {
			return dst, fmt.Errorf("read %s: %w", streamID, err)
		}
		e.Offset = pos - st.base
		e.ID = prefix + strconv.FormatInt(e.Offset, 10)
		e.StreamID, e.SourceID = st.ID, st.SourceID
		e.NativeID = string(native)
		if len(variant) > 0 {
			e.Variant = string(variant)
		}
		t, ok := types[string(typ)]
		if !ok {
			t = string(typ)
			types[t] = t
		}
		e.Type = t
		e.OccurredAt, _ = sqlitedb.ParseTime(occurred)
		e.StoredAt, _ = sqlitedb.ParseTime(created)
		// One allocation holds the event's JSON documents.
		buf := make([]byte, 0, len(meta)+len(payload)+len(handle))
		buf = append(buf, meta...)
		buf = append(buf, payload...)
		buf = append(buf, handle...)
		e.Metadata = buf[:len(meta):len(meta)]
		e.Payload = buf[len(meta) : len(meta)+len(payload) : len(meta)+len(payload)]
		if len(handle) > 0 {
			e.DeliveryHandle = buf[len(meta)+len(payload):]
		}
		if seq.Valid {
			e.Sequence = &seq.Int64
		}
		dst = append(dst, e)
	}
	if err := rows.Err(); err != nil {
		return dst, fmt.Errorf("read %s: %w", streamID, err)
	}
	return dst, nil
}

// Stats implements stream.Backend, in a few lookups by key: a stream's
// offsets are dense from its oldest event (retention deletes the oldest
// first), so it holds last - first + 1 events.
func (b *Backend) Stats(ctx context.Context, streamID string) (stream.Stats, error) {
	st, err := b.stream(streamID)
	if err != nil {
		return stream.Stats{}, err
	}
	s := stream.Stats{StreamID: streamID, LastOffset: st.committed.Load()}
	var first, last sql.NullInt64
	var firstAt, lastAt sql.NullString
	err = b.read.QueryRowContext(ctx, `SELECT
		(SELECT pos FROM stream_events WHERE pos BETWEEN ?1 AND ?2 ORDER BY pos LIMIT 1),
		(SELECT created_at FROM stream_events WHERE pos BETWEEN ?1 AND ?2 ORDER BY pos LIMIT 1),
		(SELECT pos FROM stream_events WHERE pos BETWEEN ?1 AND ?2 ORDER BY pos DESC LIMIT 1),
		(SELECT created_at FROM stream_events WHERE pos BETWEEN ?1 AND ?2 ORDER BY pos DESC LIMIT 1)`,
		st.base+1, st.base+maxOffset).Scan(&first, &firstAt, &last, &lastAt)
	if err != nil {
		return s, fmt.Errorf("stream stats %s: %w", streamID, err)
	}
	if first.Valid {
		s.FirstOffset = first.Int64 - st.base
		s.LastOffset = max(s.LastOffset, last.Int64-st.base)
		s.Events = last.Int64 - first.Int64 + 1
		s.FirstStoredAt, _ = sqlitedb.ParseTime(firstAt.String)
		s.LastStoredAt, _ = sqlitedb.ParseTime(lastAt.String)
	}
	return s, nil
}

// Lag implements stream.Backend with one lookup by key: the high
// watermark is kept in memory.
func (b *Backend) Lag(ctx context.Context, consumerID string) (stream.Lag, error) {
	c, err := b.Consumer(ctx, consumerID)
	if err != nil {
		return stream.Lag{}, err
	}
	st, err := b.stream(c.StreamID)
	if err != nil {
		return stream.Lag{}, err
	}
	l := stream.Lag{ConsumerID: consumerID, StreamID: c.StreamID, NextOffset: c.NextOffset, HighWatermark: st.committed.Load()}
	l.Events = stream.LagOf(l.NextOffset, l.HighWatermark)
	return l, nil
}

// Wait implements stream.Waiter: it returns once a commit took streamID's
// high watermark above after.
func (b *Backend) Wait(ctx context.Context, streamID string, after int64) error {
	st, err := b.stream(streamID)
	if err != nil {
		return err
	}
	for {
		st.mu.Lock()
		grew := st.grew
		st.mu.Unlock()
		if st.committed.Load() > after {
			return nil
		}
		select {
		case <-grew:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Streams implements stream.Backend, from memory.
func (b *Backend) Streams(context.Context) ([]stream.Stream, error) {
	b.mu.RLock()
	out := make([]stream.Stream, 0, len(b.streams))
	for _, st := range b.streams {
		out = append(out, st.Stream)
	}
	b.mu.RUnlock()
	slices.SortFunc(out, func(x, y stream.Stream) int { return strings.Compare(x.ID, y.ID) })
	return out, nil
}

// Lookup implements stream.Backend.
func (b *Backend) Lookup(ctx context.Context, streamID, nativeID, variant string) (stream.StoredEvent, error) {
	st, err := b.stream(streamID)
	if err != nil {
		return stream.StoredEvent{}, err
	}
	var pos int64
	err = b.read.QueryRowContext(ctx, `SELECT pos FROM stream_events WHERE stream_id = ? AND source_native_id = ? AND event_variant = ?`,
		streamID, nativeID, variant).Scan(&pos)
	if errors.Is(err, sql.ErrNoRows) {
		return stream.StoredEvent{}, fmt.Errorf("%w: %s in %s", stream.ErrNotFound, nativeID, streamID)
	}
	if err != nil {
		return stream.StoredEvent{}, fmt.Errorf("look up %s in %s: %w", nativeID, streamID, err)
	}
	return b.Event(ctx, streamID, pos-st.base)
}

// Event implements stream.Backend.
func (b *Backend) Event(ctx context.Context, streamID string, offset int64) (stream.StoredEvent, error) {
	if offset < 1 {
		return stream.StoredEvent{}, fmt.Errorf("%w: offset %d in %s", stream.ErrNotFound, offset, streamID)
	}
	evs, err := b.ReadStream(ctx, streamID, offset, 1, nil)
	if err != nil {
		return stream.StoredEvent{}, err
	}
	if len(evs) == 0 || evs[0].Offset != offset {
		return stream.StoredEvent{}, fmt.Errorf("%w: offset %d in %s", stream.ErrNotFound, offset, streamID)
	}
	return evs[0], nil
}
