// Package appendq gives any stream.Backend the write path postbox's
// ingress needs: appends queued without waiting (AppendAsync), a bounded
// queue that pushes back (AppendAsync blocks, TryAppendAsync returns
// groupcommit.ErrFull), and group commits, so that many callers share one
// round trip to the backend.
//
// A Queue is an internal/groupcommit writer whose flush takes the queued
// events (up to MaxBatch), groups them by stream in the order they were
// queued, and calls the backend's Append once per stream. Each caller's
// done then gets its own events' results, in its order. Backends with a
// writer of their own (streamsqlite) do not need a Queue.
//
// A batch whose Append fails is answered with the error for every request
// in it, the requests of other streams of the batch included: as with
// stream.Backend.Append, some of its events may be stored, and appending
// them again is safe (the stored ones come back as duplicates). A request
// for a stream the backend does not have gets stream.ErrStreamNotFound
// alone; the rest of its batch is written.
package appendq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/stream"
)

// DefaultQueueBytes is the default of Config.QueueBytes.
const DefaultQueueBytes = 64 << 20

// Config configures a Queue. Zero fields take their defaults.
type Config struct {
	// MaxBatch bounds the events of one batch (over all its streams).
	// Defaults to groupcommit.DefaultMaxBatch.
	MaxBatch int
	// QueueSize bounds the events waiting. Defaults to
	// groupcommit.DefaultQueueSize.
	QueueSize int
	// QueueBytes bounds the payload and metadata bytes of the events
	// waiting. Defaults to DefaultQueueBytes.
	QueueBytes int
	// Observe, when set, is called after each batch with its events, how
	// long its appends took and their error.
	Observe func(events int, took time.Duration, err error)
}

// Queue queues appends for a stream.Backend and writes them in batches.
type Queue struct {
	streams stream.Backend
	writer  *groupcommit.Writer[*item]

	// used by the writer goroutine only
	order    []string // the batch's streams, in the order first queued
	byStream map[string][]*item
	events   []stream.Event
}

// item is one queued event.
type item struct {
	streamID string
	ev       *stream.Event
	res      *stream.AppendResult
	req      *request
}

// request is one AppendAsync call's state.
type request struct {
	err error // an error of this request alone (written and read on the writer goroutine)
}

// Size is what an item holds in memory while queued (groupcommit.Sizer).
func (it *item) Size() int {
	return len(it.ev.Payload) + len(it.ev.Metadata) + len(it.ev.NativeID) + len(it.ev.DeliveryHandle) + 256
}

// New returns a Queue that appends to streams. Start it with Run.
func New(streams stream.Backend, cfg Config) *Queue {
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = DefaultQueueBytes
	}
	q := &Queue{streams: streams, byStream: map[string][]*item{}}
	q.writer = groupcommit.New(q.flush, groupcommit.Config{MaxBatch: cfg.MaxBatch, QueueSize: cfg.QueueSize,
		QueueBytes: cfg.QueueBytes, Observe: cfg.Observe})
	return q
}

// Run writes queued events until ctx ends, then writes what is still
// queued and returns. The backend's Append gets a context that ctx's end
// does not cancel, so a batch in progress at shutdown is still answered.
// Run does not close the backend.
func (q *Queue) Run(ctx context.Context) error { return q.writer.Run(ctx) }

// AppendAsync queues events for streamID and returns; done is called from
// the writer goroutine with one result per event after the backend stored
// them, or with an error. done must not block. AppendAsync blocks while
// the queue is full, and returns ctx's error or groupcommit.ErrClosed
// without queueing. When ctx ends before the writer took the events, they
// are not written and done gets ctx's error.
func (q *Queue) AppendAsync(ctx context.Context, streamID string, events []stream.Event, done func([]stream.AppendResult, error)) error {
	items, results, req := prepare(streamID, events)
	return q.writer.EnqueueWhile(ctx, items, answer(results, req, done))
}

// TryAppendAsync is AppendAsync that returns groupcommit.ErrFull instead
// of waiting for room in the queue.
func (q *Queue) TryAppendAsync(streamID string, events []stream.Event, done func([]stream.AppendResult, error)) error {
	items, results, req := prepare(streamID, events)
	return q.writer.TryEnqueue(items, answer(results, req, done))
}

// Append queues events for streamID and returns their results once the
// backend stored them.
func (q *Queue) Append(ctx context.Context, streamID string, events []stream.Event) ([]stream.AppendResult, error) {
	items, results, req := prepare(streamID, events)
	if err := q.writer.Do(ctx, items); err != nil {
		return nil, err
	}
	if req.err != nil {
		return nil, req.err
	}
	return results, nil
}

// QueueLen returns the events waiting for the writer.
func (q *Queue) QueueLen() int { return q.writer.Len() }

// QueueBytes returns the bytes the events waiting for the writer hold.
func (q *Queue) QueueBytes() int { return q.writer.Bytes() }

// QueueCap returns the bound of the queue in events.
func (q *Queue) QueueCap() int { return q.writer.Cap() }

func prepare(streamID string, events []stream.Event) ([]*item, []stream.AppendResult, *request) {
	req := &request{}
	results := make([]stream.AppendResult, len(events))
	items := make([]*item, len(events))
	backing := make([]item, len(events))
	for i := range events {
		backing[i] = item{streamID: streamID, ev: &events[i], res: &results[i], req: req}
		items[i] = &backing[i]
	}
	return items, results, req
}

func answer(results []stream.AppendResult, req *request, done func([]stream.AppendResult, error)) func(error) {
	return func(err error) {
		if err == nil {
			err = req.err
		}
		if err != nil {
			done(nil, err)
			return
		}
		done(results, nil)
	}
}

// flush appends one batch, one Append per stream. It runs on the writer
// goroutine only.
func (q *Queue) flush(ctx context.Context, batch []*item) error {
	defer func() {
		for _, id := range q.order {
			clear(q.byStream[id])
			q.byStream[id] = q.byStream[id][:0]
		}
		q.order = q.order[:0]
		if len(q.byStream) > 64 { // many streams once: do not keep them all
			clear(q.byStream)
		}
	}()
	for _, it := range batch {
		items, seen := q.byStream[it.streamID]
		if !seen || len(items) == 0 {
			q.order = append(q.order, it.streamID)
		}
		q.byStream[it.streamID] = append(items, it)
	}
	for _, id := range q.order {
		items := q.byStream[id]
		events := q.events[:0]
		for _, it := range items {
			events = append(events, *it.ev)
		}
		q.events = events
		results, err := q.streams.Append(ctx, id, events)
		clear(events)
		if errors.Is(err, stream.ErrStreamNotFound) {
			for _, it := range items {
				it.req.err = err // the callers' mistake: the rest of the batch is written
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("append %d events to %s: %w", len(items), id, err)
		}
		if len(results) != len(items) {
			return fmt.Errorf("append %d events to %s: the backend returned %d results", len(items), id, len(results))
		}
		for i, it := range items {
			*it.res = results[i]
		}
	}
	return nil
}
