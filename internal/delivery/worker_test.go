package delivery_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/retry"
	"github.com/postbox-events/postbox/stream"
)

// target is an HTTP endpoint that answers with the statuses of answer, in
// turn (the last one from then on), and records the requests.
type target struct {
	*httptest.Server
	mu      sync.Mutex
	answers []int
	headers []http.Header
	bodies  []string
	header  http.Header // added to every answer
}

func newTarget(t *testing.T, answers ...int) *target {
	tg := &target{answers: answers, header: http.Header{}}
	tg.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		tg.mu.Lock()
		n := len(tg.bodies)
		tg.headers = append(tg.headers, r.Header.Clone())
		tg.bodies = append(tg.bodies, string(body))
		status := tg.answers[min(n, len(tg.answers)-1)]
		for k, v := range tg.header {
			w.Header()[k] = v
		}
		tg.mu.Unlock()
		w.WriteHeader(status)
		io.WriteString(w, "answer "+http.StatusText(status))
	}))
	t.Cleanup(tg.Close)
	return tg
}

func (tg *target) calls() int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return len(tg.bodies)
}

// waitItem waits until the only item of inbox is in state with attempts,
// and returns it.
func (e *env) waitItem(t *testing.T, inbox, state string, attempts int) delivery.Item {
	t.Helper()
	var it delivery.Item
	testenv.Eventually(t, 10*time.Second, inbox+" item "+state, func() bool {
		items, err := e.d.List(context.Background(), inbox, "", 0, 10)
		if err != nil || len(items) != 1 {
			return false
		}
		it = items[0]
		return it.State == state && it.Attempts == attempts
	})
	return it
}

// checkWait checks that an item retried at now waits want (the tests
// that call it turn jitter off).
func checkWait(t *testing.T, it delivery.Item, now time.Time, want time.Duration) {
	t.Helper()
	if got := it.NextAttemptAt.Sub(now); got != want {
		t.Fatalf("after attempt %d the item waits %v, want %v", it.Attempts, got, want)
	}
}

// TestTargetFailsTwice: a target that fails twice, then succeeds, completes
// the item on the third attempt, after 5s and 10s of backoff (the
// defaults), measured on an injected clock.
func TestTargetFailsTwice(t *testing.T) { eachStore(t, testTargetFailsTwice) }

func testTargetFailsTwice(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{Jitter: retry.NoJitter})
	tg := newTarget(t, 500, 503, 200)
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL + "/in"})
	e.appendEvents(t, "h", "order.paid", 1)

	it := e.waitItem(t, "hook", delivery.StatePending, 1)
	checkWait(t, it, e.clock.Now(), 5*time.Second)
	if it.LastError == nil || !strings.Contains(*it.LastError, "answered 500 Internal Server Error: answer Internal Server Error") {
		t.Fatalf("last error %v", it.LastError)
	}
	e.clock.Advance(5 * time.Second)
	it = e.waitItem(t, "hook", delivery.StatePending, 2)
	checkWait(t, it, e.clock.Now(), 10*time.Second)
	e.clock.Advance(10 * time.Second)
	e.waitItem(t, "hook", delivery.StateCompleted, 3)
	if tg.calls() != 3 {
		t.Fatalf("%d calls, want 3", tg.calls())
	}
	h := tg.headers[2]
	if h.Get("Idempotency-Key") != "pi-0/h-0" || h.Get("X-Event-Type") != "order.paid" || h.Get("X-Postbox-Attempt") != "3" ||
		h.Get("X-Postbox-Event") != "devices/1" || h.Get("Content-Type") != "application/json" || tg.bodies[2] != `{"i":0}` {
		t.Fatalf("request: %v %s", h, tg.bodies[2])
	}
}

// TestTargetAlwaysFails: after MaxAttempts the item is failed, a dead
// letter; the backoff doubles up to RetryMaxDelay.
func TestTargetAlwaysFails(t *testing.T) { eachStore(t, testTargetAlwaysFails) }

