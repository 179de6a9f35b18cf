package ingress

import (
	"context"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
)

// budget is the ingress's memory bound (Config.MaxBufferedBytes): bytes
// are taken before a frame is read and given back as its envelopes reach
// the writer's queue. Waiters are served in order, so a connection that
// waits for a whole frame's worth is not starved by small takers.
type budget struct {
	sem     *semaphore.Weighted
	gauge   prometheus.Gauge
	waiting atomic.Int64 // takers waiting for room (for tests)
}

func newBudget(n int64, gauge prometheus.Gauge) *budget {
	return &budget{sem: semaphore.NewWeighted(n), gauge: gauge}
}

// take takes n bytes, waiting for room; it reports whether it had to
// wait, having called stalled first.
func (b *budget) take(ctx context.Context, n int64, stalled func()) (waited bool, err error) {
	if !b.sem.TryAcquire(n) {
		waited = true
		stalled()
		b.waiting.Add(1)
		err = b.sem.Acquire(ctx, n)
		b.waiting.Add(-1)
		if err != nil {
			return waited, err
		}
	}
	b.gauge.Add(float64(n))
	return waited, nil
}

// give gives n bytes back.
func (b *budget) give(n int64) {
	if n > 0 {
		b.sem.Release(n)
		b.gauge.Sub(float64(n))
	}
}
