package delivery_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// plainBackend is a stream.Backend and nothing more: no stream.Waiter, no
// stream.Trimmer, no SQL.
type plainBackend struct{ stream.Backend }

// lostCommits drops every consumer commit, as a crash right after each
// batch's store transaction would.
type lostCommits struct{ stream.Backend }

func (lostCommits) Commit(context.Context, string, int64) (stream.Consumer, error) {
	return stream.Consumer{}, errors.New("test: the process stopped before this commit")
}

// readLog records the offsets Read is asked to read from.
type readLog struct {
	stream.Backend
	mu    sync.Mutex
	froms []int64
}

func (r *readLog) Read(ctx context.Context, consumerID string, from int64, limit int) (stream.Batch, error) {
	r.mu.Lock()
	r.froms = append(r.froms, from)
	r.mu.Unlock()
	return r.Backend.Read(ctx, consumerID, from, limit)
}

func (r *readLog) first() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.froms) == 0 {
		return 0
	}
	return r.froms[0]
}

// TestCrashBetweenPositionAndCommit: every batch's store transaction
// commits and every commit of the stream consumer is lost (a crash between
// the two). After a restart the subscription reads on from its position:
// it reads no batch again, makes no item twice and loses none, and its
// consumer catches up with the position.
func TestCrashBetweenPositionAndCommit(t *testing.T) { eachStore(t, testCrashBetweenPositionAndCommit) }

func testCrashBetweenPositionAndCommit(t *testing.T, kind storeKind) {
	path := filepath.Join(t.TempDir(), "p.db")
	e := open(t, kind, openOptions{streams: path, wrap: func(b stream.Backend) stream.Backend { return lostCommits{b} },
		cfg: delivery.Config{BatchSize: 100}})
	e.create(t, delivery.Subscription{Name: "s", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest}})
	e.appendEvents(t, "a", "t", 1000)
	e.waitLag(t, "s", 0)
	c, err := e.streams.Consumer(context.Background(), "s")
	if err != nil || c.NextOffset != 1 {
		t.Fatalf("stream consumer after lost commits: %+v %v, want next offset 1", c, err)
	}
	e.checkOnce(t, "s", 1000)
	e.stop()

	var reads *readLog
	e = open(t, kind, openOptions{streams: path, state: e.stateAt, wrap: func(b stream.Backend) stream.Backend {
		reads = &readLog{Backend: b}
		return reads
	}, cfg: delivery.Config{BatchSize: 100}})
	e.waitConsumer(t, "s", 1001) // the restarted loop commits the consumer up to its position
	if from := reads.first(); from != 1001 {
		t.Fatalf("after the restart the loop first read from offset %d, want its position 1001", from)
	}
	e.appendEvents(t, "b", "t", 500)
	e.waitLag(t, "s", 0)
	e.waitConsumer(t, "s", 1501)
	e.checkOnce(t, "s", 1500)
}

// TestSeparateStreamsAndStore: delivery runs on a stream backend that is
// neither its store nor a stream.Waiter nor a stream.Trimmer. Its loop
// polls, every event becomes one item in the store, the consumer follows,
// and retention trims nothing it cannot. SQLite only: a store of its own
// database beside the streams' is what it is about.
func TestSeparateStreamsAndStore(t *testing.T) {
	dir := t.TempDir()
	e := open(t, sqliteStore, openOptions{streams: filepath.Join(dir, "streams.db"), state: filepath.Join(dir, "delivery.db"),
		wrap: func(b stream.Backend) stream.Backend { return plainBackend{b} }, cfg: delivery.Config{BatchSize: 100}})
	var b stream.Backend = plainBackend{e.streams}
	if _, ok := b.(stream.Waiter); ok {
		t.Fatal("the wrapped backend is a stream.Waiter")
	}
	e.appendEvents(t, "a", "t", 300)
	e.create(t, delivery.Subscription{Name: "s", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest}})
	e.waitLag(t, "s", 0)
	time.Sleep(300 * time.Millisecond) // let the loop find the stream idle and poll slower
	e.appendEvents(t, "b", "t", 200)
	e.waitLag(t, "s", 0)
	e.waitConsumer(t, "s", 501)
	e.checkOnce(t, "s", 500)
	if n := e.countStreams(t, `SELECT count(*) FROM sqlite_master WHERE name IN ('inbox_items', 'subscriptions', 'positions')`); n != 0 {
		t.Fatalf("the streams' database holds %d of delivery's tables", n)
	}
	if n := e.count(t, `SELECT count(*) FROM stream_events`); n != 0 {
		t.Fatalf("delivery's store holds %d stream events", n)
	}
	lag, err := e.d.Lag(context.Background(), "s")
	if err != nil || lag.NextOffset != 501 || lag.HighWatermark != 500 || lag.Events != 0 || lag.StreamID != "devices" {
		t.Fatalf("lag: %+v %v", lag, err)
	}
	c, err := e.d.Cleanup(context.Background(), e.clock.Now().Add(time.Hour))
	if err != nil || c.Events != 0 {
		t.Fatalf("cleanup without a stream.Trimmer: %+v %v", c, err)
	}
	if n := e.countStreams(t, `SELECT count(*) FROM stream_events`); n != 500 {
		t.Fatalf("%d stream events after cleanup, want 500", n)
	}
	if err := e.d.Delete(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t, `SELECT count(*) FROM positions`); n != 0 {
		t.Fatalf("%d positions after the subscription was deleted", n)
	}
}

