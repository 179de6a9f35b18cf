package delivery_test

import (
	"context"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
)

// countItems counts every item by key (inbox_id or subscription_uid) and
// state: the scan the kept counts avoid.
func (e *env) countItems(t *testing.T, key string) map[string]*delivery.InboxCounts {
	t.Helper()
	rows, err := e.state.ReadDB().Query(`SELECT ` + key + `, inbox_id, state, count(*) FROM inbox_items GROUP BY ` + key + `, inbox_id, state`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want := map[string]*delivery.InboxCounts{}
	for rows.Next() {
		var k, inbox, state string
		var n int64
		if err := rows.Scan(&k, &inbox, &state, &n); err != nil {
			t.Fatal(err)
		}
		c := want[k]
		if c == nil {
			c = &delivery.InboxCounts{Inbox: inbox}
			want[k] = c
		}
		switch state {
		case delivery.StatePending:
			c.Pending = n
		case delivery.StateProcessing:
			c.Processing = n
		case delivery.StateCompleted:
			c.Completed = n
		case delivery.StateFailed:
			c.Failed = n
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return want
}

// checkCounts holds Inboxes to a count of every item by inbox and state,
// the scan it avoids.
func (e *env) checkCounts(t *testing.T, step string) []delivery.InboxCounts {
	t.Helper()
	want := e.countItems(t, "inbox_id")
	got, err := e.d.Inboxes(context.Background())
	if err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	for _, g := range got {
		w := want[g.Inbox]
		if w == nil {
			w = &delivery.InboxCounts{Inbox: g.Inbox} // a subscription's inbox without items
		}
		if g.Pending != w.Pending || g.Processing != w.Processing || g.Completed != w.Completed || g.Failed != w.Failed {
			t.Fatalf("%s: inbox %s: pending %d processing %d completed %d failed %d; counted %d %d %d %d", step, g.Inbox,
				g.Pending, g.Processing, g.Completed, g.Failed, w.Pending, w.Processing, w.Completed, w.Failed)
		}
		if (g.Pending > 0) == g.OldestPending.IsZero() {
			t.Fatalf("%s: inbox %s: %d pending, the oldest made %v", step, g.Inbox, g.Pending, g.OldestPending)
		}
		delete(want, g.Inbox)
	}
	for inbox := range want {
		t.Fatalf("%s: inbox %s has items and is not listed", step, inbox)
	}
	return got
}

// TestInboxCounts: the counts of GET /v1/inboxes, completed read from the
// tallies the transactions write rather than counted, are the items'
// after acks (leased, an operator's, repeated), dead letters, both kinds
// of replay, folds and retention.
func TestInboxCounts(t *testing.T) { eachStore(t, testInboxCounts) }

func testInboxCounts(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{Retention: -1})
	ctx := context.Background()
	e.create(t, delivery.Subscription{Name: "a", Source: "devices"})
	e.create(t, delivery.Subscription{Name: "b", Source: "devices", Inbox: "shared"})
	e.create(t, delivery.Subscription{Name: "c", Source: "devices", Inbox: "shared", Types: []string{"t"}})
	e.create(t, delivery.Subscription{Name: "none", Source: "devices", Types: []string{"nothing.*"}})
	t0 := e.clock.Now()
	e.appendEvents(t, "x", "t", 600)
	for _, s := range []string{"a", "b", "c", "none"} {
		e.waitLag(t, s, 0)
	}
	got := e.checkCounts(t, "materialised")
	if len(got) != 3 || got[0].Inbox != "a" || got[0].Pending != 600 || got[1].Inbox != "none" || got[2].Pending != 1200 {
		t.Fatalf("materialised: %+v", got)
	}

	l, err := e.d.Lease(ctx, "a", 500, time.Hour, 0)
	if err != nil || len(l.Items) != 500 {
		t.Fatalf("lease: %d items, %v", len(l.Items), err)
	}
	ids := func(items []delivery.Item) []int64 {
		out := make([]int64, len(items))
		for i, it := range items {
			out[i] = it.ID
		}
		return out
	}
	leased := ids(l.Items)
	for i := 0; i < 300; i += 100 {
		if _, err := e.d.Ack(ctx, "a", leased[i:i+100], l.Token); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.d.Ack(ctx, "a", leased[:100], l.Token); err != nil { // acked already: no change
		t.Fatal(err)
	}
	if _, err := e.d.NackDead(ctx, "a", leased[300:350], l.Token, "bad"); err != nil {
		t.Fatal(err)
	}
	pending, err := e.d.List(ctx, "a", delivery.StatePending, 0, 20)
	if err != nil {
		t.Fatal(err)
	}
	// An operator's ack of pending items, and of dead letters, which it refuses.
	if _, err := e.d.Ack(ctx, "a", append(ids(pending), leased[300:310]...), ""); err != nil {
		t.Fatal(err)
	}
	if err := completeAll(e.d, "shared"); err != nil {
		t.Fatal(err)
	}
	got = e.checkCounts(t, "acked")
	if got[0].Completed != 320 || got[0].Processing != 150 || got[0].Failed != 50 || got[2].Completed != 1200 {
		t.Fatalf("acked: %+v", got)
	}

	if _, err := e.d.Replay(ctx, delivery.DeadLetters{Inbox: "a"}); err != nil {
		t.Fatal(err)
	}
	e.checkCounts(t, "dead letters replayed")
	e.clock.Advance(time.Minute) // a range ends before now
	job, err := e.d.ReplayRange(ctx, delivery.ReplayRange{Subscription: "b", Since: t0.Add(-time.Hour), BatchSize: 250,
		States: []string{delivery.StateCompleted}})
	if err != nil {
		t.Fatal(err)
	}
	if job = e.waitReplay(t, job.ID); job.Replayed != 600 {
		t.Fatalf("replay: %+v", job)
	}
	got = e.checkCounts(t, "completed items replayed")
	if got[2].Completed != 600 || got[2].Pending != 600 {
		t.Fatalf("replayed: %+v", got[2])
	}
	if err := e.d.FoldCounts(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkCounts(t, "folded")

	if err := completeAll(e.d, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Ack(ctx, "a", leased[350:], l.Token); err != nil {
		t.Fatal(err)
	}
	e.checkCounts(t, "all of a acked")
	e.clock.Advance(48 * time.Hour)
	e.appendEvents(t, "y", "t", 10) // recent items, which retention keeps
	e.waitLag(t, "a", 0)
	if err := completeAll(e.d, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Cleanup(ctx, e.clock.Now().Add(-24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	got = e.checkCounts(t, "after retention")
	if got[0].Completed != 10 {
		t.Fatalf("after retention: %+v", got[0])
	}
	if err := e.d.FoldCounts(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkCounts(t, "folded again")
}
