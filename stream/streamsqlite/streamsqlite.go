// Package streamsqlite is the embedded stream backend: every stream and
// consumer in one SQLite file, written by a single goroutine in group
// commits.
//
// Writes are queued (bounded) and written by Run: it takes everything
// queued up to MaxBatch items, writes them in one transaction, commits
// with the configured durability (synchronous=FULL by default), and only
// then reports each result. An event whose identity is already stored is
// not written again: its attempt count and last-seen time are updated and
// it is reported as a duplicate, or as a stream.ConflictError when its type
// or payload differs, in which case nothing changes. Consumer changes and the
// callers' own writes (Update) join the same group commits.
//
// Offsets are per stream and dense: the writer numbers a stream's events
// 1, 2, 3, ... and stores event n of stream number s under the integer key
// s<<40 | n, so reading a stream from an offset is a range scan of the
// table's key and a consumer's lag is a subtraction.
package streamsqlite

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations holds the SQL files that create and upgrade the streams'
// tables (component "streams" in schema_migrations), in the order they
// apply; Open applies them.
var Migrations, _ = fs.Sub(migrations, "migrations") // a fixed, valid name: no error

// DefaultQueueBytes is the default of Config.QueueBytes.
const DefaultQueueBytes = 64 << 20

// BackendName is the name this backend records in streams.backend.
const BackendName = "sqlite"

// Config configures a Backend. Zero fields take their defaults.
type Config struct {
	// Synchronous is sqlitedb.SyncFull (default) or sqlitedb.SyncNormal.
	Synchronous string
	// MaxBatch bounds the events written in one transaction; 1 writes each
	// event in its own transaction. Defaults to groupcommit.DefaultMaxBatch.
	MaxBatch int
	// QueueSize bounds the events waiting for the writer. Defaults to
	// groupcommit.DefaultQueueSize.
	QueueSize int
	// QueueBytes bounds the payload and metadata bytes of the events
	// waiting for the writer, so that large events cannot fill memory
	// before the count bound is reached. Defaults to DefaultQueueBytes.
	QueueBytes int
	// Observe is called after each group commit (see groupcommit.Config).
	Observe func(events int, took time.Duration, err error)
	// CheckpointPages is the size of the WAL, in pages, from which the
	// writer checkpoints it itself after a commit. Defaults to
	// WriterCheckpointPages.
	CheckpointPages int
	// Checkpoint says who checkpoints the write-ahead log:
	// sqlitedb.CheckpointAuto (the default) has the writer and Run
	// checkpoint it; sqlitedb.CheckpointLitestream checkpoints nothing and
	// leaves the log to Litestream, whose checkpoints then never race the
	// store's.
	Checkpoint string
	// ObserveSync is called after each sync of the write-ahead log with
	// FULL (see groupcommit.Config).
	ObserveSync func(commits int, took time.Duration, err error)
	// Now returns the current time. Defaults to time.Now.
	Now func() time.Time
}

// Backend stores streams in one SQLite database.
type Backend struct {
	path        string
	lock        *sqlitedb.FileLock // path's, held until Close
	write       *sql.DB            // one connection: the writer's
	read        *sql.DB            // readers, on their own connections
	checkpoint  *sql.DB            // one connection that checkpoints the WAL
	external    bool               // Config.Checkpoint is litestream: checkpoint nothing
	writer      *groupcommit.Writer[*item]
	now         func() time.Time
	observe     func(events int, took time.Duration, err error)  // Config.Observe, or what Observe set
	observeSync func(commits int, took time.Duration, err error) // Config.ObserveSync, or what ObserveSync set
	wal         *sqlitedb.WALSyncer                              // with FULL: syncs what the writer committed

	// what ObserveRetry set
	observeRetry func(events, attempt int, wait time.Duration, err error)

	// used by the writer goroutine only
	inserts [chunk + 1]*sql.Stmt // by row count
	// The same for rows without a delivery handle and a source sequence
	// (most), which leave those columns to their default (NULL) instead
	// of binding NULLs: two values fewer per row.
	insertsNarrow       [chunk + 1]*sql.Stmt
	find, touch, unmake *sql.Stmt
	// The savepoint around each function the writer runs (runFn).
	savepoint, release, rollbackTo *sql.Stmt

	args        []any
	events      []*item        // the appends of the batch being written
	lastNow     time.Time      // StoredAt never goes back along a stream
	touched     []*streamState // streams whose last offset the batch moved
	commitCount int            // for pruning consumer_commits

	readEvents *sql.Stmt // on the readers' pool

	commits atomic.Int64 // for the checkpointer: has anything been written?

	hooks hooks // AppendHooks by stream (hook.go)

	mu       sync.RWMutex
	streams  map[string]*streamState
	createMu sync.Mutex // EnsureStream's creators, one at a time
}

