package streamsqlite_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

func open(t testing.TB, cfg streamsqlite.Config) (*streamsqlite.Backend, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "postbox.db")
	b, err := streamsqlite.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; b.Close() })
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