func testTargetAlwaysFails(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{MaxAttempts: 4, RetryBaseDelay: time.Second, RetryMaxDelay: 3 * time.Second, Jitter: retry.NoJitter})
	tg := newTarget(t, 500)
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL})
	e.appendEvents(t, "h", "t", 1)
	for attempt, wait := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} {
		it := e.waitItem(t, "hook", delivery.StatePending, attempt+1)
		checkWait(t, it, e.clock.Now(), wait)
		e.clock.Advance(wait)
	}
	it := e.waitItem(t, "hook", delivery.StateFailed, 4)
	if it.FailedAt == nil || it.LastError == nil || !strings.Contains(*it.LastError, "answered 500") {
		t.Fatalf("dead letter: %+v", it)
	}
	e.clock.Advance(time.Hour)
	// A new event wakes the dispatcher, which leases every item due, the
	// dead letter among them were it retried: once the new item has had
	// its attempt, the dead letter would have had one too.
	e.appendEvents(t, "later", "t", 1)
	testenv.Eventually(t, 10*time.Second, "the new item's first attempt", func() bool {
		items, err := e.d.List(context.Background(), "hook", delivery.StatePending, 0, 10)
		return err == nil && len(items) == 1 && items[0].Attempts == 1
	})
	if tg.calls() != 5 {
		t.Fatalf("%d calls, want 5 (4, then the new item's): a dead letter is not retried", tg.calls())
	}
	if it, err := e.d.Item(context.Background(), "", it.ID); err != nil || it.State != delivery.StateFailed || it.Attempts != 4 {
		t.Fatalf("dead letter after an hour: %+v, %v", it, err)
	}
}

// TestTargetGoneAndRetryAfter: 410 dead-letters at once; Retry-After
// stretches the wait; a refused connection and a target that does not
// answer within the handler timeout are failed attempts.
func TestTargetGoneAndRetryAfter(t *testing.T) { eachStore(t, testTargetGoneAndRetryAfter) }

func testTargetGoneAndRetryAfter(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{HandlerTimeout: 200 * time.Millisecond})
	gone := newTarget(t, 410)
	e.create(t, delivery.Subscription{Name: "gone", Source: "devices", Target: gone.URL, Types: []string{"a"}})
	busy := newTarget(t, 429)
	busy.header.Set("Retry-After", "120")
	e.create(t, delivery.Subscription{Name: "busy", Source: "devices", Target: busy.URL, Types: []string{"b"}})
	down := newTarget(t, 200)
	down.Close() // refuses connections
	e.create(t, delivery.Subscription{Name: "down", Source: "devices", Target: down.URL, Types: []string{"c"}})
	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(hang)
	e.create(t, delivery.Subscription{Name: "slow", Source: "devices", Target: slow.URL, Types: []string{"d"}})
	e.appendEvents(t, "a", "a", 1)
	e.appendEvents(t, "b", "b", 1)
	e.appendEvents(t, "c", "c", 1)
	e.appendEvents(t, "d", "d", 1)
	if it := e.waitItem(t, "slow", delivery.StatePending, 1); !strings.Contains(*it.LastError, "deadline exceeded") {
		t.Fatalf("a target that does not answer within the handler timeout: %v", *it.LastError)
	}
	if it := e.waitItem(t, "gone", delivery.StateFailed, 1); !strings.Contains(*it.LastError, "410 Gone") {
		t.Fatalf("gone: %v", *it.LastError)
	}
	it := e.waitItem(t, "busy", delivery.StatePending, 1)
	if got := it.NextAttemptAt.Sub(e.clock.Now()); got != 120*time.Second {
		t.Fatalf("Retry-After 120: waits %v", got)
	}
	if it := e.waitItem(t, "down", delivery.StatePending, 1); !strings.Contains(*it.LastError, "connect") {
		t.Fatalf("down: %v", *it.LastError)
	}
}

// TestAttemptInFlightAtStop: an attempt in flight when delivery stops
// may finish, and is recorded as it ended: the target's 200 completes the
// item, rather than the item going back to pending to be sent again.
func TestAttemptInFlightAtStop(t *testing.T) { eachStore(t, testAttemptInFlightAtStop) }

