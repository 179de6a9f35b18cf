package delivery_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/retry"
	"github.com/postbox-events/postbox/stream"
)

// orderRecorder is a handler that records, per key, what it was handed:
// it fails when two items of one key are in flight at once, or an item
// comes before the one before it of its key succeeded.
type orderRecorder struct {
	mu       sync.Mutex
	inFlight map[string]int64 // key → seq in flight
	done     map[string]int64 // key → last seq that succeeded
	succeed  map[string]int   // "key/seq" → successes
	total    int
	errs     []string
	fail     func(key string, seq int64) error // nil: succeed
	// skipDead: an item failed for good (a dead letter) lets its key's
	// next one go, as on_dead_letter skip does.
	skipDead bool
}

func newOrderRecorder(fail func(key string, seq int64) error) *orderRecorder {
	return &orderRecorder{inFlight: map[string]int64{}, done: map[string]int64{}, succeed: map[string]int{}, fail: fail}
}

// handle is the Handler: events carry {"k": key, "seq": n}, n from 1 per key.
func (r *orderRecorder) handle(ctx context.Context, it *delivery.Item) error {
	var p struct {
		K   string `json:"k"`
		Seq int64  `json:"seq"`
	}
	if err := json.Unmarshal(it.Payload, &p); err != nil {
		return retry.Permanent(err)
	}
	r.mu.Lock()
	if other, busy := r.inFlight[p.K]; busy {
		r.errs = append(r.errs, fmt.Sprintf("key %s: seq %d handed out while %d in flight", p.K, p.Seq, other))
	}
	if r.done[p.K] != p.Seq-1 {
		r.errs = append(r.errs, fmt.Sprintf("key %s: seq %d handed out after seq %d succeeded", p.K, p.Seq, r.done[p.K]))
	}
	r.inFlight[p.K] = p.Seq
	r.mu.Unlock()
	time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond) // others may come in meanwhile
	var err error
	if r.fail != nil {
		err = r.fail(p.K, p.Seq)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.inFlight, p.K)
	switch {
	case err == nil:
		r.done[p.K] = p.Seq
		r.succeed[fmt.Sprintf("%s/%d", p.K, p.Seq)]++
		r.total++
	case r.skipDead && retry.Classify(err).Permanent:
		r.done[p.K] = p.Seq
	}
	return err
}

func (r *orderRecorder) completed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

// check fails t on what the recorder saw wrong, and unless every key of
// keys had its events 1..events succeed exactly once, but for those of
// except ("key/seq"), which never succeed.
func (r *orderRecorder) check(t *testing.T, keys []string, events int, except ...string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.errs {
		if i == 10 {
			t.Errorf("… %d more", len(r.errs)-10)
			break
		}
		t.Error(e)
	}
	for _, k := range keys {
		for s := 1; s <= events; s++ {
			name := fmt.Sprintf("%s/%d", k, s)
			want := 1
			if slices.Contains(except, name) {
				want = 0
			}
			if n := r.succeed[name]; n != want {
				t.Errorf("key %s seq %d succeeded %d times, want %d", k, s, n, want)
			}
		}
	}
}

// appendKeyed appends events of keys round-robin, events per key, their
// payload {"k": key, "seq": n} and metadata {"device_id": key}.
func (e *env) appendKeyed(t testing.TB, keys []string, events int) {
	t.Helper()
	var evs []stream.Event
	for s := 1; s <= events; s++ {
		for _, k := range keys {
			evs = append(evs, stream.Event{NativeID: fmt.Sprintf("%s-%d", k, s), Type: "order.step", OccurredAt: time.Now(),
				Metadata: json.RawMessage(fmt.Sprintf(`{"device_id":%q}`, k)), Payload: json.RawMessage(fmt.Sprintf(`{"k":%q,"seq":%d}`, k, s))})
		}
	}
	for len(evs) > 0 {
		n := min(len(evs), 500)
		if _, err := e.streams.Append(context.Background(), "devices", evs[:n]); err != nil {
			t.Fatal(err)
		}
		evs = evs[n:]
	}
}

func keyNames(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-%d", i)
	}
	return keys
}

// orderedConfig is a delivery that retries at once, on the real clock,
// with 8 workers.
func orderedConfig() delivery.Config {
	return delivery.Config{Now: time.Now, Workers: 8, MaxAttempts: 1000, RetryBaseDelay: time.Millisecond,
		RetryMaxDelay: 5 * time.Millisecond, Jitter: retry.NoJitter}
}

// TestOrderedPerKey: 20 keys of 15 events each to a handler that fails
// a tenth of its attempts at random, with 8 workers: each key's items
// succeed once each, in offset order, never two of a key in flight.
func TestOrderedPerKey(t *testing.T) { eachStore(t, testOrderedPerKey) }

