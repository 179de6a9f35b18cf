package outboxtest_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxtest"
)

// TestStore runs the store suite on memory, a minimal outbox that keeps
// every rule (claims and notifications included), to show that a correct
// store passes it.
func TestStore(t *testing.T) {
	outboxtest.RunStore(t, outboxtest.StoreFeatures{}, func(t *testing.T) outboxtest.Store {
		m := &memory{notify: make(chan struct{}, 1)}
		return outboxtest.Store{Store: m, Admin: m, Insert: m.insert}
	})
}

// TestPublisher runs the publisher suite on a publisher into a slice
// that drops ids it holds.
func TestPublisher(t *testing.T) {
	outboxtest.RunPublisher(t, outboxtest.PublisherFeatures{Dedups: true}, func(t *testing.T) outboxtest.Target {
		p := &sink{}
		return outboxtest.Target{Publisher: p, ReadBack: func(t *testing.T) []outboxtest.Received {
			p.mu.Lock()
			defer p.mu.Unlock()
			return slices.Clone(p.got)
		}}
	})
}

const claim = 30 * time.Second

type row struct {
	outbox.Row
	seq                     int64
	traceparent, tracestate string
	lease                   time.Time // the claim the row is held under; zero when none
}

type memory struct {
	mu     sync.Mutex
	rows   []*row
	seq    int64
	notify chan struct{}
}

var (
	_ outbox.Store    = (*memory)(nil)
	_ outbox.Admin    = (*memory)(nil)
	_ outbox.RowAdmin = (*memory)(nil)
	_ outbox.Claimer  = (*memory)(nil)
	_ outbox.Extender = (*memory)(nil)
	_ outbox.Notifier = (*memory)(nil)
)

func (m *memory) wake() {
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

func (m *memory) insert(t *testing.T, events ...outbox.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	for _, e := range events {
		m.seq++
		m.rows = append(m.rows, &row{Row: outbox.Row{EventID: e.ID, Type: e.Type, State: outbox.StatePending, CreatedAt: now, NextAttemptAt: now,
			Payload: e.Payload, CorrelationID: e.CorrelationID, TenantID: e.TenantID}, seq: m.seq, traceparent: e.TraceParent, tracestate: e.TraceState})
	}
	m.wake()
}

func (m *memory) Claims() bool               { return true }
func (m *memory) Notify() <-chan struct{}    { return m.notify }
func (m *memory) ClaimPeriod() time.Duration { return claim }

func (m *memory) Extend(ctx context.Context, now time.Time, claims []outbox.Claim) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, c := range claims {
		for _, r := range m.rows {
			if r.EventID == c.EventID && r.State == outbox.StatePending && !r.lease.IsZero() && r.lease.Equal(c.Lease) {
				r.NextAttemptAt = now.Add(claim)
				n++
			}
		}
	}
	return n, nil
}

func (m *memory) Due(ctx context.Context, now time.Time, after int64, limit int) ([]outbox.Message, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []outbox.Message
	for _, r := range m.rows {
		if len(out) == limit {
			break
		}
		if r.State != outbox.StatePending || r.seq <= after || r.NextAttemptAt.After(now) {
			continue
		}
		r.NextAttemptAt = now.Add(claim)
		r.lease = r.NextAttemptAt
		out = append(out, outbox.Message{Seq: r.seq, EventID: r.EventID, Type: r.Type, Body: r.Payload,
			CorrelationID: r.CorrelationID, TenantID: r.TenantID, Attempts: r.Attempts, CreatedAt: r.CreatedAt, Lease: r.NextAttemptAt,
			TraceParent: r.traceparent, TraceState: r.tracestate})
	}
	return out, nil
}

func (m *memory) Settle(ctx context.Context, outcomes []outbox.Outcome) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, o := range outcomes {
		i := slices.IndexFunc(m.rows, func(r *row) bool { return r.EventID == o.EventID })
		if i < 0 {
			continue
		}
		r := m.rows[i]
		if o.Kind == outbox.Delivered {
			m.rows = slices.Delete(m.rows, i, i+1)
			continue
		}
		if r.State != outbox.StatePending || r.lease.IsZero() || !r.lease.Equal(o.Lease) {
			continue
		}
		r.LastError, r.lease = o.Error, time.Time{}
		switch o.Kind {
		case outbox.Rejected:
			r.State, r.Attempts = outbox.StateRejected, r.Attempts+1
		case outbox.Retry:
			r.NextAttemptAt, r.Attempts = o.RetryAt, r.Attempts+1
		case outbox.Unanswered:
			r.NextAttemptAt = time.Now()
		}
	}
	return nil
}

func (m *memory) List(ctx context.Context, state string, limit int) ([]outbox.Row, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []outbox.Row
	for _, r := range m.rows {
		if (state == "" || r.State == state) && len(out) < limit {
			out = append(out, r.Row)
		}
	}
	return out, nil
}

func (m *memory) Counts(ctx context.Context) (pending, rejected int64, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.rows {
		if r.State == outbox.StatePending {
			pending++
		} else {
			rejected++
		}
	}
	return pending, rejected, nil
}

func (m *memory) OldestPending(ctx context.Context) (time.Time, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.rows {
		if r.State == outbox.StatePending {
			return r.CreatedAt, true, nil
		}
	}
	return time.Time{}, false, nil
}

func (m *memory) Rows(ctx context.Context, ids []string) ([]outbox.Row, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []outbox.Row
	for _, r := range m.rows {
		if slices.Contains(ids, r.EventID) {
			out = append(out, r.Row)
		}
	}
	return out, nil
}

func (m *memory) Drop(ctx context.Context, ids []string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var dropped []string
	m.rows = slices.DeleteFunc(m.rows, func(r *row) bool {
		drop := r.State == outbox.StateRejected && (len(ids) == 0 || slices.Contains(ids, r.EventID))
		if drop {
			dropped = append(dropped, r.EventID)
		}
		return drop
	})
	return dropped, nil
}

func (m *memory) Requeue(ctx context.Context, ids []string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, r := range m.rows {
		if r.State == outbox.StateRejected && (len(ids) == 0 || slices.Contains(ids, r.EventID)) {
			r.State, r.Attempts, r.NextAttemptAt = outbox.StatePending, 0, time.Now()
			n++
		}
	}
	if n > 0 {
		m.wake()
	}
	return n, nil
}

type sink struct {
	mu  sync.Mutex
	got []outboxtest.Received
}

func (s *sink) Publish(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	replies := make([]postbox.Reply, len(msgs))
	for i, m := range msgs {
		if !slices.ContainsFunc(s.got, func(r outboxtest.Received) bool { return r.EventID == m.EventID }) {
			s.got = append(s.got, outboxtest.Received{EventID: m.EventID, Type: m.Type, Payload: m.Body})
		}
		replies[i] = postbox.Reply{EventID: m.EventID, Status: postbox.StatusStored}
	}
	return replies, nil
}
