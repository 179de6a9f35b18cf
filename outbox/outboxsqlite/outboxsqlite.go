// Package outboxsqlite is the edge agent's outbox: a SQLite file (WAL,
// synchronous=FULL) of events not yet acknowledged by the control plane.
//
// A row keeps the event's fields, not its envelope: Due hands out the
// payload as Message.Body and the envelope's other fields (ts, session_id,
// device_id, seq) as the Message's, like every outbox.Store, and only a
// publisher to a postbox server builds the envelope again. An outbox file
// written by an older postbox, whose rows held whole envelopes, is
// converted when it is opened (migration 0002).
//
// Inserts are group-committed: concurrent Insert calls share one
// transaction and one fsync, and each returns only after its commit. A row
// is deleted only when its ACK arrives; a row the receiver refused for
// good is kept with state "rejected" and the reason, until Requeue.
//
// On a full disk the write-ahead log must not keep the space it took: a
// write that fails for space (SQLITE_FULL, an I/O error) is followed by a
// checkpoint that truncates the log (PRAGMA wal_checkpoint(TRUNCATE)), and
// Run truncates it too whenever nothing was written for CheckpointInterval.
package outboxsqlite

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/outbox"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Row states.
const (
	StatePending  = outbox.StatePending
	StateRejected = outbox.StateRejected
)

// ErrConflict is returned by Insert for an event id already in the outbox
// with a different payload.
var ErrConflict = errors.New("outbox: event_id already queued with a different payload")

// Config configures a Store.
type Config struct {
	Synchronous string // FULL (default) or NORMAL
	// QueueSize bounds inserts waiting for their group commit.
	QueueSize int
	Now       func() time.Time
	// CheckpointInterval is how often Run truncates the write-ahead log
	// when nothing was written since the last time. Defaults to 1m.
	CheckpointInterval time.Duration
}

// DefaultCheckpointInterval is Config.CheckpointInterval's default.
const DefaultCheckpointInterval = time.Minute

// Store is an edge outbox in one SQLite file.
type Store struct {
	db     *sql.DB
	stmts  map[string]*sql.Stmt // prepared at Open: the pool's one connection is busy inside a transaction
	writer *groupcommit.Writer[*insert]
	now    func() time.Time
	notify chan struct{}
	every  time.Duration
	writes atomic.Int64 // writes tried; Run truncates the log when it stood still
}

var (
	_ outbox.Store    = (*Store)(nil)
	_ outbox.Notifier = (*Store)(nil)
	_ outbox.Admin    = (*Store)(nil)
)

type insert struct {
	env       postbox.Envelope
	payload   []byte // env.Payload, compacted
	duplicate bool
	err       error
}

// Migrate creates or upgrades the outbox table in db. A service that writes
// its events with Insert calls it once on its own database; a relay then
// sends them from a Store opened on the same file.
func Migrate(ctx context.Context, db *sql.DB) error {
	sub, _ := fs.Sub(migrations, "migrations")
	return sqlitedb.Migrate(ctx, db, "outbox", sub)
}

// Insert writes events to the outbox inside the caller's transaction tx,
// so they are committed with the business write or not at all. An event
// must fit in a postbox envelope (outbox.Message.Envelope), so that any
// relay can send it; it is due with CreatedAt the time of the insert. An
// event whose id is queued already is not written and makes Insert
// return an error wrapping outbox.ErrDuplicate; tx stays usable. A relay
// on another connection sees the rows within its poll interval.
func Insert(ctx context.Context, tx *sql.Tx, events ...outbox.Event) error {
	now := time.Now().UTC()
	ts := now.Format(sqlitedb.Time)
	for i := range events {
		e := &events[i]
		if err := e.PrepareContext(ctx); err != nil {
			return err
		}
		m := outbox.Message{EventID: e.ID, Type: e.Type, Body: e.Payload, CorrelationID: e.CorrelationID, TenantID: e.TenantID, CreatedAt: now,
			TraceParent: e.TraceParent, TraceState: e.TraceState}
		env := m.Envelope()
		if err := env.Validate(postbox.Limits{}); err != nil {
			return fmt.Errorf("%w: %s: %v", outbox.ErrInvalidEvent, e.ID, err)
		}
		r, err := tx.ExecContext(ctx, qInsert, e.ID, e.Type, string(postbox.AppendCompact(nil, e.Payload)), ts, ts,
			env.TS, e.CorrelationID, e.TenantID, nil, e.TraceParent, e.TraceState)
		if err != nil {
			return fmt.Errorf("outbox insert %s: %w", e.ID, err)
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return fmt.Errorf("%w: %s", outbox.ErrDuplicate, e.ID)
		}
	}
	return nil
}