// streamState is what the backend keeps in memory of one stream.
type streamState struct {
	stream.Stream
	base int64 // stream_no << 40: the key of offset 0

	last int64 // the writer's high watermark, ahead of the commit inside a batch
	prev int64 // last at the start of the batch, to undo a failed one

	// id is ID as a bound INSERT argument, boxed once (the writer's).
	id any

	committed atomic.Int64 // the committed high watermark
	mu        sync.Mutex
	grew      chan struct{} // closed when committed grows
}

// offsetBits is how many low bits of an event's key hold its offset.
const offsetBits = 40

// item is one queued write: an append (ev set) or a function (fn set).
// The fields after ev are prepared by the caller's goroutine so that the
// writer only binds and executes.
type item struct {
	st       *streamState
	ev       *stream.Event
	sha      [32]byte
	occurred string
	res      *stream.AppendResult
	// row is the event's own INSERT arguments (source_native_id through
	// source_sequence), converted and boxed by the caller's goroutine:
	// each costs the writer an allocation otherwise.
	row [rowArgs]any
	// narrow: the event has no delivery handle and no source sequence
	// (row[6] and row[8] are nil), so it may be written by insertsNarrow.
	narrow bool

	fn    func(*sql.Tx) error
	fnErr error
}

// Size is what an item holds in memory while queued (groupcommit.Sizer).
func (it *item) Size() int {
	if it.ev == nil {
		return 256
	}
	return len(it.ev.Payload) + len(it.ev.Metadata) + 2*len(it.ev.DeliveryHandle) + len(it.ev.NativeID) + 256
}

