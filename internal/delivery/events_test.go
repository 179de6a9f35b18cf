package delivery_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/stream"
)

// TestEventDeliveries: an event's deliveries name every subscription of
// its stream that takes it: one holding an item, a deleted one whose item
// stays, one whose items are dead letters, and one that started after
// it; not one whose filter refuses it.
func TestEventDeliveries(t *testing.T) { eachStore(t, testEventDeliveries) }

func testEventDeliveries(t *testing.T, kind storeKind) {
	ctx := context.Background()
	e := setup(t, kind, delivery.Config{})
	earliest := stream.Start{Policy: stream.StartEarliest}
	for _, name := range []string{"keep", "gone", "dead"} {
		e.create(t, delivery.Subscription{Name: name, Source: "devices", Start: earliest})
	}
	e.create(t, delivery.Subscription{Name: "other-types", Source: "devices", Types: []string{"never.*"}, Start: earliest})
	e.appendEvents(t, "ev", "proposal.task", 1)
	for _, name := range []string{"keep", "gone", "dead"} {
		e.waitLag(t, name, 0)
	}
	l, err := e.d.Lease(ctx, "dead", 1, time.Minute, 0)
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("lease: %+v, %v", l, err)
	}
	if _, err := e.d.NackDead(ctx, "dead", []int64{l.Items[0].ID}, l.Token, "no handler"); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	e.create(t, delivery.Subscription{Name: "late", Source: "devices"})

	ev, err := e.streams.Event(ctx, "devices", 1)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := e.d.Deliveries(ctx, "devices", &ev)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range ds {
		s := fmt.Sprintf("%s %s deleted=%v", d.Subscription, d.Status, d.Deleted)
		if d.Item != nil {
			s += " " + d.Item.State
			if d.Item.EventID != "ev-0" || d.Item.Offset != 1 {
				t.Errorf("%s: item %+v, not of the event", d.Subscription, d.Item)
			}
		}
		got = append(got, s)
	}
	want := []string{
		"dead item deleted=false failed",
		"gone item deleted=true pending",
		"keep item deleted=false pending",
		"late none deleted=false",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("deliveries:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if r := ds[3].Reason; !strings.Contains(r, "started after") {
		t.Errorf("late's reason %q", r)
	}

	// A subscription created again under a deleted one's name is another
	// subscription: the old item stays the deleted one's.
	e.create(t, delivery.Subscription{Name: "gone", Source: "devices", Start: earliest})
	e.waitLag(t, "gone", 0)
	if ds, err = e.d.Deliveries(ctx, "devices", &ev); err != nil {
		t.Fatal(err)
	}
	var gone []bool
	for _, d := range ds {
		if d.Subscription == "gone" {
			gone = append(gone, d.Deleted)
		}
	}
	if !slices.Equal(gone, []bool{false, true}) {
		t.Fatalf("the deliveries of gone, deleted or not: %v, want the new one, then the deleted one", gone)
	}

	// A subscription whose loop has not read the event yet (here: none
	// runs) has it unread.
	e.halt()
	e.create(t, delivery.Subscription{Name: "behind", Source: "devices", Start: earliest})
	if ds, err = e.d.Deliveries(ctx, "devices", &ev); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ds, func(d delivery.EventDelivery) bool { return d.Subscription == "behind" })
	if i < 0 || ds[i].Status != delivery.DeliveryUnread || ds[i].Item != nil {
		t.Fatalf("behind: %+v, want unread", ds)
	}
}

// TestSearchItems: an inbox's items by event id, type, state and time,
// newest first, by pages.
func TestSearchItems(t *testing.T) { eachStore(t, testSearchItems) }

