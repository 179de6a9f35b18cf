// Package streampg keeps postbox streams, their events and their consumers
// in PostgreSQL, so that several postbox processes can share them through
// one database.
//
// Offsets. Each stream has a row in streams holding its high watermark,
// last_offset. Append runs one READ COMMITTED transaction: it locks the
// stream's row (an UPDATE, which also takes the stored time), looks up the
// identities of the batch already stored, numbers only the new events
// last_offset+1, +2, ..., inserts them, moves last_offset and commits.
// Appenders of one stream, in this process or another, take turns on the
// row lock, so a stream's offsets are dense and never handed out twice;
// appenders of different streams do not wait for each other. last_offset
// never goes down, so an offset is never reused, also after Trim deleted
// its event. The unique key (stream_id, native_id, variant) holds an
// identity once while its event is kept; the insert says ON CONFLICT DO
// NOTHING and Append fails should a row ever be skipped, which the lock
// rules out.
//
// Idempotence. Payloads are stored as bytea, exactly as given (jsonb would
// rewrite them), and a redelivery is a duplicate when its type and payload
// bytes are those stored, a stream.ConflictError otherwise.
//
// Stored time. An event's StoredAt is the database's clock_timestamp()
// taken under the stream's lock, and never earlier than the stream's
// previous append: stored times do not decrease along offsets, whichever
// process appended, so start policy at_time is an index lookup on
// (stream_id, stored_at).
//
// Durability. Append returns after PostgreSQL committed the transaction:
// what it reports is as durable as the server makes a commit
// (synchronous_commit, replication), and a failed or interrupted Append
// stored nothing of its call.
//
// Waiting. Append sends a NOTIFY in its transaction, delivered when it
// commits. The Backend's Wait shares one listening connection, taken from
// the pool at the first Wait and kept until Close; a waiter checks the high
// watermark after the LISTEN is in place, so no append slips between.
//
// Every table lives in Config.Schema, created and migrated by Open.
package streampg

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-events/postbox/internal/pgmigrate"
	"github.com/postbox-events/postbox/stream"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations holds the SQL files that create and upgrade the tables, in
// the order they apply, for users who run migrations with their own tool.
// Open applies them with the schema first in search_path.
var Migrations fs.FS = pgmigrate.Dir(migrations, "migrations")

// BackendName is the name this backend records in streams.backend.
const BackendName = "postgres"

// DefaultSchema is the default of Config.Schema.
const DefaultSchema = "postbox"

// Channel is the LISTEN/NOTIFY channel appends notify; the payload is
// "schema/stream id".
const Channel = "postbox_streams"

// DefaultReadLimit is the limit of a Read asked for 0 events; MaxReadLimit
// bounds every Read.
const (
	DefaultReadLimit = 1000
	MaxReadLimit     = 10000
)

// Config configures a Backend. Set URL or Pool.
type Config struct {
	// URL is a PostgreSQL connection string; Open makes a pool of it and
	// Close closes that pool.
	URL string
	// Pool is used instead of URL when set; Close leaves it open. Wait
	// holds one of its connections from the first Wait until Close.
	Pool *pgxpool.Pool
	// Schema holds the tables; Open creates it if needed. Letters, digits
	// and _, at most 63 bytes. Defaults to DefaultSchema.
	Schema string
}

// Backend is a stream.Backend in PostgreSQL. Several Backends, in one
// process or many, may share a schema.
type Backend struct {
	pool     *pgxpool.Pool
	ownPool  bool
	schema   string
	listener *listener
	moves    atomic.Int64 // consumer moves recorded, for pruning consumer_commits
}

var (
	_ stream.Backend = (*Backend)(nil)
	_ stream.Waiter  = (*Backend)(nil)
	_ stream.Trimmer = (*Backend)(nil)
	_ stream.Scanner = (*Backend)(nil)
	_ stream.Auditor = (*Backend)(nil)
)