func testAttemptInFlightAtStop(t *testing.T, kind storeKind) {
	cfg, sig := delivery.WithTestSignals(delivery.Config{})
	e := setup(t, kind, cfg)
	started, release := make(chan struct{}, 1), make(chan struct{})
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
	}))
	t.Cleanup(tg.Close)
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL})
	e.appendEvents(t, "h", "t", 1)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("no attempt began")
	}
	halted := make(chan struct{})
	go func() { e.halt(); close(halted) }()
	select { // delivery is stopping, the attempt in flight
	case <-sig.Stopping:
	case <-time.After(30 * time.Second):
		t.Fatal("delivery did not begin to stop")
	}
	close(release)
	select {
	case <-halted:
	case <-time.After(30 * time.Second):
		t.Fatal("delivery did not stop")
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE inbox_id = 'hook' AND state = 'completed' AND attempts = 1`); n != 1 {
		t.Fatalf("the item whose attempt ended during the stop: %d completed with its attempt, want 1", n)
	}
}

// TestAttemptCutShortAfterGrace: an attempt still running DrainGrace
// after delivery began to stop is cut short, and its item handed back
// with the attempt not counted: pending, due again at the next start.
func TestAttemptCutShortAfterGrace(t *testing.T) { eachStore(t, testAttemptCutShortAfterGrace) }

func testAttemptCutShortAfterGrace(t *testing.T, kind storeKind) {
	const grace = 300 * time.Millisecond
	e := setup(t, kind, delivery.Config{DrainGrace: grace})
	started, cut, over := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case started <- struct{}{}:
		default:
		}
		io.Copy(io.Discard, r.Body) // then the server notices the client gone
		select {                    // answers nothing until the worker gives up
		case <-r.Context().Done():
			select {
			case cut <- struct{}{}:
			default:
			}
		case <-over:
		}
	}))
	t.Cleanup(tg.Close)
	t.Cleanup(func() { close(over) }) // before tg.Close, which waits for the handler
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL, Endpoint: delivery.Endpoint{Timeout: time.Minute}})
	e.appendEvents(t, "h", "t", 1)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("no attempt began")
	}
	begin := time.Now()
	halted := make(chan struct{})
	go func() { e.halt(); close(halted) }()
	select {
	case <-halted:
	case <-time.After(30 * time.Second):
		t.Fatal("delivery did not stop")
	}
	if took := time.Since(begin); took < grace {
		t.Fatalf("delivery stopped %v after it was asked to, before the attempt's grace of %v", took, grace)
	}
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the target's request was not cut short")
	}
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE inbox_id = 'hook' AND state = 'pending' AND attempts = 0 AND lease_token IS NULL`); n != 1 {
		t.Fatalf("the item whose attempt was cut short: %d pending with no attempt counted, want 1", n)
	}
}

// TestShortRetryWaits: a retry wait under a second is kept, not rounded
// up to the dispatcher's look every second: waits of 150, 300 and 600 ms
// take about a second in all, where each would have taken one.
func TestShortRetryWaits(t *testing.T) { eachStore(t, testShortRetryWaits) }

func testShortRetryWaits(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{Now: time.Now, RetryBaseDelay: 150 * time.Millisecond, Jitter: retry.NoJitter})
	var mu sync.Mutex
	var at []time.Time
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if at = append(at, time.Now()); len(at) < 4 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(tg.Close)
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL})
	e.appendEvents(t, "h", "t", 1)
	e.waitItem(t, "hook", delivery.StateCompleted, 4)
	mu.Lock()
	defer mu.Unlock()
	for i, want := range []time.Duration{150 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond} {
		if got := at[i+1].Sub(at[i]); got < want {
			t.Errorf("retry %d came after %v, before its wait of %v", i+1, got, want)
		}
	}
	if all := at[3].Sub(at[0]); all > 2*time.Second {
		t.Errorf("three retries waiting 1.05 s in all took %v: the waits were stretched", all)
	}
}

// TestTargetRedirectIsNotFollowed: a 3xx is a failed attempt whose error
// names where it pointed; the location is never requested (followed, a
// 302 would turn the POST into a GET without its body, and carry the
// signature to another host).
func TestTargetRedirectIsNotFollowed(t *testing.T) { eachStore(t, testTargetRedirectIsNotFollowed) }