// Open opens (creating and migrating) the outbox at path. Call Run for
// inserts to be written, and Close when done.
func Open(path string, cfg Config) (*Store, error) {
	db, err := sqlitedb.Open(path, sqlitedb.Options{Synchronous: cfg.Synchronous, MaxConns: 1})
	if err != nil {
		return nil, err
	}
	if err := Migrate(context.Background(), db); err != nil {
		db.Close()
		return nil, err
	}
	s := &Store{db: db, now: cfg.Now, notify: make(chan struct{}, 1), stmts: map[string]*sql.Stmt{}, every: cfg.CheckpointInterval}
	if s.every <= 0 {
		s.every = DefaultCheckpointInterval
	}
	for _, q := range []string{qInsert, qStored, qDelivered, qRejected, qRetry, qUnanswered} {
		st, err := db.Prepare(q)
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("outbox: prepare: %w", err)
		}
		s.stmts[q] = st
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.writer = groupcommit.New(s.flush, groupcommit.Config{QueueSize: cfg.QueueSize})
	return s, nil
}

// Run writes inserts until ctx ends, and truncates the write-ahead log
// every CheckpointInterval in which nothing was written.
func (s *Store) Run(ctx context.Context) error {
	idle := make(chan struct{})
	go func() {
		defer close(idle)
		tick := time.NewTicker(s.every)
		defer tick.Stop()
		last := s.writes.Load()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if n := s.writes.Load(); n != last {
				last = n
				continue
			}
			s.truncateWAL(ctx)
		}
	}()
	err := s.writer.Run(ctx)
	<-idle
	return err
}

// truncateWAL checkpoints the write-ahead log into the database and
// truncates it to nothing, giving its space back. A checkpoint that
// cannot finish (a reader holds old pages) leaves the log as it is.
func (s *Store) truncateWAL(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		return fmt.Errorf("outbox checkpoint: %w", err)
	}
	return nil
}

// failed is called with the error of a write: one that failed for space
// truncates the write-ahead log, so the space the log took is free for
// the next write (the deletes of delivered rows above all).
func (s *Store) failed(err error) {
	if err != nil && noSpace(err) {
		s.truncateWAL(context.Background())
	}
}

// noSpace reports whether err is SQLite failing for space: the disk
// (or the database's max_page_count) full, or an I/O error writing.
func noSpace(err error) bool {
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code() & 0xff {
	case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR:
		return true
	}
	return false
}

// Close closes the database. Run must have returned.
func (s *Store) Close() error { return s.db.Close() }

// Notify returns a channel that receives after inserted rows commit.
func (s *Store) Notify() <-chan struct{} { return s.notify }

// The statements of the insert and settle paths.
const (
	qInsert = `INSERT INTO outbox (event_id, event_type, payload_json, created_at, next_attempt_at,
			occurred_at, correlation_id, tenant_id, source_seq, traceparent, tracestate)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING`
	qStored     = `SELECT payload_json FROM outbox WHERE event_id = ?`
	qDelivered  = `DELETE FROM outbox WHERE event_id = ?`
	qRejected   = `UPDATE outbox SET state = 'rejected', rejected_at = ?, last_error = ?, attempt_count = attempt_count + 1 WHERE event_id = ?`
	qRetry      = `UPDATE outbox SET next_attempt_at = ?, last_error = ?, attempt_count = attempt_count + 1 WHERE event_id = ?`
	qUnanswered = `UPDATE outbox SET last_error = ? WHERE event_id = ?`
)

// samePayload reports whether the stored payload is payload, compared as
// compact JSON. Like the control plane, the outbox judges a redelivery by
// its payload alone: a producer that resends an event id without ts
// (filled in anew) sends the same event.
func samePayload(stored string, payload json.RawMessage) bool {
	return bytes.Equal(postbox.AppendCompact(nil, []byte(stored)), postbox.AppendCompact(nil, payload))
}