func testOrderedPerKey(t *testing.T, kind storeKind) {
	e := setup(t, kind, orderedConfig())
	var mu sync.Mutex
	rnd := rand.New(rand.NewPCG(1, 2))
	rec := newOrderRecorder(func(string, int64) error {
		mu.Lock()
		defer mu.Unlock()
		if rnd.IntN(10) == 0 {
			return errors.New("target down for a moment")
		}
		return nil
	})
	e.d.Handle("orders", rec.handle)
	e.create(t, delivery.Subscription{Name: "orders", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest}, OrderBy: "/k"})
	keys := keyNames(20)
	e.appendKeyed(t, keys, 15)
	testenv.Progressing(t, stallTimeout, "every item completed", func() (bool, int64) {
		n := rec.completed()
		return n == len(keys)*15, int64(n)
	})
	rec.check(t, keys, 15)
	it, err := e.d.ItemOf(context.Background(), "orders", 1)
	if err != nil || it.OrderKey == nil || *it.OrderKey != "order-0" {
		t.Fatalf("item of offset 1: key %v, %v; want order-0", it.OrderKey, err)
	}
}

// TestOrderedPoisonItem: with on_dead_letter block, the dead letter of
// one key holds back the key's next items (Held counts the key) while
// the other keys complete; discarding it lets the key go on. With skip,
// the key goes on at once and the dead letter stays.
func TestOrderedPoisonItem(t *testing.T) {
	for _, policy := range []string{delivery.OnDeadLetterBlock, delivery.OnDeadLetterSkip} {
		t.Run(policy, func(t *testing.T) {
			eachStore(t, func(t *testing.T, kind storeKind) { testOrderedPoisonItem(t, kind, policy) })
		})
	}
}

