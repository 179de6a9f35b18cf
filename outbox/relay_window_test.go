package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
)

// slowSettle is the real store whose Settle waits until release closes.
type slowSettle struct {
	outbox.Store
	release  chan struct{}
	settling atomic.Int64 // Settle calls waiting
}

func (s *slowSettle) Settle(ctx context.Context, outcomes []outbox.Outcome) error {
	s.settling.Add(1)
	<-s.release
	return s.Store.Settle(ctx, outcomes)
}

// TestWindowDoesNotWaitForTheStore: answered messages whose outcome the
// store is still recording leave the window (they stay in flight, so they
// are not sent again): with the store's settles held back, the relay
// still sends a full window beyond the first.
func TestWindowDoesNotWaitForTheStore(t *testing.T) {
	s := openStore(t, nil)
	insert(t, s, ids("w", 300)...)
	store := &slowSettle{Store: s, release: make(chan struct{})}
	rec := &recorder{}
	var sent atomic.Int64
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		rec.record(msgs)
		sent.Add(int64(len(msgs)))
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			out[i] = ack(m)
		}
		return out, nil
	})
	cfg := fast
	cfg.BatchSize, cfg.MinInFlight, cfg.MaxInFlight = 50, 100, 100
	runRelay(t, store, pub, cfg)
	// A window of 100 answered and waiting for the store, and another
	// window answered beside it: 200 sent, none twice, the rest held.
	testenv.Eventually(t, 10*time.Second, "two windows sent while the first waits for the store", func() bool { return store.settling.Load() == 4 })
	if n := sent.Load(); n != 200 {
		t.Fatalf("%d messages sent with 4 settles of 50 waiting, want 200", n)
	}
	for _, id := range ids("w", 200) {
		if n := len(rec.sends(id)); n != 1 {
			t.Fatalf("%s sent %d times while its settle waited, want once", id, n)
		}
	}
	close(store.release)
	testenv.Eventually(t, 10*time.Second, "an empty outbox", func() bool { p, _ := counts(t, s); return p == 0 })
	if sent.Load() != 300 {
		t.Fatalf("sent %d messages for 300 rows, want each once", sent.Load())
	}
}
