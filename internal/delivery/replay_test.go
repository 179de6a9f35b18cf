package delivery_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/retry"
)

// handled counts the calls of a handler by item id.
type handled struct {
	mu sync.Mutex
	n  map[int64]int
}

func (h *handled) add(id int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[int64]int{}
	}
	h.n[id]++
}

func (h *handled) get(id int64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[id]
}

func (h *handled) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.n {
		n += c
	}
	return n
}

// waitReplay waits until replay id is no longer running and returns it.
func (e *env) waitReplay(t testing.TB, id string) delivery.ReplayJob {
	t.Helper()
	var j delivery.ReplayJob
	testenv.Eventually(t, 30*time.Second, "replay "+id+" to end", func() bool {
		var err error
		j, err = e.d.ReplayJob(context.Background(), id)
		return err == nil && j.State != delivery.ReplayRunning
	})
	return j
}

// waitSettled waits until no item of sub is pending or processing but
// those of except.
func (e *env) waitSettled(t testing.TB, sub string, except ...int64) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, sub+"'s items to be completed or failed", func() bool {
		items, err := e.d.List(context.Background(), sub, "", 0, 1000)
		if err != nil {
			return false
		}
		for _, it := range items {
			if (it.State == delivery.StatePending || it.State == delivery.StateProcessing) && !containsID(except, it.ID) {
				return false
			}
		}
		return true
	})
}