func testOrderedPoisonItem(t *testing.T, kind storeKind, policy string) {
	ctx := context.Background()
	e := setup(t, kind, orderedConfig())
	rec := newOrderRecorder(func(key string, seq int64) error {
		if key == "order-0" && seq == 2 {
			return retry.Permanent(errors.New("poison"))
		}
		return nil
	})
	rec.skipDead = policy == delivery.OnDeadLetterSkip
	e.d.Handle("orders", rec.handle)
	sub := e.create(t, delivery.Subscription{Name: "orders", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest},
		OrderBy: delivery.OrderByDevice, OnDeadLetter: policy})
	if sub.OnDeadLetter != policy {
		t.Fatalf("on_dead_letter %q, want %q", sub.OnDeadLetter, policy)
	}
	keys := keyNames(4)
	e.appendKeyed(t, keys, 5)
	want := 3*5 + 1 // the others, and order-0's first
	if policy == delivery.OnDeadLetterSkip {
		want = 4*5 - 1 // all but the poison
	}
	testenv.Progressing(t, stallTimeout, "the items that can go to complete", func() (bool, int64) {
		n := rec.completed()
		return n == want, int64(n)
	})
	dead := e.count(t, `SELECT count(*) FROM inbox_items WHERE state = 'failed'`)
	if dead != 1 {
		t.Fatalf("%d dead letters, want 1", dead)
	}
	if policy == delivery.OnDeadLetterSkip {
		rec.check(t, keys, 5, "order-0/2")
		if h, err := e.d.Held(ctx, sub); err != nil || h.Keys != 0 {
			t.Fatalf("held %+v, %v; want no key held", h, err)
		}
		return
	}
	// Blocked: order-0's seq 3..5 wait, through lease after lease.
	for range 3 {
		l, err := e.d.Lease(ctx, "orders", 10, time.Minute, 0)
		if err != nil || len(l.Items) != 0 {
			t.Fatalf("a lease behind a dead letter took %d items, %v", len(l.Items), err)
		}
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE state = 'pending'`); n != 3 {
		t.Fatalf("%d items pending, want order-0's 3 behind its dead letter", n)
	}
	h, err := e.d.Held(ctx, sub)
	if err != nil || h.Keys != 1 || h.Oldest.IsZero() {
		t.Fatalf("held %+v, %v; want 1 key, with its oldest waiting item", h, err)
	}
	dl, err := e.d.ListDeadLetters(ctx, delivery.DeadLetters{Inbox: "orders"})
	if err != nil || len(dl) != 1 {
		t.Fatalf("dead letters %v, %v", dl, err)
	}
	rec.mu.Lock()
	rec.done["order-0"] = 2 // discarded: its next goes
	rec.mu.Unlock()
	if _, err := e.d.DiscardItem(ctx, "orders", dl[0].ID); err != nil {
		t.Fatal(err)
	}
	testenv.Progressing(t, stallTimeout, "order-0 to go on", func() (bool, int64) {
		n := rec.completed()
		return n == 4*5-1, int64(n)
	})
	rec.check(t, keys, 5, "order-0/2")
}

// TestOrderedLease: a runtime's lease never holds two items of a key,
// nor an item while an earlier one of its key is processing or waits for
// a retry; an ack lets the key's next item go.
func TestOrderedLease(t *testing.T) { eachStore(t, testOrderedLease) }

func testOrderedLease(t *testing.T, kind storeKind) {
	ctx := context.Background()
	e := setup(t, kind, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "orders", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest},
		OrderBy: "metadata.device_id"})
	keys := keyNames(3)
	e.appendKeyed(t, keys, 4)
	e.waitLag(t, "orders", 0)
	seqOf := func(it delivery.Item) (string, int64) {
		var p struct {
			K   string `json:"k"`
			Seq int64  `json:"seq"`
		}
		json.Unmarshal(it.Payload, &p)
		return p.K, p.Seq
	}
	lease := func(want map[string]int64) delivery.Lease {
		t.Helper()
		l, err := e.d.Lease(ctx, "orders", 100, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, it := range l.Items {
			k, s := seqOf(it)
			if _, twice := got[k]; twice {
				t.Fatalf("one lease holds two items of %s", k)
			}
			got[k] = s
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("lease took %v, want %v", got, want)
		}
		return l
	}
	first := lease(map[string]int64{"order-0": 1, "order-1": 1, "order-2": 1})
	lease(map[string]int64{}) // every key is busy
	var ack, nack []int64
	for _, it := range first.Items {
		switch k, _ := seqOf(it); k {
		case "order-0":
			ack = append(ack, it.ID)
		case "order-1":
			nack = append(nack, it.ID)
		}
	}
	if _, err := e.d.Ack(ctx, "orders", ack, first.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Nack(ctx, "orders", nack, first.Token, time.Hour, "later"); err != nil {
		t.Fatal(err)
	}
	// order-0 goes on; order-1 waits for its retry, order-2 for its lease.
	second := lease(map[string]int64{"order-0": 2})
	// The lease of order-2's ends: its first item again, not its second.
	e.clock.Advance(2 * time.Minute)
	lease(map[string]int64{"order-2": 1, "order-0": 2})
	_ = second
	// order-1's retry comes due: its first item again.
	e.clock.Advance(time.Hour)
	lease(map[string]int64{"order-1": 1, "order-2": 1, "order-0": 2})
}

// TestOrderByInvalid: a bad order_by or on_dead_letter is refused,
// naming the field.
func TestOrderByInvalid(t *testing.T) {
	e := setup(t, sqliteStore, delivery.Config{})
	for _, c := range []struct{ by, onDead, want string }{
		{"device", "", "order_by"},
		{"metadata.", "", "order_by"},
		{"header.", "", "order_by"},
		{"header.x y", "", "order_by"},
		{"header.x-shop-id", "", "order_by"}, // not kept in a webhook's metadata
		{"order/id", "", "order_by"},
		{"/order/~2", "", "order_by"},
		{"/a~", "", "order_by"},
		{"/" + strings.Repeat("a", 300), "", "order_by"},
		{"/order/id", "drop", "on_dead_letter"},
		{"", "skip", "on_dead_letter"},
	} {
		_, _, err := e.d.Create(context.Background(), delivery.Subscription{Name: "bad", Source: "devices", OrderBy: c.by, OnDeadLetter: c.onDead})
		if !errors.Is(err, delivery.ErrInvalid) || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("order_by %q on_dead_letter %q: %v, want ErrInvalid naming %s", c.by, c.onDead, err, c.want)
		}
	}
	for _, by := range []string{"header.X-Shopify-Shop-Domain", "header.x-github-event", "header.X-Request-Id"} {
		if _, _, err := e.d.Create(context.Background(), delivery.Subscription{Name: "ok", Source: "devices", OrderBy: by}); err != nil {
			t.Errorf("order_by %q, a kept header: %v", by, err)
		}
		if err := e.d.Delete(context.Background(), "ok"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOrderedReplay: under skip, a dead letter replayed while a later
// item of its key is processing waits for it, then goes before the
// key's next pending item, which waits for it in turn.
func TestOrderedReplay(t *testing.T) { eachStore(t, testOrderedReplay) }

func testOrderedReplay(t *testing.T, kind storeKind) {
	ctx := context.Background()
	e := setup(t, kind, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "orders", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest},
		OrderBy: "/k", OnDeadLetter: delivery.OnDeadLetterSkip})
	e.appendKeyed(t, keyNames(1), 4)
	e.waitLag(t, "orders", 0)
	lease := func(wantSeq ...int) delivery.Lease {
		t.Helper()
		l, err := e.d.Lease(ctx, "orders", 10, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		for _, it := range l.Items {
			var p struct{ Seq int }
			json.Unmarshal(it.Payload, &p)
			got = append(got, p.Seq)
		}
		if fmt.Sprint(got) != fmt.Sprint(wantSeq) {
			t.Fatalf("lease took seqs %v, want %v", got, wantSeq)
		}
		return l
	}
	ids := func(l delivery.Lease) []int64 { return []int64{l.Items[0].ID} }
	first := lease(1)
	if _, err := e.d.NackDead(ctx, "orders", ids(first), first.Token, "poison"); err != nil {
		t.Fatal(err)
	}
	second := lease(2) // skip: the dead letter holds nothing back
	if _, err := e.d.Replay(ctx, delivery.DeadLetters{ID: first.Items[0].ID}); err != nil {
		t.Fatal(err)
	}
	lease() // seq 2 is processing: the replayed seq 1 waits
	if _, err := e.d.Ack(ctx, "orders", ids(second), second.Token); err != nil {
		t.Fatal(err)
	}
	again := lease(1) // the replayed one, before seq 3
	lease()
	if _, err := e.d.Ack(ctx, "orders", ids(again), again.Token); err != nil {
		t.Fatal(err)
	}
	lease(3)
}

// TestOrderedSwitchToSkip: a key held behind its dead letter goes on once
// the subscription is changed to on_dead_letter skip.
func TestOrderedSwitchToSkip(t *testing.T) { eachStore(t, testOrderedSwitchToSkip) }

func testOrderedSwitchToSkip(t *testing.T, kind storeKind) {
	ctx := context.Background()
	e := setup(t, kind, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "orders", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest}, OrderBy: "/k"})
	e.appendKeyed(t, keyNames(1), 2)
	e.waitLag(t, "orders", 0)
	l, err := e.d.Lease(ctx, "orders", 10, time.Minute, 0)
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("lease: %d items, %v", len(l.Items), err)
	}
	if _, err := e.d.NackDead(ctx, "orders", []int64{l.Items[0].ID}, l.Token, "poison"); err != nil {
		t.Fatal(err)
	}
	if l, err := e.d.Lease(ctx, "orders", 10, time.Minute, 0); err != nil || len(l.Items) != 0 {
		t.Fatalf("a lease behind a dead letter under block took %d items, %v", len(l.Items), err)
	}
	for _, bad := range []string{"", "drop"} {
		if _, err := e.d.Update(ctx, "orders", delivery.Change{OnDeadLetter: &bad}); !errors.Is(err, delivery.ErrInvalid) ||
			!strings.HasPrefix(err.Error(), "on_dead_letter") {
			t.Fatalf("on_dead_letter %q: %v, want ErrInvalid naming on_dead_letter", bad, err)
		}
	}
	skip := delivery.OnDeadLetterSkip
	// A change refused for another field writes nothing of it.
	badSecret := "not a secret"
	if _, err := e.d.Update(ctx, "orders", delivery.Change{OnDeadLetter: &skip, Secret: &badSecret}); !errors.Is(err, delivery.ErrInvalid) {
		t.Fatalf("on_dead_letter with a bad secret: %v, want ErrInvalid", err)
	}
	if s, _ := e.d.Subscription(ctx, "orders"); s.OnDeadLetter != delivery.OnDeadLetterBlock {
		t.Fatalf("on_dead_letter %q after a refused change, want block", s.OnDeadLetter)
	}
	if s, err := e.d.Update(ctx, "orders", delivery.Change{OnDeadLetter: &skip}); err != nil || s.OnDeadLetter != skip {
		t.Fatalf("update: %+v, %v", s, err)
	}
	if s, _ := e.d.Subscription(ctx, "orders"); s.OnDeadLetter != skip {
		t.Fatalf("stored on_dead_letter %q, want skip", s.OnDeadLetter)
	}
	l, err = e.d.Lease(ctx, "orders", 10, time.Minute, 0)
	if err != nil || len(l.Items) != 1 || l.Items[0].Offset != 2 {
		t.Fatalf("a lease after the switch to skip: %+v, %v; want the key's second item", l.Items, err)
	}
}

// TestOrderedInlineItems: items written with their events (InlineHook)
// carry their order key as the loop's do.
func TestOrderedInlineItems(t *testing.T) {
	ctx := context.Background()
	e := setup(t, sqliteStore, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "hooked", Source: "devices", OrderBy: "/k"})
	e.hookInline(t, "hooked")
	e.appendKeyed(t, keyNames(3), 2)
	items, err := e.d.List(ctx, "hooked", "", 0, 100)
	if err != nil || len(items) != 6 {
		t.Fatalf("%d items right after the append, %v; want 6 written with their events", len(items), err)
	}
	for _, it := range items {
		var p struct{ K string }
		json.Unmarshal(it.Payload, &p)
		if it.OrderKey == nil || *it.OrderKey != p.K {
			t.Errorf("item at offset %d: order key %v, want %q", it.Offset, it.OrderKey, p.K)
		}
	}
}
