package retry

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ParseRetryAfter reads the value of an HTTP Retry-After header (RFC 9110
// §10.2.3: delay-seconds, or an HTTP date) as a wait from now of at most
// limit. A date in the past is a wait of 0; more seconds than limit,
// however many digits, are limit. ok is false when value is empty, a
// negative number, or neither seconds nor a date.
//
// Each caller passes its own bound: a poller the longest it lets an API
// hold it back; the delivery workers the longest Duration, since they
// bound the wait themselves and log when they cut it.
func ParseRetryAfter(value string, now time.Time, limit time.Duration) (time.Duration, bool) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, false
	}
	limit = max(limit, 0)
	n, err := strconv.ParseInt(value, 10, 64)
	switch {
	case err == nil, errors.Is(err, strconv.ErrRange): // out of range: ±MaxInt64
		if n < 0 {
			return 0, false
		}
		if n > int64(limit/time.Second) {
			return limit, true
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(value)
	if err != nil {
		return 0, false
	}
	return min(max(t.Sub(now), 0), limit), true
}
