package streamtest_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamtest"
)

// TestConformance runs the suite on memory, a minimal backend that keeps
// every rule, to show that a correct backend passes it.
func TestConformance(t *testing.T) {
	var mu sync.Mutex
	stores := map[string]*store{}
	streamtest.Run(t, streamtest.Features{}, func(t *testing.T, name string) stream.Backend {
		mu.Lock()
		defer mu.Unlock()
		st, ok := stores[name]
		if !ok {
			st = &store{streams: map[string]*memStream{}, bySource: map[string]string{}, consumers: map[string]*stream.Consumer{}, moves: map[string][]stream.Move{}, changed: make(chan struct{})}
			stores[name] = st
		}
		return &memory{st: st}
	})
}

// store is what a memory backend keeps; it outlives Close, as a file would.
type store struct {
	mu        sync.Mutex
	streams   map[string]*memStream
	bySource  map[string]string
	consumers map[string]*stream.Consumer
	moves     map[string][]stream.Move // by consumer, oldest first
	ids       int
	changed   chan struct{} // closed and replaced on every append
}

type memStream struct {
	s      stream.Stream
	events []stream.StoredEvent
	index  map[[2]string]int // identity → index in events
}

type memory struct{ st *store }

var (
	_ stream.Backend = (*memory)(nil)
	_ stream.Waiter  = (*memory)(nil)
	_ stream.Auditor = (*memory)(nil)
)

func (m *memory) EnsureStream(ctx context.Context, sourceID string) (stream.Stream, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	if id, ok := m.st.bySource[sourceID]; ok {
		return m.st.streams[id].s, nil
	}
	m.st.ids++
	s := stream.Stream{ID: fmt.Sprintf("st%d", m.st.ids), SourceID: sourceID, Backend: "memory", CreatedAt: time.Now()}
	m.st.streams[s.ID] = &memStream{s: s, index: map[[2]string]int{}}
	m.st.bySource[sourceID] = s.ID
	return s, nil
}

func (m *memory) Append(ctx context.Context, streamID string, events []stream.Event) ([]stream.AppendResult, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	ms, ok := m.st.streams[streamID]
	if !ok {
		return nil, stream.ErrStreamNotFound
	}
	now := time.Now()
	res := make([]stream.AppendResult, len(events))
	for i, e := range events {
		key := [2]string{e.NativeID, e.Variant}
		if at, ok := ms.index[key]; ok {
			old := ms.events[at]
			if err := stream.Conflict(&old.Event, &e); err != nil {
				res[i] = stream.AppendResult{Offset: old.Offset, Err: err}
				continue
			}
			res[i] = stream.AppendResult{Offset: old.Offset, StoredAt: old.StoredAt, Duplicate: true}
			continue
		}
		m.st.ids++
		se := stream.StoredEvent{Event: e, Offset: int64(len(ms.events)) + 1, ID: fmt.Sprintf("ev%d", m.st.ids), StreamID: streamID, SourceID: ms.s.SourceID, StoredAt: now}
		ms.index[key] = len(ms.events)
		ms.events = append(ms.events, se)
		res[i] = stream.AppendResult{Offset: se.Offset, StoredAt: now}
	}
	close(m.st.changed)
	m.st.changed = make(chan struct{})
	return res, nil
}

// position is where start begins in ms.
func (ms *memStream) position(start stream.Start) (int64, error) {
	if err := start.Validate(); err != nil {
		return 0, err
	}
	hw := int64(len(ms.events))
	switch start.Policy {
	case stream.StartEarliest:
		return 1, nil
	case stream.StartAtOffset:
		if start.Offset > hw+1 {
			return 0, stream.ErrOffsetOutOfRange
		}
		return start.Offset, nil
	case stream.StartAtTime:
		for _, e := range ms.events {
			if !e.StoredAt.Before(start.Time) {
				return e.Offset, nil
			}
		}
	}
	return hw + 1, nil
}

