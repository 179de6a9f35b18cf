package delivery_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/schedule"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
)

// appendAt appends one event whose metadata schedules it for at (none
// when at is zero), and returns its offset.
func (e *env) appendAt(t testing.TB, id string, at time.Time) int64 {
	t.Helper()
	return e.appendTyped(t, id, "t", at)
}

// appendTyped appends one event of type typ whose metadata schedules it
// for at (none when at is zero), and returns its offset.
func (e *env) appendTyped(t testing.TB, id, typ string, at time.Time) int64 {
	t.Helper()
	meta := json.RawMessage(`{"device_id":"pi-1"}`)
	if !at.IsZero() {
		meta = json.RawMessage(`{"device_id":"pi-1","` + schedule.Key + `":"` + schedule.Format(at) + `"}`)
	}
	res, err := e.streams.Append(context.Background(), "devices", []stream.Event{{NativeID: id, Type: typ, OccurredAt: e.clock.Now(),
		Metadata: meta, Payload: json.RawMessage(`{}`)}})
	if err != nil || res[0].Err != nil {
		t.Fatalf("append %s: %v %+v", id, err, res)
	}
	return res[0].Offset
}

// leaseIDs leases what inbox has due, without waiting, and returns the
// source ids of the events leased.
func (e *env) leaseIDs(t testing.TB, inbox string) (delivery.Lease, []string) {
	t.Helper()
	l, err := e.d.Lease(context.Background(), inbox, 100, time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, it := range l.Items {
		ids = append(ids, it.EventID)
	}
	return l, ids
}

// TestScheduledItems: an item of an event scheduled 2 s ahead is pending,
// due then (its NextAttemptAt), and no lease takes it before that time;
// a lease takes it once the time came. An event scheduled in the past,
// and one without a schedule, are due at once. The kept counts count the
// scheduled item as pending.
func TestScheduledItems(t *testing.T) { eachStore(t, testScheduledItems) }

func testScheduledItems(t *testing.T, kind storeKind) {
	ctx := context.Background()
	e := setup(t, kind, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "s", Source: "devices"})
	start := e.clock.Now()
	at := start.Add(2 * time.Second)
	e.appendAt(t, "later", at)
	e.appendAt(t, "past", start.Add(-time.Hour))
	e.appendAt(t, "now", time.Time{})
	e.waitLag(t, "s", 0)

	items, err := e.d.List(ctx, "s", "", 0, 10)
	if err != nil || len(items) != 3 {
		t.Fatalf("items: %d, %v", len(items), err)
	}
	due := map[string]time.Time{}
	for _, it := range items {
		due[it.EventID] = it.NextAttemptAt
		if it.State != delivery.StatePending {
			t.Fatalf("%s is %s, want pending", it.EventID, it.State)
		}
	}
	if !due["later"].Equal(at) || !due["past"].Equal(start) || !due["now"].Equal(start) {
		t.Fatalf("due at %v; want later at %v, past and now at %v", due, at, start)
	}
	_, ids := e.leaseIDs(t, "s")
	if strings.Join(ids, ",") != "past,now" {
		t.Fatalf("leased %v, want past and now (later is due in 2s)", ids)
	}
	e.clock.Advance(2*time.Second - time.Millisecond)
	if _, ids := e.leaseIDs(t, "s"); len(ids) != 0 {
		t.Fatalf("leased %v a millisecond before the item is due", ids)
	}
	e.checkCounts(t, "before due")
	e.clock.Advance(time.Millisecond)
	if _, ids := e.leaseIDs(t, "s"); strings.Join(ids, ",") != "later" {
		t.Fatalf("leased %v once due, want later", ids)
	}
	e.checkCounts(t, "leased")
}

// TestScheduledSurvivesRestart: the schedule is stored with the item: a
// process that starts again does not lease it early, and leases it once
// it is due.
func TestScheduledSurvivesRestart(t *testing.T) { eachStore(t, testScheduledSurvivesRestart) }

func testScheduledSurvivesRestart(t *testing.T, kind storeKind) {
	ctx := context.Background()
	streamsAt := filepath.Join(t.TempDir(), "p.db")
	e := open(t, kind, openOptions{streams: streamsAt})
	e.create(t, delivery.Subscription{Name: "s", Source: "devices"})
	at := e.clock.Now().Add(time.Hour)
	e.appendAt(t, "later", at)
	e.waitLag(t, "s", 0)
	stateAt := e.stateAt
	e.stop()

	e = open(t, kind, openOptions{streams: streamsAt, state: stateAt})
	e.clock.Advance(at.Add(-time.Second).Sub(e.clock.Now()))
	if _, err := e.d.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ids := e.leaseIDs(t, "s"); len(ids) != 0 {
		t.Fatalf("after a restart, leased %v a second before it is due", ids)
	}
	e.clock.Advance(time.Second)
	if _, ids := e.leaseIDs(t, "s"); strings.Join(ids, ",") != "later" {
		t.Fatalf("after a restart, leased %v once due, want later", ids)
	}
}

