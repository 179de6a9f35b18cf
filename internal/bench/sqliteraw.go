package bench

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// rawRow is one event of the SQLite baseline, prepared by its device's
// goroutine as the server prepares an append: the writer only binds and
// executes.
type rawRow struct {
	id, occurred, metadata string
	payload                []byte
	sha                    [32]byte
}

// rawChunk is how many rows one INSERT of the SQLite baseline writes, as
// the SQLite stream backend does.
const rawChunk = 4

const rawInsertRow = "(?,?,?,?,?,?,?,?,?)"

// runRawSQLite inserts the run's events into a fresh SQLite database with
// the stream backend's schema (the same table, the same unique identity
// index, the same INSERT OR IGNORE), on the same disk as a started
// server's, through a plain group commit: one writer goroutine takes everything queued (up to maxBatch
// rows), inserts it in one transaction of multi-row INSERTs and commits
// with synchronous=FULL (or sync), while one producer per device keeps at
// most window events unacknowledged. No server, no WebSocket, no envelope
// decoding, no offsets or redelivery checks: the ceiling postbox on
// SQLite is measured against. A frame's latency runs from its enqueue to
// its commit.
func runRawSQLite(ctx context.Context, progress io.Writer, rb rawBench, maxBatch, queueSize int, sync string, res *IngestResult) error {
	dir, err := os.MkdirTemp("", "postbox-bench-raw-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "postbox.db")
	// The stream backend makes the schema and the devices' stream.
	be, err := streamsqlite.Open(path, streamsqlite.Config{Synchronous: sync})
	if err != nil {
		return fmt.Errorf("bench --raw: %w", err)
	}
	st, err := be.EnsureStream(ctx, server.DeviceSource)
	if err == nil {
		err = be.Close()
	} else {
		be.Close()
	}
	if err != nil {
		return fmt.Errorf("bench --raw: %w", err)
	}
	db, err := sqlitedb.Open(path, sqlitedb.Options{Synchronous: sync, MaxConns: 1})
	if err != nil {
		return fmt.Errorf("bench --raw: %w", err)
	}
	defer db.Close()
	var streamNo int64
	if err := db.QueryRowContext(ctx, `SELECT stream_no FROM streams WHERE stream_id = ?`, st.ID).Scan(&streamNo); err != nil {
		return fmt.Errorf("bench --raw: stream %s: %w", st.ID, err)
	}
	ins := make([]*sql.Stmt, rawChunk+1)
	for n := 1; n <= rawChunk; n++ {
		q := `INSERT OR IGNORE INTO stream_events (pos, stream_id, source_native_id, event_type, occurred_at,
			metadata_json, raw_payload_json, payload_sha256, created_at) VALUES ` +
			rawInsertRow + strings.Repeat(","+rawInsertRow, n-1)
		if ins[n], err = db.Prepare(q); err != nil {
			return fmt.Errorf("bench --raw: %w", err)
		}
		defer ins[n].Close()
	}
	pos := streamNo << 40
	args := make([]any, 0, 9*rawChunk)
	flush := func(ctx context.Context, batch []*rawRow) error {
		now := time.Now().UTC().Format(sqlitedb.Time)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		first := pos
		var full *sql.Stmt
		for len(batch) > 0 {
			n := min(rawChunk, len(batch))
			stmt := full
			if n < rawChunk || full == nil {
				stmt = tx.StmtContext(ctx, ins[n])
				if n == rawChunk {
					full = stmt
				}
			}
			args = args[:0]
			for _, r := range batch[:n] {
				pos++
				args = append(args, pos, st.ID, r.id, "proposal.task", r.occurred,
					r.metadata, string(r.payload), r.sha[:], now)
			}
			batch = batch[n:]
			if _, err := stmt.ExecContext(ctx, args...); err != nil {
				pos = first
				return err
			}
		}
		if err := tx.Commit(); err != nil {
			pos = first
			return err
		}
		return nil
	}
	w := groupcommit.New(flush, groupcommit.Config{MaxBatch: maxBatch, QueueSize: queueSize})
	wctx, stopWriter := context.WithCancel(ctx)
	defer stopWriter()
	writerDone := make(chan error, 1)
	go func() { writerDone <- w.Run(wctx) }()

	err = rb.load(ctx, progress, res, func(ctx context.Context, device string, n int, acked, nacked *atomic.Int64, lat *latencies) error {
		return rawSQLiteProducer(ctx, w, rb, device, n, acked, nacked, lat)
	})
	stopWriter()
	<-writerDone
	if err != nil {
		return fmt.Errorf("bench --raw: %w", err)
	}
	res.Stored, res.Duplicates, err = countStored(ctx, db.QueryRowContext, st.ID, rb.idPrefix)
	if err != nil {
		return fmt.Errorf("bench --raw: count: %w", err)
	}
	return nil
}

// rawSQLiteProducer enqueues n events of one device in frames, keeping at
// most window events unacknowledged.
func rawSQLiteProducer(ctx context.Context, w *groupcommit.Writer[*rawRow], rb rawBench, device string, n int,
	acked, nacked *atomic.Int64, lat *latencies) error {
	slots := make(chan struct{}, max(rb.window/rb.frame, 1))
	failed := make(chan error, 1)
	ts := time.Now().UTC()
	occurred := ts.Format(sqlitedb.Time)
	metadata := `{"device_id":"` + device + `","session_id":"sess_bench","schema_version":1}`
	for sent := 0; sent < n; sent += rb.frame {
		msgs := deviceFrame(rb.idPrefix, device, ts.Format(time.RFC3339Nano), rb.payload, min(rb.frame, n-sent))
		select {
		case slots <- struct{}{}:
		case err := <-failed:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
		t0 := time.Now()
		rows := make([]*rawRow, len(msgs))
		for i, m := range msgs {
			rows[i] = &rawRow{id: m.EventID, occurred: occurred, metadata: metadata, payload: rb.payload,
				sha: sha256.Sum256(rb.payload)}
		}
		err := w.Enqueue(ctx, rows, func(err error) {
			if err != nil {
				nacked.Add(int64(len(rows)))
				select {
				case failed <- err:
				default:
				}
			} else {
				acked.Add(int64(len(rows)))
				lat.add(time.Since(t0), len(rows))
			}
			<-slots
		})
		if err != nil {
			return err
		}
	}
	for range cap(slots) { // wait for the last frames
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case err := <-failed:
		return err
	default:
		return nil
	}
}