func (m *memory) EnsureConsumer(ctx context.Context, cfg stream.ConsumerConfig) (stream.Consumer, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	ms, ok := m.st.streams[cfg.StreamID]
	if !ok {
		return stream.Consumer{}, stream.ErrStreamNotFound
	}
	if c, ok := m.st.consumers[cfg.ID]; ok {
		if c.StreamID != cfg.StreamID {
			return stream.Consumer{}, stream.ErrConsumerExists
		}
		return *c, nil
	}
	next, err := ms.position(cfg.Start)
	if err != nil {
		return stream.Consumer{}, err
	}
	now := time.Now()
	c := &stream.Consumer{ID: cfg.ID, StreamID: cfg.StreamID, Key: cfg.StreamID + "/" + cfg.ID, NextOffset: next, Start: cfg.Start, CreatedAt: now, UpdatedAt: now}
	m.st.consumers[cfg.ID] = c
	return *c, nil
}

func (m *memory) Consumer(ctx context.Context, id string) (stream.Consumer, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	c, ok := m.st.consumers[id]
	if !ok {
		return stream.Consumer{}, stream.ErrConsumerNotFound
	}
	return *c, nil
}

func (m *memory) DeleteConsumer(ctx context.Context, id string) error {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	if _, ok := m.st.consumers[id]; !ok {
		return stream.ErrConsumerNotFound
	}
	delete(m.st.consumers, id)
	delete(m.st.moves, id)
	return nil
}

func (m *memory) Read(ctx context.Context, consumerID string, from int64, limit int) (stream.Batch, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	c, ok := m.st.consumers[consumerID]
	if !ok {
		return stream.Batch{}, stream.ErrConsumerNotFound
	}
	ms := m.st.streams[c.StreamID]
	if from == 0 {
		from = c.NextOffset
	}
	b := stream.Batch{Consumer: *c, HighWatermark: int64(len(ms.events))}
	for o := max(from, 1); o <= b.HighWatermark && len(b.Events) < limit; o++ {
		b.Events = append(b.Events, ms.events[o-1])
	}
	return b, nil
}

func (m *memory) Commit(ctx context.Context, consumerID string, offset int64) (stream.Consumer, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	c, ok := m.st.consumers[consumerID]
	if !ok {
		return stream.Consumer{}, stream.ErrConsumerNotFound
	}
	switch {
	case offset > int64(len(m.st.streams[c.StreamID].events)):
		return stream.Consumer{}, stream.ErrOffsetOutOfRange
	case offset < c.NextOffset-1:
		return stream.Consumer{}, stream.ErrCommitBehind
	}
	if offset != c.NextOffset-1 {
		m.st.moves[c.ID] = append(m.st.moves[c.ID], stream.Move{ConsumerID: c.ID, StreamID: c.StreamID, Kind: stream.MoveCommit, Offset: offset, At: time.Now()})
	}
	c.NextOffset, c.UpdatedAt = offset+1, time.Now()
	return *c, nil
}

func (m *memory) Reset(ctx context.Context, consumerID string, start stream.Start) (stream.Consumer, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	c, ok := m.st.consumers[consumerID]
	if !ok {
		return stream.Consumer{}, stream.ErrConsumerNotFound
	}
	next, err := m.st.streams[c.StreamID].position(start)
	if err != nil {
		return stream.Consumer{}, err
	}
	c.NextOffset, c.Start, c.UpdatedAt = next, start, time.Now()
	canonical := start.Canonical()
	m.st.moves[c.ID] = append(m.st.moves[c.ID], stream.Move{ConsumerID: c.ID, StreamID: c.StreamID, Kind: stream.MoveReset, Offset: next - 1, Start: &canonical, At: c.UpdatedAt})
	return *c, nil
}