// Result is the outcome of inserting one envelope.
type Result struct {
	EventID   string
	Duplicate bool  // already queued with the same payload
	Err       error // ErrConflict, or nil
}

// Insert queues envelopes and returns after their commit. Envelopes must
// be valid. Each is stored as its fields: the payload (compacted), type,
// ts exactly as given, session_id, device_id, seq, traceparent and
// tracestate; schema_version is the one Validate accepts. An envelope
// whose event_id is queued already is a duplicate when its payload is the
// same and ErrConflict otherwise; either way the queued row is unchanged.
func (s *Store) Insert(ctx context.Context, envs []postbox.Envelope) ([]Result, error) {
	items := make([]*insert, len(envs))
	for i, env := range envs {
		if !json.Valid(env.Payload) {
			return nil, fmt.Errorf("outbox: insert %s: the payload is not valid JSON", env.EventID)
		}
		items[i] = &insert{env: env, payload: postbox.AppendCompact(nil, env.Payload)}
	}
	if err := s.writer.Do(ctx, items); err != nil {
		return nil, err
	}
	select {
	case s.notify <- struct{}{}:
	default:
	}
	out := make([]Result, len(items))
	for i, it := range items {
		out[i] = Result{EventID: it.env.EventID, Duplicate: it.duplicate, Err: it.err}
	}
	return out, nil
}

func (s *Store) flush(ctx context.Context, batch []*insert) (err error) {
	s.writes.Add(1)
	defer func() { s.failed(err) }()
	now := s.now().UTC().Format(sqlitedb.Time)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox insert: %w", err)
	}
	defer tx.Rollback()
	for _, it := range batch {
		e := &it.env
		var seq any
		if e.Seq != nil {
			seq = *e.Seq
		}
		r, err := tx.StmtContext(ctx, s.stmts[qInsert]).ExecContext(ctx, e.EventID, e.Type, string(it.payload), now, now,
			e.TS, e.SessionID, e.DeviceID, seq, e.TraceParent, e.TraceState)
		if err != nil {
			return fmt.Errorf("outbox insert %s: %w", it.env.EventID, err)
		}
		if n, _ := r.RowsAffected(); n == 1 {
			continue
		}
		var body string
		if err := tx.StmtContext(ctx, s.stmts[qStored]).QueryRowContext(ctx, it.env.EventID).Scan(&body); err != nil {
			return fmt.Errorf("outbox insert %s: %w", it.env.EventID, err)
		}
		if samePayload(body, it.payload) {
			it.duplicate = true
		} else {
			it.err = ErrConflict
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox insert: commit: %w", err)
	}
	return nil
}

