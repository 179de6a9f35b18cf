package groupcommit

import (
	"context"
	"errors"
	"testing"
	"time"
)

var (
	errLocked = errors.New("disk I/O error (778)")
	errBroken = errors.New("constraint failed")
)

// TestFlushRetriesTransientErrors: a flush that fails for a transient
// reason runs again after a jittered, doubling wait, and its callers hear
// only of the outcome; any other failure, or one that lasts five attempts,
// reaches them.
func TestFlushRetriesTransientErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fails    []error // the errors of the first flushes; then they succeed
		attempts int
		want     error
	}{
		{"a hiccup", []error{errLocked, errLocked}, 3, nil},
		{"not transient", []error{errBroken}, 1, errBroken},
		{"transient, then not", []error{errLocked, errBroken}, 2, errBroken},
		{"past the budget", []error{errLocked, errLocked, errLocked, errLocked, errLocked, errLocked}, 5, errLocked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flushes := 0
			flush := func(_ context.Context, batch []int) error {
				flushes++
				if flushes <= len(tc.fails) {
					return tc.fails[flushes-1]
				}
				return nil
			}
			var observed []error
			var retries []int
			w := New(flush, Config{
				Transient: func(err error) bool { return errors.Is(err, errLocked) },
				Observe:   func(_ int, _ time.Duration, err error) { observed = append(observed, err) },
				ObserveRetry: func(items, attempt int, wait time.Duration, err error) {
					if items != 2 || !errors.Is(err, errLocked) {
						t.Errorf("retry of %d items after %v", items, err)
					}
					if bound := retryBase << (attempt - 2); wait < 0 || wait > bound {
						t.Errorf("attempt %d waits %v, want within [0, %v]", attempt, wait, bound)
					}
					retries = append(retries, attempt)
				},
			})
			var slept []time.Duration
			w.sleep = func(d time.Duration) { slept = append(slept, d) }
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Run(ctx) }()
			if err := w.Do(context.Background(), []int{1, 2}); !errors.Is(err, tc.want) && err != tc.want {
				t.Errorf("callers got %v, want %v", err, tc.want)
			}
			cancel()
			<-done
			if flushes != tc.attempts || len(retries) != tc.attempts-1 || len(slept) != tc.attempts-1 {
				t.Errorf("%d flushes, retries %v, %d waits; want %d flushes", flushes, retries, len(slept), tc.attempts)
			}
			if len(observed) != 1 || !errors.Is(observed[0], tc.want) && observed[0] != tc.want {
				t.Errorf("Observe saw %v, want the outcome %v alone", observed, tc.want)
			}
		})
	}
}

// TestRetryWait: the waits grow 100 ms, 200 ms, 400 ms, … up to 5 s, each
// drawn from zero to that bound.
func TestRetryWait(t *testing.T) {
	for attempt := 2; attempt <= 12; attempt++ {
		bound := min(retryBase<<(attempt-2), retryCap)
		var most time.Duration
		for range 200 {
			d := retryWait(attempt)
			if d < 0 || d > bound {
				t.Fatalf("attempt %d waits %v, want within [0, %v]", attempt, d, bound)
			}
			most = max(most, d)
		}
		if most < bound/2 {
			t.Errorf("attempt %d: the longest of 200 waits is %v, want near %v (full jitter)", attempt, most, bound)
		}
	}
}