func testSearchItems(t *testing.T, kind storeKind) {
	ctx := context.Background()
	e := setup(t, kind, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "s", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest}})
	e.appendEvents(t, "a", "proposal.task", 4)
	e.waitLag(t, "s", 0)
	t0 := e.clock.Now()
	e.clock.Advance(time.Hour)
	e.appendEvents(t, "b", "proposal.review", 4)
	e.waitLag(t, "s", 0)
	ids := func(items []delivery.Item) []string {
		var out []string
		for _, it := range items {
			out = append(out, it.EventID)
		}
		return out
	}
	for _, c := range []struct {
		what string
		q    delivery.ItemQuery
		want []string
	}{
		{"every item", delivery.ItemQuery{}, []string{"b-3", "b-2", "b-1", "b-0", "a-3", "a-2", "a-1", "a-0"}},
		{"by event id", delivery.ItemQuery{EventID: "a-2"}, []string{"a-2"}},
		{"by type", delivery.ItemQuery{Type: "proposal.task"}, []string{"a-3", "a-2", "a-1", "a-0"}},
		{"since", delivery.ItemQuery{Since: t0.Add(time.Minute)}, []string{"b-3", "b-2", "b-1", "b-0"}},
		{"until", delivery.ItemQuery{Until: t0.Add(time.Minute), Limit: 2}, []string{"a-3", "a-2"}},
		{"by type and time", delivery.ItemQuery{Type: "proposal.review", Until: t0.Add(time.Minute)}, nil},
		{"by state", delivery.ItemQuery{State: delivery.StateCompleted}, nil},
		{"another inbox", delivery.ItemQuery{Inbox: "nowhere"}, nil},
	} {
		if c.q.Inbox == "" {
			c.q.Inbox = "s"
		}
		got, _, err := e.d.Search(ctx, c.q)
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if !slices.Equal(ids(got), c.want) {
			t.Errorf("%s: %v, want %v", c.what, ids(got), c.want)
		}
	}
	// Pages of 3 go through every item once, in order; so do the pages
	// of one state (by id), and those of a state and a type, which read
	// at most 2 items of the state per page here.
	delivery.SetSearchScan(t, 2)
	for _, q := range []delivery.ItemQuery{{}, {State: delivery.StatePending}, {State: delivery.StatePending, Type: "proposal.review"}} {
		q.Inbox, q.Limit = "s", 3
		var all []string
		for pages := 0; ; pages++ {
			page, next, err := e.d.Search(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if pages > 10 {
				t.Fatalf("%+v: more than 10 pages", q)
			}
			all = append(all, ids(page)...)
			if next == 0 {
				break
			}
			q.Before = next
		}
		want := []string{"b-3", "b-2", "b-1", "b-0", "a-3", "a-2", "a-1", "a-0"}
		if q.Type != "" {
			want = want[:4]
		}
		if !slices.Equal(all, want) {
			t.Errorf("pages of %+v: %v, want %v", q, all, want)
		}
	}
	if _, _, err := e.d.Search(ctx, delivery.ItemQuery{Inbox: "s", Before: 999999}); !errors.Is(err, delivery.ErrInvalid) {
		t.Errorf("before an unknown item: %v, want ErrInvalid", err)
	}
}

// TestSearchUsesIndexes: on SQLite, the queries of an event's items and
// of each search filter read an index, not the whole table, in the
// order of the answer (no sort).
func TestSearchUsesIndexes(t *testing.T) {
	e := setup(t, sqliteStore, delivery.Config{})
	db := e.state.ReadDB()
	plan := func(q string, args ...any) string {
		rows, err := db.Query(`EXPLAIN QUERY PLAN `+q, args...)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rows.Close()
		var lines []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, detail)
		}
		return strings.Join(lines, "; ")
	}
	if p := plan(delivery.EventItemsSQL, 1, "devices"); !strings.Contains(p, "USING INDEX sqlite_autoindex_inbox_items_1 (subscription_uid=? AND offset=?)") || strings.Contains(p, "SCAN inbox_items") {
		t.Errorf("an event's items: plan %q, want the index of UNIQUE (subscription_uid, offset)", p)
	}
	if p := plan(delivery.ItemSubscriptionsSQL); strings.Contains(p, "SCAN inbox_items") || !strings.Contains(p, "SEARCH inbox_items USING COVERING INDEX") {
		t.Errorf("the subscriptions that hold items: plan %q, want a walk of an index", p)
	}
	since := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		what  string
		q     delivery.ItemQuery
		index string
	}{
		{"every item", delivery.ItemQuery{}, "inbox_items_by_created"},
		{"by event id", delivery.ItemQuery{EventID: "a-1"}, "inbox_items_by_native_id"},
		{"by type", delivery.ItemQuery{Type: "proposal.task"}, "inbox_items_by_type"},
		{"by type and time", delivery.ItemQuery{Type: "proposal.task", Since: since, Until: since.Add(time.Hour)}, "inbox_items_by_type"},
		{"by time", delivery.ItemQuery{Since: since, Until: since.Add(time.Hour)}, "inbox_items_by_created"},
		{"a next page", delivery.ItemQuery{Before: 42}, "inbox_items_by_created"},
		{"a next page by time", delivery.ItemQuery{Since: since, Before: 42}, "inbox_items_by_created"},
		{"a next page by type", delivery.ItemQuery{Type: "proposal.task", Before: 42}, "inbox_items_by_type"},
		{"by state", delivery.ItemQuery{State: delivery.StateCompleted}, "inbox_items_by_state"},
		{"by state, a next page", delivery.ItemQuery{State: delivery.StateCompleted, Before: 42}, "inbox_items_by_state"},
		{"by state and type", delivery.ItemQuery{State: delivery.StateCompleted, Type: "proposal.task"}, "inbox_items_by_state"},
		{"by state and time, a next page", delivery.ItemQuery{State: delivery.StateCompleted, Since: since, Before: 42}, "inbox_items_by_state"},
		{"by state and event id", delivery.ItemQuery{State: delivery.StateCompleted, EventID: "a-1"}, "inbox_items_by_native_id"},
	} {
		c.q.Inbox = "s"
		q, args := delivery.SearchSQL(c.q, since.Format(time.RFC3339Nano))
		p := plan(q, args...)
		if !strings.Contains(p, "INDEX "+c.index) {
			t.Errorf("%s: plan %q, want the index %s", c.what, p, c.index)
		}
		if strings.Contains(p, "TEMP B-TREE") {
			t.Errorf("%s: plan %q sorts", c.what, p)
		}
	}
}