// Open opens (creating and migrating) the database at path. Call Run to
// start the writer and Close when done.
//
// With synchronous FULL (the default) the writer's connection commits as
// NORMAL does, and the group commit syncs the write-ahead log itself
// (sqlitedb.WALSyncer) before it answers the commit's callers: an append
// is acknowledged only once it is on the disk, as with FULL, but the
// writer writes the next batch while the disk syncs the last.
func Open(path string, cfg Config) (*Backend, error) {
	if err := sqlitedb.CheckCheckpointMode(cfg.Checkpoint); err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if cfg.CheckpointPages <= 0 {
		cfg.CheckpointPages = WriterCheckpointPages
	}
	external := cfg.Checkpoint == sqlitedb.CheckpointLitestream
	if external {
		cfg.CheckpointPages = -1
	}
	// The writer keeps each stream's next offset in memory: a second
	// process on the file would fail every append.
	lock, err := sqlitedb.Lock(path)
	if err != nil {
		return nil, err
	}
	write, wal, err := sqlitedb.OpenWriter(path, sqlitedb.Options{Synchronous: cfg.Synchronous, AutoCheckpoint: cfg.CheckpointPages})
	if err != nil {
		lock.Unlock()
		return nil, err
	}
	err = sqlitedb.Migrate(context.Background(), write, "streams", Migrations)
	if err == nil {
		err = wal.Sync()
	}
	if err != nil {
		write.Close()
		lock.Unlock()
		return nil, err
	}
	read, err := sqlitedb.Open(path, sqlitedb.Options{Synchronous: cfg.Synchronous, MaxConns: 4, ReadOnly: true})
	if err != nil {
		write.Close()
		lock.Unlock()
		return nil, err
	}
	checkpoint, err := sqlitedb.Open(path, sqlitedb.Options{Synchronous: cfg.Synchronous, MaxConns: 1})
	if err != nil {
		write.Close()
		read.Close()
		lock.Unlock()
		return nil, err
	}
	b := &Backend{
		path:        path,
		lock:        lock,
		write:       write,
		read:        read,
		checkpoint:  checkpoint,
		external:    external,
		now:         cfg.Now,
		observe:     cfg.Observe,
		observeSync: cfg.ObserveSync,
		wal:         wal,
		streams:     map[string]*streamState{},
	}
	if b.now == nil {
		b.now = time.Now
	}
	b.find, err = write.Prepare(`SELECT pos, event_type FROM stream_events
		WHERE stream_id = ? AND source_native_id = ? AND event_variant = ?`)
	if err == nil {
		b.touch, err = write.Prepare(`UPDATE stream_events SET redelivered_at = ?, attempt_count = attempt_count + 1
		WHERE stream_id = ? AND source_native_id = ? AND event_variant = ? AND event_type = ? AND payload_sha256 = ?
		RETURNING pos, created_at`)
	}
	if err == nil {
		b.unmake, err = write.Prepare(`DELETE FROM stream_events WHERE pos BETWEEN ? AND ?`)
	}
	if err == nil {
		b.savepoint, err = write.Prepare(`SAVEPOINT fn`)
	}
	if err == nil {
		b.release, err = write.Prepare(`RELEASE fn`)
	}
	if err == nil {
		b.rollbackTo, err = write.Prepare(`ROLLBACK TO fn`)
	}
	for n := 1; n <= chunk && err == nil; n++ {
		b.inserts[n], err = write.Prepare(insertColumns + insertRow + strings.Repeat(","+insertRow, n-1))
		if err == nil {
			b.insertsNarrow[n], err = write.Prepare(insertNarrowColumns + insertNarrowRow + strings.Repeat(","+insertNarrowRow, n-1))
		}
	}
	if err == nil {
		b.readEvents, err = read.Prepare(`SELECT ` + eventColumns + `
		FROM stream_events WHERE pos BETWEEN ? AND ? ORDER BY pos LIMIT ?`)
	}
	if err == nil {
		err = b.loadStreams(context.Background())
	}
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = DefaultQueueBytes
	}
	gc := groupcommit.Config{MaxBatch: cfg.MaxBatch, QueueSize: cfg.QueueSize, QueueBytes: cfg.QueueBytes,
		Observe: func(events int, took time.Duration, err error) {
			if b.observe != nil {
				b.observe(events, took, err)
			}
		},
		Transient: sqlitedb.Transient,
		ObserveRetry: func(events, attempt int, wait time.Duration, err error) {
			if b.observeRetry != nil {
				b.observeRetry(events, attempt, wait, err)
			}
		}}
	if wal != nil {
		gc.Sync = wal.Sync
		gc.ObserveSync = func(commits int, took time.Duration, err error) {
			if b.observeSync != nil {
				b.observeSync(commits, took, err)
			}
		}
	}
	b.writer = groupcommit.New(b.flush, gc)
	return b, nil
}

// Observe sets the function called after each group commit, replacing
// Config.Observe, for a caller that did not open the backend (a server
// that counts commits and watches for failed ones). Call it before Run.
func (b *Backend) Observe(fn func(events int, took time.Duration, err error)) { b.observe = fn }

// ObserveSync sets the function called after each sync of the
// write-ahead log, replacing Config.ObserveSync. Call it before Run.
func (b *Backend) ObserveSync(fn func(commits int, took time.Duration, err error)) {
	b.observeSync = fn
}

// ObserveRetry sets the function called before a group commit that
// failed for a transient reason (sqlitedb.Transient) is tried again: its
// events, the attempt to come, the wait before it and the error. Call it
// before Run.
func (b *Backend) ObserveRetry(fn func(events, attempt int, wait time.Duration, err error)) {
	b.observeRetry = fn
}

