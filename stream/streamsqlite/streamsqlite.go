// Package streamsqlite is the embedded stream backend: every stream in one
// SQLite file, written by a single goroutine in group commits.
//
// Appends are queued (bounded) and written by Run: it takes everything
// queued up to MaxBatch events, inserts them in one transaction, commits
// with the configured durability (synchronous=FULL by default), and only
// then reports each event's result. An event whose identity is already
// stored is not written again: its attempt count and last-seen time are
// updated and it is reported as a duplicate, or as stream.ErrConflict when
// its payload differs, in which case nothing changes.
package streamsqlite

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

//go:embed migrations/*.sql
var migrations embed.FS

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
	// Now returns the current time. Defaults to time.Now.
	Now func() time.Time
}

// Backend stores streams in one SQLite database.
type Backend struct {
	path       string
	write      *sql.DB // one connection: the writer's
	read       *sql.DB // readers, on their own connections
	checkpoint *sql.DB // one connection that checkpoints the WAL
	writer     *groupcommit.Writer[*item]
	now        func() time.Time

	// used by the writer goroutine only
	inserts     [chunk + 1]*sql.Stmt // by row count
	find, touch *sql.Stmt
	args        []any

	commits atomic.Int64 // for the checkpointer: has anything been written?

	mu      sync.RWMutex
	streams map[string]stream.Stream
}

// item is one queued append; fields after ev are prepared by the caller's
// goroutine so the writer only binds and executes.
type item struct {
	streamID string
	sourceID string
	ev       *stream.Event
	sha      [32]byte
	occurred string
	res      *stream.AppendResult
}

// Size is what an item holds in memory while queued (groupcommit.Sizer).
func (it *item) Size() int {
	return len(it.ev.Payload) + len(it.ev.Metadata) + len(it.ev.NativeID) + len(it.ev.DeliveryHandle) + 256
}

// Open opens (creating and migrating) the database at path. Call Run to
// start the writer and Close when done.
func Open(path string, cfg Config) (*Backend, error) {
	write, err := sqlitedb.Open(path, sqlitedb.Options{Synchronous: cfg.Synchronous, MaxConns: 1, ManualCheckpoint: true})
	if err != nil {
		return nil, err
	}
	sub, _ := fs.Sub(migrations, "migrations")
	if err := sqlitedb.Migrate(context.Background(), write, sub); err != nil {
		write.Close()
		return nil, err
	}
	read, err := sqlitedb.Open(path, sqlitedb.Options{Synchronous: cfg.Synchronous, MaxConns: 4, ReadOnly: true})
	if err != nil {
		write.Close()
		return nil, err
	}
	checkpoint, err := sqlitedb.Open(path, sqlitedb.Options{Synchronous: cfg.Synchronous, MaxConns: 1})
	if err != nil {
		write.Close()
		read.Close()
		return nil, err
	}
	b := &Backend{
		path:       path,
		write:      write,
		read:       read,
		checkpoint: checkpoint,
		now:        cfg.Now,
		streams:    map[string]stream.Stream{},
	}
	if b.now == nil {
		b.now = time.Now
	}
	b.find, err = write.Prepare(`SELECT "offset" FROM stream_events
		WHERE stream_id = ? AND source_native_id = ? AND event_variant = ?`)
	if err == nil {
		b.touch, err = write.Prepare(`UPDATE stream_events SET last_seen_at = ?, attempt_count = attempt_count + 1
		WHERE stream_id = ? AND source_native_id = ? AND event_variant = ? AND payload_sha256 = ?
		RETURNING "offset", created_at`)
	}
	for n := 1; n <= chunk && err == nil; n++ {
		b.inserts[n], err = write.Prepare(insertColumns + insertRow + strings.Repeat(","+insertRow, n-1) + insertConflict)
	}
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("prepare: %w", err)
	}
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = DefaultQueueBytes
	}
	b.writer = groupcommit.New(b.flush, groupcommit.Config{MaxBatch: cfg.MaxBatch, QueueSize: cfg.QueueSize, QueueBytes: cfg.QueueBytes, Observe: cfg.Observe})
	return b, nil
}

