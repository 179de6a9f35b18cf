package streampg

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-events/postbox/stream"
)

var _ stream.Searcher = (*Backend)(nil)

// DefaultSearchLimit is the limit of a Search asked for 0 events;
// MaxReadLimit bounds every Search.
const DefaultSearchLimit = 100

// Search implements stream.Searcher. A time range becomes a range of
// offsets: stored times never decrease along a stream, so each end is the
// first event of the index by stored time (stream_events_stored_at) at
// or after it. Then a native id is a lookup of the identity's unique
// index, a type a range of the index by type (stream_events_by_type), and
// no filter a range of the primary key, each read newest first.
func (b *Backend) Search(ctx context.Context, streamID string, q stream.Query) ([]stream.StoredEvent, error) {
	s, last, err := b.highWatermark(ctx, b.pool, streamID)
	if err != nil {
		return nil, err
	}
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultSearchLimit
	}
	limit = min(limit, MaxReadLimit)
	lo, hi := int64(1), last
	if q.Before > 0 {
		hi = min(hi, q.Before-1)
	}
	if !q.Since.IsZero() {
		if lo, err = b.offsetAt(ctx, streamID, q.Since, last); err != nil {
			return nil, err
		}
	}
	if !q.Until.IsZero() {
		end, err := b.offsetAt(ctx, streamID, q.Until, last)
		if err != nil {
			return nil, err
		}
		hi = min(hi, end-1)
	}
	if lo > hi {
		return nil, nil
	}
	where := []string{`e.stream_id = $1`, `e.event_offset BETWEEN $2 AND $3`}
	args := []any{streamID, lo, hi}
	if q.NativeID != "" {
		args = append(args, q.NativeID)
		where = append(where, `e.native_id = $`+strconv.Itoa(len(args)))
	}
	if q.Type != "" {
		args = append(args, q.Type)
		where = append(where, `e.event_type = $`+strconv.Itoa(len(args)))
	}
	args = append(args, limit)
	rows, err := b.pool.Query(ctx, b.q(`SELECT `+eventColumns+` FROM {s}.stream_events e WHERE `+strings.Join(where, ` AND `)+
		` ORDER BY e.event_offset DESC LIMIT $`+strconv.Itoa(len(args))), args...)
	if err != nil {
		return nil, fmt.Errorf("search %s: %w", streamID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stream.StoredEvent, error) {
		return scanEvent(r, s.ID, s.SourceID)
	})
	if err != nil {
		return nil, fmt.Errorf("search %s: %w", streamID, err)
	}
	return out, nil
}

// offsetAt returns the first offset of streamID stored at or after t, or
// last+1.
func (b *Backend) offsetAt(ctx context.Context, streamID string, t time.Time, last int64) (int64, error) {
	var off int64
	err := b.pool.QueryRow(ctx, b.q(`SELECT event_offset FROM {s}.stream_events
		WHERE stream_id = $1 AND stored_at >= $2 ORDER BY stored_at, event_offset LIMIT 1`), streamID, t).Scan(&off)
	if errors.Is(err, pgx.ErrNoRows) {
		return last + 1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("offset at %s in %s: %w", t.Format(time.RFC3339Nano), streamID, err)
	}
	return off, nil
}