// Due implements outbox.Store. A message's CreatedAt is the event's ts,
// with the offset its producer gave (or, were the stored ts not RFC 3339,
// the time the row was queued); CorrelationID its session_id, TenantID its
// device_id and SourceSeq its seq.
func (s *Store) Due(ctx context.Context, now time.Time, after int64, limit int) ([]outbox.Message, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT seq, event_id, event_type, payload_json, occurred_at, created_at, correlation_id, tenant_id, source_seq, attempt_count,
			traceparent, tracestate
		FROM outbox WHERE state = 'pending' AND seq > ? AND next_attempt_at <= ? ORDER BY seq LIMIT ?`,
		after, now.UTC().Format(sqlitedb.Time), limit)
	if err != nil {
		return nil, fmt.Errorf("outbox due: %w", err)
	}
	defer rows.Close()
	var out []outbox.Message
	for rows.Next() {
		var m outbox.Message
		var body, occurred, created string
		var seq sql.NullInt64
		if err := rows.Scan(&m.Seq, &m.EventID, &m.Type, &body, &occurred, &created, &m.CorrelationID, &m.TenantID, &seq, &m.Attempts,
			&m.TraceParent, &m.TraceState); err != nil {
			return nil, fmt.Errorf("outbox due: %w", err)
		}
		m.Body = []byte(body)
		var err error
		if m.CreatedAt, err = time.Parse(time.RFC3339Nano, occurred); err != nil {
			m.CreatedAt, _ = time.Parse(sqlitedb.Time, created)
		}
		if seq.Valid {
			m.SourceSeq = &seq.Int64
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// Settle implements outbox.Store: delivered rows are deleted, rejected
// ones kept with their reason.
func (s *Store) Settle(ctx context.Context, outcomes []outbox.Outcome) (err error) {
	s.writes.Add(1)
	defer func() { s.failed(err) }()
	now := s.now().UTC().Format(sqlitedb.Time)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox settle: %w", err)
	}
	defer tx.Rollback()
	for _, o := range outcomes {
		var err error
		switch o.Kind {
		case outbox.Delivered:
			_, err = tx.StmtContext(ctx, s.stmts[qDelivered]).ExecContext(ctx, o.EventID)
		case outbox.Rejected:
			_, err = tx.StmtContext(ctx, s.stmts[qRejected]).ExecContext(ctx, now, o.Error, o.EventID)
		case outbox.Retry:
			_, err = tx.StmtContext(ctx, s.stmts[qRetry]).ExecContext(ctx, o.RetryAt.UTC().Format(sqlitedb.Time), o.Error, o.EventID)
		case outbox.Unanswered:
			_, err = tx.StmtContext(ctx, s.stmts[qUnanswered]).ExecContext(ctx, o.Error, o.EventID)
		}
		if err != nil {
			return fmt.Errorf("outbox settle %s: %w", o.EventID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox settle: commit: %w", err)
	}
	return nil
}

// Row is an outbox row as operators see it.
type Row = outbox.Row

// List returns up to limit rows in state ("" for all), oldest first.
func (s *Store) List(ctx context.Context, state string, limit int) ([]Row, error) {
	q := `SELECT event_id, event_type, state, created_at, next_attempt_at, attempt_count, coalesce(last_error, ''), payload_json, correlation_id, tenant_id FROM outbox`
	args := []any{}
	if state != "" {
		q += ` WHERE state = ?`
		args = append(args, state)
	}
	q += ` ORDER BY seq LIMIT ?`
	args = append(args, limit)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox list: %w", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		var created, next, payload string
		if err := rows.Scan(&r.EventID, &r.Type, &r.State, &created, &next, &r.Attempts, &r.LastError, &payload, &r.CorrelationID, &r.TenantID); err != nil {
			return nil, fmt.Errorf("outbox list: %w", err)
		}
		r.Payload = json.RawMessage(payload)
		r.CreatedAt, _ = time.Parse(sqlitedb.Time, created)
		r.NextAttemptAt, _ = time.Parse(sqlitedb.Time, next)
		out = append(out, r)
	}
	return out, rows.Err()
}

// Counts returns how many rows are in each state.
func (s *Store) Counts(ctx context.Context) (pending, rejected int64, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'rejected') FROM outbox`).
		Scan(&pending, &rejected)
	return
}

// OldestPending returns when the oldest pending row was queued; ok is
// false when nothing is pending.
func (s *Store) OldestPending(ctx context.Context) (t time.Time, ok bool, err error) {
	var created sql.NullString
	if err := s.db.QueryRowContext(ctx, `SELECT min(created_at) FROM outbox WHERE state = 'pending'`).Scan(&created); err != nil {
		return time.Time{}, false, fmt.Errorf("outbox oldest pending: %w", err)
	}
	if !created.Valid {
		return time.Time{}, false, nil
	}
	t, err = time.Parse(sqlitedb.Time, created.String)
	return t, err == nil, err
}

// Requeue makes rejected rows pending and due now, with their attempts
// counted from zero again (a row parked after RelayConfig.MaxAttempts
// gets as many tries again; its last error stays until the next send);
// with no ids, every rejected row. It returns how many rows it requeued.
func (s *Store) Requeue(ctx context.Context, ids []string) (int64, error) {
	now := s.now().UTC().Format(sqlitedb.Time)
	q := `UPDATE outbox SET state = 'pending', next_attempt_at = ?, rejected_at = NULL, attempt_count = 0 WHERE state = 'rejected'`
	args := []any{now}
	if len(ids) > 0 {
		q += ` AND event_id IN (?` + strings.Repeat(",?", len(ids)-1) + `)`
		for _, id := range ids {
			args = append(args, id)
		}
	}
	r, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("outbox requeue: %w", err)
	}
	n, _ := r.RowsAffected()
	if n > 0 {
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
	return n, nil
}