// CheckpointInterval is how often Run checkpoints the WAL when something
// was committed. Small checkpoints often keep each one short, which keeps
// the writer's fsyncs from queueing behind a long one (measured in
// BENCHMARKS.md).
const CheckpointInterval = 10 * time.Millisecond

// Run runs the writer until ctx ends, then writes what is still queued.
// Beside it, Run checkpoints the WAL into the database file every
// CheckpointInterval on its own connection, so the writer never pays for
// a checkpoint inside a commit.
func (b *Backend) Run(ctx context.Context) error {
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

// Close checkpoints and closes the database. Run must have returned.
func (b *Backend) Close() error {
	sqlitedb.Checkpoint(context.Background(), b.checkpoint)
	return errors.Join(b.write.Close(), b.read.Close(), b.checkpoint.Close())
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
	if s, ok := b.streamByID(sourceID); ok {
		return s, nil
	}
	now := b.now().UTC()
	if _, err := b.write.ExecContext(ctx, `INSERT INTO streams (stream_id, source_id, stream_key, backend, created_at)
		VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`, sourceID, sourceID, sourceID, BackendName, now.Format(sqlitedb.Time)); err != nil {
		return stream.Stream{}, fmt.Errorf("ensure stream %s: %w", sourceID, err)
	}
	var s stream.Stream
	var created string
	if err := b.write.QueryRowContext(ctx, `SELECT stream_id, source_id, backend, created_at FROM streams WHERE source_id = ?`, sourceID).
		Scan(&s.ID, &s.SourceID, &s.Backend, &created); err != nil {
		return stream.Stream{}, fmt.Errorf("ensure stream %s: %w", sourceID, err)
	}
	s.CreatedAt, _ = time.Parse(sqlitedb.Time, created)
	b.mu.Lock()
	b.streams[s.ID] = s
	b.mu.Unlock()
	return s, nil
}

func (b *Backend) streamByID(id string) (stream.Stream, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	s, ok := b.streams[id]
	return s, ok
}

// AppendAsync queues events for streamID and returns; done is called from
// the writer goroutine with one result per event after their transaction
// committed, or with an error (nothing was stored) when it failed. done must
// not block. AppendAsync blocks while the queue is full, and returns ctx's
// error, stream.ErrStreamNotFound or groupcommit.ErrClosed without queueing.
func (b *Backend) AppendAsync(ctx context.Context, streamID string, events []stream.Event, done func([]stream.AppendResult, error)) error {
	items, results, err := b.prepare(streamID, events)
	if err != nil {
		return err
	}
	return b.writer.Enqueue(ctx, items, func(err error) { done(results, err) })
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
	s, ok := b.streamByID(streamID)
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s", stream.ErrStreamNotFound, streamID)
	}
	results := make([]stream.AppendResult, len(events))
	items := make([]*item, len(events))
	backing := make([]item, len(events))
	for i := range events {
		sum := sha256.Sum256(events[i].Payload)
		backing[i] = item{
			streamID: s.ID,
			sourceID: s.SourceID,
			ev:       &events[i],
			sha:      sum,
			occurred: events[i].OccurredAt.UTC().Format(sqlitedb.Time),
			res:      &results[i],
		}
		items[i] = &backing[i]
	}
	return items, results, nil
}

// chunk is how many events one INSERT statement writes.
const chunk = 4

const insertColumns = `INSERT INTO stream_events (stream_id, source_id,
	source_native_id, event_variant, event_type, occurred_at, metadata_json, raw_payload_json,
	delivery_handle_json, payload_sha256, source_sequence, created_at, last_seen_at) VALUES `

const insertRow = "(?,?,?,?,?,?,?,?,?,?,?,?,?)"

const insertConflict = ` ON CONFLICT (stream_id, source_native_id, event_variant) DO NOTHING`

