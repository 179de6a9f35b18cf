package groupcommit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/postbox-events/postbox/internal/groupcommit"
)

// recorder is a FlushFunc that records every batch it is given and fails
// the batches fail picks.
type recorder struct {
	mu        sync.Mutex
	batches   [][]int
	committed map[int]bool // items of batches that flushed without error
	fail      func(batch []int) error
	gate      chan struct{} // when set, each flush waits for a receive
	entered   chan struct{} // when set, each flush sends on it first
}

func newRecorder() *recorder { return &recorder{committed: map[int]bool{}} }

func (r *recorder) flush(ctx context.Context, batch []int) error {
	if r.entered != nil {
		r.entered <- struct{}{}
	}
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, slices.Clone(batch))
	if r.fail != nil {
		if err := r.fail(batch); err != nil {
			return err
		}
	}
	for _, it := range batch {
		r.committed[it] = true
	}
	return nil
}

func (r *recorder) flushed() [][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches)
}

func (r *recorder) isCommitted(items []int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, it := range items {
		if !r.committed[it] {
			return false
		}
	}
	return true
}

// seq returns the n items from..from+n-1.
func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// run starts w.Run and returns a function that stops it and returns its
// error.
func run[T any](w *groupcommit.Writer[T]) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx) }()
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() {
			cancel()
			err = <-errc
		})
		return err
	}
}

// doneLog records the done calls of requests.
type doneLog struct {
	mu    sync.Mutex
	calls map[string][]error
	all   sync.WaitGroup
}

func newDoneLog() *doneLog { return &doneLog{calls: map[string][]error{}} }

// done returns the done function of request name, which also checks that
// its items were committed (or their flush failed) before it was called.
func (l *doneLog) done(t *testing.T, r *recorder, name string, items []int) func(error) {
	l.all.Add(1)
	return func(err error) {
		l.mu.Lock()
		l.calls[name] = append(l.calls[name], err)
		first := len(l.calls[name]) == 1
		l.mu.Unlock()
		if err == nil && !r.isCommitted(items) {
			t.Errorf("request %s: done(nil) before all its items were flushed", name)
		}
		if first {
			l.all.Done()
		}
	}
}

// result returns the one error request name was answered with.
func (l *doneLog) result(t *testing.T, name string) error {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.calls[name]); n != 1 {
		t.Errorf("request %s: done called %d times, want once", name, n)
		return nil
	}
	return l.calls[name][0]
}

// TestBatchesBoundedByMaxBatch: a flush never gets more than MaxBatch
// items, items are flushed once each in the order they were queued, and a
// backlog is written in full batches.
func TestBatchesBoundedByMaxBatch(t *testing.T) {
	for _, maxBatch := range []int{1, 3, 16, 1000} {
		t.Run(fmt.Sprint("MaxBatch=", maxBatch), func(t *testing.T) {
			rec := newRecorder()
			w := groupcommit.New(rec.flush, groupcommit.Config{MaxBatch: maxBatch, QueueSize: 1000})
			log := newDoneLog()
			// Queue a backlog before the writer runs, in requests of
			// uneven sizes, so that batches cut across requests.
			var want []int
			next := 0
			for i, n := range []int{5, 1, 37, 2, 64, 7, 100, 3} {
				items := seq(next, n)
				next += n
				want = append(want, items...)
				if err := w.Enqueue(context.Background(), items, log.done(t, rec, fmt.Sprint(i), items)); err != nil {
					t.Fatal(err)
				}
			}
			if got := w.Len(); got != len(want) {
				t.Fatalf("Len %d after queueing %d items", got, len(want))
			}
			stop := run(w)
			log.all.Wait()
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			var got []int
			batches := rec.flushed()
			for i, b := range batches {
				if len(b) > maxBatch {
					t.Errorf("batch %d has %d items, over MaxBatch %d", i, len(b), maxBatch)
				}
				if len(b) == 0 {
					t.Errorf("batch %d is empty", i)
				}
				got = append(got, b...)
			}
			if !slices.Equal(got, want) {
				t.Errorf("flushed %v,\nwant %v (each item once, in queue order)", got, want)
			}
			// The backlog was there from the start: every batch but the
			// last is full.
			if wantBatches := (len(want) + maxBatch - 1) / maxBatch; len(batches) != wantBatches {
				t.Errorf("%d batches for a backlog of %d with MaxBatch %d, want %d", len(batches), len(want), maxBatch, wantBatches)
			}
			for i := range 8 {
				if err := log.result(t, fmt.Sprint(i)); err != nil {
					t.Errorf("request %d: %v", i, err)
				}
			}
			if w.Len() != 0 {
				t.Errorf("Len %d after Run returned", w.Len())
			}
		})
	}
}

