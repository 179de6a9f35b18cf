// Package budget is a bound on the memory that readers sharing it hold:
// bytes are taken before a buffer grows to hold them and given back when
// what they hold is done with. The server's poll and feed sources share
// one (serve --source-buffer-bytes).
//
// Readers that each hold part of what they read could take the whole
// budget and wait for each other forever, so the last Reserve bytes are
// kept for one reader at a time, once the rest is taken: that reader can
// always finish what it reads (at most Reserve bytes), which gives room
// back to the others as it is stored. A reader that holds bytes must not
// wait for more without first letting go of what it can (TryTake, then
// store what it holds, then Take). The ingress (internal/ingress) holds
// its frames in one too (serve --ws-buffer-bytes).
package budget

import (
	"context"
	"sync"
)

// Budget is a byte budget. A nil *Budget bounds nothing.
type Budget struct {
	size, reserve int64
	onChange      func(delta int64) // nil: none

	mu     sync.Mutex
	used   int64
	holder any           // the reader that may use the reserve, or nil
	freed  chan struct{} // closed (and replaced) when room frees
}

// New returns a budget of size bytes whose last reserve bytes (at most
// half of size) go to one reader at a time. onChange, when not nil, is
// called with each change of the bytes taken (a gauge's Add).
func New(size, reserve int64, onChange func(delta int64)) *Budget {
	return &Budget{size: size, reserve: min(reserve, size/2), onChange: onChange, freed: make(chan struct{})}
}

// Size returns the bound; 0 for a nil budget.
func (b *Budget) Size() int64 {
	if b == nil {
		return 0
	}
	return b.size
}

// Reserve returns the most one reader may hold and still finish: what
// one answer or line may be at most. 0 for a nil budget.
func (b *Budget) Reserve() int64 {
	if b == nil {
		return 0
	}
	return b.reserve
}

// Used returns the bytes taken.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// TryTake takes n bytes for owner if there is room now.
func (b *Budget) TryTake(n int64, owner any) bool {
	if b == nil || n <= 0 {
		return true
	}
	b.mu.Lock()
	ok := b.fits(n, owner)
	b.mu.Unlock()
	if ok && b.onChange != nil {
		b.onChange(n)
	}
	return ok
}

// fits takes n for owner when there is room. b.mu is held.
func (b *Budget) fits(n int64, owner any) bool {
	ok := b.used+n <= b.size-b.reserve
	if !ok && b.used+n <= b.size && (b.holder == nil || b.holder == owner) {
		b.holder, ok = owner, true
	}
	if ok {
		b.used += n
	}
	return ok
}

// Take takes n bytes for owner, waiting for room until ctx ends.
func (b *Budget) Take(ctx context.Context, n int64, owner any) error {
	if b == nil || n <= 0 {
		return nil
	}
	for {
		b.mu.Lock()
		ok := b.fits(n, owner)
		freed := b.freed
		b.mu.Unlock()
		if ok {
			if b.onChange != nil {
				b.onChange(n)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-freed:
		}
	}
}

// Done ends owner's read: the reserve is free for another reader (what
// owner took stays taken until given back).
func (b *Budget) Done(owner any) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.holder == owner {
		b.holder = nil
		b.signal()
	}
}

// Give gives n bytes back and returns the bytes still taken.
func (b *Budget) Give(n int64) (left int64) {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	if n > 0 {
		b.used -= n
		b.signal()
	}
	left = b.used
	b.mu.Unlock()
	if n > 0 && b.onChange != nil {
		b.onChange(-n)
	}
	return left
}

// signal wakes the waiters. b.mu is held.
func (b *Budget) signal() {
	close(b.freed)
	b.freed = make(chan struct{})
}
