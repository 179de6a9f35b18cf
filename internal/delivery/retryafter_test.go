package delivery_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/retry"
)

// TestRetryAfterBounded: a Retry-After longer than RetryMaxDelay, in
// seconds (a year, or more seconds than a Duration holds) or as an HTTP
// date a year ahead, and a Go handler's RetryAfter of a year make the
// next attempt wait RetryMaxDelay, logged at debug; a Retry-After below
// it is honoured as it is.
func TestRetryAfterBounded(t *testing.T) { eachStore(t, testRetryAfterBounded) }

func testRetryAfterBounded(t *testing.T, kind storeKind) {
	const maxDelay = time.Minute
	var logs testenv.Buffer
	e := setup(t, kind, delivery.Config{RetryMaxDelay: maxDelay,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	yearAhead := e.clock.Now().Add(365 * 24 * time.Hour).Format(http.TimeFormat)
	for name, retryAfter := range map[string]string{
		"year": "31536000", "overflow": "99999999999999999999", "date": yearAhead, "small": "45",
	} {
		tg := newTarget(t, http.StatusServiceUnavailable)
		tg.header.Set("Retry-After", retryAfter)
		e.create(t, delivery.Subscription{Name: name, Source: "devices", Target: tg.URL, Types: []string{name}})
	}
	e.d.Handle("go-year", func(ctx context.Context, it *delivery.Item) error {
		return retry.RetryAfter(365*24*time.Hour, errors.New("come back next year"))
	})
	e.create(t, delivery.Subscription{Name: "go-year", Source: "devices", Types: []string{"go-year"}})
	e.d.Handle("go-small", func(ctx context.Context, it *delivery.Item) error {
		return retry.RetryAfter(45*time.Second, errors.New("come back in 45s"))
	})
	e.create(t, delivery.Subscription{Name: "go-small", Source: "devices", Types: []string{"go-small"}})
	for _, typ := range []string{"year", "overflow", "date", "small", "go-year", "go-small"} {
		e.appendEvents(t, typ, typ, 1)
	}

	now := e.clock.Now()
	for inbox, want := range map[string]time.Duration{
		"year": maxDelay, "overflow": maxDelay, "date": maxDelay, "go-year": maxDelay,
		"small": 45 * time.Second, "go-small": 45 * time.Second,
	} {
		it := e.waitItem(t, inbox, delivery.StatePending, 1)
		if got := it.NextAttemptAt.Sub(now); got != want {
			t.Errorf("%s: the next attempt is %v later, want %v", inbox, got, want)
		}
	}
	cut := map[string]bool{}
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "level=DEBUG") && strings.Contains(line, "Retry-After beyond the retry max delay") {
			for f := range strings.FieldsSeq(line) {
				if inbox, ok := strings.CutPrefix(f, "inbox="); ok {
					cut[inbox] = true
				}
			}
		}
	}
	for inbox, want := range map[string]bool{"year": true, "overflow": true, "date": true, "go-year": true, "small": false, "go-small": false} {
		if cut[inbox] != want {
			t.Errorf("%s: logged a Retry-After cut: %v, want %v; logs:\n%s", inbox, cut[inbox], want, logs.String())
		}
	}
}