var schemaName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Open connects, creates Config.Schema if needed and migrates it.
func Open(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.Schema == "" {
		cfg.Schema = DefaultSchema
	}
	if !schemaName.MatchString(cfg.Schema) {
		return nil, fmt.Errorf("streampg: schema %q: want letters, digits and _, at most 63 bytes, not starting with a digit", cfg.Schema)
	}
	b := &Backend{pool: cfg.Pool, schema: cfg.Schema}
	if b.pool == nil {
		if cfg.URL == "" {
			return nil, errors.New("streampg: Config needs a URL or a Pool")
		}
		pool, err := pgxpool.New(ctx, cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("streampg: %w", err)
		}
		b.pool, b.ownPool = pool, true
	}
	if err := pgmigrate.Apply(ctx, b.pool, "streams", Migrations, b.schema); err != nil {
		b.Close()
		return nil, fmt.Errorf("streampg: schema %s: %w", b.schema, err)
	}
	b.listener = newListener(b.pool, b.schema)
	return b, nil
}

// Close stops the listener and closes the pool Open made.
func (b *Backend) Close() error {
	if b.listener != nil {
		b.listener.close()
	}
	if b.ownPool {
		b.pool.Close()
	}
	return nil
}

// q returns query with every "{s}." naming the backend's schema.
func (b *Backend) q(query string) string {
	return strings.ReplaceAll(query, "{s}.", pgx.Identifier{b.schema}.Sanitize()+".")
}

// EnsureStream implements stream.Backend. The stream's id is its source id.
func (b *Backend) EnsureStream(ctx context.Context, sourceID string) (stream.Stream, error) {
	if sourceID == "" {
		return stream.Stream{}, errors.New("ensure stream: empty source id")
	}
	if _, err := b.pool.Exec(ctx, b.q(`INSERT INTO {s}.streams (stream_id, source_id, backend) VALUES ($1, $1, $2)
		ON CONFLICT DO NOTHING`), sourceID, BackendName); err != nil {
		return stream.Stream{}, fmt.Errorf("ensure stream %s: %w", sourceID, err)
	}
	s, err := b.streamRow(ctx, b.pool, sourceID)
	if err != nil {
		return stream.Stream{}, fmt.Errorf("ensure stream %s: %w", sourceID, err)
	}
	return s, nil
}

type queryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func (b *Backend) streamRow(ctx context.Context, q queryer, id string) (stream.Stream, error) {
	var s stream.Stream
	err := q.QueryRow(ctx, b.q(`SELECT stream_id, source_id, backend, created_at FROM {s}.streams WHERE stream_id = $1`), id).
		Scan(&s.ID, &s.SourceID, &s.Backend, &s.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("%w: %s", stream.ErrStreamNotFound, id)
	}
	s.CreatedAt = s.CreatedAt.UTC()
	return s, err
}

// Streams implements stream.Backend.
func (b *Backend) Streams(ctx context.Context) ([]stream.Stream, error) {
	rows, err := b.pool.Query(ctx, b.q(`SELECT stream_id, source_id, backend, created_at FROM {s}.streams ORDER BY stream_id COLLATE "C"`))
	if err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stream.Stream, error) {
		var s stream.Stream
		err := r.Scan(&s.ID, &s.SourceID, &s.Backend, &s.CreatedAt)
		s.CreatedAt = s.CreatedAt.UTC()
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	return out, nil
}

// key is an event's identity within its stream.
type key struct{ native, variant string }

// stored is what Append needs of an event already stored.
type stored struct {
	offset   int64
	typ      string
	payload  []byte
	storedAt time.Time
}

