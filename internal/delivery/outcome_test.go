package delivery_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/retry"
)

// TestTransientNotCounted: a handler whose errors are retry.Transient (its
// database is down) fails an item more often than MaxAttempts without
// dead-lettering it; the attempts are not counted, and each retry waits
// the backoff of the attempt that failed. Once the outage ends the item
// completes on its first counted attempt.
func TestTransientNotCounted(t *testing.T) { eachStore(t, testTransientNotCounted) }

func testTransientNotCounted(t *testing.T, kind storeKind) {
	const maxAttempts, outage = 2, 5
	e := setup(t, kind, delivery.Config{MaxAttempts: maxAttempts, RetryBaseDelay: time.Second, Jitter: retry.NoJitter})
	var calls atomic.Int32
	e.d.Handle("t", func(ctx context.Context, it *delivery.Item) error {
		if n := calls.Add(1); n <= outage {
			return fmt.Errorf("save: %w", retry.Transient(errors.New("database is down")))
		}
		return nil
	})
	e.create(t, delivery.Subscription{Name: "t", Source: "devices"})
	e.appendEvents(t, "x", "t", 1)
	for k := 1; k <= outage; k++ {
		var it delivery.Item
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("transient failure %d settled", k), func() bool {
			items, err := e.d.List(context.Background(), "t", "", 0, 10)
			if err != nil || len(items) != 1 || int(calls.Load()) != k {
				return false
			}
			it = items[0]
			return it.State == delivery.StatePending && it.LastError != nil && it.NextAttemptAt.After(e.clock.Now())
		})
		if it.Attempts != 0 {
			t.Fatalf("after transient failure %d the item has %d attempts, want 0 (not counted)", k, it.Attempts)
		}
		if *it.LastError != "save: database is down" {
			t.Fatalf("last error %q", *it.LastError)
		}
		checkWait(t, it, e.clock.Now(), time.Second)
		e.clock.Advance(time.Second)
	}
	e.waitItem(t, "t", delivery.StateCompleted, 1)
	if n := calls.Load(); n != outage+1 {
		t.Fatalf("%d calls, want %d", n, outage+1)
	}
}

// TestPermanentAndPlainErrors: retry.Permanent dead-letters an item on its
// first attempt, however many it has left; a plain error is counted.
func TestPermanentAndPlainErrors(t *testing.T) { eachStore(t, testPermanentAndPlainErrors) }

func testPermanentAndPlainErrors(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{MaxAttempts: 10, Jitter: retry.NoJitter})
	e.d.Handle("p", func(ctx context.Context, it *delivery.Item) error {
		return fmt.Errorf("decode: %w", retry.Permanent(errors.New("not an order")))
	})
	e.d.Handle("c", func(ctx context.Context, it *delivery.Item) error { return errors.New("refused") })
	e.create(t, delivery.Subscription{Name: "p", Source: "devices"})
	e.create(t, delivery.Subscription{Name: "c", Source: "devices"})
	e.appendEvents(t, "x", "t", 1)
	if it := e.waitItem(t, "p", delivery.StateFailed, 1); it.LastError == nil || *it.LastError != "decode: not an order" {
		t.Fatalf("dead letter: %+v", it)
	}
	checkWait(t, e.waitItem(t, "c", delivery.StatePending, 1), e.clock.Now(), delivery.DefaultRetryBaseDelay)
}

// TestJitterModes: by default (retry.FullJitter) the first retries of
// items that failed together spread over [0, RetryBaseDelay];
// retry.EqualJitter keeps them in its upper half.
func TestJitterModes(t *testing.T) {
	for _, tc := range []struct {
		jitter retry.Jitter
		low    time.Duration
	}{
		{retry.FullJitter, 0},
		{retry.EqualJitter, delivery.DefaultRetryBaseDelay / 2},
	} {
		t.Run(tc.jitter.String(), func(t *testing.T) {
			const n = 40
			e := setup(t, sqliteStore, delivery.Config{Jitter: tc.jitter})
			e.d.Handle("j", func(ctx context.Context, it *delivery.Item) error { return errors.New("no") })
			e.create(t, delivery.Subscription{Name: "j", Source: "devices"})
			e.appendEvents(t, "x", "t", n)
			var items []delivery.Item
			testenv.Eventually(t, 10*time.Second, "every item failed once", func() bool {
				var err error
				items, err = e.d.List(context.Background(), "j", delivery.StatePending, 0, 2*n)
				if err != nil || len(items) != n {
					return false
				}
				for _, it := range items {
					if it.Attempts != 1 {
						return false
					}
				}
				return true
			})
			now, high := e.clock.Now(), delivery.DefaultRetryBaseDelay
			mid := tc.low + (high-tc.low)/2
			var lower, upper int
			for _, it := range items {
				w := it.NextAttemptAt.Sub(now)
				if w < tc.low || w > high {
					t.Fatalf("item %d waits %v, want in [%v, %v]", it.ID, w, tc.low, high)
				}
				if w < mid {
					lower++
				} else {
					upper++
				}
			}
			if lower == 0 || upper == 0 {
				t.Fatalf("%d waits below %v and %d above: not spread", lower, mid, upper)
			}
		})
	}
}