// TestScheduledCancel: an operator's Cancel of a scheduled item makes it
// a dead letter that no lease takes, before or after its time; cancelling
// an item that a lease took (it was due) is ErrInvalidState, and so is
// cancelling it again once completed.
func TestScheduledCancel(t *testing.T) { eachStore(t, testScheduledCancel) }

func testScheduledCancel(t *testing.T, kind storeKind) {
	ctx := context.Background()
	e := setup(t, kind, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "s", Source: "devices"})
	at := e.clock.Now().Add(time.Minute)
	e.appendAt(t, "cancelled", at)
	e.appendAt(t, "taken", at)
	e.waitLag(t, "s", 0)
	items, err := e.d.List(ctx, "s", "", 0, 10)
	if err != nil || len(items) != 2 {
		t.Fatalf("items: %d, %v", len(items), err)
	}
	it, err := e.d.Cancel(ctx, "s", items[0].ID, "not wanted")
	if err != nil || it.State != delivery.StateFailed || it.LastError == nil || !strings.HasPrefix(*it.LastError, delivery.CancelReason) {
		t.Fatalf("cancel before due: %+v, %v", it, err)
	}
	e.checkCounts(t, "cancelled")
	e.clock.Advance(time.Minute)
	l, ids := e.leaseIDs(t, "s")
	if strings.Join(ids, ",") != "taken" {
		t.Fatalf("leased %v once due, want taken alone (cancelled was cancelled)", ids)
	}
	if _, err := e.d.Cancel(ctx, "s", items[1].ID, ""); !errors.Is(err, delivery.ErrInvalidState) {
		t.Fatalf("cancel of a leased item: %v, want ErrInvalidState", err)
	}
	if _, err := e.d.Ack(ctx, "s", []int64{items[1].ID}, l.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Cancel(ctx, "s", items[1].ID, ""); !errors.Is(err, delivery.ErrInvalidState) {
		t.Fatalf("cancel of a completed item: %v, want ErrInvalidState", err)
	}
	e.clock.Advance(time.Hour)
	if _, ids := e.leaseIDs(t, "s"); len(ids) != 0 {
		t.Fatalf("leased %v: a cancelled item never goes", ids)
	}
	e.checkCounts(t, "done")
}

// TestScheduledPush: the workers of a subscription with a target do not
// POST a scheduled item before its time: dispatcher rounds that find
// nothing due pass while it waits, and it is sent once due.
func TestScheduledPush(t *testing.T) { eachStore(t, testScheduledPush) }

func testScheduledPush(t *testing.T, kind storeKind) {
	cfg, sig := delivery.WithTestSignals(delivery.Config{})
	e := setup(t, kind, cfg)
	tg := newTarget(t, http.StatusOK)
	e.create(t, delivery.Subscription{Name: "s", Source: "devices", Target: tg.URL})
	at := e.clock.Now().Add(2 * time.Second)
	e.appendAt(t, "later", at)
	e.waitLag(t, "s", 0)
	// Two rounds that found nothing after the item was there: the
	// dispatcher looked (the item's commit woke it) and left it.
	for drained := false; !drained; {
		select {
		case <-sig.Dispatched:
		default:
			drained = true
		}
	}
	for empty := 0; empty < 2; {
		select {
		case r := <-sig.Dispatched:
			if r.Inbox == "s" && r.Leased > 0 {
				t.Fatalf("the dispatcher leased %d items before they were due", r.Leased)
			}
			if r.Inbox == "s" {
				empty++
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no dispatcher round")
		}
	}
	if n := tg.calls(); n != 0 {
		t.Fatalf("the target got %d POSTs before the item was due", n)
	}
	e.clock.Advance(2 * time.Second)
	testenv.Eventually(t, 30*time.Second, "the item to be sent once due", func() bool { return tg.calls() == 1 })
	e.waitItem(t, "s", delivery.StateCompleted, 1)
}

// TestScheduledInline: items written with their events (InlineHook) are
// due when their events say, as the loop's are.
func TestScheduledInline(t *testing.T) {
	e := setup(t, sqliteStore, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "hooked", Source: "devices"})
	e.hookInline(t, "hooked")
	at := e.clock.Now().Add(time.Minute)
	e.appendAt(t, "later", at)
	e.appendAt(t, "now", time.Time{})
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE subscription_id = 'hooked'`); n != 2 {
		t.Fatalf("%d items right after the appends, want 2 (written with their events)", n)
	}
	if _, ids := e.leaseIDs(t, "hooked"); strings.Join(ids, ",") != "now" {
		t.Fatalf("leased %v, want now alone", ids)
	}
	e.clock.Advance(time.Minute)
	if _, ids := e.leaseIDs(t, "hooked"); strings.Join(ids, ",") != "later" {
		t.Fatalf("leased %v once due, want later", ids)
	}
}
