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
// Writes are group-committed: concurrent Insert and Settle calls share one
// transaction and one fsync, and each returns only after its commit is on
// the disk. With synchronous FULL (the default) the writer's connection
// commits as NORMAL does and the group commit syncs the write-ahead log
// itself before it answers (as the server's stream store does), so the
// next batch is written while the disk syncs the last. Inserts go four
// rows to a statement; delivered rows are deleted by runs of consecutive
// seqs (most often one statement for a whole publish), or, for outcomes
// without a seq, by id up to 64 to a statement. The relay's reads (Due)
// take the rows this Store just inserted from memory, and the rest, like
// the counts, from a read-only connection that does not wait for the
// writer. A row is deleted only when its ACK arrives; a row the receiver
// refused for good is kept with state "rejected" and the reason, until
// Requeue.
//
// On a full disk the write-ahead log must not keep the space it took: a
// write that fails for space (SQLITE_FULL, an I/O error) is followed by a
// checkpoint that truncates the log (PRAGMA wal_checkpoint(TRUNCATE)), and
// Run truncates it too whenever nothing was written for
// Config.CheckpointInterval. With Config.Checkpoint "litestream" the
// Store checkpoints nothing, neither of those nor SQLite's automatic
// ones, and leaves the log to Litestream, which replicates the file.
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
	"slices"
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

// Migrations holds the SQL files that create and upgrade the outbox table
// (component "outbox" in schema_migrations), in the order they apply;
// Migrate and Open apply them.
var Migrations, _ = fs.Sub(migrations, "migrations") // a fixed, valid name: no error

// Row states.
const (
	StatePending  = outbox.StatePending
	StateRejected = outbox.StateRejected
)

// ErrConflict is returned by Insert for an event id already in the outbox
// with a different type or payload.
var ErrConflict = errors.New("outbox: event_id already queued with a different type or payload")

// ErrRejected is returned by Insert for an event already in the outbox,
// the same, that the receiver refused: it is not sent again unless
// requeued (Requeue, postbox outbox requeue).
var ErrRejected = errors.New("outbox: event_id already in the outbox, refused by the server")

// RejectedError is ErrRejected with the receiver's reason.
type RejectedError struct{ Reason string }

func (e *RejectedError) Error() string { return ErrRejected.Error() + ": " + e.Reason }
func (e *RejectedError) Unwrap() error { return ErrRejected }