// loadStreams reads every stream into memory with its high watermark.
func (b *Backend) loadStreams(ctx context.Context) error {
	rows, err := b.write.QueryContext(ctx, `SELECT stream_id, source_id, backend, created_at, stream_no, last_offset FROM streams`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		st, err := scanStream(rows)
		if err != nil {
			return err
		}
		b.streams[st.ID] = st
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, st := range b.streams {
		var top sql.NullInt64 // the last event, in case last_offset lags it
		if err := b.write.QueryRowContext(ctx, `SELECT max(pos) FROM stream_events WHERE pos BETWEEN ? AND ?`,
			st.base+1, st.base+maxOffset).Scan(&top); err != nil {
			return err
		}
		if top.Valid && top.Int64-st.base > st.last {
			st.last = top.Int64 - st.base
		}
		st.prev = st.last
		st.committed.Store(st.last)
	}
	return nil
}

func scanStream(rows interface{ Scan(...any) error }) (*streamState, error) {
	st := &streamState{grew: make(chan struct{})}
	var created string
	var no int64
	if err := rows.Scan(&st.ID, &st.SourceID, &st.Backend, &created, &no, &st.last); err != nil {
		return nil, err
	}
	st.CreatedAt, _ = sqlitedb.ParseTime(created)
	st.base = no << offsetBits
	st.prev = st.last
	st.committed.Store(st.last)
	return st, nil
}

// maxOffset is the largest offset a stream can hold.
const maxOffset = 1<<offsetBits - 1

// WriterCheckpointPages is the default of Config.CheckpointPages: the
// size of the WAL (16 MiB in 4 KiB pages) from which the writer
// checkpoints it itself after a commit. The checkpointer beside it
// (CheckpointInterval) copies the pages into the database file but never
// finishes while the writer keeps appending, and SQLite starts the log
// anew only after a checkpoint that finished: under steady load the log
// grew by every page written (225 MB in 300,000 events). The writer's own
// checkpoint finds all but the last few milliseconds' pages copied,
// finishes, and the next commit starts the log from its beginning.
const WriterCheckpointPages = 4096

// CheckpointInterval is how often Run checkpoints the WAL when something
// was committed. Small checkpoints often keep each one short, which keeps
// the writer's fsyncs from queueing behind a long one (measured in
// BENCHMARKS.md).
const CheckpointInterval = 10 * time.Millisecond

// Run runs the writer until ctx ends, then writes what is still queued.
// Beside it, Run checkpoints the WAL into the database file every
// CheckpointInterval on its own connection, so the writer pays only for
// the last pages of a checkpoint (WriterCheckpointPages). With
// Config.Checkpoint litestream it checkpoints nothing.
func (b *Backend) Run(ctx context.Context) error {
	if b.external {
		return b.writer.Run(ctx)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(CheckpointInterval)
		defer t.Stop()
		var seen int64
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if n := b.commits.Load(); n != seen {
					seen = n
					sqlitedb.Checkpoint(context.Background(), b.checkpoint) // a failure is retried after the next commit
				}
			}
		}
	}()
	err := b.writer.Run(ctx)
	close(stop)
	<-done
	return err
}

// Close checkpoints (unless Config.Checkpoint is litestream) and closes
// the database. Run must have returned.
func (b *Backend) Close() error {
	if !b.external {
		sqlitedb.Checkpoint(context.Background(), b.checkpoint)
	}
	err := errors.Join(b.write.Close(), b.read.Close(), b.checkpoint.Close())
	return errors.Join(err, b.wal.Close(), b.lock.Unlock())
}

// QueueLen returns the events waiting for the writer; QueueCap its bound.
func (b *Backend) QueueLen() int { return b.writer.Len() }

// QueueBytes returns the bytes the events waiting for the writer hold.
func (b *Backend) QueueBytes() int { return b.writer.Bytes() }

// QueueCap returns the bound of the writer's queue.
func (b *Backend) QueueCap() int { return b.writer.Cap() }