func testTargetRedirectIsNotFollowed(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	landed := newTarget(t, 200)
	for i, status := range []int{http.StatusFound, http.StatusTemporaryRedirect} {
		name := fmt.Sprint("redirect", status)
		tg := newTarget(t, status)
		tg.header.Set("Location", landed.URL+"/moved")
		e.create(t, delivery.Subscription{Name: name, Source: "devices", Target: tg.URL, Types: []string{name}})
		e.appendEvents(t, name, name, 1)
		it := e.waitItem(t, name, delivery.StatePending, 1)
		if !strings.Contains(*it.LastError, fmt.Sprintf("answered %d", status)) || !strings.Contains(*it.LastError, "a redirect to "+landed.URL+"/moved, which postbox does not follow") {
			t.Fatalf("%d: last error %q", status, *it.LastError)
		}
		if tg.calls() != 1 || landed.calls() != 0 {
			t.Fatalf("%d (%d): the target got %d calls and the location %d, want 1 and 0", status, i, tg.calls(), landed.calls())
		}
	}
}

// TestGoHandlerAndReplay: a Go handler that fails dead-letters the item;
// replay brings it back with its attempts reset, and it completes once the
// handler works.
func TestGoHandlerAndReplay(t *testing.T) { eachStore(t, testGoHandlerAndReplay) }

func testGoHandlerAndReplay(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	var broken atomic.Bool
	broken.Store(true)
	var done atomic.Int64
	e.d.Handle("jobs", func(ctx context.Context, it *delivery.Item) error {
		if broken.Load() {
			if it.Attempts == 2 {
				panic("boom")
			}
			if it.Attempts == 3 {
				return retry.Permanent(errors.New("bad payload"))
			}
			return errors.New("not yet")
		}
		done.Add(1)
		return nil
	})
	e.create(t, delivery.Subscription{Name: "jobs", Source: "devices"})
	e.appendEvents(t, "j", "t", 1)
	e.waitItem(t, "jobs", delivery.StatePending, 1)
	e.clock.Advance(5 * time.Second)
	if it := e.waitItem(t, "jobs", delivery.StatePending, 2); !strings.Contains(*it.LastError, "handler panicked: boom") {
		t.Fatalf("panic: %v", *it.LastError)
	}
	e.clock.Advance(10 * time.Second)
	dead := e.waitItem(t, "jobs", delivery.StateFailed, 3)
	if *dead.LastError != "bad payload" {
		t.Fatalf("dead: %v", *dead.LastError)
	}
	ctx := context.Background()
	list, err := e.d.ListDeadLetters(ctx, delivery.DeadLetters{Subscription: "jobs"})
	if err != nil || len(list) != 1 || list[0].ID != dead.ID {
		t.Fatalf("dead letters: %+v %v", list, err)
	}
	if none, _ := e.d.ListDeadLetters(ctx, delivery.DeadLetters{From: e.clock.Now().Add(time.Second)}); len(none) != 0 {
		t.Fatalf("dead letters failed after now: %d", len(none))
	}
	broken.Store(false)
	ids, err := e.d.Replay(ctx, delivery.DeadLetters{ID: dead.ID})
	if err != nil || len(ids) != 1 {
		t.Fatalf("replay: %v %v", ids, err)
	}
	it := e.waitItem(t, "jobs", delivery.StateCompleted, 1)
	if it.Replays != 1 || it.ReplayedAt == nil || it.FailedAt != nil || done.Load() != 1 {
		t.Fatalf("replayed item: %+v, handled %d times", it, done.Load())
	}
	if ids, _ := e.d.Replay(ctx, delivery.DeadLetters{ID: dead.ID}); len(ids) != 0 {
		t.Fatalf("replayed a completed item: %v", ids)
	}
}

// TestRecover: items a previous process left processing come back
// pending, or failed after their last attempt, and Recover reports the
// backlog. On a shared store it leaves the items whose lease has not
// expired: another live process may be working on them.
func TestRecover(t *testing.T) { eachStore(t, testRecover) }

