package delivery_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/retry"
	"github.com/postbox-events/postbox/stream"
)

// checkSubscriptionCounts holds SubscriptionCounts to a count of every
// item by subscription uid and state.
func (e *env) checkSubscriptionCounts(t *testing.T, step string) {
	t.Helper()
	want := e.countItems(t, "subscription_uid")
	got, err := e.d.SubscriptionCounts(context.Background())
	if err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	for uid, g := range got {
		w := want[uid]
		if w == nil {
			w = &delivery.InboxCounts{Inbox: g.Inbox} // every item of it deleted
		}
		if g != *w {
			t.Fatalf("%s: subscription %s: kept %+v, counted %+v", step, uid, g, *w)
		}
		delete(want, uid)
	}
	for uid, w := range want {
		t.Fatalf("%s: subscription %s has items %+v and no kept counts", step, uid, *w)
	}
}

// TestKeptCountsProperty: after every step of a random mix of appends
// (a third of them events scheduled for up to two hours ahead, or past),
// leases, acks (by lease and by an operator), nacks, dead letters,
// extensions, expired leases (taken again by a lease, or ended by the
// reaper), replays of dead letters and of ranges, retention, folds, a
// subscription deleted and created again, and a stop of the process with
// items leased followed by a start and Recover, the counts kept per inbox
// and per subscription equal a count of the items. POSTBOX_TEST_SEED
// replays a seed the log printed.
func TestKeptCountsProperty(t *testing.T) { eachStore(t, testKeptCountsProperty) }