// flush writes one batch in one transaction. It runs on the writer
// goroutine only.
//
// Events go in by multi-row INSERTs of up to chunk rows that skip
// identities already stored. When a statement inserted every row (the
// common case), the rows' offsets are the consecutive ones ending at its
// last insert id. Otherwise each row of that statement is looked up:
// rows this statement inserted have offsets past the previous high
// watermark; every other row is a redelivery, counted, or a conflict.
func (b *Backend) flush(ctx context.Context, batch []*item) error {
	// Truncated to the stored precision, so that the StoredAt of the first
	// delivery equals the one a redelivery reads back from created_at.
	now := b.now().UTC().Truncate(time.Microsecond)
	nowText := now.Format(sqlitedb.Time)
	tx, err := b.write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("append: begin: %w", err)
	}
	defer tx.Rollback()
	full := tx.StmtContext(ctx, b.inserts[chunk]) // bound to the transaction once, for every full chunk
	for len(batch) > 0 {
		part := batch[:min(chunk, len(batch))]
		batch = batch[len(part):]
		args := b.args[:0]
		for _, it := range part {
			ev := it.ev
			var handle any
			if len(ev.DeliveryHandle) > 0 {
				handle = string(ev.DeliveryHandle)
			}
			metadata := "{}"
			if len(ev.Metadata) > 0 {
				metadata = string(ev.Metadata)
			}
			var seq any
			if ev.Sequence != nil {
				seq = *ev.Sequence
			}
			args = append(args, it.streamID, it.sourceID, ev.NativeID, ev.Variant,
				ev.Type, it.occurred, metadata, string(ev.Payload), handle, it.sha[:], seq, nowText, nowText)
		}
		b.args = args
		ins := full
		if len(part) < chunk {
			ins = tx.StmtContext(ctx, b.inserts[len(part)])
		}
		r, err := ins.ExecContext(ctx, args...)
		clear(args)
		if err != nil {
			return fmt.Errorf("append: insert: %w", err)
		}
		inserted, _ := r.RowsAffected()
		last, _ := r.LastInsertId()
		if int(inserted) == len(part) {
			for i, it := range part {
				it.res.Offset = last - int64(len(part)-1-i)
				it.res.StoredAt = now
			}
			continue
		}
		if err := b.sortOut(ctx, tx, part, inserted, last, now, nowText); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("append: commit: %w", err)
	}
	b.commits.Add(1)
	return nil
}

// sortOut sets the results of a statement that did not insert every row.
func (b *Backend) sortOut(ctx context.Context, tx *sql.Tx, part []*item, inserted, last int64, now time.Time, nowText string) error {
	firstNew := last - inserted + 1
	if inserted == 0 {
		firstNew = math.MaxInt64
	}
	lookup, touch := tx.StmtContext(ctx, b.find), tx.StmtContext(ctx, b.touch)
	claimed := make(map[[2]string]bool, len(part))
	for _, it := range part {
		ev := it.ev
		key := [2]string{ev.NativeID, ev.Variant}
		var off int64
		if err := lookup.QueryRowContext(ctx, it.streamID, ev.NativeID, ev.Variant).Scan(&off); err != nil {
			return fmt.Errorf("append: look up %s: %w", ev.NativeID, err)
		}
		if off >= firstNew && !claimed[key] {
			claimed[key] = true
			it.res.Offset, it.res.StoredAt = off, now
			continue
		}
		var created string
		err := touch.QueryRowContext(ctx, nowText, it.streamID, ev.NativeID, ev.Variant, it.sha[:]).Scan(&it.res.Offset, &created)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			it.res.Offset, it.res.Err = off, stream.ErrConflict
		case err != nil:
			return fmt.Errorf("append: redelivery of %s: %w", ev.NativeID, err)
		default:
			it.res.Duplicate = true
			it.res.StoredAt, _ = time.Parse(sqlitedb.Time, created)
		}
	}
	return nil
}

// Stats summarises streamID.
func (b *Backend) Stats(ctx context.Context, streamID string) (stream.Stats, error) {
	st := stream.Stats{StreamID: streamID}
	err := b.read.QueryRowContext(ctx, `SELECT count(*), coalesce(min("offset"), 0), coalesce(max("offset"), 0)
		FROM stream_events WHERE stream_id = ?`, streamID).Scan(&st.Events, &st.FirstOffset, &st.LastOffset)
	if err != nil {
		return st, fmt.Errorf("stream stats %s: %w", streamID, err)
	}
	return st, nil
}

// ReadDB returns the backend's read-only connection pool, for queries that
// have no method yet (operator tools, tests).
func (b *Backend) ReadDB() *sql.DB { return b.read }