// EnsureStream returns the stream of sourceID, creating it if needed. The
// stream's id is the source id.
func (b *Backend) EnsureStream(ctx context.Context, sourceID string) (stream.Stream, error) {
	if st, err := b.stream(sourceID); err == nil {
		return st.Stream, nil
	}
	if sourceID == "" {
		return stream.Stream{}, errors.New("ensure stream: empty source id")
	}
	// Not under b.mu: the writer goroutine holds the write connection
	// while it looks streams up (b.stream takes b.mu), so waiting for
	// that connection under b.mu would deadlock with it. The insert is
	// idempotent, and the row read back is the one every creator stores.
	b.createMu.Lock() // one creator at a time
	defer b.createMu.Unlock()
	if st, err := b.stream(sourceID); err == nil {
		return st.Stream, nil
	}
	now := b.now().UTC()
	if _, err := b.write.ExecContext(ctx, `INSERT INTO streams (stream_id, source_id, stream_key, backend, created_at, stream_no, last_offset)
		VALUES (?1, ?1, ?1, ?2, ?3, (SELECT coalesce(max(stream_no), 0) + 1 FROM streams), 0) ON CONFLICT DO NOTHING`,
		sourceID, BackendName, now.Format(sqlitedb.Time)); err != nil {
		return stream.Stream{}, fmt.Errorf("ensure stream %s: %w", sourceID, err)
	}
	if err := b.wal.Sync(); err != nil {
		return stream.Stream{}, fmt.Errorf("ensure stream %s: %w", sourceID, err)
	}
	st, err := scanStream(b.write.QueryRowContext(ctx, `SELECT stream_id, source_id, backend, created_at, stream_no, last_offset
		FROM streams WHERE source_id = ?`, sourceID))
	if err != nil {
		return stream.Stream{}, fmt.Errorf("ensure stream %s: %w", sourceID, err)
	}
	b.mu.Lock()
	b.streams[st.ID] = st
	b.mu.Unlock()
	return st.Stream, nil
}

// stream returns the in-memory state of streamID.
func (b *Backend) stream(id string) (*streamState, error) {
	b.mu.RLock()
	st, ok := b.streams[id]
	b.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s", stream.ErrStreamNotFound, id)
	}
	return st, nil
}

// AppendAsync queues events for streamID and returns; done is called from
// the writer goroutine with one result per event after their transaction
// committed, or with an error (nothing was stored) when it failed. done must
// not block. The events, and the bytes of their payloads and metadata,
// must not change until done is called: the writer reads them in place. AppendAsync blocks while the queue is full, and returns ctx's
// error, stream.ErrStreamNotFound or groupcommit.ErrClosed without queueing.
// When ctx ends before the writer took the events, they are not written and
// done gets ctx's error: a caller that went away (a closed connection) does
// not keep the writer busy.
func (b *Backend) AppendAsync(ctx context.Context, streamID string, events []stream.Event, done func([]stream.AppendResult, error)) error {
	items, results, err := b.prepare(streamID, events)
	if err != nil {
		return err
	}
	return b.writer.EnqueueWhile(ctx, items, func(err error) { done(results, err) })
}

// AppendAsyncWith is AppendAsync that also runs fn in the transaction
// that writes events, after them: fn's writes commit with the events or
// not at all (a source's checkpoint with the page it read). The events and
// fn are never split over two group commits. fn runs on the writer
// goroutine in a savepoint, as Update's; when it fails, the events still
// commit and done gets fn's error with their results.
func (b *Backend) AppendAsyncWith(ctx context.Context, streamID string, events []stream.Event, fn func(tx *sql.Tx) error,
	done func([]stream.AppendResult, error)) error {
	items, results, err := b.prepare(streamID, events)
	if err != nil {
		return err
	}
	last := &item{fn: fn}
	items = append(items, last)
	return b.writer.EnqueueWhole(ctx, items, func(err error) {
		if err == nil {
			err = last.fnErr
		}
		done(results, err)
	})
}

