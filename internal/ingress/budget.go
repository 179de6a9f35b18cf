package ingress

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// budget is the ingress's memory bound (Config.MaxBufferedBytes): bytes
// are taken as a frame's bytes arrive, before its buffer grows to hold
// them, and given back as its envelopes reach the writer's queue.
//
// Frames that each hold part of themselves could take the whole budget and
// wait for each other forever; so the last frame's worth (at most half the
// budget) is a reserve that one frame at a time may use, once the rest is
// taken: that frame can always be read to its end, decoded and queued,
// which gives room back to the others. A slow sender cannot keep the
// reserve without first filling the rest with bytes it sent.
type budget struct {
	gauge   prometheus.Gauge
	waiting atomic.Int64 // takers waiting for room (for tests)

	mu     sync.Mutex
	size   int64         // the bound
	main   int64         // what any frame may fill; the rest is the reserve
	used   int64         // taken
	holder any           // the frame that may use the reserve, or nil
	freed  chan struct{} // closed (and replaced) when room frees
}

func newBudget(n, frame int64, gauge prometheus.Gauge) *budget {
	return &budget{gauge: gauge, size: n, main: n - min(frame, n/2), freed: make(chan struct{})}
}

// take takes n bytes for owner, a frame being read, waiting for room; it
// reports whether it had to wait, having called stalled first.
func (b *budget) take(ctx context.Context, n int64, owner any, stalled func()) (waited bool, err error) {
	for {
		b.mu.Lock()
		ok := b.used+n <= b.main
		if !ok && b.used+n <= b.size && (b.holder == nil || b.holder == owner) {
			b.holder, ok = owner, true
		}
		if ok {
			b.used += n
		}
		freed := b.freed
		b.mu.Unlock()
		if ok {
			b.gauge.Add(float64(n))
			return waited, nil
		}
		if !waited {
			waited = true
			stalled()
		}
		b.waiting.Add(1)
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-freed:
		}
		b.waiting.Add(-1)
		if err != nil {
			return waited, err
		}
	}
}

// done ends owner's frame: the reserve is free for another (what owner
// took stays taken until given back).
func (b *budget) done(owner any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.holder == owner {
		b.holder = nil
		b.signal()
	}
}

// give gives n bytes back.
func (b *budget) give(n int64) {
	if n > 0 {
		b.mu.Lock()
		b.used -= n
		b.signal()
		b.mu.Unlock()
		b.gauge.Sub(float64(n))
	}
}

// signal wakes the waiters. b.mu is held.
func (b *budget) signal() {
	close(b.freed)
	b.freed = make(chan struct{})
}