// TestSearchItemsOfSubscriptionsMadeAgain: an inbox filled by a
// subscription that was deleted and made again (another uid) is searched
// by time across both, newest first, and by pages that go through every
// item once; an event's deliveries name the items of both.
func TestSearchItemsOfSubscriptionsMadeAgain(t *testing.T) {
	eachStore(t, testSearchItemsOfSubscriptionsMadeAgain)
}

func testSearchItemsOfSubscriptionsMadeAgain(t *testing.T, kind storeKind) {
	ctx := context.Background()
	e := setup(t, kind, delivery.Config{})
	earliest := stream.Start{Policy: stream.StartEarliest}
	e.create(t, delivery.Subscription{Name: "s", Source: "devices", Start: earliest})
	e.appendEvents(t, "a", "proposal.task", 3)
	e.waitLag(t, "s", 0)
	e.clock.Advance(time.Minute)
	if err := e.d.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	e.create(t, delivery.Subscription{Name: "s", Source: "devices", Start: earliest}) // reads a-0..a-2 again
	e.waitLag(t, "s", 0)
	t1 := e.clock.Now()
	e.clock.Advance(time.Minute)
	e.appendEvents(t, "b", "proposal.task", 2)
	e.waitLag(t, "s", 0)

	all, next, err := e.d.Search(ctx, delivery.ItemQuery{Inbox: "s", Limit: 100})
	if err != nil || next != 0 {
		t.Fatalf("search: %v, next %d", err, next)
	}
	if len(all) != 8 {
		t.Fatalf("%d items, want 8 (3 of the deleted subscription, 5 of the new one)", len(all))
	}
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if a.CreatedAt.Before(b.CreatedAt) || (a.CreatedAt.Equal(b.CreatedAt) && a.ID < b.ID) {
			t.Fatalf("items %d and %d out of order: %v/%d before %v/%d", i-1, i, a.CreatedAt, a.ID, b.CreatedAt, b.ID)
		}
	}
	if got := all[len(all)-1].EventID; got != "a-0" || all[len(all)-1].CreatedAt.After(t1) {
		t.Errorf("the oldest item is %s of %v, want a-0 of the deleted subscription", got, all[len(all)-1].CreatedAt)
	}
	for _, q := range []delivery.ItemQuery{{}, {Since: t1}, {Until: t1}} {
		q.Inbox, q.Limit = "s", 3
		var want []int64
		for _, it := range all {
			if (q.Since.IsZero() || !it.CreatedAt.Before(q.Since)) && (q.Until.IsZero() || it.CreatedAt.Before(q.Until)) {
				want = append(want, it.ID)
			}
		}
		var got []int64
		for pages := 0; ; pages++ {
			if pages > 10 {
				t.Fatalf("%+v: more than 10 pages", q)
			}
			page, next, err := e.d.Search(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range page {
				got = append(got, it.ID)
			}
			if next == 0 {
				break
			}
			q.Before = next
		}
		if !slices.Equal(got, want) {
			t.Errorf("pages of since %v until %v: %v, want %v", q.Since, q.Until, got, want)
		}
	}

	ev, err := e.streams.Event(ctx, "devices", 1)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := e.d.Deliveries(ctx, "devices", &ev)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range ds {
		if d.Item == nil || d.Item.EventID != "a-0" {
			t.Errorf("delivery %+v: want an item of a-0", d)
		}
		got = append(got, fmt.Sprintf("%s deleted=%v", d.Subscription, d.Deleted))
	}
	if want := []string{"s deleted=false", "s deleted=true"}; !slices.Equal(got, want) {
		t.Errorf("deliveries %v, want %v", got, want)
	}
}
