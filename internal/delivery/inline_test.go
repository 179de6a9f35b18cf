package delivery_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/stream"
)

// TestInlineItems: with an InlineHook on its stream, a subscription's
// items are written in the transaction that stores their events (the
// position moves with them, as the loop would); a subscription whose position is behind leaves the events to its
// loop and items stay one per event; a deleted subscription gets nothing.
func TestInlineItems(t *testing.T) {
	ctx := context.Background()
	e := setup(t, sqliteStore, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "hooked", Source: "devices", Types: []string{"keep.*"}})
	e.hookInline(t, "hooked")

	// One Append is one transaction: when it returns, the items are there.
	appendMixed := func(prefix string) {
		t.Helper()
		var evs []stream.Event
		for i := range 15 {
			typ := "keep.x"
			if i%3 == 2 {
				typ = "drop.y"
			}
			evs = append(evs, stream.Event{NativeID: prefix + "-" + string(rune('a'+i)), Type: typ, Payload: []byte(`{"i":1}`)})
		}
		if _, err := e.streams.Append(ctx, "devices", evs); err != nil {
			t.Fatal(err)
		}
	}
	appendMixed("first")
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE subscription_id = 'hooked'`); n != 10 {
		t.Fatalf("%d items right after the append, want 10 (written with their events)", n)
	}
	if lag, err := e.d.Lag(ctx, "hooked"); err != nil || lag.Events != 0 || lag.NextOffset != 16 {
		t.Fatalf("lag right after the append: %+v, %v; want the position moved past the 15 events", lag, err)
	}
	items, err := e.d.List(ctx, "hooked", "", 0, 100)
	if err != nil || len(items) != 10 || items[0].Offset != 1 || items[0].EventID != "first-a" || items[0].Type != "keep.x" ||
		string(items[0].Payload) != `{"i":1}` || items[0].State != delivery.StatePending {
		t.Fatalf("items: %d, %v; first %+v", len(items), err, items[0])
	}
	// Items are leased and acked as any other.
	l, err := e.d.Lease(ctx, "hooked", 100, 0, 0)
	if err != nil || len(l.Items) != 10 {
		t.Fatalf("lease: %d items, %v", len(l.Items), err)
	}
	if _, err := e.d.Ack(ctx, "hooked", []int64{l.Items[0].ID}, l.Token); err != nil {
		t.Fatal(err)
	}

	// Behind: the loop takes the events from its position, and the hook
	// writes again once the position is where new events start.
	if _, err := e.d.Reset(ctx, "hooked", stream.Start{Policy: stream.StartEarliest}); err != nil {
		t.Fatal(err)
	}
	appendMixed("second")
	e.waitLag(t, "hooked", 0)
	appendMixed("third")
	e.waitLag(t, "hooked", 0)
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE subscription_id = 'hooked'`); n != 30 {
		t.Fatalf("%d items, want 30", n)
	}
	if n := e.count(t, `SELECT count(DISTINCT "offset") FROM inbox_items WHERE subscription_id = 'hooked'`); n != 30 {
		t.Fatalf("items for %d distinct events, want 30", n)
	}

	// Deleted: nothing is written for it, and appends go on.
	if err := e.d.Delete(ctx, "hooked"); err != nil {
		t.Fatal(err)
	}
	appendMixed("fourth")
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE subscription_id = 'hooked'`); n != 30 {
		t.Fatalf("%d items after the subscription was deleted, want 30", n)
	}
}

// TestInlineHookElsewhere: delivery writes items with their events only
// when its store is the stream backend's database.
func TestInlineHookElsewhere(t *testing.T) {
	e := setup(t, postgresStore, delivery.Config{})
	if fn, err := e.d.InlineHook(context.Background(), "any"); fn != nil || err != nil {
		t.Fatalf("InlineHook on PostgreSQL: %v, %v; want none", fn != nil, err)
	}
}

// BenchmarkInlineItems measures the writer appending webhooks in
// transactions of ten (~300-byte payloads, metadata as a webhook's),
// without a subscription (events) and with one whose items an InlineHook
// writes with them (items): the difference is what writing an event's
// item inline costs. ns/op is per event; synchronous=NORMAL keeps fsync
// out of it.
//
//	go test -run '^$' -bench InlineItems -benchmem -count 5 ./internal/delivery/
func BenchmarkInlineItems(b *testing.B) {
	payload := []byte(`{"object":"event","type":"invoice.paid","created":1763683200,"livemode":false,` +
		`"data":{"object":{"id":"in_1QbenchA2b3C4d5E","object":"invoice","amount_paid":4200,"currency":"eur",` +
		`"customer":"cus_bench0001","status":"paid","description":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}}`)
	meta := []byte(`{"headers":{"content-type":"application/json","idempotency-key":"wh_bench_1","user-agent":"postbox-bench","x-event-type":"invoice.paid"},"remote_addr":"127.0.0.1:50000"}`)
	const batch = 10
	for _, hooked := range []bool{false, true} {
		name := "events"
		if hooked {
			name = "items"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			e := open(b, sqliteStore, openOptions{sync: "NORMAL"})
			if hooked {
				e.create(b, delivery.Subscription{Name: "hooked", Source: "devices"})
				e.hookInline(b, "hooked")
			}
			evs := make([]stream.Event, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				for j := range evs {
					evs[j] = stream.Event{NativeID: "wh-" + strconv.Itoa(i+j), Type: "invoice.paid", OccurredAt: time.Now(), Metadata: meta, Payload: payload}
				}
				if _, err := e.streams.Append(ctx, "devices", evs); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if hooked {
				if n := e.count(b, `SELECT count(*) FROM inbox_items WHERE subscription_id = 'hooked'`); n < b.N {
					b.Fatalf("%d items for %d events", n, b.N)
				}
			}
		})
	}
}