func testKeptCountsProperty(t *testing.T, kind storeKind) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("POSTBOX_TEST_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("POSTBOX_TEST_SEED: %v", err)
		}
	}
	t.Logf("seed %d (POSTBOX_TEST_SEED=%d replays it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	ctx := context.Background()
	// No reaper, no retention loop: the test ends leases and deletes items
	// itself, between its checks.
	cfg := delivery.Config{Retention: -1, ReapInterval: time.Hour, MaxAttempts: 3}
	streamsAt := filepath.Join(t.TempDir(), "p.db")
	e := open(t, kind, openOptions{streams: streamsAt, cfg: cfg})
	subs := []delivery.Subscription{
		{Name: "a", Source: "devices"},
		{Name: "b", Source: "devices", Inbox: "shared"},
		{Name: "c", Source: "devices", Inbox: "shared", Types: []string{"t.odd"}, Start: stream.Start{Policy: stream.StartEarliest},
			OrderBy: delivery.OrderByDevice}, // ordered per device, beside b in its inbox
	}
	for _, s := range subs {
		e.create(t, s)
	}
	inboxes := []string{"a", "shared"}
	type held struct {
		inbox, token string
		ids          []int64
	}
	var leases []held
	events := 0
	appendSome := func() {
		n := 1 + rng.IntN(40)
		typ := "t.even"
		if rng.IntN(2) == 0 {
			typ = "t.odd"
		}
		if rng.IntN(3) == 0 { // scheduled: due in up to 2 hours, or past
			for i := range n {
				at := e.clock.Now().Add(time.Duration(rng.IntN(150)-30) * time.Minute)
				e.appendTyped(t, "e"+strconv.Itoa(events+i), typ, at)
			}
		} else {
			e.appendEvents(t, "e"+strconv.Itoa(events), typ, n)
		}
		events += n
		for _, s := range []string{"a", "b", "c"} {
			e.waitLag(t, s, 0)
		}
	}
	someOf := func(ids []int64) []int64 { // at least one
		out := []int64{ids[rng.IntN(len(ids))]}
		for _, id := range ids {
			if rng.IntN(2) == 0 {
				out = append(out, id)
			}
		}
		return out
	}
	pickLease := func() *held {
		if len(leases) == 0 {
			return nil
		}
		return &leases[rng.IntN(len(leases))]
	}
	appendSome()
	for step := range 120 {
		var what string
		switch op := rng.IntN(17); op {
		case 0, 1:
			what = "append"
			appendSome()
		case 2, 3:
			inbox := inboxes[rng.IntN(len(inboxes))]
			visibility := time.Hour
			if rng.IntN(3) == 0 {
				visibility = time.Second
			}
			l, err := e.d.Lease(ctx, inbox, 1+rng.IntN(30), visibility, 0)
			if err != nil {
				t.Fatal(err)
			}
			what = "lease " + strconv.Itoa(len(l.Items)) + " of " + inbox
			var ids []int64
			for _, it := range l.Items {
				ids = append(ids, it.ID)
			}
			leases = append(leases, held{inbox, l.Token, ids})
		case 4:
			what = "ack by lease"
			if h := pickLease(); h != nil && len(h.ids) > 0 {
				if _, err := e.d.Ack(ctx, h.inbox, someOf(h.ids), h.token); err != nil {
					t.Fatal(err)
				}
			}
		case 5:
			what = "nack"
			if h := pickLease(); h != nil && len(h.ids) > 0 {
				if _, err := e.d.Nack(ctx, h.inbox, someOf(h.ids), h.token, time.Duration(rng.IntN(2))*time.Minute, "nope"); err != nil {
					t.Fatal(err)
				}
			}
		case 6:
			what = "nack dead"
			if h := pickLease(); h != nil && len(h.ids) > 0 {
				if _, err := e.d.NackDead(ctx, h.inbox, someOf(h.ids), h.token, "bad"); err != nil {
					t.Fatal(err)
				}
			}
		case 7:
			what = "extend"
			if h := pickLease(); h != nil && len(h.ids) > 0 {
				if _, _, err := e.d.Extend(ctx, h.inbox, someOf(h.ids), h.token, time.Hour); err != nil {
					t.Fatal(err)
				}
			}
		case 8:
			what = "operator ack"
			inbox := inboxes[rng.IntN(len(inboxes))]
			items, err := e.d.List(ctx, inbox, "", 0, 500)
			if err != nil {
				t.Fatal(err)
			}
			var ids []int64
			for _, it := range items {
				if rng.IntN(8) == 0 {
					ids = append(ids, it.ID)
				}
			}
			if len(ids) > 0 {
				if _, err := e.d.Ack(ctx, inbox, ids, ""); err != nil {
					t.Fatal(err)
				}
			}
		case 9:
			what = "time passes; leases expire"
			e.clock.Advance(time.Duration(1+rng.IntN(90)) * time.Minute)
			if rng.IntN(2) == 0 {
				what += ", reaped"
				if err := e.d.Reap(ctx); err != nil {
					t.Fatal(err)
				}
			}
		case 10:
			what = "dead letters replayed"
			if _, err := e.d.Replay(ctx, delivery.DeadLetters{Inbox: inboxes[rng.IntN(len(inboxes))]}); err != nil {
				t.Fatal(err)
			}
		case 11:
			sub := []string{"a", "b", "c"}[rng.IntN(3)]
			states := [][]string{{delivery.StateCompleted}, {delivery.StateFailed}, nil}[rng.IntN(3)]
			what = "range of " + sub + " replayed"
			e.clock.Advance(time.Second) // the range ends before now
			job, err := e.d.ReplayRange(ctx, delivery.ReplayRange{Subscription: sub, Since: e.clock.Now().Add(-1000 * time.Hour),
				BatchSize: 1 + rng.IntN(50), States: states})
			if err != nil {
				t.Fatal(err)
			}
			e.waitReplay(t, job.ID)
		case 12:
			what = "retention"
			e.clock.Advance(time.Duration(rng.IntN(120)) * time.Minute)
			if _, err := e.d.Cleanup(ctx, e.clock.Now().Add(-time.Hour)); err != nil {
				t.Fatal(err)
			}
		case 13:
			if rng.IntN(2) == 0 {
				what = "fold"
				if err := e.d.FoldCounts(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				what = "c deleted and created again"
				if err := e.d.Delete(ctx, "c"); err != nil {
					t.Fatal(err)
				}
				e.create(t, subs[2])
				e.waitLag(t, "c", 0)
			}
		case 14:
			what = "the process stops with items leased, starts again and recovers"
			now := e.clock.Now()
			stateAt := e.stateAt
			e.stop()
			e = open(t, kind, openOptions{streams: streamsAt, state: stateAt, cfg: cfg})
			e.clock.Advance(now.Sub(e.clock.Now()))
			if _, err := e.d.Recover(ctx); err != nil {
				t.Fatal(err)
			}
			for _, s := range []string{"a", "b", "c"} {
				e.waitLag(t, s, 0)
			}
		case 15:
			what = "an operator cancels or discards items"
			inbox := inboxes[rng.IntN(len(inboxes))]
			items, err := e.d.List(ctx, inbox, "", 0, 500)
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range items {
				var err error
				switch rng.IntN(12) {
				case 0:
					_, err = e.d.Cancel(ctx, inbox, it.ID, "")
				case 1:
					_, err = e.d.DiscardItem(ctx, inbox, it.ID)
				}
				if err != nil && !errors.Is(err, delivery.ErrInvalidState) {
					t.Fatal(err)
				}
			}
		case 16:
			what = "an operator discards dead letters"
			f := delivery.DeadLetters{Inbox: inboxes[rng.IntN(len(inboxes))]}
			if rng.IntN(2) == 0 {
				f = delivery.DeadLetters{Subscription: []string{"a", "b", "c"}[rng.IntN(3)]}
			}
			if _, err := e.d.Discard(ctx, f); err != nil {
				t.Fatal(err)
			}
		}
		name := "step " + strconv.Itoa(step) + " (" + what + ")"
		e.checkCounts(t, name)
		e.checkSubscriptionCounts(t, name)
	}
}

// TestKeptCountsWorkers: the workers' path (leases of a dispatcher, acks
// and failed attempts settled in group commits) keeps the counts equal to
// a count of the items, with a handler that completes some items, fails
// others for a while, dead-letters some and fails some transiently.
func TestKeptCountsWorkers(t *testing.T) { eachStore(t, testKeptCountsWorkers) }

func testKeptCountsWorkers(t *testing.T, kind storeKind) {
	ctx := context.Background()
	e := setup(t, kind, delivery.Config{Retention: -1, MaxAttempts: 3, RetryBaseDelay: time.Microsecond, RetryMaxDelay: time.Microsecond})
	e.create(t, delivery.Subscription{Name: "w", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest}})
	var transient sync.Map // item ids that failed transiently once
	e.d.Handle("w", func(ctx context.Context, it *delivery.Item) error {
		switch it.Offset % 5 {
		case 0:
			return retry.Permanent(errors.New("never"))
		case 1:
			if it.Attempts < 2 {
				return errors.New("not yet")
			}
		case 2: // a transient failure counts no attempt: the first call alone fails
			if _, again := transient.LoadOrStore(it.ID, true); !again {
				return retry.Transient(errors.New("down"))
			}
		case 3:
			return errors.New("always") // dead after MaxAttempts
		}
		return nil
	})
	e.appendEvents(t, "w", "t", 300)
	var last []delivery.InboxCounts
	for deadline := time.Now().Add(stallTimeout); ; {
		e.clock.Advance(time.Second) // retries come due
		in, err := e.d.Inboxes(ctx)
		if err == nil && len(in) > 0 && in[0].Completed+in[0].Failed == 300 {
			break
		}
		last = in
		if time.Now().After(deadline) {
			t.Fatalf("not every item completed or failed: %+v, %v", last, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.checkCounts(t, "handled")
	e.checkSubscriptionCounts(t, "handled")
	got, _ := e.d.Inboxes(ctx)
	if got[0].Completed != 180 || got[0].Failed != 120 {
		t.Fatalf("handled: %+v, want 180 completed and 120 failed", got[0])
	}
}
