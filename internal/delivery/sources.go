package delivery

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// Kinds of source. A source's kind says how its events arrive; its
// settings (Source.Settings) are the kind's own.
const (
	// KindDevice: edge devices send envelopes over the WebSocket ingress.
	KindDevice = "device"
	// KindWebhook: providers POST webhooks to /webhooks/{source}.
	KindWebhook = "webhook"
	// KindPoll: postbox polls a JSON HTTP API for pages of items.
	KindPoll = "poll"
	// KindFeed: postbox follows another postbox's replay feed.
	KindFeed = "feed"
)

// Source is where events come from: a device fleet, a webhook endpoint,
// and (later kinds) a poller or a feed. One source has one stream, of its
// name.
type Source struct {
	Name   string
	Kind   string // KindDevice, KindWebhook, ...
	Stream string // the stream its events are stored in: Name
	// Settings are the kind's settings as a JSON object ({} for none),
	// stored as given; delivery does not read them.
	Settings json.RawMessage
	// Checkpoint is how far a source that reads from upstream has read;
	// zero for a source that is sent to.
	Checkpoint Checkpoint
	CreatedAt  time.Time
}

// Checkpoint is how far a source has read upstream, written in the
// transaction that stores what it read and loaded at start.
type Checkpoint struct {
	Cursor      string    // what to ask upstream for next; "" when none
	LastEventAt time.Time // the source's time of the last event stored
	LastError   string    // the last failure reading upstream; "" after a success
	LastPollAt  time.Time
	UpdatedAt   time.Time // zero: no checkpoint yet
}

