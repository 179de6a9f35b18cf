package delivery_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
)

// TestEarliestAndLatest: a subscription created with earliest after
// 10,000 events were stored gets all of them as items, once each, without
// anything being sent again; one created with latest gets only what comes
// after it.
func TestEarliestAndLatest(t *testing.T) { eachStore(t, testEarliestAndLatest) }

func testEarliestAndLatest(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	e.appendEvents(t, "old", "proposal.task", 10000)
	e.create(t, delivery.Subscription{Name: "backfill", Source: "devices", Types: []string{"proposal.*"}, Start: stream.Start{Policy: stream.StartEarliest}})
	e.create(t, delivery.Subscription{Name: "fresh", Source: "devices", Types: []string{"proposal.*"}})
	e.waitLag(t, "backfill", 0)
	if n := e.count(t, `SELECT count(DISTINCT "offset") FROM inbox_items WHERE inbox_id = 'backfill' AND state = 'pending'`); n != 10000 {
		t.Fatalf("backfill has %d pending items, want 10000", n)
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE inbox_id = 'fresh'`); n != 0 {
		t.Fatalf("fresh has %d items before any new event", n)
	}
	e.appendEvents(t, "new", "proposal.review", 5)
	e.appendEvents(t, "other", "telemetry.cpu", 5) // matches neither
	e.waitLag(t, "fresh", 0)
	e.waitLag(t, "backfill", 0)
	items, err := e.d.List(context.Background(), "fresh", "", 0, 100)
	if err != nil || len(items) != 5 {
		t.Fatalf("fresh: %d items, %v", len(items), err)
	}
	for i, it := range items {
		if it.EventID != fmt.Sprintf("new-%d", i) || it.Offset != int64(10001+i) || it.State != delivery.StatePending ||
			string(it.DeliveryHandle) != `{"reply_to":"pi"}` || string(it.Payload) != fmt.Sprintf(`{"i":%d}`, i) || it.Type != "proposal.review" {
			t.Fatalf("fresh item %d: %+v", i, it)
		}
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE inbox_id = 'backfill'`); n != 10005 {
		t.Fatalf("backfill has %d items, want 10005", n)
	}
}

// TestMatchRules: type patterns and metadata equality.
func TestMatchRules(t *testing.T) { eachStore(t, testMatchRules) }

