package intake

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"time"

	"github.com/postbox-events/postbox/internal/names"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

// The migrations of the store: SQLite's, and PostgreSQL's.
//
//go:embed migrations/*.sql pgmigrations/*.sql
var migrations embed.FS

// Migrations returns the migrations of intake's tables: PostgreSQL's
// with postgres, else SQLite's.
func Migrations(postgres bool) fs.FS {
	dir := "migrations"
	if postgres {
		dir = "pgmigrations"
	}
	sub, err := fs.Sub(migrations, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

// Component is the name intake's migrations are recorded under.
const Component = "intake"

// Errors the API maps to statuses.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("exists with another definition")
	ErrInvalid  = errors.New("invalid")
)

// kindError is an error of one of the kinds above, with a message for
// people.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

func errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

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
// a REST API polled for pages, or another postbox's feed. One source has
// one stream, of its name.
type Source struct {
	Name   string
	Kind   string // KindDevice, KindWebhook, ...
	Stream string // the stream its events are stored in: Name
	// Settings are the kind's settings as a JSON object ({} for none),
	// stored as given.
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
	if !names.Valid(s.Name) {
		return errorf(ErrInvalid, "name %q: %s", s.Name, names.Rule)
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

// DB is the SQL database intake keeps its tables in: the one delivery
// keeps its state in (a delivery.Store is one), SQLite unless
// StoreConfig.PostgreSQL says otherwise.
type DB interface {
	// Update runs fn in a write transaction; fn's error undoes its writes.
	// A store may run fn again when its transaction must be retried.
	Update(ctx context.Context, fn func(tx *sql.Tx) error) error
	// Migrate applies a component's migrations to the database.
	Migrate(ctx context.Context, component string, fsys fs.FS) error
	// ReadDB returns read-only connections to the database.
	ReadDB() *sql.DB
}

// Streams creates a source's stream (a stream.Backend does).
type Streams interface {
	EnsureStream(ctx context.Context, sourceID string) (stream.Stream, error)
}

// Readers returns, in the transaction tx of the store, the names of the
// subscriptions that read the stream of source: a source they read is not
// deleted. Delivery's (*Delivery).ReadersOf is one.
type Readers func(ctx context.Context, tx *sql.Tx, source string) ([]string, error)

// StoreConfig configures a Store.
type StoreConfig struct {
	// PostgreSQL says the DB speaks PostgreSQL (a shared store); its
	// queries, written for SQLite, are rewritten for it.
	PostgreSQL bool
	// Readers refuses to delete a source that subscriptions read. Nil:
	// none do.
	Readers Readers
	// Logger defaults to one that discards.
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// Store keeps sources, their checkpoints and the webhook digests in a DB.
type Store struct {
	db      DB
	read    sqlitedb.Conn // the store's read-only connections
	stmts   *sqlitedb.StmtCache
	streams Streams
	pg      bool
	readers Readers
	log     *slog.Logger
	now     func() time.Time
}

// Open applies intake's migrations to db and returns its Store. Sources
// are created with their stream in streams.
func Open(ctx context.Context, db DB, streams Streams, cfg StoreConfig) (*Store, error) {
	if err := db.Migrate(ctx, Component, Migrations(cfg.PostgreSQL)); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	var stmts *sqlitedb.StmtCache
	if !cfg.PostgreSQL {
		stmts = sqlitedb.NewStmtCache(db)
	}
	return &Store{db: db, read: sqlitedb.Conn{Tx: db.ReadDB(), PostgreSQL: cfg.PostgreSQL}, stmts: stmts, streams: streams, pg: cfg.PostgreSQL, readers: cfg.Readers, log: cfg.Logger, now: cfg.Now}, nil
}

// q returns query, written with SQLite's parameters, in the DB's dialect.
// conn runs queries on tx, a write transaction of the store (see
// sqlitedb.Conn).
func (s *Store) conn(tx *sql.Tx) sqlitedb.Conn {
	return sqlitedb.Conn{Tx: tx, PostgreSQL: s.pg, Stmts: s.stmts}
}

// CreateSource stores src and creates its stream. It reports
// created=false, with the stored source, when one of that name exists
// with the same kind and settings, and ErrConflict when they differ.
func (s *Store) CreateSource(ctx context.Context, src Source) (_ Source, created bool, _ error) {
	if err := src.validate(); err != nil {
		return src, false, err
	}
	if old, err := s.Source(ctx, src.Name); err == nil {
		if old.Kind != src.Kind || !bytes.Equal(old.Settings, src.Settings) {
			return old, false, errorf(ErrConflict, "source %q exists with another kind or settings", src.Name)
		}
		return old, false, nil
	} else if !errors.Is(err, ErrNotFound) {
		return src, false, err
	}
	// The stream first: a source is never without one.
	if _, err := s.streams.EnsureStream(ctx, src.Stream); err != nil {
		return src, false, fmt.Errorf("create source %s: stream: %w", src.Name, err)
	}
	src.CreatedAt = s.now().UTC().Truncate(time.Microsecond)
	var inserted int64
	err := s.db.Update(ctx, func(tx *sql.Tx) error {
		c := s.conn(tx)
		res, err := c.ExecContext(ctx, `INSERT INTO sources (source_id, kind, stream_id, settings_json, created_at)
			VALUES (?, ?, ?, ?, ?) ON CONFLICT (source_id) DO NOTHING`,
			src.Name, src.Kind, src.Stream, string(src.Settings), src.CreatedAt.Format(sqlitedb.Time))
		if err != nil {
			return err
		}
		inserted, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return src, false, fmt.Errorf("create source %s: %w", src.Name, err)
	}
	if inserted == 0 { // created meanwhile by another request or process
		return s.CreateSource(ctx, src)
	}
	s.log.Info("intake: source created", "source", src.Name, "kind", src.Kind)
	return src, true, nil
}

const sourceSelect = `SELECT s.source_id, s.kind, s.stream_id, s.settings_json, s.created_at,
	c.next_cursor, c.last_event_at, c.last_error, c.last_poll_at, c.updated_at
	FROM sources s LEFT JOIN source_checkpoints c ON c.source_id = s.source_id`

// Sources returns every source by name.
func (s *Store) Sources(ctx context.Context) ([]Source, error) {
	rows, err := s.read.QueryContext(ctx, sourceSelect+` ORDER BY s.source_id`)
	if err != nil {
		return nil, fmt.Errorf("read sources: %w", err)
	}
	return scanSources(rows)
}

// Source returns the source name, or ErrNotFound.
func (s *Store) Source(ctx context.Context, name string) (Source, error) {
	rows, err := s.read.QueryContext(ctx, sourceSelect+` WHERE s.source_id = ?`, name)
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
// subscriptions read (StoreConfig.Readers) is not deleted: ErrConflict names
// them. The check and the delete are one transaction.
func (s *Store) DeleteSource(ctx context.Context, name string) error {
	found := false
	err := s.db.Update(ctx, func(tx *sql.Tx) error {
		c := s.conn(tx)
		if s.readers != nil {
			subs, err := s.readers(ctx, tx, name)
			if err != nil {
				return err
			}
			if len(subs) > 0 {
				return errorf(ErrConflict, "source %q is read by the subscriptions %s: delete them first", name, strings.Join(subs, ", "))
			}
		}
		res, err := c.ExecContext(ctx, `DELETE FROM sources WHERE source_id = ?`, name)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		found = n > 0
		if err != nil || !found {
			return err
		}
		_, err = c.ExecContext(ctx, `DELETE FROM source_checkpoints WHERE source_id = ?`, name)
		return err
	})
	if _, ok := errors.AsType[*kindError](err); ok {
		return err
	}
	if err != nil {
		return fmt.Errorf("delete source %s: %w", name, err)
	}
	if !found {
		return errorf(ErrNotFound, "source %q: no such source", name)
	}
	s.log.Info("intake: source deleted", "source", name)
	return nil
}

// CheckpointWriter returns a function that records cp as the checkpoint of
// the source name in a transaction of the store (tx), with UpdatedAt set
// to now: the runner passes it to the writer so that it commits with the
// events it read (streamsqlite's AppendAsyncWith), or runs it with
// SaveCheckpoint. It writes nothing, and returns an ErrNotFound error,
// when the source name created at created no longer exists: a runner of
// a deleted source, or of one deleted and created again, does not leave
// its checkpoint behind.
func (s *Store) CheckpointWriter(ctx context.Context, name string, created time.Time, cp Checkpoint) func(tx *sql.Tx) error {
	text := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t.UTC().Format(sqlitedb.Time)
	}
	now := s.now().UTC().Format(sqlitedb.Time)
	// On PostgreSQL the source's row is locked (FOR SHARE) until the
	// checkpoint commits: a DeleteSource at once waits for it, and then
	// deletes the checkpoint too; one that committed first leaves no row
	// to find. (SQLite has one writer.)
	lock := ``
	if s.pg {
		lock = ` FOR SHARE`
	}
	return func(tx *sql.Tx) error {
		c := sqlitedb.Conn{Tx: tx, PostgreSQL: s.pg}
		res, err := c.ExecContext(ctx, `INSERT INTO source_checkpoints (source_id, next_cursor, last_event_at, last_error, last_poll_at, updated_at)
			SELECT CAST(?1 AS TEXT), CAST(?2 AS TEXT), CAST(?3 AS TEXT), CAST(?4 AS TEXT), CAST(?5 AS TEXT), CAST(?6 AS TEXT)
			WHERE EXISTS (SELECT 1 FROM sources WHERE source_id = ?1 AND created_at = ?7`+lock+`)
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
func (s *Store) SaveCheckpoint(ctx context.Context, name string, created time.Time, cp Checkpoint) error {
	return s.db.Update(ctx, s.CheckpointWriter(ctx, name, created, cp))
}

// ClaimDigest records that the webhook of source stored under key has a
// body of digest, for window: until then, a webhook of that body under
// another key is a replay. It returns the key that holds the digest: key
// when it was free, had expired or was key's already, else the other key,
// whose claim is left as it was. Claims are atomic in the store, so two
// processes of a shared store claiming one digest at once see one owner.
// Each claim deletes a few expired ones.
func (s *Store) ClaimDigest(ctx context.Context, source, digest, key string, window time.Duration) (owner string, err error) {
	now := s.now().UTC()
	err = s.db.Update(ctx, func(tx *sql.Tx) error {
		c := s.conn(tx)
		at := now.Format(sqlitedb.Time)
		if _, err := c.ExecContext(ctx, `INSERT INTO webhook_digests (source_id, digest, native_id, expires_at) VALUES (?1, ?2, ?3, ?4)
			ON CONFLICT (source_id, digest) DO UPDATE SET native_id = excluded.native_id, expires_at = excluded.expires_at
			WHERE webhook_digests.expires_at <= ?5`, source, digest, key, now.Add(window).Format(sqlitedb.Time), at); err != nil {
			return err
		}
		if err := c.QueryRowContext(ctx, `SELECT native_id FROM webhook_digests WHERE source_id = ? AND digest = ?`, source, digest).Scan(&owner); err != nil {
			return err
		}
		_, err := c.ExecContext(ctx, `DELETE FROM webhook_digests WHERE (source_id, digest) IN
			(SELECT source_id, digest FROM webhook_digests WHERE expires_at <= ? LIMIT 16)`, at)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("webhook digest of %s: %w", source, err)
	}
	return owner, nil
}