// TryAppendAsync is AppendAsync that returns groupcommit.ErrFull instead
// of waiting for room in the queue.
func (b *Backend) TryAppendAsync(streamID string, events []stream.Event, done func([]stream.AppendResult, error)) error {
	items, results, err := b.prepare(streamID, events)
	if err != nil {
		return err
	}
	return b.writer.TryEnqueue(items, func(err error) { done(results, err) })
}

// Append appends events to streamID and returns after their commit.
func (b *Backend) Append(ctx context.Context, streamID string, events []stream.Event) ([]stream.AppendResult, error) {
	items, results, err := b.prepare(streamID, events)
	if err != nil {
		return nil, err
	}
	if err := b.writer.Do(ctx, items); err != nil {
		return nil, err
	}
	return results, nil
}

func (b *Backend) prepare(streamID string, events []stream.Event) ([]*item, []stream.AppendResult, error) {
	st, err := b.stream(streamID)
	if err != nil {
		return nil, nil, err
	}
	results := make([]stream.AppendResult, len(events))
	items := make([]*item, len(events))
	backing := make([]item, len(events))
	for i := range events {
		it := &backing[i]
		*it = item{
			st:       st,
			ev:       &events[i],
			sha:      sha256.Sum256(events[i].Payload),
			occurred: events[i].OccurredAt.UTC().Format(sqlitedb.Time),
			res:      &results[i],
		}
		it.prepareRow()
		items[i] = it
	}
	return items, results, nil
}

// rowArgs is how many of an INSERT row's arguments item.row holds.
const rowArgs = 9

// emptyMetadata is the metadata stored for an event without any, boxed.
var emptyMetadata any = "{}"

// prepareRow fills it.row.
func (it *item) prepareRow() {
	ev := it.ev
	var handle, seq any
	if len(ev.DeliveryHandle) > 0 {
		handle = string(ev.DeliveryHandle)
	}
	metadata := emptyMetadata
	if len(ev.Metadata) > 0 {
		metadata = unsafe.String(unsafe.SliceData(ev.Metadata), len(ev.Metadata))
	}
	if ev.Sequence != nil {
		seq = *ev.Sequence
	}
	// The payload and metadata are bound as text without a copy of their
	// bytes (string would double the memory of every queued event): the
	// caller leaves them as they are until the append is answered, and the
	// driver copies them when it binds them.
	payload := unsafe.String(unsafe.SliceData(ev.Payload), len(ev.Payload))
	it.row = [rowArgs]any{ev.NativeID, ev.Variant, ev.Type, it.occurred, metadata, payload, handle, it.sha[:], seq}
	it.narrow = handle == nil && seq == nil
}

// chunk is how many events one INSERT statement writes.
const chunk = 4

// insertColumns are a row's stored columns but for attempt_count and
// redelivered_at (their defaults); source_id and last_seen_at are derived
// (migration 0006).
//
// OR IGNORE skips a row whose identity is stored already, as ON CONFLICT
// DO NOTHING on the identity would, and makes every other conflict skip
// its row too instead of failing the statement: no bound value is NULL,
// and the key (pos) is a fresh offset, so there is none. A statement that
// cannot fail midway needs no statement journal, which otherwise copies
// every page the statement touches first (about a tenth of the writer's
// time). A row skipped for any reason is written again alone (oneByOne),
// which tells a redelivery from a conflict and fails the batch otherwise.
const insertColumns = `INSERT OR IGNORE INTO stream_events (pos, stream_id,
	source_native_id, event_variant, event_type, occurred_at, metadata_json, raw_payload_json,
	delivery_handle_json, payload_sha256, source_sequence, created_at) VALUES `

const insertRow = "(?,?,?,?,?,?,?,?,?,?,?,?)"

// insertNarrowColumns leave out delivery_handle_json and source_sequence
// too, for rows whose are NULL.
const insertNarrowColumns = `INSERT OR IGNORE INTO stream_events (pos, stream_id,
	source_native_id, event_variant, event_type, occurred_at, metadata_json, raw_payload_json,
	payload_sha256, created_at) VALUES `

