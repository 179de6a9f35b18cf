package streamsqlite_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

func open(t testing.TB, cfg streamsqlite.Config) (*streamsqlite.Backend, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "postbox.db")
	r := start(t, path, cfg)
	t.Cleanup(func() { r.Close() })
	b := r.Backend
	if _, err := b.EnsureStream(context.Background(), "devices"); err != nil {
		t.Fatal(err)
	}
	return b, path
}

func event(id, payload string) stream.Event {
	return stream.Event{NativeID: id, Type: "proposal.task", OccurredAt: time.Now(), Payload: json.RawMessage(payload)}
}

func TestPragmasOnEveryConnection(t *testing.T) {
	b, _ := open(t, streamsqlite.Config{})
	for i := 0; i < 4; i++ {
		mode, sync, busy, err := sqlitedb.Pragmas(context.Background(), b.ReadDB())
		if err != nil {
			t.Fatal(err)
		}
		if mode != "wal" || sync != 2 || busy != 5000 {
			t.Fatalf("journal_mode=%s synchronous=%d busy_timeout=%d, want wal/2(FULL)/5000", mode, sync, busy)
		}
	}
}

func TestAppendDuplicateAndConflict(t *testing.T) {
	b, _ := open(t, streamsqlite.Config{})
	ctx := context.Background()
	first, err := b.Append(ctx, "devices", []stream.Event{event("evt_1", `{"a":1}`)})
	if err != nil || first[0].Duplicate || first[0].Err != nil || first[0].Offset == 0 {
		t.Fatalf("first append: %+v %v", first, err)
	}
	for i := 0; i < 5; i++ {
		again, err := b.Append(ctx, "devices", []stream.Event{event("evt_1", `{"a":1}`)})
		if err != nil || !again[0].Duplicate || again[0].Offset != first[0].Offset || !again[0].StoredAt.Equal(first[0].StoredAt) {
			t.Fatalf("redelivery %d: %+v %v (first %+v)", i, again, err, first)
		}
	}
	conflict, err := b.Append(ctx, "devices", []stream.Event{event("evt_1", `{"a":2}`)})
	if err != nil || !errors.Is(conflict[0].Err, stream.ErrConflict) {
		t.Fatalf("conflict: %+v %v", conflict, err)
	}
	var n, attempts int
	var payload string
	if err := b.ReadDB().QueryRow(`SELECT count(*), max(attempt_count), max(raw_payload_json) FROM stream_events WHERE source_native_id = 'evt_1'`).Scan(&n, &attempts, &payload); err != nil {
		t.Fatal(err)
	}
	if n != 1 || attempts != 6 || payload != `{"a":1}` {
		t.Fatalf("rows=%d attempts=%d payload=%s, want 1, 6, the first payload", n, attempts, payload)
	}
}

func TestAppendUnknownStream(t *testing.T) {
	b, _ := open(t, streamsqlite.Config{})
	if _, err := b.Append(context.Background(), "nope", []stream.Event{event("e", `{}`)}); !errors.Is(err, stream.ErrStreamNotFound) {
		t.Fatalf("got %v", err)
	}
}