// Exists reports whether the SQLite file at path holds an outbox. It
// reads the file without writing to it (no pragma, no migration), so a
// wrong path is never made an outbox; a file that is not a SQLite
// database is an error.
func Exists(path string) (bool, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		return false, err
	}
	defer db.Close()
	var n int
	err = db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'outbox'`).Scan(&n)
	return n > 0, err
}

// Config configures a Store.
type Config struct {
	Synchronous string // FULL (default) or NORMAL
	// QueueSize bounds inserts waiting for their group commit.
	QueueSize int
	Now       func() time.Time
	// CheckpointInterval is how often Run truncates the write-ahead log
	// when nothing was written since the last time. Defaults to 1m.
	CheckpointInterval time.Duration
	// Checkpoint says who checkpoints the write-ahead log: "auto" (the
	// default: the Store, as above) or "litestream" (never the Store:
	// Litestream, which replicates the file and checkpoints the log once
	// it has shipped it; a truncating checkpoint of the Store's would
	// wait on Litestream's read transaction, holding the writer). See
	// sqlitedb.CheckpointAuto and sqlitedb.CheckpointLitestream.
	Checkpoint string
}

// DefaultCheckpointInterval is Config.CheckpointInterval's default.
const DefaultCheckpointInterval = time.Minute

// Store is an edge outbox in one SQLite file.
type Store struct {
	db      *sql.DB // the writer's one connection
	read    *sql.DB // read-only connections: Due, Counts, List, OldestPending
	wal     *sqlitedb.WALSyncer
	stmts   map[string]*sql.Stmt          // prepared at Open: the pool's one connection is busy inside a transaction
	inserts [2][insertChunk + 1]*sql.Stmt // [traced][rows]: without the trace columns when no row has them
	deletes map[int]*sql.Stmt             // DELETE … WHERE event_id IN (n ids), for each n of deleteSizes
	due     *sql.Stmt
	writer  *groupcommit.Writer[*write]
	running atomic.Bool // Run started the writer: settles go through it
	recent  recent      // rows just inserted, for Due
	now     func() time.Time
	notify  chan struct{}
	every   time.Duration
	// external: Config.Checkpoint is litestream, the Store checkpoints nothing
	external bool
	writes   atomic.Int64 // writes tried; Run truncates the log when it stood still
}

// insertChunk is how many rows one INSERT writes, as the server's stream
// store does: fewer statements to step through for the same rows.
const insertChunk = 4

// deleteSizes are the id counts of the prepared deletes of delivered rows,
// largest first: a settle of n delivered rows takes them greedily.
var deleteSizes = []int{64, 16, 4, 1}

var (
	_ outbox.Store    = (*Store)(nil)
	_ outbox.Notifier = (*Store)(nil)
	_ outbox.Admin    = (*Store)(nil)
	_ outbox.RowAdmin = (*Store)(nil)
)

// write is one item of the group commit: an envelope to insert, or the
// outcomes of one Settle.
type write struct {
	// An insert: the envelope, its row's INSERT arguments (boxed by the
	// caller's goroutine, so that the writer only binds and executes) and
	// what the insert found.
	env       postbox.Envelope
	payload   []byte // env.Payload, compacted
	args      [insertArgs]any
	traced    bool // the envelope has a traceparent or a tracestate
	duplicate bool
	err       error

	// The row as Due hands it out (for recent), when next_attempt_at
	// is, and, once inserted, its seq.
	msg  outbox.Message
	next time.Time
	seq  int64

	settle []outbox.Outcome // a Settle's outcomes, written in the same transaction
}

// insertArgs is the number of arguments of one row of qInsert; the
// last two are the trace columns, which a row without them leaves to
// their default, the empty string.
const insertArgs = 11

// untracedArgs is the number of arguments of a row without the trace
// columns: two strings fewer to bind, each copied by the driver into
// memory of its own.
const untracedArgs = insertArgs - 2

// Migrate creates or upgrades the outbox table in db. A service that writes
// its events with Insert calls it once on its own database; a relay then
// sends them from a Store opened on the same file.
func Migrate(ctx context.Context, db *sql.DB) error {
	return sqlitedb.Migrate(ctx, db, "outbox", Migrations)
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
	if err := sqlitedb.CheckCheckpointMode(cfg.Checkpoint); err != nil {
		return nil, fmt.Errorf("open outbox %s: %w", path, err)
	}
	// With FULL it commits as NORMAL, and the group commit syncs the log
	// before it answers: durable as FULL. The writer checkpoints once the
	// log reaches 16 MiB, not SQLite's 4: rows live for moments, so a
	// longer log copies each page once for more of its versions, and the
	// agent path ran faster (BENCHMARKS.md).
	pages := checkpointPages
	external := cfg.Checkpoint == sqlitedb.CheckpointLitestream
	if external {
		pages = -1
	}
	db, wal, err := sqlitedb.OpenWriter(path, sqlitedb.Options{Synchronous: cfg.Synchronous, AutoCheckpoint: pages})
	if err != nil {
		return nil, err
	}
	err = Migrate(context.Background(), db)
	if err == nil {
		err = wal.Sync()
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	read, err := sqlitedb.Open(path, sqlitedb.Options{Synchronous: cfg.Synchronous, MaxConns: 2, ReadOnly: true})
	if err != nil {
		db.Close()
		return nil, err
	}
	s := &Store{db: db, read: read, wal: wal, now: cfg.Now, notify: make(chan struct{}, 1), stmts: map[string]*sql.Stmt{},
		deletes: map[int]*sql.Stmt{}, every: cfg.CheckpointInterval, external: external}
	if s.every <= 0 {
		s.every = DefaultCheckpointInterval
	}
	if err := s.prepare(); err != nil {
		s.Close()
		return nil, fmt.Errorf("outbox: prepare: %w", err)
	}
	if s.now == nil {
		s.now = time.Now
	}
	gc := groupcommit.Config{QueueSize: cfg.QueueSize, MaxBatch: maxBatch, Transient: sqlitedb.Transient}
	if wal != nil {
		gc.Sync = wal.Sync
	}
	s.writer = groupcommit.New(s.flush, gc)
	return s, nil
}

// prepare prepares the statements of the write path and of Due.
func (s *Store) prepare() error {
	for _, q := range []string{qStored, qRejected, qRetry, qUnanswered, qDeleteRun} {
		st, err := s.db.Prepare(q)
		if err != nil {
			return err
		}
		s.stmts[q] = st
	}
	for traced, cols := range []int{untracedArgs, insertArgs} {
		for n := 1; n <= insertChunk; n++ {
			st, err := s.db.Prepare(qInsertRows(n, cols))
			if err != nil {
				return err
			}
			s.inserts[traced][n] = st
		}
	}
	for _, n := range deleteSizes {
		st, err := s.db.Prepare(`DELETE FROM outbox WHERE event_id IN (?` + strings.Repeat(",?", n-1) + `)`)
		if err != nil {
			return err
		}
		s.deletes[n] = st
	}
	var err error
	s.due, err = s.read.Prepare(qDue)
	return err
}

// checkpointPages is the size of the write-ahead log, in pages of 4 KiB (16 MiB),
// from which the writer checkpoints it after a commit.
const checkpointPages = 4096

// maxBatch bounds the inserts and settles of one group commit: larger
// than the server's, because the intake hands over a whole request (up
// to 1,000 events from postbox send) at a time.
const maxBatch = 8192

// Run writes inserts and settles until ctx ends, and truncates the
// write-ahead log every Config.CheckpointInterval in which nothing was
// written.
func (s *Store) Run(ctx context.Context) error {
	s.running.Store(true)
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
	if s.external {
		return nil
	}
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
func (s *Store) Close() error {
	err := s.db.Close()
	if s.read != nil {
		s.read.Close()
	}
	s.wal.Close()
	return err
}

// Notify returns a channel that receives after inserted rows commit.
func (s *Store) Notify() <-chan struct{} { return s.notify }

// The statements of the insert and settle paths.
const (
	qStored = `SELECT event_type, payload_json, state, coalesce(last_error, '') FROM outbox WHERE event_id = ?`
	// qDue reads rows by seq, the rowid, not through the (state, seq)
	// index: that would cost a lookup in the table for every row.
	qDue = `SELECT seq, event_id, event_type, payload_json, occurred_at, created_at, correlation_id, tenant_id, source_seq, attempt_count,
			traceparent, tracestate
		FROM outbox NOT INDEXED WHERE state = 'pending' AND seq > ? AND next_attempt_at <= ? ORDER BY seq LIMIT ?`
	qRejected   = `UPDATE outbox SET state = 'rejected', rejected_at = ?, last_error = ?, attempt_count = attempt_count + 1 WHERE event_id = ? AND state = 'pending'`
	qRetry      = `UPDATE outbox SET next_attempt_at = ?, last_error = ?, attempt_count = attempt_count + 1 WHERE event_id = ? AND state = 'pending'`
	qUnanswered = `UPDATE outbox SET last_error = ? WHERE event_id = ? AND state = 'pending'`
	qDeleteRun  = `DELETE FROM outbox WHERE seq BETWEEN ? AND ?`
)

// insertColumns are the columns an insert writes, in the order of a
// write's args: the trace columns last.
var insertColumns = [insertArgs]string{"event_id", "event_type", "payload_json", "created_at", "next_attempt_at",
	"occurred_at", "correlation_id", "tenant_id", "source_seq", "traceparent", "tracestate"}

// qInsert inserts one row of every column.
var qInsert = qInsertRows(1, insertArgs)

// qInsertRows inserts n rows of the first cols of insertColumns.
func qInsertRows(n, cols int) string {
	row := "(?" + strings.Repeat(", ?", cols-1) + ")"
	return "INSERT INTO outbox (" + strings.Join(insertColumns[:cols], ", ") + ") VALUES " + row +
		strings.Repeat(", "+row, n-1) + " ON CONFLICT (event_id) DO NOTHING"
}

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
	Duplicate bool  // already queued, the same type and payload
	Err       error // ErrConflict, a *RejectedError (ErrRejected), or nil
}

// Insert queues envelopes and returns after their commit. Envelopes must
// be valid. Each is stored as its fields: the payload (compacted), type,
// ts exactly as given, session_id, device_id, seq, traceparent and
// tracestate; schema_version is the one Validate accepts. An envelope
// whose event_id is queued already is a duplicate when its type and
// payload are the same, ErrRejected when they are but the receiver
// refused the row, and ErrConflict otherwise; the queued row is unchanged.
func (s *Store) Insert(ctx context.Context, envs []postbox.Envelope) ([]Result, error) {
	items := make([]*write, len(envs))
	now := s.now().UTC().Format(sqlitedb.Time)
	next, _ := time.Parse(sqlitedb.Time, now)
	for i, env := range envs {
		if !postbox.Valid(env.Payload) {
			return nil, fmt.Errorf("outbox: insert %s: the payload is not valid JSON", env.EventID)
		}
		it := &write{env: env, payload: postbox.AppendCompact(nil, env.Payload)}
		var seq any
		if env.Seq != nil {
			seq = *env.Seq
		}
		it.args = [insertArgs]any{env.EventID, env.Type, string(it.payload), now, now,
			env.TS, env.SessionID, env.DeviceID, seq, env.TraceParent, env.TraceState}
		it.traced = env.TraceParent != "" || env.TraceState != ""
		// As Due reads it back.
		it.next = next
		it.msg = outbox.Message{EventID: env.EventID, Type: env.Type, Body: it.payload, CorrelationID: env.SessionID, TenantID: env.DeviceID,
			SourceSeq: env.Seq, TraceParent: env.TraceParent, TraceState: env.TraceState}
		var err error
		if it.msg.CreatedAt, err = time.Parse(time.RFC3339Nano, env.TS); err != nil {
			it.msg.CreatedAt = next
		}
		items[i] = it
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

// flush writes a batch of inserts and settles in one transaction: the
// inserts first, four rows to a statement, then the settles.
func (s *Store) flush(ctx context.Context, batch []*write) (err error) {
	s.writes.Add(1)
	defer func() { s.failed(err) }()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox write: %w", err)
	}
	defer tx.Rollback()
	inserts := make([]*write, 0, len(batch))
	var settles []*write
	for _, it := range batch {
		if it.settle != nil {
			settles = append(settles, it)
		} else {
			inserts = append(inserts, it)
		}
	}
	from, to, err := s.insertRows(ctx, tx, inserts)
	if err != nil {
		return err
	}
	if len(settles) > 0 {
		now := s.now().UTC().Format(sqlitedb.Time)
		for _, it := range settles {
			if err := s.settleTx(ctx, tx, now, it.settle); err != nil {
				return err
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox write: commit: %w", err)
	}
	s.recent.committed(from, to, inserts, settles)
	return nil
}

// insertRows inserts rows in statements of insertChunk rows; a chunk
// that did not insert every row (an event id queued already), or that
// names an id twice, is done again a row at a time to tell each row's
// outcome. It sets each inserted row's seq, and returns the
// sqlite_sequence value before the rows (from; -1 without rows) and
// after them (to).
func (s *Store) insertRows(ctx context.Context, tx *sql.Tx, rows []*write) (from, to int64, _ error) {
	if len(rows) == 0 {
		return -1, -1, nil
	}
	// high is at least the seq of every row in the table and below the
	// seq of every row inserted after it was read (AUTOINCREMENT): the
	// rows of a chunk are those above the high before it.
	var high int64
	if err := tx.QueryRowContext(ctx, qSequence).Scan(&high); err != nil {
		return 0, 0, fmt.Errorf("outbox insert: %w", err)
	}
	from = high
	single := false // a row was inserted alone: ids refused may have used up seqs
	args := make([]any, 0, insertChunk*insertArgs)
	for len(rows) > 0 {
		n := min(insertChunk, len(rows))
		chunk := rows[:n]
		rows = rows[n:]
		if n > 1 && distinct(chunk) {
			stmts, cols := s.inserts[0], untracedArgs
			if slices.ContainsFunc(chunk, func(it *write) bool { return it.traced }) {
				stmts, cols = s.inserts[1], insertArgs
			}
			args = args[:0]
			for _, it := range chunk {
				args = append(args, it.args[:cols]...)
			}
			r, err := tx.StmtContext(ctx, stmts[n]).ExecContext(ctx, args...)
			if err != nil {
				return 0, 0, fmt.Errorf("outbox insert %s: %w", chunk[0].env.EventID, err)
			}
			got, _ := r.RowsAffected()
			if got == int64(n) {
				if high, err = r.LastInsertId(); err != nil {
					return 0, 0, fmt.Errorf("outbox insert %s: %w", chunk[0].env.EventID, err)
				}
				for i, it := range chunk { // one statement's rows take consecutive seqs
					it.seq = high - int64(n-1-i)
				}
				continue
			}
			// Some ids were queued already (rare). Undo the rows this
			// chunk added, which nothing else can have written to, and
			// insert it a row at a time to tell each row's outcome.
			if got > 0 {
				if _, err := tx.ExecContext(ctx, `DELETE FROM outbox WHERE seq > ?`, high); err != nil {
					return 0, 0, fmt.Errorf("outbox insert %s: %w", chunk[0].env.EventID, err)
				}
			}
		}
		single = true
		for _, it := range chunk {
			inserted, err := s.insertOne(ctx, tx, it)
			if err != nil {
				return 0, 0, err
			}
			if inserted > 0 {
				high, it.seq = inserted, inserted
			}
		}
	}
	if single {
		if err := tx.QueryRowContext(ctx, qSequence).Scan(&high); err != nil {
			return 0, 0, fmt.Errorf("outbox insert: %w", err)
		}
	}
	return from, high, nil
}

// qSequence reads the last seq the table handed out.
const qSequence = `SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'outbox'), 0)`

// distinct reports whether the rows' event ids differ from each other.
func distinct(rows []*write) bool {
	for i := range rows {
		for j := range i {
			if rows[i].env.EventID == rows[j].env.EventID {
				return false
			}
		}
	}
	return true
}

// insertOne inserts one row and returns its seq; when its id is queued
// already, it returns 0 and records whether it is a duplicate or a
// conflict.
func (s *Store) insertOne(ctx context.Context, tx *sql.Tx, it *write) (int64, error) {
	r, err := tx.StmtContext(ctx, s.inserts[1][1]).ExecContext(ctx, it.args[:]...)
	if err != nil {
		return 0, fmt.Errorf("outbox insert %s: %w", it.env.EventID, err)
	}
	if n, _ := r.RowsAffected(); n == 1 {
		seq, err := r.LastInsertId()
		if err != nil {
			return 0, fmt.Errorf("outbox insert %s: %w", it.env.EventID, err)
		}
		return seq, nil
	}
	var typ, body, state, lastError string
	if err := tx.StmtContext(ctx, s.stmts[qStored]).QueryRowContext(ctx, it.env.EventID).Scan(&typ, &body, &state, &lastError); err != nil {
		return 0, fmt.Errorf("outbox insert %s: %w", it.env.EventID, err)
	}
	switch {
	case typ != it.env.Type || !samePayload(body, it.payload):
		it.err = ErrConflict
	case state == StateRejected:
		it.err = &RejectedError{Reason: lastError}
	default:
		it.duplicate = true
	}
	return 0, nil
}

// Due implements outbox.Store. A message's CreatedAt is the event's ts,
// with the offset its producer gave (or, were the stored ts not RFC 3339,
// the time the row was queued); CorrelationID its session_id, TenantID its
// device_id and SourceSeq its seq.
//
// Rows this Store inserted come from memory while the relay reads just
// behind the inserts (recent), the rest from the file.
func (s *Store) Due(ctx context.Context, now time.Time, after int64, limit int) ([]outbox.Message, error) {
	out, hi, ok := s.recent.due(now, after, limit)
	if !ok {
		return s.dueFile(ctx, now, after, limit, nil)
	}
	if len(out) == limit {
		return out, nil
	}
	return s.dueFile(ctx, now, max(after, hi), limit-len(out), out)
}

// dueFile appends up to limit due rows after seq after, read from the
// file, to out.
func (s *Store) dueFile(ctx context.Context, now time.Time, after int64, limit int, out []outbox.Message) ([]outbox.Message, error) {
	rows, err := s.due.QueryContext(ctx, after, now.UTC().Format(sqlitedb.Time), limit)
	if err != nil {
		return nil, fmt.Errorf("outbox due: %w", err)
	}
	defer rows.Close()
	if out == nil {
		out = make([]outbox.Message, 0, min(limit, 1024))
	}
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
// ones kept with their reason. While Run runs, the outcomes are written
// by its group commit, in one transaction with the inserts and settles
// queued beside them, and Settle returns once that is on the disk.
func (s *Store) Settle(ctx context.Context, outcomes []outbox.Outcome) (err error) {
	if len(outcomes) == 0 {
		return nil
	}
	if s.running.Load() {
		ch := make(chan error, 1)
		if err := s.writer.EnqueueWhole(ctx, []*write{{settle: outcomes}}, func(err error) { ch <- err }); err != nil {
			return fmt.Errorf("outbox settle: %w", err)
		}
		select {
		case err := <-ch:
			if err != nil {
				return fmt.Errorf("outbox settle: %w", err)
			}
			return nil
		case <-ctx.Done():
			// The writer has not answered in time (the relay bounds a
			// settle by its SettleTimeout, so that a stuck store cannot
			// hold up its shutdown). The outcomes may still be written;
			// written again, a delete finds nothing and a rejected
			// row is left as it is.
			return fmt.Errorf("outbox settle: %w", ctx.Err())
		}
	}
	s.writes.Add(1)
	defer func() { s.failed(err) }()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox settle: %w", err)
	}
	defer tx.Rollback()
	if err := s.settleTx(ctx, tx, s.now().UTC().Format(sqlitedb.Time), outcomes); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox settle: commit: %w", err)
	}
	s.recent.committed(-1, -1, nil, []*write{{settle: outcomes}})
	return s.wal.Sync()
}

// settleTx writes outcomes in tx: the deletes of delivered rows a run of
// seqs or up to 64 ids to a statement, the other outcomes a statement
// each.
func (s *Store) settleTx(ctx context.Context, tx *sql.Tx, now string, outcomes []outbox.Outcome) error {
	var delivered []any
	var seqs []int64
	for _, o := range outcomes {
		var err error
		switch o.Kind {
		case outbox.Delivered:
			if o.Seq > 0 {
				seqs = append(seqs, o.Seq)
			} else {
				delivered = append(delivered, o.EventID)
			}
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
	// Delivered rows with their seq go by runs of consecutive seqs, most
	// often one run for a whole publish: one statement, and no look-up
	// of each id.
	slices.Sort(seqs)
	for len(seqs) > 0 {
		n := 1
		for n < len(seqs) && seqs[n] <= seqs[n-1]+1 {
			n++
		}
		if _, err := tx.StmtContext(ctx, s.stmts[qDeleteRun]).ExecContext(ctx, seqs[0], seqs[n-1]); err != nil {
			return fmt.Errorf("outbox settle seq %d-%d: %w", seqs[0], seqs[n-1], err)
		}
		seqs = seqs[n:]
	}
	for len(delivered) > 0 {
		for _, n := range deleteSizes {
			if n > len(delivered) {
				continue
			}
			if _, err := tx.StmtContext(ctx, s.deletes[n]).ExecContext(ctx, delivered[:n]...); err != nil {
				return fmt.Errorf("outbox settle %s: %w", delivered[0], err)
			}
			delivered = delivered[n:]
			break
		}
	}
	return nil
}

// Row is an outbox row as operators see it.
type Row = outbox.Row

// List returns up to limit rows in state ("" for all), oldest first.
func (s *Store) List(ctx context.Context, state string, limit int) ([]Row, error) {
	q := `SELECT ` + rowColumns + ` FROM outbox`
	args := []any{}
	if state != "" {
		q += ` WHERE state = ?`
		args = append(args, state)
	}
	q += ` ORDER BY seq LIMIT ?`
	args = append(args, limit)
	return s.rows(ctx, "outbox list", q, args...)
}

// rowColumns are the columns rows reads, in its order.
const rowColumns = `event_id, event_type, state, created_at, next_attempt_at, attempt_count, coalesce(last_error, ''), payload_json, correlation_id, tenant_id`

// rows runs q, a SELECT of rowColumns, and returns its rows; what names
// the caller in an error.
func (s *Store) rows(ctx context.Context, what, q string, args ...any) ([]Row, error) {
	rows, err := s.read.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		var created, next, payload string
		if err := rows.Scan(&r.EventID, &r.Type, &r.State, &created, &next, &r.Attempts, &r.LastError, &payload, &r.CorrelationID, &r.TenantID); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		r.Payload = json.RawMessage(payload)
		r.CreatedAt, _ = time.Parse(sqlitedb.Time, created)
		r.NextAttemptAt, _ = time.Parse(sqlitedb.Time, next)
		out = append(out, r)
	}
	return out, rows.Err()
}

// Rows returns the rows of ids, in any state; an id the outbox does not
// hold has no row.
func (s *Store) Rows(ctx context.Context, ids []string) ([]Row, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return s.rows(ctx, "outbox rows", `SELECT `+rowColumns+` FROM outbox WHERE event_id IN (?`+strings.Repeat(",?", len(ids)-1)+`) ORDER BY seq`, args...)
}

// Drop deletes rejected rows for good: those of ids, or with no ids every
// rejected row. It returns the ids it deleted.
func (s *Store) Drop(ctx context.Context, ids []string) ([]string, error) {
	q := `DELETE FROM outbox WHERE state = 'rejected'`
	args := []any{}
	if len(ids) > 0 {
		q += ` AND event_id IN (?` + strings.Repeat(",?", len(ids)-1) + `)`
		for _, id := range ids {
			args = append(args, id)
		}
	}
	rows, err := s.db.QueryContext(ctx, q+` RETURNING event_id`, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox drop: %w", err)
	}
	var dropped []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox drop: %w", err)
		}
		dropped = append(dropped, id)
	}
	err = rows.Err()
	rows.Close()
	if err == nil {
		err = s.wal.Sync()
	}
	if err != nil {
		return nil, fmt.Errorf("outbox drop: %w", err)
	}
	return dropped, nil
}

// Counts returns how many rows are in each state.
func (s *Store) Counts(ctx context.Context) (pending, rejected int64, err error) {
	var all int64
	err = s.read.QueryRowContext(ctx, `SELECT count(*), (SELECT count(*) FROM outbox WHERE state = 'rejected') FROM outbox`).
		Scan(&all, &rejected)
	return all - rejected, rejected, err
}

// OldestPending returns when the oldest pending row was queued; ok is
// false when nothing is pending.
func (s *Store) OldestPending(ctx context.Context) (t time.Time, ok bool, err error) {
	var created sql.NullString
	if err := s.read.QueryRowContext(ctx, `SELECT min(created_at) FROM outbox WHERE state = 'pending'`).Scan(&created); err != nil {
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
	s.recent.mu.Lock()
	s.recent.invalidate() // rows behind the range are due again
	s.recent.mu.Unlock()
	if err == nil {
		err = s.wal.Sync()
	}
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
