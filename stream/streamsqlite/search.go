package streamsqlite

import (
	"context"
	"fmt"
	"strings"

	"github.com/postbox-events/postbox/stream"
)

var _ stream.Searcher = (*Backend)(nil)

// DefaultSearchLimit is the limit of a Search asked for 0 events;
// MaxReadLimit bounds every Search.
const DefaultSearchLimit = 100

// Search implements stream.Searcher on the readers' connections. A time
// range becomes a range of keys: stored times never decrease along a
// stream, so its ends are binary searches over offsets (offsetAt). Then
// a native id is a lookup of the identity's unique index, a type a range
// of the index by type (stream_events_by_type), and no filter a range of
// the primary key, each read newest first.
func (b *Backend) Search(ctx context.Context, streamID string, q stream.Query) ([]stream.StoredEvent, error) {
	st, err := b.stream(streamID)
	if err != nil {
		return nil, err
	}
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultSearchLimit
	}
	limit = min(limit, MaxReadLimit)
	last := st.committed.Load()
	lo, hi := int64(1), last // offsets [lo, hi]
	if q.Before > 0 {
		hi = min(hi, q.Before-1)
	}
	if !q.Since.IsZero() {
		if lo, err = b.offsetAt(ctx, b.read, st, 1, last, q.Since); err != nil {
			return nil, err
		}
	}
	if !q.Until.IsZero() {
		end, err := b.offsetAt(ctx, b.read, st, 1, last, q.Until)
		if err != nil {
			return nil, err
		}
		hi = min(hi, end-1)
	}
	if lo > hi {
		return nil, nil
	}
	query, args := searchSQL(streamID, st.base+lo, st.base+hi, q.NativeID, q.Type, limit)
	rows, err := b.read.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("search %s: %w", streamID, err)
	}
	return scanEvents(rows, st, nil)
}

// searchSQL is the query of Search for the keys [lo, hi] of streamID,
// and its arguments.
func searchSQL(streamID string, lo, hi int64, nativeID, typ string, limit int) (string, []any) {
	where := []string{`pos BETWEEN ? AND ?`}
	args := []any{lo, hi}
	if nativeID != "" {
		where = append(where, `stream_id = ? AND source_native_id = ?`)
		args = append(args, streamID, nativeID)
	}
	if typ != "" {
		// The index by type holds every stream's events; the key range
		// above keeps this stream's.
		where = append(where, `event_type = ?`)
		args = append(args, typ)
	}
	return `SELECT ` + eventColumns + ` FROM stream_events WHERE ` + strings.Join(where, ` AND `) + ` ORDER BY pos DESC LIMIT ?`, append(args, limit)
}