func testRecover(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{MaxAttempts: 2, ReapInterval: time.Hour}) // no reaper: Recover finds the expired leases
	e.create(t, delivery.Subscription{Name: "r", Source: "devices"})
	e.appendEvents(t, "r", "t", 5)
	e.waitLag(t, "r", 0)
	ctx := context.Background()
	l, _ := e.d.Lease(ctx, "r", 1, time.Hour, 0)
	e.d.Nack(ctx, "r", []int64{l.Items[0].ID}, l.Token, 0, "first")
	if l, _ = e.d.Lease(ctx, "r", 3, time.Hour, 0); len(l.Items) != 3 || l.Items[0].Attempts != 2 {
		t.Fatalf("lease: %+v", l)
	}
	e.clock.Advance(time.Minute)
	if kind == postgresStore {
		if b, err := e.d.Recover(ctx); err != nil || b.Recovered != 0 || b.Pending != 2 {
			t.Fatalf("recover on a shared store while the leases last: %+v %v, want none recovered and 2 pending", b, err)
		}
		if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE state = 'processing'`); n != 3 {
			t.Fatalf("%d processing items after recover, want the 3 under a live lease", n)
		}
		e.clock.Advance(time.Hour)
	}
	b, err := e.d.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.Recovered != 3 || b.Pending != 4 || b.Failed != 1 || !b.OldestPending.Equal(l.Items[1].CreatedAt) {
		t.Fatalf("backlog %+v; oldest pending want %v", b, l.Items[1].CreatedAt)
	}
	it, _ := e.d.Item(ctx, "", l.Items[0].ID)
	if it.State != delivery.StateFailed || !strings.Contains(*it.LastError, "interrupted") {
		t.Fatalf("item on its last attempt: %+v", it)
	}
}

// TestRetention deletes completed and failed items and read stream events
// older than the cutoff, and nothing else.
func TestRetention(t *testing.T) { eachStore(t, testRetention) }

func testRetention(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{Retention: -1})
	ctx := context.Background()
	e.create(t, delivery.Subscription{Name: "all", Source: "devices"})
	e.appendEvents(t, "old", "t", 2500)
	e.waitLag(t, "all", 0)
	// 2000 completed, 300 failed, 100 processing, 100 pending; all old.
	l, _ := e.d.Lease(ctx, "all", 2400, 100*time.Hour, 0) // outlasts the 48h the clock moves
	var done, failed []int64
	for i, it := range l.Items {
		switch {
		case i < 2000:
			done = append(done, it.ID)
		case i < 2300:
			failed = append(failed, it.ID)
		}
	}
	for i := 0; i < len(done); i += 500 {
		e.d.Ack(ctx, "all", done[i:i+500], l.Token)
	}
	e.exec(t, `UPDATE inbox_items SET state = 'failed', failed_at = updated_at, lease_token = NULL
		WHERE item_id BETWEEN ? AND ?`, failed[0], failed[len(failed)-1])
	e.clock.Advance(48 * time.Hour)
	// A consumer that is not a subscription has read only half the stream.
	if _, err := e.streams.EnsureConsumer(ctx, stream.ConsumerConfig{ID: "behind", StreamID: "devices",
		Start: stream.Start{Policy: stream.StartAtOffset, Offset: 1200}}); err != nil {
		t.Fatal(err)
	}
	e.appendEvents(t, "new", "t", 10) // recent events and items
	e.waitLag(t, "all", 0)
	c, err := e.d.Cleanup(ctx, e.clock.Now().Add(-24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if c.Items != 2300 || c.Events != 1199 {
		t.Fatalf("cleanup: %+v, want 2300 items and 1199 events (those before the slowest consumer's offset 1200)", c)
	}
	for state, want := range map[string]int{"completed": 0, "failed": 0, "processing": 100, "pending": 110} {
		if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE state = ?`, state); n != want {
			t.Errorf("%s items: %d, want %d", state, n, want)
		}
	}
	if n := e.countStreams(t, `SELECT count(*) FROM stream_events`); n != 2510-1199 {
		t.Errorf("stream events: %d, want %d", n, 2510-1199)
	}
	st, _ := e.streams.Stats(ctx, "devices")
	if st.LastOffset != 2510 {
		t.Errorf("high watermark %d after trimming, want 2510", st.LastOffset)
	}
}

