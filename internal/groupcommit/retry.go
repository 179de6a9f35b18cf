package groupcommit

import (
	"context"
	"math/rand/v2"
	"time"
)

// Retries of a flush that failed for a transient reason (Config.Transient):
// the first attempt at once, then after a wait drawn at random between
// zero and 100 ms, 200 ms, 400 ms and 800 ms (full jitter; doubling, capped
// at retryCap), so that a batch is refused after about 1.5 s at most.
// Past that the store is not having a hiccup: the batch's callers get the
// error (the ingress NACKs `outage`, a webhook gets 503) and the server's
// health says the store cannot commit, as for any failed commit.
const (
	retryBase     = 100 * time.Millisecond
	retryCap      = 5 * time.Second
	retryAttempts = 5
)

// retryWait returns how long to wait before attempt (2, 3, …): a random
// duration up to retryBase doubled attempt-2 times, at most retryCap.
func retryWait(attempt int) time.Duration {
	d := retryBase << (attempt - 2)
	if d <= 0 || d > retryCap {
		d = retryCap
	}
	return rand.N(d + 1)
}

// flushRetrying runs flush, and runs it again while it fails for a
// transient reason, up to retryAttempts in all. A failed flush is as if
// never written, so running it again is safe.
func (w *Writer[T]) flushRetrying(ctx context.Context, items []T) error {
	err := w.flush(ctx, items)
	for attempt := 2; err != nil && w.cfg.Transient != nil && w.cfg.Transient(err) && attempt <= retryAttempts; attempt++ {
		wait := retryWait(attempt)
		if w.cfg.ObserveRetry != nil {
			w.cfg.ObserveRetry(len(items), attempt, wait, err)
		}
		w.sleep(wait)
		err = w.flush(ctx, items)
	}
	return err
}