// Append implements stream.Backend in one transaction (see the package
// documentation): all of the call's events are stored, or none.
func (b *Backend) Append(ctx context.Context, streamID string, events []stream.Event) ([]stream.AppendResult, error) {
	results := make([]stream.AppendResult, len(events))
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("append to %s: %w", streamID, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	// Lock the stream and take the stored time under the lock.
	var last int64
	var now time.Time
	err = tx.QueryRow(ctx, b.q(`UPDATE {s}.streams SET last_stored_at = greatest(clock_timestamp(), last_stored_at)
		WHERE stream_id = $1 RETURNING last_offset, last_stored_at`), streamID).Scan(&last, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", stream.ErrStreamNotFound, streamID)
	}
	if err != nil {
		return nil, fmt.Errorf("append to %s: lock stream: %w", streamID, err)
	}
	now = now.UTC()
	if len(events) == 0 {
		return results, tx.Commit(ctx)
	}

	// The identities of the call already stored.
	natives := make([]string, 0, len(events))
	variants := make([]string, 0, len(events))
	seen := make(map[key]*stored, len(events))
	for i := range events {
		k := key{events[i].NativeID, events[i].Variant}
		if _, ok := seen[k]; !ok {
			seen[k] = nil
			natives, variants = append(natives, k.native), append(variants, k.variant)
		}
	}
	rows, err := tx.Query(ctx, b.q(`SELECT e.native_id, e.variant, e.event_offset, e.event_type, e.payload, e.stored_at
		FROM {s}.stream_events e JOIN unnest($2::text[], $3::text[]) AS k (native_id, variant)
		ON e.native_id = k.native_id AND e.variant = k.variant
		WHERE e.stream_id = $1`), streamID, natives, variants)
	if err != nil {
		return nil, fmt.Errorf("append to %s: look up identities: %w", streamID, err)
	}
	for rows.Next() {
		var k key
		s := &stored{}
		if err := rows.Scan(&k.native, &k.variant, &s.offset, &s.typ, &s.payload, &s.storedAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("append to %s: look up identities: %w", streamID, err)
		}
		s.storedAt = s.storedAt.UTC()
		seen[k] = s
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("append to %s: look up identities: %w", streamID, err)
	}

	// Number the new events; report duplicates and conflicts.
	var (
		offsets                  []int64
		ins, vars, types         []string
		occurred                 []time.Time
		seqs                     []*int64
		metas, payloads, handles [][]byte
	)
	for i := range events {
		ev := &events[i]
		k := key{ev.NativeID, ev.Variant}
		if s := seen[k]; s != nil {
			r := &results[i]
			r.Offset, r.StoredAt = s.offset, s.storedAt
			r.Err = stream.Conflict(&stream.Event{Type: s.typ, Payload: s.payload}, ev)
			r.Duplicate = r.Err == nil
			continue
		}
		last++
		seen[k] = &stored{offset: last, typ: ev.Type, payload: ev.Payload, storedAt: now}
		results[i] = stream.AppendResult{Offset: last, StoredAt: now}
		meta := []byte(ev.Metadata)
		if len(meta) == 0 {
			meta = []byte("{}")
		}
		payload := []byte(ev.Payload)
		if payload == nil {
			payload = []byte{}
		}
		var handle []byte
		if len(ev.DeliveryHandle) > 0 {
			handle = ev.DeliveryHandle
		}
		offsets = append(offsets, last)
		ins, vars, types = append(ins, ev.NativeID), append(vars, ev.Variant), append(types, ev.Type)
		occurred = append(occurred, ev.OccurredAt)
		seqs = append(seqs, ev.Sequence)
		metas, payloads, handles = append(metas, meta), append(payloads, payload), append(handles, handle)
	}
	if len(offsets) == 0 {
		return results, tx.Commit(ctx)
	}

	var batch pgx.Batch
	insert := batch.Queue(b.q(`INSERT INTO {s}.stream_events (stream_id, event_offset, native_id, variant, event_type,
		occurred_at, source_sequence, metadata, payload, delivery_handle, stored_at)
		SELECT $1, u.o, u.n, u.v, u.t, u.oc, u.sq, u.m, u.p, u.d, $11
		FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::bigint[],
			$8::bytea[], $9::bytea[], $10::bytea[]) AS u (o, n, v, t, oc, sq, m, p, d)
		ON CONFLICT (stream_id, native_id, variant) DO NOTHING`),
		streamID, offsets, ins, vars, types, occurred, seqs, metas, payloads, handles, now)
	var inserted int64
	insert.Exec(func(ct pgconn.CommandTag) error {
		inserted = ct.RowsAffected()
		return nil
	})
	batch.Queue(b.q(`UPDATE {s}.streams SET last_offset = $2 WHERE stream_id = $1`), streamID, last)
	batch.Queue(`SELECT pg_notify($1, $2)`, Channel, b.schema+"/"+streamID)
	if err := tx.SendBatch(ctx, &batch).Close(); err != nil {
		return nil, fmt.Errorf("append to %s: %w", streamID, err)
	}
	if inserted != int64(len(offsets)) {
		return nil, fmt.Errorf("append to %s: stored %d of %d new events: an identity was inserted without the stream's lock", streamID, inserted, len(offsets))
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("append to %s: commit: %w", streamID, err)
	}
	return results, nil
}
