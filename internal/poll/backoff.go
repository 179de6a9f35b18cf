package poll

import (
	"net/http"
	"strconv"
	"strings"
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

// retryAfter reads a Retry-After header (seconds, or an HTTP date) as a
// wait from now, bounded by limit; ok is false when there is none or it
// does not parse.
func retryAfter(h string, now time.Time, limit time.Duration) (time.Duration, bool) {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0, false
	}
	var d time.Duration
	if n, err := strconv.ParseInt(h, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		d = time.Duration(min(n, int64(limit/time.Second)+1)) * time.Second
	} else if t, err := http.ParseTime(h); err == nil {
		d = max(t.Sub(now), 0)
	} else {
		return 0, false
	}
	return min(d, limit), true
}
