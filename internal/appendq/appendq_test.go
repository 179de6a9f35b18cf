package appendq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/appendq"
	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// recorder is a stream.Backend (a real SQLite one) that records each
// Append call and can fail the appends of one stream.
type recorder struct {
	stream.Backend
	mu     sync.Mutex
	calls  []call
	failOn string
}

type call struct {
	streamID string
	ids      []string
}

var errInjected = errors.New("injected append failure")

func (r *recorder) Append(ctx context.Context, streamID string, events []stream.Event) ([]stream.AppendResult, error) {
	c := call{streamID: streamID}
	for _, ev := range events {
		c.ids = append(c.ids, ev.NativeID)
	}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	fail := r.failOn == streamID
	r.mu.Unlock()
	if fail {
		return nil, errInjected
	}
	return r.Backend.Append(ctx, streamID, events)
}

func (r *recorder) appends() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]call(nil), r.calls...)
}

// newBackend returns a recorder over a SQLite backend in a temporary
// directory with streams a and b, running until the test ends.
func newBackend(t *testing.T) *recorder {
	t.Helper()
	b, err := streamsqlite.Open(filepath.Join(t.TempDir(), "streams.db"), streamsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("backend Run: %v", err)
		}
		b.Close()
	})
	for _, id := range []string{"a", "b"} {
		if _, err := b.EnsureStream(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	return &recorder{Backend: b}
}

// run runs q until the test ends and waits for Run to return.
func run(t *testing.T, q *appendq.Queue) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("queue Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func events(ids ...string) []stream.Event {
	evs := make([]stream.Event, len(ids))
	for i, id := range ids {
		evs[i] = stream.Event{NativeID: id, Type: "t", OccurredAt: time.Now(), Payload: json.RawMessage(`{"id":"` + id + `"}`)}
	}
	return evs
}

// answer is what one request's done got.
type answer struct {
	res []stream.AppendResult
	err error
}

func enqueue(t *testing.T, q *appendq.Queue, streamID string, evs []stream.Event) chan answer {
	t.Helper()
	ch := make(chan answer, 1)
	if err := q.AppendAsync(context.Background(), streamID, evs, func(res []stream.AppendResult, err error) { ch <- answer{res, err} }); err != nil {
		t.Fatalf("AppendAsync %s: %v", streamID, err)
	}
	return ch
}

func TestBatchesCallersAndGroupsByStream(t *testing.T) {
	b := newBackend(t)
	var mu sync.Mutex
	var batches []int
	q := appendq.New(b, appendq.Config{Observe: func(n int, _ time.Duration, err error) {
		mu.Lock()
		batches = append(batches, n)
		mu.Unlock()
	}})
	// Queued before Run starts, so the writer finds all of them at once.
	r1 := enqueue(t, q, "a", events("a1", "a2"))
	r2 := enqueue(t, q, "b", events("b1"))
	r3 := enqueue(t, q, "a", events("a3", "a1")) // a1 again: a duplicate within the batch
	r4 := enqueue(t, q, "b", events("b2", "b3"))
	if got := q.QueueLen(); got != 7 {
		t.Fatalf("QueueLen = %d, want 7", got)
	}
	run(t, q)
	want := map[string][]int64{"r1": {1, 2}, "r2": {1}, "r3": {3, 1}, "r4": {2, 3}}
	for name, ch := range map[string]chan answer{"r1": r1, "r2": r2, "r3": r3, "r4": r4} {
		a := <-ch
		if a.err != nil {
			t.Fatalf("%s: %v", name, a.err)
		}
		if len(a.res) != len(want[name]) {
			t.Fatalf("%s: %d results, want %d", name, len(a.res), len(want[name]))
		}
		for i, res := range a.res {
			if res.Offset != want[name][i] || res.Err != nil {
				t.Errorf("%s result %d = %+v, want offset %d", name, i, res, want[name][i])
			}
		}
	}
	if a3 := (<-enqueue(t, q, "a", events("a3"))).res[0]; !a3.Duplicate || a3.Offset != 3 {
		t.Errorf("a3 appended again = %+v, want a duplicate at offset 3", a3)
	}
	calls := b.appends()
	if len(calls) < 2 {
		t.Fatalf("appends = %+v, want one per stream", calls)
	}
	first := fmt.Sprint(calls[:2])
	if want := "[{a [a1 a2 a3 a1]} {b [b1 b2 b3]}]"; first != want {
		t.Errorf("the batch's appends = %s, want %s", first, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(batches) == 0 || batches[0] != 7 {
		t.Errorf("batch sizes = %v, want the first of 7 events", batches)
	}
}

func TestDuplicateWithAnotherPayloadIsAConflict(t *testing.T) {
	b := newBackend(t)
	q := appendq.New(b, appendq.Config{})
	run(t, q)
	if _, err := q.Append(context.Background(), "a", events("x")); err != nil {
		t.Fatal(err)
	}
	ev := events("x")
	ev[0].Payload = json.RawMessage(`{"other":true}`)
	res, err := q.Append(context.Background(), "a", ev)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res[0].Err, stream.ErrConflict) {
		t.Errorf("result = %+v, want ErrConflict", res[0])
	}
}

func TestFailedAppendAnswersTheWholeBatch(t *testing.T) {
	b := newBackend(t)
	b.failOn = "b"
	var mu sync.Mutex
	var failed []error
	q := appendq.New(b, appendq.Config{Observe: func(_ int, _ time.Duration, err error) {
		mu.Lock()
		failed = append(failed, err)
		mu.Unlock()
	}})
	r1 := enqueue(t, q, "a", events("a1"))
	r2 := enqueue(t, q, "b", events("b1"))
	r3 := enqueue(t, q, "a", events("a2"))
	run(t, q)
	for i, ch := range []chan answer{r1, r2, r3} {
		if a := <-ch; !errors.Is(a.err, errInjected) || a.res != nil {
			t.Errorf("request %d: %v, %v; want the injected error and no results", i+1, a.res, a.err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failed) != 1 || !errors.Is(failed[0], errInjected) {
		t.Errorf("Observe saw %v, want the injected error once", failed)
	}
}

func TestUnknownStreamFailsOnlyItsRequest(t *testing.T) {
	b := newBackend(t)
	q := appendq.New(b, appendq.Config{})
	r1 := enqueue(t, q, "nope", events("n1"))
	r2 := enqueue(t, q, "a", events("a1"))
	run(t, q)
	if a := <-r1; !errors.Is(a.err, stream.ErrStreamNotFound) {
		t.Errorf("unknown stream: %v, want ErrStreamNotFound", a.err)
	}
	if a := <-r2; a.err != nil || a.res[0].Offset != 1 {
		t.Errorf("stream a: %+v, %v; want offset 1", a.res, a.err)
	}
}

func TestFullQueue(t *testing.T) {
	b := newBackend(t)
	q := appendq.New(b, appendq.Config{QueueSize: 2})
	if q.QueueCap() != 2 {
		t.Fatalf("QueueCap = %d, want 2", q.QueueCap())
	}
	got := make(chan answer, 3)
	done := func(res []stream.AppendResult, err error) { got <- answer{res, err} }
	if err := q.TryAppendAsync("a", events("a1", "a2"), done); err != nil {
		t.Fatal(err)
	}
	if q.QueueBytes() <= 0 {
		t.Errorf("QueueBytes = %d with two events queued", q.QueueBytes())
	}
	if err := q.TryAppendAsync("a", events("a3"), done); !errors.Is(err, groupcommit.ErrFull) {
		t.Fatalf("TryAppendAsync on a full queue = %v, want ErrFull", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := q.AppendAsync(ctx, "a", events("a3"), done); !errors.Is(err, context.Canceled) {
		t.Fatalf("AppendAsync on a full queue with an ended context = %v, want context.Canceled", err)
	}
	run(t, q)
	if a := <-got; a.err != nil || len(a.res) != 2 {
		t.Fatalf("queued request: %+v, %v", a.res, a.err)
	}
	if err := q.TryAppendAsync("a", events("a3"), done); err != nil {
		t.Fatalf("TryAppendAsync after the queue drained: %v", err)
	}
	if a := <-got; a.err != nil || a.res[0].Offset != 3 {
		t.Fatalf("a3: %+v, %v; want offset 3", a.res, a.err)
	}
}

func TestShutdownDrains(t *testing.T) {
	b := newBackend(t)
	q := appendq.New(b, appendq.Config{MaxBatch: 3})
	var chans []chan answer
	for i := range 10 {
		chans = append(chans, enqueue(t, q, "a", events(fmt.Sprintf("e%d", i))))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Run starts stopped: it writes what is queued and returns
	if err := q.Run(ctx); err != nil {
		t.Fatal(err)
	}
	for i, ch := range chans {
		select {
		case a := <-ch:
			if a.err != nil || a.res[0].Offset != int64(i+1) {
				t.Errorf("request %d: %+v, %v; want offset %d", i, a.res, a.err, i+1)
			}
		default:
			t.Fatalf("request %d not answered when Run returned", i)
		}
	}
	if err := q.AppendAsync(context.Background(), "a", events("late"), func([]stream.AppendResult, error) {}); !errors.Is(err, groupcommit.ErrClosed) {
		t.Errorf("AppendAsync after Run = %v, want ErrClosed", err)
	}
	st, err := b.Stats(context.Background(), "a")
	if err != nil || st.Events != 10 {
		t.Errorf("stream a holds %d events (%v), want 10", st.Events, err)
	}
	if calls := b.appends(); len(calls) != 4 {
		t.Errorf("%d appends, want 4 batches of at most 3", len(calls))
	}
}