// TestWaitedPastLease: an item leased for the workers that waits for one
// so long that its lease could end during its attempt is handed back,
// not attempted: another lease could take it while the attempt runs. It
// goes out again under a new lease, its attempt not counted twice.
func TestWaitedPastLease(t *testing.T) { eachStore(t, testWaitedPastLease) }

func testWaitedPastLease(t *testing.T, kind storeKind) {
	const timeout = 10 * time.Second // the lease: 2·timeout + 10s
	e := setup(t, kind, delivery.Config{Workers: 1, HandlerTimeout: timeout})
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	var mu sync.Mutex
	var late []string // attempts whose lease could end during them
	e.d.Handle("slow", func(ctx context.Context, it *delivery.Item) error {
		if it.LeaseExpiresAt == nil || e.clock.Now().Add(timeout).After(*it.LeaseExpiresAt) {
			mu.Lock()
			late = append(late, fmt.Sprintf("item %d at %v, its lease ends %v", it.ID, e.clock.Now(), it.LeaseExpiresAt))
			mu.Unlock()
		}
		select {
		case started <- struct{}{}:
			<-release // the first attempt holds the one worker
		default:
		}
		return nil
	})
	e.create(t, delivery.Subscription{Name: "slow", Source: "devices"})
	e.appendEvents(t, "s", "t", 3)
	<-started
	ctx := context.Background()
	testenv.Eventually(t, 10*time.Second, "three items leased", func() bool {
		items, err := e.d.List(ctx, "slow", delivery.StateProcessing, 0, 10)
		return err == nil && len(items) == 3
	})
	e.clock.Advance(25 * time.Second) // the two waiting can no longer finish within their lease
	close(release)
	testenv.Eventually(t, 10*time.Second, "three items completed", func() bool {
		items, err := e.d.List(ctx, "slow", delivery.StateCompleted, 0, 10)
		return err == nil && len(items) == 3
	})
	items, _ := e.d.List(ctx, "slow", "", 0, 10)
	for _, it := range items {
		if it.Attempts != 1 {
			t.Errorf("item %d completed after %d attempts, want 1: a hand-back counts none", it.ID, it.Attempts)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(late) > 0 {
		t.Fatalf("attempts started too late in their lease: %v", late)
	}
}

// TestAckedDuringAttempt: an item an operator acks while a worker attempts
// it no longer holds its lease when the attempt succeeds; the acker's one
// statement for held items passes it by, and it settles the long way:
// completed once, counted once, while the other items of the batch
// complete by the statement.
func TestAckedDuringAttempt(t *testing.T) { eachStore(t, testAckedDuringAttempt) }

func testAckedDuringAttempt(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	var handled atomic.Int64
	e.d.Handle("jobs", func(ctx context.Context, it *delivery.Item) error {
		if it.EventID == "a-0" { // acked by an operator meanwhile
			if res, err := e.d.Ack(ctx, "jobs", []int64{it.ID}, ""); err != nil || res[0].Err != nil {
				return fmt.Errorf("operator ack: %v %+v", err, res)
			}
		}
		handled.Add(1)
		return nil
	})
	e.create(t, delivery.Subscription{Name: "jobs", Source: "devices"})
	e.appendEvents(t, "a", "t", 5)
	deadline := time.Now().Add(10 * time.Second)
	for {
		counts, err := e.d.Inboxes(context.Background())
		if err == nil && len(counts) == 1 && counts[0].Completed == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("items not completed: %+v (handled %d)", counts, handled.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.checkCounts(t, "all completed")
	if n := e.count(t, `SELECT count(*) FROM inbox_items WHERE inbox_id = 'jobs' AND state = 'completed' AND lease_token IS NULL`); n != 5 {
		t.Fatalf("%d of 5 items completed without a lease", n)
	}
}
