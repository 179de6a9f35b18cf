package poll

import (
	"time"

	"github.com/postbox-events/postbox/retry"
)

// backoff is the wait after consecutive failures: retry.Backoff with
// equal jitter (at least half the exponential wait, so that a failing API
// is not hammered; the rest random, so that pollers failing together do
// not come back together), counting the failures since the last success.
type backoff struct {
	b retry.Backoff
	n int
}

func newBackoff(min, max time.Duration) *backoff {
	return &backoff{b: retry.Backoff{Base: min, Max: max, Jitter: retry.EqualJitter}}
}

// next returns the wait after one more failure.
func (b *backoff) next() time.Duration {
	d := b.b.Delay(b.n)
	b.n++
	return d
}

// ceiling is the bound of the next wait.
func (b *backoff) ceiling() time.Duration { return b.b.Ceiling(b.n) }

// reset starts over after a success.
func (b *backoff) reset() { b.n = 0 }
