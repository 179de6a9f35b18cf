package streamsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// TestAppendAsyncWith: the function runs in the transaction that writes
// the events, after them, even when the events are more than MaxBatch
// and others are queued ahead (it sees every one of them and none is
// committed without it); its failure is reported with the events'
// results, which stay stored.
func TestAppendAsyncWith(t *testing.T) {
	b, _ := open(t, streamsqlite.Config{MaxBatch: 4})
	ctx := context.Background()
	var evs []stream.Event
	for i := range 10 {
		evs = append(evs, event(fmt.Sprintf("w%d", i), `{"i":1}`))
	}
	// Something queued ahead, so that the request starts mid-batch.
	ahead := make(chan error, 1)
	if err := b.AppendAsync(ctx, "devices", []stream.Event{event("ahead", `{}`)}, func(_ []stream.AppendResult, err error) { ahead <- err }); err != nil {
		t.Fatal(err)
	}
	var seen, committed int
	done := make(chan error, 1)
	var results []stream.AppendResult
	const count = `SELECT count(*) FROM stream_events WHERE stream_id = 'devices' AND source_native_id LIKE 'w%'`
	err := b.AppendAsyncWith(ctx, "devices", evs, func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, count).Scan(&seen); err != nil {
			return err
		}
		return b.ReadDB().QueryRowContext(ctx, count).Scan(&committed) // another connection: what is committed
	}, func(res []stream.AppendResult, err error) { results = res; done <- err })
	if err != nil {
		t.Fatal(err)
	}
	if err := <-ahead; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if seen != 10 || committed != 0 || len(results) != 10 || results[9].Offset == 0 {
		t.Fatalf("the function saw %d of the 10 events in its transaction, %d committed before it; results %+v", seen, committed, results)
	}
	boom := errors.New("boom")
	err = b.AppendAsyncWith(ctx, "devices", []stream.Event{event("w99", `{}`)}, func(*sql.Tx) error { return boom },
		func(res []stream.AppendResult, err error) { results = res; done <- err })
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, boom) || len(results) != 1 || results[0].Offset == 0 {
		t.Fatalf("a failing function: %v %+v, want boom with the event's result", err, results)
	}
	if _, err := b.Lookup(ctx, "devices", "w99", ""); err != nil {
		t.Errorf("the event of a failing function is not stored: %v", err)
	}
}