func testMatchRules(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	e.appendEvents(t, "a", "proposal.task", 30) // device_id pi-0, pi-1, pi-2 in turn
	e.appendEvents(t, "b", "task.created", 30)
	e.create(t, delivery.Subscription{Name: "pi1-proposals", Source: "devices", Types: []string{"proposal.*"},
		Metadata: map[string]string{"device_id": "pi-1"}, Start: stream.Start{Policy: stream.StartEarliest}})
	e.create(t, delivery.Subscription{Name: "all", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest}})
	e.create(t, delivery.Subscription{Name: "two-kinds", Source: "devices", Types: []string{"*.task", "task.*"}, Inbox: "shared",
		Start: stream.Start{Policy: stream.StartAtOffset, Offset: 21}})
	for _, s := range []string{"pi1-proposals", "all", "two-kinds"} {
		e.waitLag(t, s, 0)
	}
	for inbox, want := range map[string]int{"pi1-proposals": 10, "all": 60, "shared": 40} {
		if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE inbox_id = ?`, inbox); n != want {
			t.Errorf("inbox %s: %d items, want %d", inbox, n, want)
		}
	}
}

// TestTwoSubscriptionsIndependent: one subscription's runtime never acks,
// the other's completes everything; both catch up with ingest and
// neither's items depend on the other. The busy one's largest lag during
// the bursts of ingest is logged, not checked: it depends on the machine.
func TestTwoSubscriptionsIndependent(t *testing.T) { eachStore(t, testTwoSubscriptionsIndependent) }

func testTwoSubscriptionsIndependent(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "stalled", Source: "devices"})
	e.create(t, delivery.Subscription{Name: "busy", Source: "devices"})
	// Both loops run before ingest starts: each records its position as it
	// starts (on a shared store, once it holds its lease).
	testenv.Eventually(t, 10*time.Second, "both loops to start", func() bool {
		return e.count(t, `SELECT count(*) FROM positions`) == 2
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var completed atomic.Int64
	runtimeDone := make(chan error, 1)
	go func() { // busy's runtime
		for ctx.Err() == nil {
			l, err := e.d.Lease(ctx, "busy", 500, time.Minute, 100*time.Millisecond)
			if err != nil {
				runtimeDone <- err
				return
			}
			var ids []int64
			for _, it := range l.Items {
				ids = append(ids, it.ID)
			}
			if len(ids) == 0 {
				continue
			}
			res, err := e.d.Ack(ctx, "busy", ids, l.Token)
			if err != nil {
				runtimeDone <- err
				return
			}
			for _, r := range res {
				if r.Err != nil {
					runtimeDone <- r.Err
					return
				}
			}
			completed.Add(int64(len(ids)))
		}
		runtimeDone <- nil
	}()
	const total = 5000
	maxLag := int64(0)
	for i := 0; i < total/1000; i++ {
		e.appendEvents(t, fmt.Sprint("r", i), "x", 1000)
		lag, err := e.streams.Lag(ctx, "busy")
		if err != nil {
			t.Fatal(err)
		}
		maxLag = max(maxLag, lag.Events)
	}
	e.waitLag(t, "busy", 0)
	e.waitLag(t, "stalled", 0)
	testenv.Progressing(t, stallTimeout, "busy's runtime to complete every item", func() (bool, int64) {
		n := completed.Load()
		return n == total, n
	})
	cancel()
	if err := <-runtimeDone; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE inbox_id = 'stalled' AND state = 'pending'`); n != total {
		t.Fatalf("stalled has %d pending items, want %d", n, total)
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE inbox_id = 'busy' AND state = 'completed'`); n != total {
		t.Fatalf("busy has %d completed items, want %d", n, total)
	}
	t.Logf("busy's largest lag while %d events were appended 1,000 at a time: %d events", total, maxLag)
}

// TestLeaseExpires: a runtime leases items and dies; after the visibility
// timeout they are pending again, another runtime completes them once, and
// the first runtime's late ack is refused.
func TestLeaseExpires(t *testing.T) { eachStore(t, testLeaseExpires) }

func testLeaseExpires(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{ReapInterval: 10 * time.Millisecond})
	e.create(t, delivery.Subscription{Name: "jobs", Source: "devices"})
	e.appendEvents(t, "j", "job", 5)
	e.waitLag(t, "jobs", 0)
	ctx := context.Background()
	first, err := e.d.Lease(ctx, "jobs", 3, 30*time.Second, 0)
	if err != nil || len(first.Items) != 3 {
		t.Fatalf("lease: %d items, %v", len(first.Items), err)
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE state = 'processing'`); n != 3 {
		t.Fatalf("%d processing, want 3", n)
	}
	e.clock.Advance(29 * time.Second)
	if l, _ := e.d.Lease(ctx, "jobs", 10, 30*time.Second, 0); len(l.Items) != 2 {
		t.Fatalf("before the timeout, a second lease got %d items, want the 2 never leased", len(l.Items))
	}
	e.clock.Advance(2 * time.Second) // the first lease expired; the second has 29s left
	testenv.Eventually(t, 5*time.Second, "expired items to be pending again", func() bool {
		return e.count(t, `SELECT count(*) FROM inbox_items WHERE state = 'pending'`) == 3
	})
	second, err := e.d.Lease(ctx, "jobs", 10, 30*time.Second, 0)
	if err != nil || len(second.Items) != 3 {
		t.Fatalf("re-lease: %d items, %v", len(second.Items), err)
	}
	for i, it := range second.Items {
		if it.ID != first.Items[i].ID || it.Attempts != 2 {
			t.Fatalf("re-leased item %d: id %d attempts %d, want id %d attempts 2", i, it.ID, it.Attempts, first.Items[i].ID)
		}
	}
	late, err := e.d.Ack(ctx, "jobs", []int64{first.Items[0].ID}, first.Token)
	if err != nil || !errors.Is(late[0].Err, delivery.ErrLeaseLost) {
		t.Fatalf("late ack with the expired lease: %+v %v", late, err)
	}
	ids := []int64{second.Items[0].ID, second.Items[1].ID, second.Items[2].ID}
	res, err := e.d.Ack(ctx, "jobs", ids, second.Token)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil || r.State != delivery.StateCompleted {
			t.Fatalf("ack: %+v", r)
		}
	}
	again, _ := e.d.Ack(ctx, "jobs", ids[:1], "")
	if again[0].Err != nil || again[0].State != delivery.StateCompleted {
		t.Fatalf("second ack of a completed item: %+v", again[0])
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE state = 'completed'`); n != 3 {
		t.Fatalf("%d completed, want 3", n)
	}
}

// TestNackDelay: a nacked item comes back after its delay, with its reason.
func TestNackDelay(t *testing.T) { eachStore(t, testNackDelay) }

func testNackDelay(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "n", Source: "devices"})
	e.appendEvents(t, "n", "job", 1)
	e.waitLag(t, "n", 0)
	ctx := context.Background()
	l, err := e.d.Lease(ctx, "n", 1, time.Minute, 0)
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("lease: %+v %v", l, err)
	}
	res, err := e.d.Nack(ctx, "n", []int64{l.Items[0].ID}, l.Token, time.Minute, "downstream 503")
	if err != nil || res[0].Err != nil || res[0].State != delivery.StatePending {
		t.Fatalf("nack: %+v %v", res, err)
	}
	if again, _ := e.d.Lease(ctx, "n", 1, time.Minute, 0); len(again.Items) != 0 {
		t.Fatalf("leased a nacked item before its delay")
	}
	e.clock.Advance(time.Minute)
	again, err := e.d.Lease(ctx, "n", 1, time.Minute, 0)
	if err != nil || len(again.Items) != 1 || again.Items[0].LastError == nil || *again.Items[0].LastError != "downstream 503" || again.Items[0].Attempts != 2 {
		t.Fatalf("lease after the delay: %+v %v", again, err)
	}
	if res, _ := e.d.Ack(ctx, "n", []int64{999}, ""); !errors.Is(res[0].Err, delivery.ErrNotFound) {
		t.Fatalf("ack of an unknown item: %+v", res[0])
	}
}

// TestLeaseWaits: a lease that waits returns as soon as an item arrives.
func TestLeaseWaits(t *testing.T) { eachStore(t, testLeaseWaits) }

func testLeaseWaits(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "w", Source: "devices"})
	got := make(chan delivery.Lease, 1)
	go func() {
		l, _ := e.d.Lease(context.Background(), "w", 10, time.Minute, 30*time.Second)
		got <- l
	}()
	e.appendEvents(t, "w", "job", 1)
	select {
	case l := <-got:
		if len(l.Items) != 1 {
			t.Fatalf("waiting lease got %d items", len(l.Items))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a waiting lease did not wake when an item arrived")
	}
}

// TestCreateDelete: definitions, conflicts, unknown sources, deletion.
func TestCreateDelete(t *testing.T) { eachStore(t, testCreateDelete) }

func testCreateDelete(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	ctx := context.Background()
	s := delivery.Subscription{Name: "s", Source: "devices", Types: []string{"a.*"}}
	e.create(t, s)
	if _, created, err := e.d.Create(ctx, s); err != nil || created {
		t.Fatalf("same definition again: created=%v %v", created, err)
	}
	s.Types = []string{"b.*"}
	if _, _, err := e.d.Create(ctx, s); !errors.Is(err, delivery.ErrConflict) {
		t.Fatalf("other definition: %v", err)
	}
	for _, bad := range []delivery.Subscription{
		{Name: "", Source: "devices"},
		{Name: "has space", Source: "devices"},
		{Name: "x", Source: ""},
		{Name: "x", Source: "devices", Start: stream.Start{Policy: "sometime"}},
		{Name: "x", Source: "devices", Start: stream.Start{Policy: stream.StartAtOffset, Offset: 99}},
	} {
		if _, _, err := e.d.Create(ctx, bad); !errors.Is(err, delivery.ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := e.d.Subscription(ctx, "x"); !errors.Is(err, delivery.ErrNotFound) {
		t.Fatalf("a refused subscription was stored: %v", err)
	}
	if _, _, err := e.d.Create(ctx, delivery.Subscription{Name: "y", Source: "nope"}); !errors.Is(err, delivery.ErrNotFound) {
		t.Fatalf("unknown source: %v", err)
	}
	if err := e.d.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.streams.Consumer(ctx, "s"); !errors.Is(err, stream.ErrConsumerNotFound) {
		t.Fatalf("consumer after delete: %v", err)
	}
	if err := e.d.Delete(ctx, "s"); !errors.Is(err, delivery.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}
