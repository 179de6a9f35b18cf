package outbox

import (
	"math/rand/v2"
	"time"
)

// Backoff computes exponential delays with full jitter: attempt n waits a
// uniformly random time in [0, min(Max, Base·2^n)).
type Backoff struct {
	Base time.Duration
	Max  time.Duration
}

// Delay returns the wait before attempt n (n >= 0).
func (b Backoff) Delay(n int) time.Duration {
	ceil := b.Ceiling(n)
	if ceil <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(ceil)))
}

// Ceiling returns the upper bound of Delay(n): min(Max, Base·2^n).
func (b Backoff) Ceiling(n int) time.Duration {
	d := b.Base
	for i := 0; i < n && d < b.Max; i++ {
		d *= 2
	}
	return min(d, b.Max)
}
