package delivery_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestExtend: a runtime's heartbeat keeps its lease past the visibility
// timeout, so that no one else leases the item; a lease that expired, was
// settled or is not the caller's cannot be extended.
func TestExtend(t *testing.T) { eachStore(t, testExtend) }

func testExtend(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{ReapInterval: 10 * time.Millisecond})
	e.create(t, delivery.Subscription{Name: "long", Source: "devices"})
	e.appendEvents(t, "l", "job", 3)
	e.waitLag(t, "long", 0)
	ctx := context.Background()
	l, err := e.d.Lease(ctx, "long", 2, 30*time.Second, 0)
	if err != nil || len(l.Items) != 2 {
		t.Fatalf("lease: %d items, %v", len(l.Items), err)
	}
	ids := []int64{l.Items[0].ID, l.Items[1].ID}

	e.clock.Advance(20 * time.Second)
	res, expires, err := e.d.Extend(ctx, "long", ids, l.Token, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := e.clock.Now().Add(30 * time.Second); !expires.Equal(want) {
		t.Fatalf("extended to %v, want %v", expires, want)
	}
	for _, r := range res {
		if r.Err != nil || r.State != delivery.StateProcessing {
			t.Fatalf("extend: %+v", r)
		}
	}
	e.clock.Advance(20 * time.Second) // past the first end, before the new one
	if other, _ := e.d.Lease(ctx, "long", 10, 30*time.Second, 0); len(other.Items) != 1 || other.Items[0].ID == ids[0] || other.Items[0].ID == ids[1] {
		t.Fatalf("a second lease after the first end got %+v, want only the item never leased", other.Items)
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE state = 'processing' AND attempts = 1`); n != 3 {
		t.Fatalf("%d items processing on their first attempt, want 3 (an extension counts no attempt)", n)
	}

	wrong, _, err := e.d.Extend(ctx, "long", ids[:1], "lease_not_mine", time.Minute)
	if err != nil || !errors.Is(wrong[0].Err, delivery.ErrLeaseLost) {
		t.Fatalf("extend with another token: %+v %v", wrong, err)
	}
	if _, _, err := e.d.Extend(ctx, "long", ids[:1], "", time.Minute); !errors.Is(err, delivery.ErrInvalid) {
		t.Fatalf("extend without a token: %v, want ErrInvalid", err)
	}
	missing, _, err := e.d.Extend(ctx, "long", []int64{999999}, l.Token, time.Minute)
	if err != nil || !errors.Is(missing[0].Err, delivery.ErrNotFound) {
		t.Fatalf("extend of no item: %+v %v", missing, err)
	}

	if acked, err := e.d.Ack(ctx, "long", ids[:1], l.Token); err != nil || acked[0].Err != nil {
		t.Fatalf("ack: %+v %v", acked, err)
	}
	after, _, err := e.d.Extend(ctx, "long", ids, l.Token, time.Minute)
	if err != nil || !errors.Is(after[0].Err, delivery.ErrLeaseLost) || after[1].Err != nil {
		t.Fatalf("extend after acking the first item: %+v %v", after, err)
	}

	e.clock.Advance(2 * time.Minute) // the second item's lease ends
	testenv.Eventually(t, 5*time.Second, "the expired lease to be reaped", func() bool {
		return e.count(t, `SELECT count(*) FROM inbox_items WHERE item_id = ? AND state = 'pending'`, ids[1]) == 1
	})
	lost, _, err := e.d.Extend(ctx, "long", ids[1:], l.Token, time.Minute)
	if err != nil || !errors.Is(lost[0].Err, delivery.ErrLeaseLost) {
		t.Fatalf("extend of an expired lease: %+v %v", lost, err)
	}
}

// TestNackDead: a nack that says no further attempt can help makes the
// item a dead letter at once, on its first attempt.
func TestNackDead(t *testing.T) { eachStore(t, testNackDead) }

func testNackDead(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{MaxAttempts: 5})
	e.create(t, delivery.Subscription{Name: "d", Source: "devices"})
	e.appendEvents(t, "d", "job", 1)
	e.waitLag(t, "d", 0)
	ctx := context.Background()
	l, err := e.d.Lease(ctx, "d", 1, time.Minute, 0)
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("lease: %d items, %v", len(l.Items), err)
	}
	res, err := e.d.NackDead(ctx, "d", []int64{l.Items[0].ID}, l.Token, "malformed")
	if err != nil || res[0].Err != nil || res[0].State != delivery.StateFailed {
		t.Fatalf("nack dead: %+v %v", res, err)
	}
	it, err := e.d.Item(ctx, "d", l.Items[0].ID)
	if err != nil || it.State != delivery.StateFailed || it.Attempts != 1 || it.LastError == nil || *it.LastError != "malformed" {
		t.Fatalf("the item: %+v %v, want failed after 1 attempt with its reason", it, err)
	}
}