// TestReset: Reset moves a subscription's position and its consumer, and
// the loop follows. Backwards, it makes items again only of events that
// have none (here, deleted as retention would): one item per subscription
// and event, whatever the reset.
func TestReset(t *testing.T) { eachStore(t, testReset) }

func testReset(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{BatchSize: 100})
	ctx := context.Background()
	e.create(t, delivery.Subscription{Name: "r", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest}})
	e.appendEvents(t, "a", "t", 20)
	e.waitLag(t, "r", 0)
	e.waitConsumer(t, "r", 21)
	e.exec(t, `DELETE FROM inbox_items WHERE "offset" > 10`)
	c, err := e.d.Reset(ctx, "r", stream.Start{Policy: stream.StartAtOffset, Offset: 6})
	if err != nil || c.NextOffset != 6 {
		t.Fatalf("reset to offset 6: %+v %v", c, err)
	}
	e.waitLag(t, "r", 0)
	e.waitConsumer(t, "r", 21)
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE subscription_id = 'r'`); n != 20 {
		t.Fatalf("%d items after the reset, want 20", n)
	}
	if n := e.count(t, `SELECT count(DISTINCT "offset") FROM inbox_items WHERE subscription_id = 'r'`); n != 20 {
		t.Fatalf("items for %d distinct offsets after the reset, want 20", n)
	}
	if n := e.count(t, `SELECT sum(pending) FROM item_counts c JOIN subscriptions s ON s.subscription_uid = c.subscription_uid
		WHERE s.subscription_id = 'r'`); n != 30 {
		// The 20 counted first (the items deleted above were deleted
		// behind the counts' back), and the 10 made again from offset 6,
		// not the 15 events read again.
		t.Fatalf("the kept counts say %d items pending, want 30: 20 and the 10 made again from offset 6", n)
	}

	if _, err := e.d.Reset(ctx, "nope", stream.Start{}); !errors.Is(err, delivery.ErrNotFound) {
		t.Fatalf("reset of an unknown subscription: %v", err)
	}
	if _, err := e.d.Reset(ctx, "r", stream.Start{Policy: stream.StartAtOffset, Offset: 99}); !errors.Is(err, delivery.ErrInvalid) {
		t.Fatalf("reset past the end of the stream: %v", err)
	}
	if _, err := e.d.Reset(ctx, "r", stream.Start{Policy: "sometime"}); !errors.Is(err, delivery.ErrInvalid) {
		t.Fatalf("reset to no policy: %v", err)
	}
	c, err = e.d.Reset(ctx, "r", stream.Start{Policy: stream.StartLatest})
	if err != nil || c.NextOffset != 21 {
		t.Fatalf("reset to latest: %+v %v", c, err)
	}
	e.appendEvents(t, "b", "t", 5) // the loop runs after every reset, failed or not
	e.waitLag(t, "r", 0)
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE subscription_id = 'r'`); n != 25 {
		t.Fatalf("%d items after 5 more events, want 25", n)
	}
}

