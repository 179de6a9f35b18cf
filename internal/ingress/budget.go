package ingress

import (
	"context"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	membudget "github.com/postbox-events/postbox/internal/budget"
)

// budget is the ingress's memory bound (Config.MaxBufferedBytes): bytes
// are taken as a frame's bytes arrive, before its buffer grows to hold
// them, and given back as its envelopes are committed (the writer's queue
// holds them until then, so they count here until they are let go of).
//
// It is a budget.Budget whose reserve is a frame's worth (at most half the
// budget), which one frame at a time may use once the rest is taken: that
// frame can always be read to its end, decoded, queued and committed,
// which gives room back to the others. A slow sender cannot keep the
// reserve without first filling the rest with bytes it sent.
//
// Once the budget held a frame's worth (or more) and then stayed empty for
// releaseAfter, release runs (debug.FreeOSMemory): after a burst of large
// frames the heap is garbage the collector would not look at until the
// next allocations, and the process would keep its peak size for minutes.
type budget struct {
	*membudget.Budget
	waiting atomic.Int64 // takers waiting for room (for tests)
	release func()       // gives the freed memory back to the system

	mu           sync.Mutex    // guards the release's state below
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
	return &budget{Budget: membudget.New(n, frame, func(d int64) { gauge.Add(float64(d)) }),
		release: debug.FreeOSMemory, releaseMin: frame, releaseAfter: releaseAfter}
}

// take takes n bytes for owner, a frame being read, waiting for room; it
// reports whether it had to wait, having called stalled first.
func (b *budget) take(ctx context.Context, n int64, owner any, stalled func()) (waited bool, err error) {
	if !b.TryTake(n, owner) {
		waited = true
		stalled()
		b.waiting.Add(1)
		err = b.Take(ctx, n, owner)
		b.waiting.Add(-1)
		if err != nil {
			return waited, err
		}
	}
	used := b.Used()
	b.mu.Lock()
	b.takes++
	b.owed = b.owed || used >= b.releaseMin
	b.mu.Unlock()
	return waited, nil
}

// done ends owner's frame: the reserve is free for another (what owner
// took stays taken until given back).
func (b *budget) done(owner any) { b.Done(owner) }

// give gives n bytes back.
func (b *budget) give(n int64) {
	if n <= 0 {
		return
	}
	left := b.Give(n)
	b.mu.Lock()
	if left == 0 && b.owed && b.timer == nil {
		b.timer = time.AfterFunc(b.releaseAfter, b.releaseIdle(b.takes))
	}
	b.mu.Unlock()
}

// releaseIdle returns the timer function of a release set when the budget
// emptied after takes takes: it releases when nothing was taken since;
// else it waits again if the budget is empty, and the next time the
// budget empties sets another if not.
func (b *budget) releaseIdle(takes uint64) func() {
	return func() {
		empty := b.Used() == 0
		b.mu.Lock()
		b.timer = nil
		idle := empty && b.takes == takes
		switch {
		case idle:
			b.owed = false
		case empty:
			b.timer = time.AfterFunc(b.releaseAfter, b.releaseIdle(b.takes))
		}
		b.mu.Unlock()
		if idle {
			b.release()
		}
	}
}