const insertNarrowRow = "(?,?,?,?,?,?,?,?,?,?)"

// flush writes one batch in one transaction. It runs on the writer
// goroutine only.
//
// Events go in by multi-row INSERTs of up to chunk rows that skip
// identities already stored, each row under the next offset of its
// stream. When a statement inserted every row (the common case), those
// offsets stand. Otherwise its rows are taken out again and written one by
// one, so that an offset goes only to an event that was stored and a
// stream's offsets stay dense; a row that is not stored is a redelivery
// (the same type and payload sha256), counted, or a conflict. Then the batch's functions run, each in a
// savepoint.
//
// A stream's high watermark is its newest event's offset, read at Open;
// streams.last_offset keeps it for when the newest events are deleted, so
// whatever deletes them must record it there first.
func (b *Backend) flush(ctx context.Context, batch []*item) (err error) {
	// Truncated to the stored precision, so that the StoredAt of the first
	// delivery equals the one a redelivery reads back from created_at.
	now := b.now().UTC().Truncate(time.Microsecond)
	if now.Before(b.lastNow) {
		now = b.lastNow // the clock went back: stored times still only grow
	}
	nowText := now.Format(sqlitedb.Time)
	var nowArg any = nowText // boxed once for every row
	tx, err := b.write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("append: begin: %w", err)
	}
	defer tx.Rollback()
	defer func() {
		if err != nil {
			for _, st := range b.touched {
				st.last = st.prev
			}
			b.touched = b.touched[:0]
		}
	}()
	// Bound to the transaction once, for every full chunk: wide and narrow.
	var full, fullNarrow *sql.Stmt
	events := b.events[:0]
	for _, it := range batch {
		if it.ev != nil {
			*it.res = stream.AppendResult{} // a flush tried again (groupcommit's retries) starts afresh
			events = append(events, it)
		}
	}
	b.events = events
	defer clear(events)
	for len(events) > 0 {
		n := min(chunk, len(events))
		part := events[:n]
		events = events[n:]
		narrow := true
		for _, it := range part {
			narrow = narrow && it.narrow
		}
		var ins *sql.Stmt
		switch {
		case n < chunk && narrow:
			ins = tx.StmtContext(ctx, b.insertsNarrow[n])
		case n < chunk:
			ins = tx.StmtContext(ctx, b.inserts[n])
		case narrow:
			if fullNarrow == nil {
				fullNarrow = tx.StmtContext(ctx, b.insertsNarrow[chunk])
			}
			ins = fullNarrow
		default:
			if full == nil {
				full = tx.StmtContext(ctx, b.inserts[chunk])
			}
			ins = full
		}
		inserted, err := b.insert(ctx, ins, narrow, part, nowArg)
		if err != nil {
			return err
		}
		if inserted == int64(len(part)) {
			for _, it := range part {
				it.res.StoredAt = now
			}
			continue
		}
		if err := b.oneByOne(ctx, tx, part, now, nowText); err != nil {
			return err
		}
	}
	b.runHooks(ctx, tx, batch)
	for _, it := range batch {
		if it.fn != nil {
			it.fnErr = b.runFn(ctx, tx, it.fn)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("append: commit: %w", err)
	}
	b.committed()
	b.lastNow = now
	for _, st := range b.touched {
		st.prev = st.last
		st.publish(st.last)
	}
	b.touched = b.touched[:0]
	b.commits.Add(1)
	return nil
}

// insert writes part with one statement, each row under the next offset
// of its stream, and returns how many rows it inserted.
//
// Only pos is converted here: the rest was boxed before (item.row,
// streamState.id, now once per batch), so that the writer, the one
// goroutine every event waits for, does not allocate for it.
//
// With narrow (ins of insertsNarrow), the rows' NULL delivery handle and
// source sequence are not bound.
func (b *Backend) insert(ctx context.Context, ins *sql.Stmt, narrow bool, part []*item, now any) (int64, error) {
	args := b.args[:0]
	for _, it := range part {
		st := it.st
		if st.id == nil {
			st.id = st.ID
		}
		it.res.Offset = b.nextOffset(st)
		args = append(args, st.base+it.res.Offset, st.id)
		if narrow {
			args = append(args, it.row[:6]...)
			args = append(args, it.row[7])
		} else {
			args = append(args, it.row[:]...)
		}
		args = append(args, now)
	}
	b.args = args
	r, err := ins.ExecContext(ctx, args...)
	clear(args)
	if err != nil {
		return 0, fmt.Errorf("append: insert: %w", err)
	}
	return r.RowsAffected()
}

