package delivery_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
)

func TestPause(t *testing.T) { eachStore(t, testPause) }

// testPause pauses one of two subscriptions filling one inbox: a lease
// takes none of its items while its loop keeps filling the inbox, the
// pause survives a restart and holds in a second process of the store,
// and a resume hands its items out again.
func testPause(t *testing.T, kind storeKind) {
	ctx := context.Background()
	streams := filepath.Join(t.TempDir(), "p.db")
	e := open(t, kind, openOptions{streams: streams})
	e.create(t, delivery.Subscription{Name: "a", Source: "devices", Inbox: "shared", Types: []string{"a"}})
	e.create(t, delivery.Subscription{Name: "b", Source: "devices", Inbox: "shared", Types: []string{"b"}})

	s, err := e.d.Pause(ctx, "a", "target under maintenance")
	if err != nil {
		t.Fatal(err)
	}
	if s.PausedAt.IsZero() || s.PausedReason != "target under maintenance" {
		t.Fatalf("paused subscription: at %v, reason %q", s.PausedAt, s.PausedReason)
	}
	again, err := e.d.Pause(ctx, "a", "")
	if err != nil || !again.PausedAt.Equal(s.PausedAt) || again.PausedReason != s.PausedReason {
		t.Fatalf("pausing again without a reason: %+v %v, want the first time and reason kept", again, err)
	}
	if _, err := e.d.Pause(ctx, "nope", ""); !errors.Is(err, delivery.ErrNotFound) {
		t.Fatalf("pause of an unknown subscription: %v, want ErrNotFound", err)
	}
	if _, err := e.d.Pause(ctx, "a", string(make([]byte, 501))); !errors.Is(err, delivery.ErrInvalid) {
		t.Fatalf("pause with a reason of 501 bytes: %v, want ErrInvalid", err)
	}

	// Its loop keeps filling the inbox while paused.
	e.appendEvents(t, "a", "a", 4)
	e.appendEvents(t, "b", "b", 3)
	e.waitLag(t, "a", 0)
	e.waitLag(t, "b", 0)
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE subscription_id = 'a' AND state = 'pending'`); n != 4 {
		t.Fatalf("%d pending items of the paused subscription, want 4", n)
	}
	l, err := e.d.Lease(ctx, "shared", 100, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 3 {
		t.Fatalf("lease of the shared inbox: %d items, want b's 3", len(l.Items))
	}
	for _, it := range l.Items {
		if it.Subscription != "b" {
			t.Fatalf("leased item %d of paused subscription %s", it.ID, it.Subscription)
		}
	}
	// An expired lease of a paused subscription's item is not taken again.
	e.exec(t, `UPDATE inbox_items SET state = 'processing', attempts = 1, lease_token = 'old', lease_expires_at = '2000-01-01T00:00:00.000000Z'
		WHERE item_id = (SELECT min(item_id) FROM inbox_items WHERE subscription_id = 'a')`)
	if l, err := e.d.Lease(ctx, "shared", 100, time.Minute, 0); err != nil || len(l.Items) != 0 {
		t.Fatalf("lease while a is paused: %d items, %v, want none", len(l.Items), err)
	}

	// The pause survives a restart.
	e.stop()
	other := open(t, kind, openOptions{streams: streams, state: e.stateAt})
	if s, err := other.d.Subscription(ctx, "a"); err != nil || s.PausedAt.IsZero() {
		t.Fatalf("after a restart: %+v %v, want a paused", s, err)
	}
	if l, err := other.d.Lease(ctx, "shared", 100, time.Minute, 0); err != nil || len(l.Items) != 0 {
		t.Fatalf("lease in another process while a is paused: %d items, %v, want none", len(l.Items), err)
	}

	// Resumed: a waiting lease is woken and gets a's items.
	got := make(chan delivery.Lease, 1)
	go func() {
		l, _ := other.d.Lease(ctx, "shared", 100, time.Minute, 30*time.Second)
		got <- l
	}()
	s, err = other.d.Resume(ctx, "a")
	if err != nil || !s.PausedAt.IsZero() || s.PausedReason != "" {
		t.Fatalf("resume: %+v %v", s, err)
	}
	select {
	case l := <-got:
		if len(l.Items) != 4 {
			t.Fatalf("lease after the resume: %d items, want a's 4", len(l.Items))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a waiting lease got nothing within 20s of the resume")
	}
}

func TestCancelDiscard(t *testing.T) { eachStore(t, testCancelDiscard) }

// testCancelDiscard cancels and discards items and dead letters on each
// store: states, refusals, and the kept count of completed items.
func testCancelDiscard(t *testing.T, kind storeKind) {
	ctx := context.Background()
	e := setup(t, kind, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "jobs", Source: "devices"})
	e.appendEvents(t, "j", "job", 6)
	e.waitLag(t, "jobs", 0)
	l, err := e.d.Lease(ctx, "jobs", 2, time.Minute, 0)
	if err != nil || len(l.Items) != 2 {
		t.Fatalf("lease: %d items, %v", len(l.Items), err)
	}
	done, busy := l.Items[0].ID, l.Items[1].ID
	if _, err := e.d.Ack(ctx, "jobs", []int64{done}, l.Token); err != nil {
		t.Fatal(err)
	}
	var pending []int64
	items, err := e.d.List(ctx, "jobs", delivery.StatePending, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		pending = append(pending, it.ID)
	}

	it, err := e.d.Cancel(ctx, "jobs", pending[0], "wrong customer")
	if err != nil || it.State != delivery.StateFailed || it.LastError == nil || *it.LastError != "cancelled by an operator: wrong customer" || it.FailedAt == nil {
		t.Fatalf("cancel: %+v %v", it, err)
	}
	for _, c := range []struct {
		id   int64
		want error
	}{{pending[0], delivery.ErrInvalidState}, {busy, delivery.ErrInvalidState}, {done, delivery.ErrInvalidState}, {99999, delivery.ErrNotFound}} {
		if _, err := e.d.Cancel(ctx, "jobs", c.id, ""); !errors.Is(err, c.want) {
			t.Errorf("cancel %d: %v, want %v", c.id, err, c.want)
		}
	}
	if _, err := e.d.DiscardItem(ctx, "jobs", busy); !errors.Is(err, delivery.ErrInvalidState) {
		t.Errorf("discard of a processing item: %v, want ErrInvalidState", err)
	}
	if _, err := e.d.DiscardItem(ctx, "other", done); !errors.Is(err, delivery.ErrNotFound) {
		t.Errorf("discard in another inbox: %v, want ErrNotFound", err)
	}
	if it, err := e.d.DiscardItem(ctx, "jobs", done); err != nil || it.State != delivery.StateCompleted {
		t.Fatalf("discard of a completed item: %+v %v", it, err)
	}
	counts := func() delivery.InboxCounts {
		all, err := e.d.Inboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range all {
			if c.Inbox == "jobs" {
				return c
			}
		}
		return delivery.InboxCounts{}
	}
	if c := counts(); c.Completed != 0 || c.Failed != 1 || c.Pending != 3 || c.Processing != 1 {
		t.Fatalf("counts after the discard: %+v, want 0 completed, 1 failed, 3 pending, 1 processing", c)
	}
	for _, id := range pending[1:3] {
		if _, err := e.d.Cancel(ctx, "jobs", id, ""); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := e.d.Discard(ctx, delivery.DeadLetters{IDs: []int64{pending[1], busy}})
	if err != nil || len(ids) != 1 || ids[0] != pending[1] {
		t.Fatalf("discard by ids: %v %v, want %d alone", ids, err, pending[1])
	}
	ids, err = e.d.Discard(ctx, delivery.DeadLetters{Inbox: "jobs"})
	if err != nil || len(ids) != 2 {
		t.Fatalf("discard of the inbox's dead letters: %v %v, want 2", ids, err)
	}
	if c := counts(); c.Failed != 0 || c.Pending != 1 {
		t.Fatalf("counts at the end: %+v", c)
	}
}
