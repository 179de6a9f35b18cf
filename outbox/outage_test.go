package outbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/retry"
)

// TestOutageNackIsNotTheRowsFailure: a receiver whose commits fail NACKs
// every event outage. That is an outage: no attempt is counted, no
// row is parked or backed off, and the rows go as soon as the receiver
// recovers, although a retry of the row's own would wait an hour.
func TestOutageNackIsNotTheRowsFailure(t *testing.T) {
	s := openStore(t, nil)
	all := ids("evt", 20)
	insert(t, s, all...)

	var healed atomic.Bool
	var nacked atomic.Int64
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			if healed.Load() {
				out[i] = ack(m)
				continue
			}
			out[i] = postbox.Nack(m.EventID, &postbox.FieldError{Code: postbox.CodeOutage, Message: "not stored, send again: database or disk is full"})
		}
		if !healed.Load() {
			nacked.Add(1)
		}
		return out, nil
	})
	if !postbox.CodeOutage.Retryable() {
		t.Fatal("outage is not retryable")
	}
	cfg := fast
	cfg.Retry = retry.Backoff{Base: time.Hour, Max: time.Hour}
	cfg.MaxAttempts = 3
	runRelay(t, s, pub, cfg)

	testenv.Eventually(t, 10*time.Second, "ten outage NACKs", func() bool { return nacked.Load() >= 10 })
	for _, id := range all {
		r, ok := row(t, s, id)
		if !ok || r.State != outbox.StatePending || r.Attempts != 0 {
			t.Fatalf("%s during the outage: %+v, want pending with no attempt counted", id, r)
		}
	}
	healed.Store(true)
	testenv.Eventually(t, 10*time.Second, "the outbox to empty once the receiver recovered", func() bool {
		p, r := counts(t, s)
		return p == 0 && r == 0
	})
}

// TestWindowGrowsOnAGoodLinkAndShrinksAfterAnOutage: the window starts at
// MinInFlight, reaches MaxInFlight while everything is ACKed, and after a
// transport failure starts again from what was answered since, never
// below MinInFlight.
func TestWindowGrowsOnAGoodLinkAndShrinksAfterAnOutage(t *testing.T) {
	s := openStore(t, nil)
	insert(t, s, ids("a", 3000)...)

	var mu sync.Mutex
	var windows, failures []int
	var failNext atomic.Bool
	var delivered atomic.Int64
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		if failNext.CompareAndSwap(true, false) {
			return nil, errors.New("connection reset")
		}
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			out[i] = ack(m)
		}
		return out, nil
	})
	cfg := fast
	cfg.BatchSize, cfg.MinInFlight, cfg.MaxInFlight = 50, 100, 1000
	cfg.Observe = func(st outbox.Stats) {
		mu.Lock()
		windows = append(windows, st.Window)
		delivered.Add(int64(st.Delivered))
		if st.Err != nil {
			failures = append(failures, st.Window)
		}
		mu.Unlock()
	}
	runRelay(t, s, pub, cfg)
	testenv.Eventually(t, 20*time.Second, "the first rows delivered", func() bool { return delivered.Load() == 3000 })
	mu.Lock()
	first, top := windows[0], 0
	for _, w := range windows {
		top = max(top, w)
	}
	windows = nil
	mu.Unlock()
	if first > 150 || top != 1000 {
		t.Fatalf("window after the first publish %d, largest %d; want at most 150 (MinInFlight and one batch answered) and 1000 (MaxInFlight)", first, top)
	}

	// A long good connection: the failure keeps the window it reached.
	// The next connection answers only 10 rows before it fails: the
	// window falls to MinInFlight.
	for i, prefix := range []string{"b", "c"} {
		failNext.Store(true)
		insert(t, s, ids(prefix, 10)...)
		testenv.Eventually(t, 20*time.Second, "the rows sent after the failure delivered", func() bool { return delivered.Load() == int64(3010+10*i) })
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failures) != 2 || failures[0] != 1000 || failures[1] != 100 {
		t.Fatalf("windows after the two transport failures %v, want [1000 100]", failures)
	}
}
