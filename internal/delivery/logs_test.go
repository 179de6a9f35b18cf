package delivery_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/retry"
	"github.com/postbox-events/postbox/stream"
)

// TestAttemptLogs: every attempt's start, completion and failure is logged
// with the event's identity (source, event id, type, offset), the item and
// the attempt, as JSON lines; starts and completions at INFO, a retry at
// INFO, a dead letter at ERROR.
func TestAttemptLogs(t *testing.T) {
	var log testenv.JSONLog
	e := setup(t, sqliteStore, delivery.Config{MaxAttempts: 2, RetryBaseDelay: time.Second, Jitter: retry.NoJitter,
		Logger: log.Logger()})
	failing, ok := newTarget(t, 500), newTarget(t, 200)
	e.create(t, delivery.Subscription{Name: "bad", Source: "devices", Target: failing.URL})
	e.appendEvents(t, "ev", "order.paid", 1)
	e.waitItem(t, "bad", delivery.StatePending, 1)
	e.clock.Advance(time.Second)
	it := e.waitItem(t, "bad", delivery.StateFailed, 2)
	e.create(t, delivery.Subscription{Name: "good", Source: "devices", Target: ok.URL, Start: stream.Start{Policy: stream.StartEarliest}})
	e.waitItem(t, "good", delivery.StateCompleted, 1)

	identity := map[string]any{"source": "devices", "event_id": "ev-0", "type": "order.paid", "offset": 1.0}
	check := func(msg, level string, n int, more map[string]any) {
		t.Helper()
		var ls []map[string]any
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("%d lines %q", n, msg), func() bool { // logged once settled
			ls = log.Lines(t, msg)
			return len(ls) >= n
		})
		if len(ls) != n {
			t.Fatalf("%d lines %q, want %d", len(ls), msg, n)
		}
		for _, l := range ls {
			for k, v := range identity {
				if l[k] != v {
					t.Errorf("%q: %s is %v, want %v (%v)", msg, k, l[k], v, l)
				}
			}
			for k, v := range more {
				if l[k] != v {
					t.Errorf("%q: %s is %v, want %v (%v)", msg, k, l[k], v, l)
				}
			}
			if l["level"] != level || l["item"] == nil || l["attempt"] == nil {
				t.Errorf("%q: %v, want level %s with the item and the attempt", msg, l, level)
			}
		}
	}
	check("delivery: processing", "INFO", 3, nil)
	check("delivery: attempt failed; retry scheduled", "INFO", 1, map[string]any{"inbox": "bad", "item": float64(it.ID), "attempt": 1.0})
	check("delivery: attempt failed; the item is a dead letter", "ERROR", 1, map[string]any{"inbox": "bad", "attempt": 2.0})
	check("delivery: completed", "INFO", 1, map[string]any{"inbox": "good"})
}

// TestNackLogs: an item a runtime nacks through the pull API is logged
// with its event's identity: a retry at INFO, a dead letter at ERROR.
func TestNackLogs(t *testing.T) {
	var log testenv.JSONLog
	e := setup(t, sqliteStore, delivery.Config{MaxAttempts: 5, Logger: log.Logger()})
	e.create(t, delivery.Subscription{Name: "pull", Source: "devices"})
	e.appendEvents(t, "ev", "order.paid", 2)
	e.waitLag(t, "pull", 0)
	ctx := context.Background()
	l, err := e.d.Lease(ctx, "pull", 2, time.Minute, 0)
	if err != nil || len(l.Items) != 2 {
		t.Fatalf("lease: %d items, %v", len(l.Items), err)
	}
	if _, err := e.d.Nack(ctx, "pull", []int64{l.Items[0].ID}, l.Token, time.Minute, "timeout talking to the ledger"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.NackDead(ctx, "pull", []int64{l.Items[1].ID}, l.Token, "malformed"); err != nil {
		t.Fatal(err)
	}
	for msg, want := range map[string]map[string]any{
		"delivery: the runtime nacked the item; retry scheduled": {"level": "INFO", "inbox": "pull", "item": float64(l.Items[0].ID),
			"source": "devices", "event_id": "ev-0", "type": "order.paid", "offset": 1.0, "attempt": 1.0, "err": "timeout talking to the ledger"},
		"delivery: the runtime nacked the item; it is a dead letter": {"level": "ERROR", "item": float64(l.Items[1].ID),
			"event_id": "ev-1", "offset": 2.0, "err": "malformed"},
	} {
		ls := log.Lines(t, msg)
		if len(ls) != 1 {
			t.Fatalf("%d lines %q, want 1", len(ls), msg)
		}
		for k, v := range want {
			if ls[0][k] != v {
				t.Errorf("%q: %s is %v, want %v (%v)", msg, k, ls[0][k], v, ls[0])
			}
		}
	}
}
