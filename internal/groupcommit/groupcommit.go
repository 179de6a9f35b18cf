// Package groupcommit runs the single-writer, group-commit write path of
// postbox's SQLite stores.
//
// Callers enqueue items into a bounded queue. One goroutine, Run, takes
// everything queued (up to MaxBatch items), hands it to the flush function,
// which writes it in one transaction and commits, and only then tells each
// caller its items are done. A commit is shared by every caller in the batch,
// so the cost of an fsync is paid once per batch instead of once per item,
// and the store sees exactly one writer.
//
// With Config.Sync the fsync leaves the writer's path: flush commits
// without waiting for the disk, a goroutine of the Writer's own calls Sync
// once for every commit made since its last call, and only then are those
// commits' callers told. The next batch is written while the disk syncs
// the last, so the writer is busy for the CPU a batch costs, not for it and
// an fsync in turn.
//
// The queue is bounded by QueueSize items, and by QueueBytes when the items
// implement Sizer: Enqueue blocks while it is full
// (a stream transport stops reading, which is backpressure) and TryEnqueue
// returns ErrFull (an HTTP handler answers 429).
package groupcommit

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Defaults of Config.
const (
	DefaultMaxBatch  = 2048
	DefaultQueueSize = 10000
)

var (
	// ErrFull is returned by TryEnqueue when the queue has no room.
	ErrFull = errors.New("write queue is full")
	// ErrClosed is returned once Run has returned.
	ErrClosed = errors.New("writer is closed")
)

// Config configures a Writer.
type Config struct {
	// MaxBatch bounds the items written in one transaction. 1 gives one
	// transaction per item. Defaults to DefaultMaxBatch.
	MaxBatch int
	// QueueSize bounds the items waiting to be written. Defaults to
	// DefaultQueueSize.
	QueueSize int
	// QueueBytes bounds the sum of the Size of the items waiting, when the
	// items implement Sizer. Zero means no bound in bytes.
	QueueBytes int
	// Observe, when set, is called after each flush with the batch size,
	// how long the flush took and its error.
	Observe func(items int, took time.Duration, err error)
	// Sync, when set, makes what flush committed durable (an fsync of the
	// write-ahead log). A flush's callers are answered after a Sync that
	// began after the flush returned; one call covers every flush since
	// the last. A failed Sync answers those callers with its error.
	Sync func() error
	// ObserveSync, when set, is called after each Sync with the flushes
	// it covered, how long it took and its error.
	ObserveSync func(flushes int, took time.Duration, err error)
	// Transient, when set, reports whether a failed flush may succeed
	// when run again (an I/O hiccup of SQLite's disk): the
	// batch is then flushed again after a backoff of 100 ms doubling, with
	// full jitter, five attempts in all (about 1.5 s at most) before its
	// callers get the error. Observe sees the last attempt only.
	Transient func(error) bool
	// ObserveRetry, when set, is called before each retry of a flush of
	// items: the attempt to come (2, 3, …), the wait before it, and the
	// error of the one before.
	ObserveRetry func(items, attempt int, wait time.Duration, err error)
}

// Sizer is implemented by items that know how much memory they hold.
type Sizer interface{ Size() int }

// FlushFunc writes batch in one transaction and commits it. It may record
// per-item results in the items. When it returns an error, every item of
// the batch is answered with that error and must be as if never written.
type FlushFunc[T any] func(ctx context.Context, batch []T) error

// Writer is a bounded queue drained by one goroutine in group commits.
type Writer[T any] struct {
	flush FlushFunc[T]
	cfg   Config

	mu     sync.Mutex
	queue  []entry[T]
	bytes  int           // sum of the queued items' Size
	space  chan struct{} // closed when items leave the queue
	ready  chan struct{} // wakes Run
	closed bool

	sync  *syncer             // nil without Config.Sync
	sleep func(time.Duration) // time.Sleep; a test's own in tests
}

type entry[T any] struct {
	item T
	req  *request
}

type request struct {
	remaining int
	err       error
	done      func(error)
	// ctx, when not nil, is the caller's (EnqueueWhile): a request whose
	// ctx ended before the writer took its first item is dropped whole.
	ctx     context.Context
	started bool // the writer took one of its items (writer goroutine only)
	dropped bool // ctx ended before that: none of its items is written
	whole   bool // its items go in one flush (EnqueueWhole)
}

// New returns a Writer that writes with flush. Start it with Run.
func New[T any](flush FlushFunc[T], cfg Config) *Writer[T] {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	w := &Writer[T]{
		flush: flush,
		cfg:   cfg,
		space: make(chan struct{}),
		ready: make(chan struct{}, 1),
		sleep: time.Sleep,
	}
	if cfg.Sync != nil {
		w.sync = &syncer{sync: cfg.Sync, observe: cfg.ObserveSync, wake: make(chan struct{}, 1), taken: make(chan struct{})}
	}
	return w
}