// TestMaxBatchOne: with MaxBatch 1 every flush writes exactly one item,
// also while items keep arriving.
func TestMaxBatchOne(t *testing.T) {
	rec := newRecorder()
	w := groupcommit.New(rec.flush, groupcommit.Config{MaxBatch: 1})
	stop := run(w)
	defer stop()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				if err := w.Do(context.Background(), seq(g*1000+i*10, 3)); err != nil {
					t.Errorf("Do: %v", err)
				}
			}
		})
	}
	wg.Wait()
	batches := rec.flushed()
	if len(batches) != 8*25*3 {
		t.Errorf("%d flushes for %d items, want one each", len(batches), 8*25*3)
	}
	for i, b := range batches {
		if len(b) != 1 {
			t.Fatalf("flush %d got %d items: %v", i, len(b), b)
		}
	}
}

var errDisk = errors.New("disk on fire")

// TestDoneAfterFlushWithItsError: each request's done is called once,
// after all its items' flushes, with nil when they all committed and with
// the flush error when any batch holding one of its items failed.
func TestDoneAfterFlushWithItsError(t *testing.T) {
	// MaxBatch 4 over a queue of [a a a a | a a b b | c c c c | d d e e]
	// (a: 6 items, b: 2, c: 4, d: 2, e: 2): a spans batches 1 and 2.
	type req struct {
		name  string
		items []int
	}
	reqs := []req{{"a", seq(0, 6)}, {"b", seq(6, 2)}, {"c", seq(8, 4)}, {"d", seq(12, 2)}, {"e", seq(14, 2)}}
	for _, tc := range []struct {
		name    string
		failing int // 1-based batch that fails; 0: none
		failed  []string
	}{
		{"no failure", 0, nil},
		{"first part of a split request fails", 1, []string{"a"}},
		{"last part of a split request fails", 2, []string{"a", "b"}},
		{"a batch of one request fails", 3, []string{"c"}},
		{"a batch of two requests fails", 4, []string{"d", "e"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			var n int
			rec.fail = func([]int) error {
				n++ // under rec.mu
				if n == tc.failing {
					return fmt.Errorf("batch %d: %w", n, errDisk)
				}
				return nil
			}
			var observed []error
			w := groupcommit.New(rec.flush, groupcommit.Config{MaxBatch: 4, QueueSize: 100,
				Observe: func(items int, _ time.Duration, err error) {
					if items != 4 {
						t.Errorf("Observe: %d items, want 4", items)
					}
					observed = append(observed, err)
				}})
			log := newDoneLog()
			for _, r := range reqs {
				if err := w.TryEnqueue(r.items, log.done(t, rec, r.name, r.items)); err != nil {
					t.Fatal(err)
				}
			}
			stop := run(w)
			log.all.Wait()
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			for _, r := range reqs {
				err := log.result(t, r.name)
				if slices.Contains(tc.failed, r.name) {
					if !errors.Is(err, errDisk) {
						t.Errorf("request %s: done(%v), want the flush error", r.name, err)
					}
				} else if err != nil {
					t.Errorf("request %s: done(%v), want nil", r.name, err)
				}
			}
			if len(observed) != 4 {
				t.Fatalf("Observe called %d times, want 4", len(observed))
			}
			for i, err := range observed {
				if (i+1 == tc.failing) != (err != nil) {
					t.Errorf("Observe of batch %d: %v", i+1, err)
				}
			}
		})
	}
}

