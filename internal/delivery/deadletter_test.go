package delivery_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/stream"
)

// TestDeadLetterOutlivesRedelivery: a dead letter stays one until an
// operator replays it. The same event sent again (a duplicate, stored
// once) and the subscription reset to read its stream again leave the
// dead-lettered item as it is, with no second item; Replay makes it
// pending.
func TestDeadLetterOutlivesRedelivery(t *testing.T) { eachStore(t, testDeadLetterOutlivesRedelivery) }

func testDeadLetterOutlivesRedelivery(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{MaxAttempts: 5})
	e.create(t, delivery.Subscription{Name: "d", Source: "devices"})
	e.appendEvents(t, "poison", "job", 1)
	e.waitLag(t, "d", 0)
	ctx := context.Background()
	l, err := e.d.Lease(ctx, "d", 1, time.Minute, 0)
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("lease: %d items, %v", len(l.Items), err)
	}
	id := l.Items[0].ID
	if res, err := e.d.NackDead(ctx, "d", []int64{id}, l.Token, "malformed"); err != nil || res[0].Err != nil {
		t.Fatalf("nack dead: %+v %v", res, err)
	}
	dead := func(when string) {
		t.Helper()
		it, err := e.d.Item(ctx, "d", id)
		if err != nil || it.State != delivery.StateFailed || it.Attempts != 1 {
			t.Fatalf("%s: the item is %+v (%v), want the dead letter after 1 attempt", when, it, err)
		}
		if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE subscription_id = 'd'`); n != 1 {
			t.Fatalf("%s: %d items, want 1", when, n)
		}
	}

	// The same event again: a duplicate, stored once.
	res, err := e.streams.Append(ctx, "devices", []stream.Event{{NativeID: "poison-0", Type: "job", OccurredAt: time.Now(),
		Metadata: json.RawMessage(`{"device_id":"pi-0"}`), Payload: json.RawMessage(`{"i":0}`),
		DeliveryHandle: json.RawMessage(`{"reply_to":"pi"}`)}})
	if err != nil || res[0].Err != nil || !res[0].Duplicate {
		t.Fatalf("the event sent again: %+v %v, want a duplicate", res, err)
	}
	e.waitLag(t, "d", 0)
	dead("after the event was sent again")

	// The subscription reads its stream again from the start.
	if _, err := e.d.Reset(ctx, "d", stream.Start{Policy: stream.StartEarliest}); err != nil {
		t.Fatal(err)
	}
	e.waitLag(t, "d", 0)
	dead("after the subscription read its stream again")

	replayed, err := e.d.Replay(ctx, delivery.DeadLetters{Subscription: "d"})
	if err != nil || len(replayed) != 1 || replayed[0] != id {
		t.Fatalf("replay: %v %v, want [%d]", replayed, err, id)
	}
	it, err := e.d.Item(ctx, "d", id)
	if err != nil || it.State != delivery.StatePending || it.Attempts != 0 {
		t.Fatalf("after the operator's replay the item is %+v (%v), want pending with no attempt", it, err)
	}
}