// nextOffset takes the next offset of st for the batch being written.
func (b *Backend) nextOffset(st *streamState) int64 {
	if !slices.Contains(b.touched, st) {
		b.touched = append(b.touched, st)
	}
	st.last++
	return st.last
}

// oneByOne undoes a statement that did not insert every row of part and
// writes its rows one at a time.
func (b *Backend) oneByOne(ctx context.Context, tx *sql.Tx, part []*item, now time.Time, nowText string) error {
	for i := len(part) - 1; i >= 0; i-- { // give the offsets back, newest first
		st := part[i].st
		if _, err := tx.StmtContext(ctx, b.unmake).ExecContext(ctx, st.base+part[i].res.Offset, st.base+maxOffset); err != nil {
			return fmt.Errorf("append: undo: %w", err)
		}
		st.last = part[i].res.Offset - 1
	}
	one := tx.StmtContext(ctx, b.inserts[1])
	lookup, touch := tx.StmtContext(ctx, b.find), tx.StmtContext(ctx, b.touch)
	for _, it := range part {
		inserted, err := b.insert(ctx, one, false, []*item{it}, nowText)
		if err != nil {
			return err
		}
		if inserted == 1 {
			it.res.StoredAt = now
			continue
		}
		it.st.last-- // not stored: the offset goes to the next event
		ev := it.ev
		var pos int64
		var created string
		err = touch.QueryRowContext(ctx, nowText, it.st.ID, ev.NativeID, ev.Variant, ev.Type, it.sha[:]).Scan(&pos, &created)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			var storedType string
			if err := lookup.QueryRowContext(ctx, it.st.ID, ev.NativeID, ev.Variant).Scan(&pos, &storedType); err != nil {
				return fmt.Errorf("append: look up %s: %w", ev.NativeID, err)
			}
			it.res.Err = &stream.ConflictError{Field: stream.FieldPayload}
			if storedType != ev.Type {
				it.res.Err = &stream.ConflictError{Field: stream.FieldType}
			}
		case err != nil:
			return fmt.Errorf("append: redelivery of %s: %w", ev.NativeID, err)
		default:
			it.res.Duplicate = true
			it.res.StoredAt, _ = sqlitedb.ParseTime(created)
		}
		it.res.Offset = pos - it.st.base
	}
	return nil
}

// runFn runs fn inside a savepoint of tx: when fn fails, what it wrote is
// undone and the rest of the batch commits.
func (b *Backend) runFn(ctx context.Context, tx *sql.Tx, fn func(*sql.Tx) error) error {
	if _, err := tx.StmtContext(ctx, b.savepoint).ExecContext(ctx); err != nil {
		return err
	}
	release := tx.StmtContext(ctx, b.release)
	if err := fn(tx); err != nil {
		if _, rerr := tx.StmtContext(ctx, b.rollbackTo).ExecContext(ctx); rerr != nil {
			return errors.Join(err, rerr)
		}
		release.ExecContext(ctx)
		return err
	}
	_, err := release.ExecContext(ctx)
	return err
}

// publish records a committed high watermark and wakes its waiters.
func (st *streamState) publish(last int64) {
	if st.committed.Load() == last {
		return
	}
	st.mu.Lock()
	st.committed.Store(last)
	close(st.grew)
	st.grew = make(chan struct{})
	st.mu.Unlock()
}

// ReadDB returns the backend's read-only connection pool, for queries that
// have no method yet (operator tools, tests).
func (b *Backend) ReadDB() *sql.DB { return b.read }