// TestTryEnqueueFull: TryEnqueue refuses what does not fit with ErrFull and
// queues nothing of it.
func TestTryEnqueueFull(t *testing.T) {
	rec := newRecorder()
	w := groupcommit.New(rec.flush, groupcommit.Config{QueueSize: 4})
	if w.Cap() != 4 {
		t.Fatalf("Cap %d, want 4", w.Cap())
	}
	called := 0
	count := func(error) { called++ }
	if err := w.TryEnqueue(seq(0, 3), count); err != nil {
		t.Fatalf("TryEnqueue into an empty queue: %v", err)
	}
	if err := w.TryEnqueue(seq(3, 2), count); !errors.Is(err, groupcommit.ErrFull) {
		t.Fatalf("TryEnqueue of 2 into 3/4: %v, want ErrFull", err)
	}
	if err := w.TryEnqueue(seq(3, 1), count); err != nil {
		t.Fatalf("TryEnqueue of 1 into 3/4: %v", err)
	}
	if err := w.TryEnqueue(seq(4, 1), count); !errors.Is(err, groupcommit.ErrFull) {
		t.Fatalf("TryEnqueue into a full queue: %v, want ErrFull", err)
	}
	if got := w.Len(); got != 4 {
		t.Fatalf("Len %d, want 4: a refused request was queued", got)
	}
	stop := run(w)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if called != 2 {
		t.Errorf("done called %d times, want 2 (refused requests are never answered)", called)
	}
	var got []int
	for _, b := range rec.flushed() {
		got = append(got, b...)
	}
	if !slices.Equal(got, seq(0, 4)) {
		t.Errorf("flushed %v, want %v", got, seq(0, 4))
	}
}

// TestEnqueueBlocksWhileFull: Enqueue waits while the queue has no room and
// proceeds once the writer takes items out.
func TestEnqueueBlocksWhileFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := newRecorder()
		w := groupcommit.New(rec.flush, groupcommit.Config{QueueSize: 4, MaxBatch: 2})
		if err := w.Enqueue(context.Background(), seq(0, 4), nil); err != nil {
			t.Fatal(err)
		}
		returned := make(chan error, 1)
		go func() { returned <- w.Enqueue(context.Background(), seq(4, 2), nil) }()
		synctest.Wait() // the goroutine is blocked, or has returned
		select {
		case err := <-returned:
			t.Fatalf("Enqueue into a full queue returned %v without waiting", err)
		default:
		}
		if w.Len() != 4 {
			t.Fatalf("Len %d while full, want 4", w.Len())
		}

		// The writer takes one batch and stalls in its flush: two items
		// of room are enough for the waiting request.
		rec.gate = make(chan struct{})
		rec.entered = make(chan struct{})
		stop := run(w)
		<-rec.entered
		synctest.Wait()
		select {
		case err := <-returned:
			if err != nil {
				t.Fatalf("Enqueue after room was made: %v", err)
			}
		default:
			t.Fatal("Enqueue still blocked after the writer took items out of the queue")
		}
		if got := w.Len(); got != 4 {
			t.Errorf("Len %d, want 4 (2 left + 2 queued)", got)
		}
		go func() {
			for range rec.entered {
			}
		}()
		close(rec.gate)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		close(rec.entered)
		var got []int
		for _, b := range rec.flushed() {
			got = append(got, b...)
		}
		if !slices.Equal(got, seq(0, 6)) {
			t.Errorf("flushed %v, want %v", got, seq(0, 6))
		}
	})
}

// TestEnqueueLargerThanQueue: a request larger than the whole queue waits
// for an empty queue instead of waiting forever.
func TestEnqueueLargerThanQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := newRecorder()
		w := groupcommit.New(rec.flush, groupcommit.Config{QueueSize: 4, MaxBatch: 4})
		if err := w.Enqueue(context.Background(), seq(0, 1), nil); err != nil {
			t.Fatal(err)
		}
		returned := make(chan error, 1)
		go func() { returned <- w.Enqueue(context.Background(), seq(1, 10), nil) }()
		synctest.Wait()
		select {
		case err := <-returned:
			t.Fatalf("oversized Enqueue into a non-empty queue returned %v", err)
		default:
		}
		stop := run(w)
		if err := <-returned; err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		for i, b := range rec.flushed() {
			if len(b) > 4 {
				t.Errorf("batch %d has %d items, over MaxBatch", i, len(b))
			}
		}
	})
}

