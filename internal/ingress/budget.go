package ingress

import (
	"context"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// budget is the ingress's memory bound (Config.MaxBufferedBytes): bytes
// are taken as a frame's bytes arrive, before its buffer grows to hold
// them, and given back as its envelopes are committed (the writer's queue
// holds them until then, so they count here until they are let go of).
//
// Frames that each hold part of themselves could take the whole budget and
// wait for each other forever; so the last frame's worth (at most half the
// budget) is a reserve that one frame at a time may use, once the rest is
// taken: that frame can always be read to its end, decoded, queued and
// committed, which gives room back to the others. A slow sender cannot keep the
// reserve without first filling the rest with bytes it sent.
//
// Once the budget held a frame's worth (or more) and then stayed empty for
// releaseAfter, release runs (debug.FreeOSMemory): after a burst of large
// frames the heap is garbage the collector would not look at until the
// next allocations, and the process would keep its peak size for minutes.
type budget struct {
	gauge   prometheus.Gauge
	waiting atomic.Int64 // takers waiting for room (for tests)
	release func()       // gives the freed memory back to the system

	mu     sync.Mutex
	size   int64         // the bound
	main   int64         // what any frame may fill; the rest is the reserve
	used   int64         // taken
	holder any           // the frame that may use the reserve, or nil
	freed  chan struct{} // closed (and replaced) when room frees

	releaseMin   int64         // what the budget must have held for a release to be owed
	releaseAfter time.Duration // how long it must then stay empty
	owed         bool          // it held that much since the last release
	takes        uint64        // counts takes, so that a timer sees activity since it was set
	timer        *time.Timer   // a release waiting for the budget to stay empty, or nil
}

// releaseAfter is how long the budget stays empty before its memory is
// given back to the system (budget.releaseAfter, but in tests).
const releaseAfter = 2 * time.Second

func newBudget(n, frame int64, gauge prometheus.Gauge) *budget {
	return &budget{gauge: gauge, size: n, main: n - min(frame, n/2), freed: make(chan struct{}),
		release: debug.FreeOSMemory, releaseMin: frame, releaseAfter: releaseAfter}
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
			b.takes++
			b.owed = b.owed || b.used >= b.releaseMin
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
		if b.used == 0 && b.owed && b.timer == nil {
			b.timer = time.AfterFunc(b.releaseAfter, b.releaseIdle(b.takes))
		}
		b.mu.Unlock()
		b.gauge.Sub(float64(n))
	}
}

// releaseIdle returns the timer function of a release set when the budget
// emptied after takes takes: it releases when nothing was taken since;
// else it waits again if the budget is empty, and the next time the
// budget empties sets another if not.
func (b *budget) releaseIdle(takes uint64) func() {
	return func() {
		b.mu.Lock()
		b.timer = nil
		idle := b.used == 0 && b.takes == takes
		switch {
		case idle:
			b.owed = false
		case b.used == 0:
			b.timer = time.AfterFunc(b.releaseAfter, b.releaseIdle(b.takes))
		}
		b.mu.Unlock()
		if idle {
			b.release()
		}
	}
}

// signal wakes the waiters. b.mu is held.
func (b *budget) signal() {
	close(b.freed)
	b.freed = make(chan struct{})
}