func TestDuplicateWithinOneBatch(t *testing.T) {
	b, _ := open(t, streamsqlite.Config{})
	res, err := b.Append(context.Background(), "devices", []stream.Event{event("x", `{}`), event("x", `{}`), event("x", `{"b":1}`)})
	if err != nil || res[0].Duplicate || !res[1].Duplicate || !errors.Is(res[2].Err, stream.ErrConflict) {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestReopenKeepsEvents(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.db")
	for round := 0; round < 2; round++ {
		b, err := streamsqlite.Open(path, streamsqlite.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { b.Run(ctx); close(done) }()
		if _, err := b.EnsureStream(ctx, "devices"); err != nil {
			t.Fatal(err)
		}
		res, err := b.Append(ctx, "devices", []stream.Event{event(fmt.Sprint("e", round), `{}`), event("e0", `{}`)})
		if err != nil || res[1].Duplicate != true {
			t.Fatalf("round %d: %+v %v", round, res, err)
		}
		st, _ := b.Stats(ctx, "devices")
		if st.Events != int64(round+1) {
			t.Fatalf("round %d: %d events", round, st.Events)
		}
		cancel()
		<-done
		b.Close()
	}
}

func BenchmarkAppend(b *testing.B) {
	for _, batch := range []int{1, 64, 1024} {
		b.Run(fmt.Sprint("batch=", batch), func(b *testing.B) {
			be, _ := open(b, streamsqlite.Config{})
			payload := json.RawMessage(`{"intent":"server.log_summary","confidence":0.84,"user_text":"summarize last night crash logs and tell me what went wrong with the deploy, please, thanks","n":0000000}`)
			evs := make([]stream.Event, batch)
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				for j := range evs {
					evs[j] = stream.Event{NativeID: fmt.Sprintf("evt_%d_%d", i, j), Type: "t", OccurredAt: time.Now(), Payload: payload}
				}
				if _, err := be.Append(context.Background(), "devices", evs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkAppendParallel appends from many goroutines at once, as the
// ingress does: callers prepare their events concurrently and the writer
// groups them into commits.
func BenchmarkAppendParallel(b *testing.B) {
	be, _ := open(b, streamsqlite.Config{})
	payload := json.RawMessage(`{"intent":"server.log_summary","confidence":0.84,"user_text":"summarize last night crash logs and tell me what went wrong with the deploy, please, thanks","n":0000000}`)
	b.SetParallelism(8)
	var seq atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := seq.Add(1)
		evs := make([]stream.Event, 0, 64)
		i := 0
		flush := func() {
			if _, err := be.Append(context.Background(), "devices", evs); err != nil {
				b.Error(err)
			}
			evs = evs[:0]
		}
		for pb.Next() {
			i++
			evs = append(evs, stream.Event{NativeID: fmt.Sprintf("evt_%d_%d", g, i), Type: "t", OccurredAt: time.Now(), Payload: payload})
			if len(evs) == cap(evs) {
				flush()
			}
		}
		flush()
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// running is a Backend whose writer runs until Close.
type running struct {
	*streamsqlite.Backend
	stop func()
}

func (r *running) Close() error { r.stop(); return r.Backend.Close() }

func start(t testing.TB, path string, cfg streamsqlite.Config) *running {
	t.Helper()
	b, err := streamsqlite.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()
	return &running{Backend: b, stop: func() { cancel(); <-done }}
}

// TestMigrateFromGlobalOffsets opens a file written by the first schema,
// whose offsets were one sequence for all streams, and finds each
// stream's events numbered 1, 2, 3, ... in their old order.
func TestMigrateFromGlobalOffsets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sqlitedb.Open(path, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	schema, err := os.ReadFile("migrations/0001_streams.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(string(schema) + `; PRAGMA user_version = 1;
		INSERT INTO streams VALUES ('devices', 'devices', 'devices', 'sqlite', '2026-01-01T00:00:00.000000Z'),
		                           ('webhooks', 'webhooks', 'webhooks', 'sqlite', '2026-01-01T00:00:00.000000Z')`); err != nil {
		t.Fatal(err)
	}
	for i, s := range []string{"devices", "webhooks", "devices", "devices", "webhooks"} {
		payload := fmt.Sprintf(`{"i":%d}`, i)
		sum := sha256.Sum256([]byte(payload))
		if _, err := db.Exec(`INSERT INTO stream_events (stream_id, source_id, source_native_id, event_type, occurred_at,
			metadata_json, raw_payload_json, payload_sha256, created_at, last_seen_at) VALUES (?, ?, ?, 't', ?, '{}', ?, ?, ?, ?)`,
			s, s, fmt.Sprint("e", i), "2026-01-01T00:00:00.000000Z", payload, sum[:],
			fmt.Sprintf("2026-01-01T00:00:0%d.000000Z", i), "2026-01-01T00:00:00.000000Z"); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	b := start(t, path, streamsqlite.Config{})
	defer b.Close()
	ctx := context.Background()
	for s, want := range map[string][]string{"devices": {"e0", "e2", "e3"}, "webhooks": {"e1", "e4"}} {
		evs, err := b.ReadStream(ctx, s, 1, 100, nil)
		if err != nil || len(evs) != len(want) {
			t.Fatalf("%s: %d events, %v", s, len(evs), err)
		}
		for i, e := range evs {
			if e.Offset != int64(i+1) || e.NativeID != want[i] || e.ID != fmt.Sprintf("%s/%d", s, i+1) {
				t.Fatalf("%s event %d: offset %d id %s native %s, want offset %d native %s", s, i, e.Offset, e.ID, e.NativeID, i+1, want[i])
			}
		}
		st, err := b.Stats(ctx, s)
		if err != nil || st.LastOffset != int64(len(want)) || st.Events != int64(len(want)) {
			t.Fatalf("%s stats %+v %v", s, st, err)
		}
	}
	e1 := event("e1", `{"i":1}`)
	e1.Type = "t" // as stored: another type would be a conflict
	res, err := b.Append(ctx, "webhooks", []stream.Event{event("e5", `{}`), e1})
	if err != nil || res[0].Offset != 3 || !res[1].Duplicate || res[1].Offset != 1 {
		t.Fatalf("append after migration: %+v %v", res, err)
	}
}

// TestOneBatchManyStreams puts appends to two streams, with redeliveries
// and a conflict, and two functions (one failing) into one group commit:
// each stream's offsets stay dense, and only the failing function's
// writes are undone.
func TestOneBatchManyStreams(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.db")
	b, err := streamsqlite.Open(path, streamsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, s := range []string{"a", "b"} {
		if _, err := b.EnsureStream(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	type call struct {
		res []stream.AppendResult
		err error
	}
	var calls []chan call
	appendAsync := func(s string, evs ...stream.Event) {
		ch := make(chan call, 1)
		calls = append(calls, ch)
		if err := b.AppendAsync(ctx, s, evs, func(res []stream.AppendResult, err error) { ch <- call{res, err} }); err != nil {
			t.Fatal(err)
		}
	}
	fnErrs := make(chan error, 2)
	update := func(fail bool) {
		go func() {
			fnErrs <- b.Update(ctx, func(tx *sql.Tx) error {
				if _, err := tx.Exec(`CREATE TABLE IF NOT EXISTS scratch (fail INTEGER)`); err != nil {
					return err
				}
				if _, err := tx.Exec(`INSERT INTO scratch VALUES (?)`, fail); err != nil {
					return err
				}
				if fail {
					return errors.New("no")
				}
				return nil
			})
		}()
	}
	// The writer is not running yet: everything below lands in one batch,
	// functions between appends.
	appendAsync("a", event("1", `{}`), event("2", `{}`), event("1", `{}`))
	update(true)
	testenv.Eventually(t, 5*time.Second, "4 items queued", func() bool { return b.QueueLen() == 4 })
	appendAsync("b", event("1", `{}`), event("x", `{}`), event("x", `{"other":1}`), event("y", `{}`), event("z", `{}`))
	update(false)
	testenv.Eventually(t, 5*time.Second, "10 items queued", func() bool { return b.QueueLen() == 10 })
	appendAsync("a", event("3", `{}`))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { b.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done; b.Close() }()

	var got [][]stream.AppendResult
	for _, ch := range calls {
		c := <-ch
		if c.err != nil {
			t.Fatal(c.err)
		}
		got = append(got, c.res)
	}
	offsets := func(res []stream.AppendResult) (o []int64) {
		for _, r := range res {
			o = append(o, r.Offset)
		}
		return o
	}
	if o := offsets(got[0]); fmt.Sprint(o) != "[1 2 1]" || !got[0][2].Duplicate {
		t.Fatalf("stream a: %v %+v", o, got[0])
	}
	if o := offsets(got[1]); fmt.Sprint(o) != "[1 2 2 3 4]" || !errors.Is(got[1][2].Err, stream.ErrConflict) {
		t.Fatalf("stream b: %v %+v", o, got[1])
	}
	if o := offsets(got[2]); fmt.Sprint(o) != "[3]" {
		t.Fatalf("stream a, second call: %v", o)
	}
	failed := 0
	for range 2 {
		if err := <-fnErrs; err != nil {
			failed++
		}
	}
	var rows, kept int
	if err := b.ReadDB().QueryRow(`SELECT count(*), coalesce(sum(fail = 0), 0) FROM scratch`).Scan(&rows, &kept); err != nil || failed != 1 || rows != 1 || kept != 1 {
		t.Fatalf("functions: %d failed, scratch has %d rows (%d of the one that succeeded), %v", failed, rows, kept, err)
	}
}

// fill appends n events of about 300 bytes to "devices" in batches.
func fill(tb testing.TB, b *streamsqlite.Backend, n int) {
	tb.Helper()
	payload := json.RawMessage(`{"intent":"server.log_summary","confidence":0.84,"user_text":"summarize last night crash logs and tell me what went wrong with the deploy, please, thanks","n":0000000}`)
	meta := json.RawMessage(`{"device_id":"pi-1","session_id":"s-1"}`)
	evs := make([]stream.Event, 0, 2048)
	for i := 0; i < n; {
		evs = evs[:0]
		for ; i < n && len(evs) < cap(evs); i++ {
			evs = append(evs, stream.Event{NativeID: fmt.Sprintf("evt_%09d", i), Type: "proposal.task", OccurredAt: time.Now(), Metadata: meta, Payload: payload})
		}
		if _, err := b.Append(context.Background(), "devices", evs); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkRead reads a stream of 100,000 events from an offset in
// batches of 1,000, as a consumer does, without committing.
func BenchmarkRead(b *testing.B) {
	const stored = 100000
	be, _ := open(b, streamsqlite.Config{Synchronous: sqlitedb.SyncNormal})
	fill(b, be, stored)
	ctx := context.Background()
	if _, err := be.EnsureConsumer(ctx, stream.ConsumerConfig{ID: "reader", StreamID: "devices", Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	from := int64(1)
	for i := 0; i < b.N; i += 1000 {
		batch, err := be.Read(ctx, "reader", from, 1000)
		if err != nil || len(batch.Events) != 1000 {
			b.Fatalf("read from %d: %d events, %v", from, len(batch.Events), err)
		}
		if from += 1000; from > stored {
			from = 1
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkLag asks a consumer's lag with 1,000,000 events stored.
func BenchmarkLag(b *testing.B) {
	be, _ := open(b, streamsqlite.Config{Synchronous: sqlitedb.SyncNormal})
	fill(b, be, 1000000)
	ctx := context.Background()
	if _, err := be.EnsureConsumer(ctx, stream.ConsumerConfig{ID: "c", StreamID: "devices", Start: stream.Start{Policy: stream.StartAtOffset, Offset: 250000}}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		lag, err := be.Lag(ctx, "c")
		if err != nil || lag.Events != 750001 {
			b.Fatalf("lag %+v %v", lag, err)
		}
	}
}

// TestEnsureStreamWhileWriting creates streams while the writer is busy
// appending and committing: EnsureStream must not wait for the write
// connection while it holds what the writer needs to look a stream up
// (a deadlock that hung the first source created at run time).
func TestEnsureStreamWhileWriting(t *testing.T) {
	b := start(t, filepath.Join(t.TempDir(), "p.db"), streamsqlite.Config{})
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := b.EnsureStream(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.EnsureConsumer(ctx, stream.ConsumerConfig{ID: "c", StreamID: s.ID, Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			if _, err := b.Append(ctx, s.ID, []stream.Event{event(fmt.Sprint("e", i), `{}`)}); err != nil {
				return
			}
			b.Commit(ctx, "c", int64(i+1))
		}
	}()
	for i := range 200 {
		if _, err := b.EnsureStream(ctx, fmt.Sprint("new-", i)); err != nil {
			t.Fatalf("EnsureStream %d while the writer works: %v", i, err)
		}
	}
	cancel()
	<-done
}