// TestEnqueueCancelled: a waiting Enqueue returns its context's error when
// the context ends, and queues nothing.
func TestEnqueueCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := newRecorder()
		w := groupcommit.New(rec.flush, groupcommit.Config{QueueSize: 2})
		if err := w.TryEnqueue(seq(0, 2), nil); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var called bool
		returned := make(chan error, 1)
		go func() { returned <- w.Enqueue(ctx, seq(2, 1), func(error) { called = true }) }()
		synctest.Wait()
		select {
		case err := <-returned:
			t.Fatalf("Enqueue into a full queue returned %v", err)
		default:
		}
		cancel()
		if err := <-returned; !errors.Is(err, context.Canceled) {
			t.Fatalf("Enqueue after cancel: %v, want context.Canceled", err)
		}
		if w.Len() != 2 {
			t.Errorf("Len %d, want 2: the cancelled request was queued", w.Len())
		}
		// A deadline works the same way.
		dctx, dcancel := context.WithTimeout(context.Background(), time.Second)
		defer dcancel()
		if err := w.Enqueue(dctx, seq(2, 1), nil); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Enqueue past its deadline: %v, want context.DeadlineExceeded", err)
		}
		stop := run(w)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if called {
			t.Error("the done of a cancelled request was called")
		}
		var got []int
		for _, b := range rec.flushed() {
			got = append(got, b...)
		}
		if !slices.Equal(got, seq(0, 2)) {
			t.Errorf("flushed %v, want %v", got, seq(0, 2))
		}
	})
}

// TestRunDrainsThenCloses: when Run's context ends, Run finishes the batch
// in progress, writes what is still queued and returns; after that every
// enqueue returns ErrClosed, and a request that was waiting for room is
// answered one way or the other.
func TestRunDrainsThenCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := newRecorder()
		rec.gate = make(chan struct{})
		rec.entered = make(chan struct{})
		w := groupcommit.New(rec.flush, groupcommit.Config{QueueSize: 4, MaxBatch: 2})
		log := newDoneLog()
		stop := run(w)
		a := seq(0, 2)
		if err := w.Enqueue(context.Background(), a, log.done(t, rec, "a", a)); err != nil {
			t.Fatal(err)
		}
		<-rec.entered // the writer is flushing a and holds it
		b := seq(2, 4)
		if err := w.Enqueue(context.Background(), b, log.done(t, rec, "b", b)); err != nil {
			t.Fatal(err)
		}
		// c waits for room.
		c := seq(6, 1)
		cErr := make(chan error, 1)
		var cDone sync.WaitGroup
		cDone.Add(1)
		var cResult error
		go func() {
			cErr <- w.Enqueue(context.Background(), c, func(err error) { cResult = err; cDone.Done() })
		}()
		synctest.Wait()

		stopped := make(chan error, 1)
		go func() { stopped <- stop() }()
		synctest.Wait() // Run is still in the flush of a: it cannot return
		select {
		case err := <-stopped:
			t.Fatalf("Run returned %v while a flush was in progress", err)
		default:
		}
		go func() {
			for range rec.entered {
			}
		}()
		close(rec.gate)
		if err := <-stopped; err != nil {
			t.Fatalf("Run: %v", err)
		}
		close(rec.entered)
		log.all.Wait()
		if err := log.result(t, "a"); err != nil {
			t.Errorf("a: %v", err)
		}
		if err := log.result(t, "b"); err != nil {
			t.Errorf("b: %v", err)
		}
		want := append(slices.Clone(a), b...)
		// c was either queued before the writer closed (and then must have
		// been flushed and answered) or refused with ErrClosed.
		switch err := <-cErr; {
		case err == nil:
			cDone.Wait()
			if cResult != nil {
				t.Errorf("c: done(%v)", cResult)
			}
			want = append(want, c...)
		case errors.Is(err, groupcommit.ErrClosed):
		default:
			t.Errorf("c: Enqueue %v, want nil or ErrClosed", err)
		}
		var got []int
		for _, b := range rec.flushed() {
			got = append(got, b...)
		}
		if !slices.Equal(got, want) {
			t.Errorf("flushed %v, want %v", got, want)
		}
		if w.Len() != 0 {
			t.Errorf("Len %d after Run returned", w.Len())
		}

		if err := w.Enqueue(context.Background(), seq(10, 1), nil); !errors.Is(err, groupcommit.ErrClosed) {
			t.Errorf("Enqueue after Run: %v, want ErrClosed", err)
		}
		if err := w.TryEnqueue(seq(10, 1), nil); !errors.Is(err, groupcommit.ErrClosed) {
			t.Errorf("TryEnqueue after Run: %v, want ErrClosed", err)
		}
		if err := w.Do(context.Background(), seq(10, 1)); !errors.Is(err, groupcommit.ErrClosed) {
			t.Errorf("Do after Run: %v, want ErrClosed", err)
		}
		if w.Len() != 0 {
			t.Errorf("Len %d: something was queued after Run returned", w.Len())
		}
	})
}