// validate checks s and fills its stream and settings defaults.
func (s *Source) validate() error {
	if !ValidName(s.Name) {
		return errorf(ErrInvalid, "name %q: %s", s.Name, NameRule)
	}
	if s.Kind == "" {
		return errorf(ErrInvalid, "kind: required")
	}
	if s.Stream == "" {
		s.Stream = s.Name
	}
	if s.Stream != s.Name {
		return errorf(ErrInvalid, "stream %q: a source's stream has its name, %q", s.Stream, s.Name)
	}
	if len(bytes.TrimSpace(s.Settings)) == 0 {
		s.Settings = json.RawMessage(`{}`)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(s.Settings, &obj); err != nil || obj == nil {
		return errorf(ErrInvalid, "settings: want a JSON object")
	}
	var compact bytes.Buffer
	json.Compact(&compact, s.Settings)
	s.Settings = compact.Bytes()
	return nil
}

// CreateSource stores s and creates its stream. It reports created=false,
// with the stored source, when one of that name exists with the same kind
// and settings, and ErrConflict when they differ.
func (d *Delivery) CreateSource(ctx context.Context, s Source) (_ Source, created bool, _ error) {
	if err := s.validate(); err != nil {
		return s, false, err
	}
	if old, err := d.Source(ctx, s.Name); err == nil {
		if old.Kind != s.Kind || !bytes.Equal(old.Settings, s.Settings) {
			return old, false, errorf(ErrConflict, "source %q exists with another kind or settings", s.Name)
		}
		return old, false, nil
	} else if !errors.Is(err, ErrNotFound) {
		return s, false, err
	}
	// The stream first: a source is never without one.
	if _, err := d.streams.EnsureStream(ctx, s.Stream); err != nil {
		return s, false, fmt.Errorf("create source %s: stream: %w", s.Name, err)
	}
	s.CreatedAt = d.now().UTC().Truncate(time.Microsecond)
	var inserted int64
	err := d.update(ctx, func(tx conn) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO sources (source_id, kind, stream_id, settings_json, created_at)
			VALUES (?, ?, ?, ?, ?) ON CONFLICT (source_id) DO NOTHING`,
			s.Name, s.Kind, s.Stream, string(s.Settings), s.CreatedAt.Format(sqlitedb.Time))
		if err != nil {
			return err
		}
		inserted, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return s, false, fmt.Errorf("create source %s: %w", s.Name, err)
	}
	if inserted == 0 { // created meanwhile by another request or process
		return d.CreateSource(ctx, s)
	}
	d.log.Info("delivery: source created", "source", s.Name, "kind", s.Kind)
	return s, true, nil
}

const sourceSelect = `SELECT s.source_id, s.kind, s.stream_id, s.settings_json, s.created_at,
	c.next_cursor, c.last_event_at, c.last_error, c.last_poll_at, c.updated_at
	FROM sources s LEFT JOIN source_checkpoints c ON c.source_id = s.source_id`

// Sources returns every source by name.
func (d *Delivery) Sources(ctx context.Context) ([]Source, error) {
	rows, err := d.db.QueryContext(ctx, sourceSelect+` ORDER BY s.source_id`)
	if err != nil {
		return nil, fmt.Errorf("read sources: %w", err)
	}
	return scanSources(rows)
}

// Source returns the source name, or ErrNotFound.
func (d *Delivery) Source(ctx context.Context, name string) (Source, error) {
	rows, err := d.db.QueryContext(ctx, sourceSelect+` WHERE s.source_id = ?`, name)
	if err != nil {
		return Source{}, fmt.Errorf("read source %s: %w", name, err)
	}
	srcs, err := scanSources(rows)
	if err != nil {
		return Source{}, err
	}
	if len(srcs) == 0 {
		return Source{}, errorf(ErrNotFound, "source %q: no such source", name)
	}
	return srcs[0], nil
}

func scanSources(rows *sql.Rows) ([]Source, error) {
	defer rows.Close()
	var out []Source
	for rows.Next() {
		var s Source
		var settings, created string
		var cursor, eventAt, lastErr, pollAt, updated sql.NullString
		if err := rows.Scan(&s.Name, &s.Kind, &s.Stream, &settings, &created, &cursor, &eventAt, &lastErr, &pollAt, &updated); err != nil {
			return nil, fmt.Errorf("read sources: %w", err)
		}
		s.Settings = json.RawMessage(settings)
		s.CreatedAt, _ = sqlitedb.ParseTime(created)
		c := &s.Checkpoint
		c.Cursor, c.LastError = cursor.String, lastErr.String
		for _, t := range []struct {
			v  sql.NullString
			to *time.Time
		}{{eventAt, &c.LastEventAt}, {pollAt, &c.LastPollAt}, {updated, &c.UpdatedAt}} {
			if t.v.Valid {
				*t.to, _ = sqlitedb.ParseTime(t.v.String)
			}
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// DeleteSource deletes the source name and its checkpoint; its stream and
// the events it holds stay (retention deletes them). A source that
// subscriptions read is not deleted: ErrConflict names them.
func (d *Delivery) DeleteSource(ctx context.Context, name string) error {
	found := false
	err := d.update(ctx, func(tx conn) error {
		rows, err := tx.QueryContext(ctx, `SELECT subscription_id FROM subscriptions WHERE source_id = ? ORDER BY subscription_id`, name)
		if err != nil {
			return err
		}
		var subs []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				rows.Close()
				return err
			}
			subs = append(subs, s)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(subs) > 0 {
			return errorf(ErrConflict, "source %q is read by the subscriptions %s: delete them first", name, strings.Join(subs, ", "))
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM sources WHERE source_id = ?`, name)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		found = n > 0
		if err != nil || !found {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM source_checkpoints WHERE source_id = ?`, name)
		return err
	})
	if _, ok := errors.AsType[*Error](err); ok {
		return err
	}
	if err != nil {
		return fmt.Errorf("delete source %s: %w", name, err)
	}
	if !found {
		return errorf(ErrNotFound, "source %q: no such source", name)
	}
	d.log.Info("delivery: source deleted", "source", name)
	return nil
}

// CheckpointWriter returns a function that records cp as the checkpoint of
// the source name in a transaction of the store (tx), with UpdatedAt set
// to now: the source runners pass it to the writer so that it commits
// with the events it read (streamsqlite's AppendAsyncWith), or run it
// with SaveCheckpoint. It writes nothing, and returns an ErrNotFound
// error, when the source name created at created no longer exists: a
// runner of a deleted source, or of one deleted and created again, does
// not leave its checkpoint behind.
func (d *Delivery) CheckpointWriter(ctx context.Context, name string, created time.Time, cp Checkpoint) func(tx *sql.Tx) error {
	text := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t.UTC().Format(sqlitedb.Time)
	}
	now := d.now().UTC().Format(sqlitedb.Time)
	return func(tx *sql.Tx) error {
		c := conn{c: tx, pg: d.pg}
		res, err := c.ExecContext(ctx, `INSERT INTO source_checkpoints (source_id, next_cursor, last_event_at, last_error, last_poll_at, updated_at)
			SELECT CAST(?1 AS TEXT), CAST(?2 AS TEXT), CAST(?3 AS TEXT), CAST(?4 AS TEXT), CAST(?5 AS TEXT), CAST(?6 AS TEXT)
			WHERE EXISTS (SELECT 1 FROM sources WHERE source_id = ?1 AND created_at = ?7)
			ON CONFLICT (source_id) DO UPDATE SET next_cursor = excluded.next_cursor, last_event_at = excluded.last_event_at,
				last_error = excluded.last_error, last_poll_at = excluded.last_poll_at, updated_at = excluded.updated_at`,
			name, cp.Cursor, text(cp.LastEventAt), cp.LastError, text(cp.LastPollAt), now, created.UTC().Format(sqlitedb.Time))
		if err != nil {
			return fmt.Errorf("save checkpoint of %s: %w", name, err)
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return errorf(ErrNotFound, "source %q: no such source (deleted while it ran)", name)
		}
		return nil
	}
}

// SaveCheckpoint records cp as the checkpoint of the source name created
// at created, in a transaction of its own (see CheckpointWriter).
func (d *Delivery) SaveCheckpoint(ctx context.Context, name string, created time.Time, cp Checkpoint) error {
	return d.store.Update(ctx, d.CheckpointWriter(ctx, name, created, cp))
}

// Leads reports whether this process runs the work one process of a
// shared store runs (retention, the sources that read upstream): the
// leader of a shared store, or the only process.
func (d *Delivery) Leads() bool { return d.leads() }

// Once runs fn unless the store records that marker was done, and then
// records it: what fn creates is created once in the store's life, and
// what an operator deletes afterwards stays deleted. fn must be safe to
// run again (a crash before the record runs it at the next start), and
// to run in two processes at once on a shared store.
func (d *Delivery) Once(ctx context.Context, marker string, fn func(ctx context.Context) error) error {
	if done, err := d.Marked(ctx, marker); err != nil || done {
		return err
	}
	if err := fn(ctx); err != nil {
		return err
	}
	return d.update(ctx, func(tx conn) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO store_markers (marker, created_at) VALUES (?, ?) ON CONFLICT (marker) DO NOTHING`,
			marker, d.now().UTC().Format(sqlitedb.Time))
		return err
	})
}

// Marked reports whether the store records marker (see Once).
func (d *Delivery) Marked(ctx context.Context, marker string) (bool, error) {
	var n int
	if err := d.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM store_markers WHERE marker = ?`, marker).Scan(&n); err != nil {
		return false, fmt.Errorf("read marker %s: %w", marker, err)
	}
	return n > 0, nil
}