func containsID(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// TestReplayRange: a replay of a time range delivers every completed and
// failed item made in it again, once, and none made outside it; a pending
// item of the range is left alone; states narrows it.
func TestReplayRange(t *testing.T) { eachStore(t, testReplayRange) }

func testReplayRange(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	ctx := context.Background()
	var calls handled
	const stuck = 15 // the offset of an item that stays pending
	e.d.Handle("r", func(ctx context.Context, it *delivery.Item) error {
		calls.add(it.ID)
		switch {
		case it.Offset == stuck:
			return errors.New("not yet")
		case it.Offset%4 == 0:
			return retry.Permanent(errors.New("bad payload"))
		}
		return nil
	})
	e.create(t, delivery.Subscription{Name: "r", Source: "devices"})
	t0 := e.clock.Now()
	// 10 items at t0, 20 an hour later, 10 two hours later.
	e.appendEvents(t, "a", "t", 10)
	e.waitLag(t, "r", 0)
	e.waitSettled(t, "r")
	e.clock.Advance(time.Hour)
	e.appendEvents(t, "b", "t", 20)
	e.waitLag(t, "r", 0)
	stuckItem, err := e.d.ItemOf(ctx, "r", stuck)
	if err != nil {
		t.Fatal(err)
	}
	e.waitSettled(t, "r", stuckItem.ID)
	e.clock.Advance(time.Hour)
	e.appendEvents(t, "c", "t", 10)
	e.waitLag(t, "r", 0)
	e.waitSettled(t, "r", stuckItem.ID)
	before := map[int64]int{}
	items, err := e.d.List(ctx, "r", "", 0, 1000)
	if err != nil || len(items) != 40 {
		t.Fatalf("items: %d %v", len(items), err)
	}
	failed := 0
	for _, it := range items {
		before[it.ID] = calls.get(it.ID)
		if it.Offset > 10 && it.Offset <= 30 && it.State == delivery.StateFailed {
			failed++
		}
	}
	if failed != 5 {
		t.Fatalf("%d failed items in the range, want 5", failed)
	}

	job, err := e.d.ReplayRange(ctx, delivery.ReplayRange{Subscription: "r", Since: t0.Add(time.Hour), Until: t0.Add(2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if job.Matched != 19 || job.Inbox != "r" || len(job.States) != 2 || !job.Until.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("job: %+v, want 19 matched: the 20 items of the range but the pending one", job)
	}
	job = e.waitReplay(t, job.ID)
	if job.State != delivery.ReplayCompleted || job.Replayed != 19 || job.FinishedAt == nil || job.Error != "" || job.Batches != 1 {
		t.Fatalf("job at its end: %+v", job)
	}
	testenv.Eventually(t, 30*time.Second, "the replayed items to be handled", func() bool {
		return calls.total() >= sum(before)+19
	})
	e.waitSettled(t, "r", stuckItem.ID)
	items, _ = e.d.List(ctx, "r", "", 0, 1000)
	for _, it := range items {
		inRange := it.Offset > 10 && it.Offset <= 30 && it.Offset != stuck
		want, replays := before[it.ID], 0
		if inRange {
			want, replays = want+1, 1
		}
		if it.Offset == stuck {
			if it.Replays != 0 {
				t.Errorf("the pending item was replayed: %+v", it)
			}
			continue
		}
		if got := calls.get(it.ID); got != want || it.Replays != replays {
			t.Errorf("item at offset %d (%s): handled %d times, replays %d; want %d and %d", it.Offset, it.State, got, it.Replays, want, replays)
		}
		if inRange && (it.Attempts != 1 || it.ReplayedAt == nil) {
			t.Errorf("replayed item at offset %d: attempts %d, replayed_at %v; want a fresh budget: 1 attempt", it.Offset, it.Attempts, it.ReplayedAt)
		}
	}

	// Only the failed ones of the first hour.
	job, err = e.d.ReplayRange(ctx, delivery.ReplayRange{Subscription: "r", Since: t0, Until: t0.Add(time.Hour), States: []string{delivery.StateFailed}})
	if err != nil {
		t.Fatal(err)
	}
	if job = e.waitReplay(t, job.ID); job.Matched != 2 || job.Replayed != 2 {
		t.Fatalf("failed items of the first hour: %+v, want 2 (offsets 4 and 8)", job)
	}
	// Until defaults to now.
	e.clock.Advance(time.Minute)
	job, err = e.d.ReplayRange(ctx, delivery.ReplayRange{Subscription: "r", Since: t0.Add(2 * time.Hour), States: []string{delivery.StateCompleted}})
	if err != nil || !job.Until.Equal(e.clock.Now()) {
		t.Fatalf("until: %+v %v, want now", job, err)
	}
	if job = e.waitReplay(t, job.ID); job.Replayed != 7 {
		t.Fatalf("completed items of the last hour: %+v, want 7 (offsets 31 to 40 but 32, 36 and 40)", job)
	}
}

func sum(m map[int64]int) int {
	n := 0
	for _, c := range m {
		n += c
	}
	return n
}

// TestReplayRangeInvalid: what ReplayRange refuses.
func TestReplayRangeInvalid(t *testing.T) {
	e := setup(t, sqliteStore, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "r", Source: "devices"})
	ctx := context.Background()
	now := e.clock.Now()
	for _, c := range []struct {
		r    delivery.ReplayRange
		kind error
	}{
		{delivery.ReplayRange{Subscription: "r"}, delivery.ErrInvalid},
		{delivery.ReplayRange{Subscription: "r", Since: now.Add(-time.Hour), Until: now.Add(-2 * time.Hour)}, delivery.ErrInvalid},
		{delivery.ReplayRange{Subscription: "r", Since: now.Add(-time.Hour), Until: now.Add(-time.Hour)}, delivery.ErrInvalid},
		{delivery.ReplayRange{Subscription: "r", Since: now.Add(time.Hour)}, delivery.ErrInvalid},
		{delivery.ReplayRange{Subscription: "r", Since: now.Add(-time.Hour), States: []string{"pending"}}, delivery.ErrInvalid},
		{delivery.ReplayRange{Subscription: "r", Since: now.Add(-time.Hour), BatchSize: -1}, delivery.ErrInvalid},
		{delivery.ReplayRange{Subscription: "nope", Since: now.Add(-time.Hour)}, delivery.ErrNotFound},
	} {
		if _, err := e.d.ReplayRange(ctx, c.r); !errors.Is(err, c.kind) {
			t.Errorf("%+v: %v, want %v", c.r, err, c.kind)
		}
	}
	if _, err := e.d.ReplayJob(ctx, "rpl_nope"); !errors.Is(err, delivery.ErrNotFound) {
		t.Errorf("unknown replay: %v", err)
	}
}

// batchLog calls fn with each "replay batch" record delivery logs, in the
// runner, before its next batch.
type batchLog struct {
	fn func(ctx context.Context, r slog.Record)
}

func (b batchLog) Enabled(context.Context, slog.Level) bool { return true }
func (b batchLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "delivery: replay batch" {
		b.fn(ctx, r)
	}
	return nil
}
func (b batchLog) WithAttrs([]slog.Attr) slog.Handler { return b }
func (b batchLog) WithGroup(string) slog.Handler      { return b }

// completeAll leases and acks every item of inbox.
func completeAll(d *delivery.Delivery, inbox string) error {
	ctx := context.Background()
	for {
		l, err := d.Lease(ctx, inbox, 1000, time.Hour, 0)
		if err != nil || len(l.Items) == 0 {
			return err
		}
		ids := make([]int64, len(l.Items))
		for i, it := range l.Items {
			ids[i] = it.ID
		}
		if _, err := d.Ack(ctx, inbox, ids, l.Token); err != nil {
			return err
		}
	}
}

// TestReplayBatches: a range of 5,000 items is replayed 1,000 at a time,
// each batch in its own transaction, its progress visible after each.
func TestReplayBatches(t *testing.T) { eachStore(t, testReplayBatches) }

func testReplayBatches(t *testing.T, kind storeKind) {
	var d atomic.Pointer[delivery.Delivery]
	var mu sync.Mutex
	var seen []int64 // the job's replayed count after each batch
	log := slog.New(batchLog{fn: func(ctx context.Context, r slog.Record) {
		mu.Lock()
		defer mu.Unlock()
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "replay" {
				j, err := d.Load().ReplayJob(ctx, a.Value.String())
				if err == nil && j.State == delivery.ReplayRunning {
					seen = append(seen, j.Replayed)
				}
			}
			return true
		})
	}})
	e := setup(t, kind, delivery.Config{Logger: log})
	d.Store(e.d)
	e.create(t, delivery.Subscription{Name: "big", Source: "devices"})
	e.appendEvents(t, "x", "t", 5000)
	e.waitLag(t, "big", 0)
	if err := completeAll(e.d, "big"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	job, err := e.d.ReplayRange(context.Background(), delivery.ReplayRange{Subscription: "big", Since: e.clock.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if job.Matched != 5000 || job.BatchSize != delivery.DefaultReplayBatch {
		t.Fatalf("job: %+v", job)
	}
	job = e.waitReplay(t, job.ID)
	// Five full batches, then one that finds the range walked.
	if job.State != delivery.ReplayCompleted || job.Replayed != 5000 || job.Batches != 6 {
		t.Fatalf("job: %+v", job)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []int64{1000, 2000, 3000, 4000, 5000}; !slicesEqual(seen, want) {
		t.Fatalf("progress after each batch: %v, want %v", seen, want)
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE state = 'pending' AND replays = 1 AND attempts = 0`); n != 5000 {
		t.Fatalf("%d items pending again, want 5000", n)
	}
}

func slicesEqual(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestReplayResumes: a job whose process stops between two batches is
// resumed at the next start where it stopped: the items of its first
// batches, completed again meanwhile, are not replayed a second time.
func TestReplayResumes(t *testing.T) { eachStore(t, testReplayResumes) }

func testReplayResumes(t *testing.T, kind storeKind) {
	var e *env
	stopped := make(chan struct{})
	var batches atomic.Int32
	log := slog.New(batchLog{fn: func(ctx context.Context, r slog.Record) {
		if batches.Add(1) != 2 {
			return
		}
		// After the second batch: the items of both are delivered again,
		// then the process stops.
		if err := completeAll(e.d, "s"); err != nil {
			t.Error(err)
		}
		close(stopped)
		<-ctx.Done()
	}})
	path := filepath.Join(t.TempDir(), "p.db")
	e = open(t, kind, openOptions{streams: path, cfg: delivery.Config{Logger: log}})
	e.create(t, delivery.Subscription{Name: "s", Source: "devices"})
	e.appendEvents(t, "x", "t", 3000)
	e.waitLag(t, "s", 0)
	if err := completeAll(e.d, "s"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	job, err := e.d.ReplayRange(context.Background(), delivery.ReplayRange{Subscription: "s", Since: e.clock.Now().Add(-time.Hour), BatchSize: 500})
	if err != nil || job.Matched != 3000 {
		t.Fatalf("job %+v %v, want 3000 matched", job, err)
	}
	<-stopped
	e.stop()

	e = open(t, kind, openOptions{streams: path, state: e.stateAt})
	if j, err := e.d.ReplayJob(context.Background(), job.ID); err != nil || j.Replayed < 1000 {
		t.Fatalf("job after the restart: %+v %v", j, err)
	}
	job = e.waitReplay(t, job.ID)
	if job.State != delivery.ReplayCompleted || job.Replayed != 3000 {
		t.Fatalf("job: %+v", job)
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE replays = 1`); n != 3000 {
		t.Fatalf("%d items replayed once, want 3000", n)
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE state = 'completed'`); n != 1000 {
		t.Fatalf("%d completed items, want the 1000 of the first two batches, completed again before the stop", n)
	}
}