// TestRunCancelledBeforeStart: a Run whose context has already ended still
// writes everything queued before returning, and closes the writer.
func TestRunCancelledBeforeStart(t *testing.T) {
	// Run sees a pending wake-up and the end of its context at once; it
	// must drain whichever it picks. Repeat to cover both choices.
	for i := range 64 {
		rec := newRecorder()
		w := groupcommit.New(rec.flush, groupcommit.Config{MaxBatch: 2})
		var answered []error
		for j := range 3 {
			if err := w.TryEnqueue(seq(j*2, 2), func(err error) { answered = append(answered, err) }); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := w.Run(ctx); err != nil {
			t.Fatalf("Run: %v", err)
		}
		var got []int
		for _, b := range rec.flushed() {
			got = append(got, b...)
		}
		if !slices.Equal(got, seq(0, 6)) || len(answered) != 3 || slices.ContainsFunc(answered, func(err error) bool { return err != nil }) {
			t.Fatalf("round %d: flushed %v, answered %v; want all 6 items flushed and 3 requests answered nil", i, got, answered)
		}
		if err := w.TryEnqueue(seq(9, 1), nil); !errors.Is(err, groupcommit.ErrClosed) {
			t.Fatalf("TryEnqueue after Run: %v, want ErrClosed", err)
		}
	}
}

// TestDoWaitsForCommit: Do returns after the flush holding its items, with
// its error, even when its context ends in between.
func TestDoWaitsForCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := newRecorder()
		rec.gate = make(chan struct{})
		rec.entered = make(chan struct{})
		rec.fail = func(batch []int) error {
			if slices.Contains(batch, 99) {
				return errDisk
			}
			return nil
		}
		w := groupcommit.New(rec.flush, groupcommit.Config{})
		stop := run(w)
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() { res <- w.Do(ctx, []int{1, 2}) }()
		<-rec.entered
		cancel()
		synctest.Wait()
		select {
		case err := <-res:
			t.Fatalf("Do returned %v before its flush finished", err)
		default:
		}
		rec.gate <- struct{}{}
		if err := <-res; err != nil {
			t.Fatalf("Do: %v", err)
		}
		if !rec.isCommitted([]int{1, 2}) {
			t.Fatal("Do returned nil before its items were flushed")
		}
		go func() { res <- w.Do(context.Background(), []int{99}) }()
		<-rec.entered
		rec.gate <- struct{}{}
		if err := <-res; !errors.Is(err, errDisk) {
			t.Fatalf("Do of a failing batch: %v, want the flush error", err)
		}
		go func() {
			for range rec.entered {
			}
		}()
		close(rec.gate)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		close(rec.entered)
	})
}

// BenchmarkEnqueue measures the queue and batching overhead of one
// writer with many concurrent producers and a flush that does nothing.
func BenchmarkEnqueue(b *testing.B) {
	for _, size := range []int{1, 16} {
		b.Run(fmt.Sprint("items=", size), func(b *testing.B) {
			w := groupcommit.New(func(context.Context, []int) error { return nil }, groupcommit.Config{})
			stop := run(w)
			defer stop()
			items := seq(0, size)
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := w.Do(context.Background(), items); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// sized is an item that reports its size in bytes.
type sized int

func (s sized) Size() int { return int(s) }

// TestQueueBytesBound: items that report their size are bounded in bytes
// as well as in count.
func TestQueueBytesBound(t *testing.T) {
	w := groupcommit.New(func(ctx context.Context, batch []sized) error { return nil },
		groupcommit.Config{QueueSize: 1000, QueueBytes: 100})
	for i, tc := range []struct {
		size sized
		want error
	}{
		{60, nil},                 // 60
		{60, groupcommit.ErrFull}, // 120 would be over
		{30, nil},                 // 90
		{20, groupcommit.ErrFull}, // 110 would be over
		{10, nil},                 // 100: at the bound
	} {
		if err := w.TryEnqueue([]sized{tc.size}, nil); !errors.Is(err, tc.want) {
			t.Fatalf("item %d (%d bytes): got %v, want %v", i, tc.size, err, tc.want)
		}
	}
	if b := w.Bytes(); b != 100 {
		t.Fatalf("queue holds %d bytes, want 100", b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.Run(ctx) // writes what is queued, then returns
	if b, n := w.Bytes(), w.Len(); b != 0 || n != 0 {
		t.Fatalf("after the flush the queue holds %d items, %d bytes", n, b)
	}
}