// TestPositionFromOldDatabase: a subscription of a database made before
// positions were stored (its offset was only its stream consumer's)
// starts at its consumer's offset, and records it. SQLite only: the
// PostgreSQL store began with positions.
func TestPositionFromOldDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.db")
	ctx, cancel := context.WithCancel(context.Background())
	old, err := streamsqlite.Open(path, streamsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); old.Run(ctx) }()
	schema := fstest.MapFS{}
	for _, name := range []string{"0001_delivery.sql", "0002_workers.sql"} {
		body, err := os.ReadFile(filepath.Join("migrations", name))
		if err != nil {
			t.Fatal(err)
		}
		schema[name] = &fstest.MapFile{Data: body}
	}
	if err := old.Migrate(ctx, "delivery", schema); err != nil {
		t.Fatal(err)
	}
	if _, err := old.EnsureStream(ctx, "devices"); err != nil {
		t.Fatal(err)
	}
	if err := old.Update(ctx, func(tx *sql.Tx) error {
		_, err := tx.Exec(`INSERT INTO subscriptions (subscription_id, subscription_uid, source_id, stream_id, inbox_id,
			match_types_json, match_metadata_json, start_policy, start_offset, start_time, created_at, target_url)
			VALUES ('old', 'sub_01OLD', 'devices', 'devices', 'old', '[]', '{}', 'earliest', 0, NULL, ?, NULL)`,
			time.Now().UTC().Format(sqlitedb.Time))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	(&env{streams: old}).appendEvents(t, "a", "t", 10)
	if _, err := old.EnsureConsumer(ctx, stream.ConsumerConfig{ID: "old", StreamID: "devices", Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Commit(ctx, "old", 7); err != nil { // the old process made items of 1..7
		t.Fatal(err)
	}
	cancel()
	<-done
	old.Close()

	e := open(t, sqliteStore, openOptions{streams: path, cfg: delivery.Config{BatchSize: 100}})
	e.waitLag(t, "old", 0)
	var offsets []int64
	rows, err := e.state.ReadDB().Query(`SELECT "offset" FROM inbox_items WHERE subscription_id = 'old' ORDER BY "offset"`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var o int64
		rows.Scan(&o)
		offsets = append(offsets, o)
	}
	rows.Close()
	if !slices.Equal(offsets, []int64{8, 9, 10}) {
		t.Fatalf("items of offsets %v, want 8, 9, 10: from the consumer's offset on", offsets)
	}
	if n := e.count(t, `SELECT next_offset FROM positions WHERE subscription_uid = 'sub_01OLD'`); n != 11 {
		t.Fatalf("position %d, want 11", n)
	}
	e.waitConsumer(t, "old", 11)
}

// deafWaiter is a stream.Waiter that is never woken: its Wait returns only
// when its context ends, as a JetStream client's would when the wake-up
// was lost while it reconnected to another server.
type deafWaiter struct{ stream.Backend }

func (deafWaiter) Wait(ctx context.Context, _ string, _ int64) error {
	<-ctx.Done()
	return ctx.Err()
}

// failingWaiter is a stream.Waiter whose Wait fails at once.
type failingWaiter struct{ stream.Backend }

func (failingWaiter) Wait(context.Context, string, int64) error { return errors.New("waiter broken") }

// TestLostWakeUp: a loop whose wait is never woken, or fails, still reads
// the events appended while it waited: a wait ends after a while and the
// loop reads again, and a failed wait does not end the loop.
func TestLostWakeUp(t *testing.T) {
	for name, wrap := range map[string]func(stream.Backend) stream.Backend{
		"deaf":    func(b stream.Backend) stream.Backend { return deafWaiter{b} },
		"failing": func(b stream.Backend) stream.Backend { return failingWaiter{b} },
	} {
		t.Run(name, func(t *testing.T) {
			e := open(t, sqliteStore, openOptions{wrap: wrap})
			e.create(t, delivery.Subscription{Name: "s", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest}})
			e.appendEvents(t, "a", "t", 10)
			e.waitLag(t, "s", 0)
			e.appendEvents(t, "b", "t", 10) // while the loop waits
			e.waitLag(t, "s", 0)
			e.checkOnce(t, "s", 20)
		})
	}
}