// Len returns the number of items waiting to be written.
func (w *Writer[T]) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue)
}

// Cap returns the queue's bound.
func (w *Writer[T]) Cap() int { return w.cfg.QueueSize }

// Enqueue queues items and returns at once; done is called from the writer
// goroutine after the items' transaction committed (nil) or failed. done
// must not block. Enqueue blocks while the queue has no room for items
// (a request larger than the queue waits for an empty queue, and then
// exceeds the bound: callers keep requests small) and returns
// ctx's error or ErrClosed without queueing anything.
func (w *Writer[T]) Enqueue(ctx context.Context, items []T, done func(error)) error {
	return w.enqueue(ctx, items, done, nil)
}

// EnqueueWhile is Enqueue for a caller that stops caring about items when
// ctx ends (a connection that closed cannot be answered): if ctx ended
// before the writer took the first of items, none of them is written, and
// done gets ctx's error. Once the writer took one, all of them are written
// and answered as with Enqueue.
func (w *Writer[T]) EnqueueWhile(ctx context.Context, items []T, done func(error)) error {
	return w.enqueue(ctx, items, done, ctx)
}

// EnqueueWhole is EnqueueWhile whose items are all written in one flush,
// and so one transaction, even when they start a batch near MaxBatch
// (the batch then exceeds MaxBatch): a caller that writes its own record
// with its items (a source's checkpoint with the page it read) has both
// or neither.
func (w *Writer[T]) EnqueueWhole(ctx context.Context, items []T, done func(error)) error {
	return w.enqueueReq(ctx, items, done, ctx, true)
}

func (w *Writer[T]) enqueue(ctx context.Context, items []T, done func(error), reqCtx context.Context) error {
	return w.enqueueReq(ctx, items, done, reqCtx, false)
}

func (w *Writer[T]) enqueueReq(ctx context.Context, items []T, done func(error), reqCtx context.Context, whole bool) error {
	if len(items) == 0 {
		return w.empty(done)
	}
	for {
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			return ErrClosed
		}
		if w.fits(items) {
			w.push(items, done, reqCtx)
			if whole {
				w.queue[len(w.queue)-1].req.whole = true
			}
			w.mu.Unlock()
			return nil
		}
		space := w.space
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-space:
		}
	}
}

// TryEnqueue is Enqueue that returns ErrFull instead of waiting.
func (w *Writer[T]) TryEnqueue(items []T, done func(error)) error {
	if len(items) == 0 {
		return w.empty(done)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	if !w.fits(items) {
		return ErrFull
	}
	w.push(items, done, nil)
	return nil
}

// Do enqueues items and waits for their commit.
func (w *Writer[T]) Do(ctx context.Context, items []T) error {
	ch := make(chan error, 1)
	if err := w.Enqueue(ctx, items, func(err error) { ch <- err }); err != nil {
		return err
	}
	return <-ch // answered even after ctx ends: Run flushes what it accepted
}

func (w *Writer[T]) fits(items []T) bool {
	if len(w.queue) == 0 {
		return true
	}
	if len(w.queue)+len(items) > w.cfg.QueueSize {
		return false
	}
	return w.cfg.QueueBytes <= 0 || w.bytes+sizeOf(items) <= w.cfg.QueueBytes
}

func sizeOf[T any](items []T) int {
	n := 0
	for _, it := range items {
		if s, ok := any(it).(Sizer); ok {
			n += s.Size()
		}
	}
	return n
}

// Bytes returns the sum of the Size of the queued items.
func (w *Writer[T]) Bytes() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.bytes
}

// empty answers a request without items.
func (w *Writer[T]) empty(done func(error)) error {
	w.mu.Lock()
	closed := w.closed
	w.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if done != nil {
		done(nil)
	}
	return nil
}

func (w *Writer[T]) push(items []T, done func(error), ctx context.Context) {
	req := &request{remaining: len(items), done: done, ctx: ctx}
	for _, it := range items {
		w.queue = append(w.queue, entry[T]{item: it, req: req})
	}
	w.bytes += sizeOf(items)
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// Run writes queued items until ctx ends, then writes what is still queued
// and returns. Items are flushed with a context that is not cancelled by
// ctx, so a batch in progress at shutdown still commits and is answered.
func (w *Writer[T]) Run(ctx context.Context) error {
	if w.sync != nil {
		flushed := make(chan struct{})
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			w.sync.run(flushed)
		}()
		defer func() {
			close(flushed) // no flush follows: the syncer answers the last and stops
			<-stopped
		}()
	}
	fctx := context.WithoutCancel(ctx)
	batch := make([]entry[T], 0, w.cfg.MaxBatch)
	items := make([]T, 0, w.cfg.MaxBatch)
	for {
		select {
		case <-w.ready:
		case <-ctx.Done():
			w.mu.Lock()
			w.closed = true
			w.mu.Unlock()
			for w.writeBatch(fctx, batch, items) {
			}
			return nil
		}
		for w.writeBatch(fctx, batch, items) {
		}
	}
}

