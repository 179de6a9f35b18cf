package retry_test

import (
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/postbox-events/postbox/retry"
)

// TestParseRetryAfter: seconds and HTTP dates, bounded by the caller's
// limit, as a poller (a minute) and the delivery workers (the longest
// Duration, bounding the wait themselves) read them.
func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const forever = time.Duration(math.MaxInt64)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	for _, c := range []struct {
		name, value string
		limit       time.Duration
		want        time.Duration
		ok          bool
	}{
		{"empty", "", time.Minute, 0, false},
		{"spaces only", "  ", time.Minute, 0, false},
		{"seconds", "3", time.Minute, 3 * time.Second, true},
		{"seconds with spaces", " 45 ", forever, 45 * time.Second, true},
		{"zero", "0", time.Minute, 0, true},
		{"negative", "-1", time.Minute, 0, false},
		{"negative beyond int64", "-99999999999999999999", forever, 0, false},
		{"garbage", "soon", time.Minute, 0, false},
		{"fraction", "1.5", time.Minute, 0, false},
		{"over the limit", "99999999", time.Minute, time.Minute, true},
		{"at the limit", "60", time.Minute, time.Minute, true},
		{"a year, unbounded", "31536000", forever, 365 * 24 * time.Hour, true},
		{"more seconds than a Duration holds", "9223372037", forever, forever, true},
		{"beyond int64", "99999999999999999999", forever, forever, true},
		{"beyond int64, bounded", "99999999999999999999", time.Minute, time.Minute, true},
		{"date", date(20 * time.Second), time.Minute, 20 * time.Second, true},
		{"date over the limit", date(time.Hour), time.Minute, time.Minute, true},
		{"date a year ahead, unbounded", date(365 * 24 * time.Hour), forever, 365 * 24 * time.Hour, true},
		{"past date", date(-time.Hour), time.Minute, 0, true},
		{"zero limit", "3", 0, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := retry.ParseRetryAfter(c.value, now, c.limit)
			if got != c.want || ok != c.ok {
				t.Errorf("ParseRetryAfter(%q, now, %v) = %v, %v; want %v, %v", c.value, c.limit, got, ok, c.want, c.ok)
			}
		})
	}
}
