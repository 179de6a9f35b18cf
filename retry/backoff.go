package retry

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Jitter is how much of a Backoff's exponential wait is drawn at random,
// so that clients failing together do not retry together. The zero value
// is FullJitter.
type Jitter int

// Jitter modes. With c the ceiling of an attempt, min(Max, Base·2^attempt):
const (
	// FullJitter waits a uniformly random time in [0, c): the spread that
	// settles contention fastest, and the zero value.
	FullJitter Jitter = iota
	// EqualJitter waits c/2 plus a uniformly random time in [0, c/2): at
	// least half the exponential wait, spread over the rest.
	EqualJitter
	// NoJitter waits exactly c.
	NoJitter
)

// String returns the mode's name: "full", "equal" or "none".
func (j Jitter) String() string {
	switch j {
	case FullJitter:
		return "full"
	case EqualJitter:
		return "equal"
	case NoJitter:
		return "none"
	}
	return fmt.Sprintf("Jitter(%d)", int(j))
}

// ParseJitter returns the mode String names.
func ParseJitter(s string) (Jitter, error) {
	for _, j := range []Jitter{FullJitter, EqualJitter, NoJitter} {
		if s == j.String() {
			return j, nil
		}
	}
	return 0, fmt.Errorf("jitter %q: want full, equal or none", s)
}

// Backoff computes exponential waits: attempt n (from 0) has the ceiling
// min(Max, Base·2^n), and waits a part of it set by Jitter. The zero
// Jitter is FullJitter. A Backoff is a value; its methods are safe for
// concurrent use.
type Backoff struct {
	// Base is the ceiling of attempt 0; each attempt doubles it.
	Base time.Duration
	// Max bounds the ceiling. A Max below Base makes every ceiling Max.
	Max time.Duration
	// Jitter is the random part of each wait. Defaults to FullJitter.
	Jitter Jitter
}

// Delay returns the wait before attempt n (n >= 0; a negative n is 0).
func (b Backoff) Delay(n int) time.Duration {
	c := b.Ceiling(n)
	if c <= 0 {
		return 0
	}
	switch b.Jitter {
	case NoJitter:
		return c
	case EqualJitter:
		half := c / 2
		return half + randN(c-half)
	default:
		return randN(c)
	}
}

// Ceiling returns the upper bound of Delay(n): min(Max, Base·2^n), or
// 0 when Base or Max is not positive.
func (b Backoff) Ceiling(n int) time.Duration {
	if b.Base <= 0 || b.Max <= 0 {
		return 0
	}
	if n < 0 {
		n = 0
	}
	if n >= 63 || b.Base > b.Max>>n {
		return b.Max
	}
	return b.Base << n
}

// randN is a uniformly random duration in [0, d), 0 when d <= 0.
func randN(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(d)))
}