// writeBatch flushes up to MaxBatch queued items; it reports whether it
// found any.
func (w *Writer[T]) writeBatch(ctx context.Context, batch []entry[T], items []T) bool {
	if w.sync != nil {
		// A commit no Sync has taken yet is answered by the next Sync
		// anyway: committing again before it is taken would only make
		// smaller batches.
		w.sync.waitTaken()
	}
	w.mu.Lock()
	n := min(len(w.queue), w.cfg.MaxBatch)
	if n == 0 {
		w.mu.Unlock()
		return false
	}
	for n < len(w.queue) && w.queue[n-1].req.whole && w.queue[n].req == w.queue[n-1].req {
		n++ // an EnqueueWhole request is not split
	}
	batch = append(batch[:0], w.queue[:n]...)
	for _, e := range batch {
		if s, ok := any(e.item).(Sizer); ok {
			w.bytes -= s.Size()
		}
	}
	rest := copy(w.queue, w.queue[n:])
	clear(w.queue[rest:])
	w.queue = w.queue[:rest]
	close(w.space)
	w.space = make(chan struct{})
	w.mu.Unlock()

	// Requests whose caller went away before any of their items was taken
	// are dropped here, whole, instead of being written for nobody.
	items = items[:0]
	kept := batch[:0]
	for _, e := range batch {
		r := e.req
		if !r.started {
			r.started = true
			if r.ctx != nil && r.ctx.Err() != nil {
				r.dropped, r.err = true, r.ctx.Err()
			}
		}
		if r.dropped {
			if r.remaining--; r.remaining == 0 && r.done != nil {
				r.done(r.err)
			}
			continue
		}
		kept = append(kept, e)
		items = append(items, e.item)
	}
	batch = kept
	if len(items) == 0 {
		clear(batch[:n])
		return true
	}
	start := time.Now()
	err := w.flushRetrying(ctx, items)
	if w.cfg.Observe != nil {
		w.cfg.Observe(len(items), time.Since(start), err)
	}
	for _, e := range batch {
		r := e.req
		if err != nil && r.err == nil {
			r.err = err
		}
		r.remaining--
		if r.remaining == 0 && r.done != nil {
			if w.sync != nil && r.err == nil {
				w.sync.add(r)
			} else {
				r.done(r.err)
			}
		}
	}
	if w.sync != nil && err == nil {
		w.sync.flushed()
	}
	clear(items)
	clear(batch[:n]) // let the items go before the next batch
	return true
}

// syncer answers the callers of committed flushes once Sync has made them
// durable, on a goroutine of its own so that the writer goes on meanwhile.
type syncer struct {
	sync    func() error
	observe func(flushes int, took time.Duration, err error)
	wake    chan struct{} // has a token when flushes wait for a Sync

	mu      sync.Mutex
	waiting []*request    // answered after the next Sync
	flushes int           // flushes since the last Sync
	taken   chan struct{} // closed when the syncer takes the flushes
	spare   []*request
}

// waitTaken returns once no committed flush waits for a Sync to begin
// (writer goroutine).
func (s *syncer) waitTaken() {
	s.mu.Lock()
	for s.flushes > 0 {
		taken := s.taken
		s.mu.Unlock()
		<-taken
		s.mu.Lock()
	}
	s.mu.Unlock()
}

// add queues r's answer for after the next Sync (writer goroutine).
func (s *syncer) add(r *request) {
	s.mu.Lock()
	s.waiting = append(s.waiting, r)
	s.mu.Unlock()
}

// flushed records a committed flush and wakes the syncer (writer goroutine).
func (s *syncer) flushed() {
	s.mu.Lock()
	s.flushes++
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run syncs and answers until last is closed (no flush follows), then
// syncs once more for what the last flushes committed.
func (s *syncer) run(last <-chan struct{}) {
	for {
		select {
		case <-s.wake:
			s.once()
		case <-last:
			s.once()
			return
		}
	}
}

// once calls Sync for the flushes committed so far and answers their
// callers.
func (s *syncer) once() {
	s.mu.Lock()
	reqs, flushes := s.waiting, s.flushes
	s.waiting, s.spare, s.flushes = s.spare[:0], nil, 0
	close(s.taken)
	s.taken = make(chan struct{})
	s.mu.Unlock()
	if flushes == 0 && len(reqs) == 0 {
		return
	}
	start := time.Now()
	err := s.sync()
	if s.observe != nil {
		s.observe(flushes, time.Since(start), err)
	}
	for i, r := range reqs {
		r.done(err)
		reqs[i] = nil
	}
	s.mu.Lock()
	if s.spare == nil {
		s.spare = reqs[:0]
	}
	s.mu.Unlock()
}