func (m *memory) Moves(ctx context.Context, consumerID string, limit int) ([]stream.Move, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	if _, ok := m.st.consumers[consumerID]; !ok {
		return nil, stream.ErrConsumerNotFound
	}
	all := m.st.moves[consumerID]
	var out []stream.Move
	for i := len(all) - 1; i >= 0 && len(out) < limit; i-- {
		out = append(out, all[i])
	}
	return out, nil
}

func (m *memory) Stats(ctx context.Context, streamID string) (stream.Stats, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	ms, ok := m.st.streams[streamID]
	if !ok {
		return stream.Stats{}, stream.ErrStreamNotFound
	}
	s := stream.Stats{StreamID: streamID, Events: int64(len(ms.events))}
	if n := len(ms.events); n > 0 {
		s.FirstOffset, s.LastOffset = 1, int64(n)
		s.FirstStoredAt, s.LastStoredAt = ms.events[0].StoredAt, ms.events[n-1].StoredAt
	}
	return s, nil
}

func (m *memory) Lag(ctx context.Context, consumerID string) (stream.Lag, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	c, ok := m.st.consumers[consumerID]
	if !ok {
		return stream.Lag{}, stream.ErrConsumerNotFound
	}
	hw := int64(len(m.st.streams[c.StreamID].events))
	return stream.Lag{ConsumerID: c.ID, StreamID: c.StreamID, NextOffset: c.NextOffset, HighWatermark: hw, Events: max(hw-c.NextOffset+1, 0)}, nil
}

func (m *memory) Wait(ctx context.Context, streamID string, after int64) error {
	for {
		m.st.mu.Lock()
		ms, ok := m.st.streams[streamID]
		changed := m.st.changed
		var hw int64
		if ok {
			hw = int64(len(ms.events))
		}
		m.st.mu.Unlock()
		if !ok {
			return stream.ErrStreamNotFound
		}
		if hw > after {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

func (m *memory) Close() error { return nil }

func (m *memory) Streams(ctx context.Context) ([]stream.Stream, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	out := make([]stream.Stream, 0, len(m.st.streams))
	for _, ms := range m.st.streams {
		out = append(out, ms.s)
	}
	slices.SortFunc(out, func(a, b stream.Stream) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

func (m *memory) Event(ctx context.Context, streamID string, offset int64) (stream.StoredEvent, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	ms, ok := m.st.streams[streamID]
	if !ok {
		return stream.StoredEvent{}, stream.ErrStreamNotFound
	}
	if offset < 1 || offset > int64(len(ms.events)) {
		return stream.StoredEvent{}, stream.ErrNotFound
	}
	return ms.events[offset-1], nil
}

func (m *memory) Lookup(ctx context.Context, streamID, nativeID, variant string) (stream.StoredEvent, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	ms, ok := m.st.streams[streamID]
	if !ok {
		return stream.StoredEvent{}, stream.ErrStreamNotFound
	}
	at, ok := ms.index[[2]string{nativeID, variant}]
	if !ok {
		return stream.StoredEvent{}, stream.ErrNotFound
	}
	return ms.events[at], nil
}

var _ stream.Searcher = (*memory)(nil)

// Search reads the stream through, newest first: a reference needs no
// index.
func (m *memory) Search(ctx context.Context, streamID string, q stream.Query) ([]stream.StoredEvent, error) {
	m.st.mu.Lock()
	defer m.st.mu.Unlock()
	ms, ok := m.st.streams[streamID]
	if !ok {
		return nil, stream.ErrStreamNotFound
	}
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	var out []stream.StoredEvent
	for i := len(ms.events) - 1; i >= 0 && len(out) < limit; i-- {
		e := ms.events[i]
		switch {
		case q.Before > 0 && e.Offset >= q.Before,
			q.NativeID != "" && e.NativeID != q.NativeID,
			q.Type != "" && e.Type != q.Type,
			!q.Since.IsZero() && e.StoredAt.Before(q.Since),
			!q.Until.IsZero() && !e.StoredAt.Before(q.Until):
			continue
		}
		out = append(out, e)
	}
	return out, nil
}
