package delivery_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/testenv"
)

// Two secrets as Standard Webhooks writes them (whsec_ and base64 of 24
// and 32 bytes).
const (
	secretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretB = "whsec_dGhpcyBpcyBhIHRlc3Qgc2VjcmV0IG9mIDMyIGJ5dGVzIQ=="
)

// verify checks a request as the Standard Webhooks specification says a
// receiver does, written here from the specification and not from
// postbox's code: the signed content is "id.timestamp.body", the key is
// the base64 after "whsec_", the signature HMAC-SHA256 in base64 after
// "v1,", one of the space-separated signatures must match, and the
// timestamp must be within five minutes of now.
func verify(secret string, h http.Header, body []byte, now time.Time) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing headers")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return err
	}
	if d := now.Sub(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return errors.New("timestamp too far from now")
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "." + string(body)))
	want := base64.StdEncoding.EncodeToString(m.Sum(nil))
	for _, s := range strings.Split(sigs, " ") {
		if v, ok := strings.CutPrefix(s, "v1,"); ok && hmac.Equal([]byte(v), []byte(want)) {
			return nil
		}
	}
	return errors.New("no signature matches")
}

// TestEndpointSigns: a target with a secret gets Standard Webhooks headers
// that verify with a verifier written from the specification and with the
// standard-webhooks library; webhook-id stays the same across retries and
// webhook-timestamp is each attempt's; a wrong secret does not verify.
func TestEndpointSigns(t *testing.T) { eachStore(t, testEndpointSigns) }

func testEndpointSigns(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	tg := newTarget(t, 500, 200)
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL,
		Secrets: []delivery.Secret{{Key: secretA}}, Endpoint: delivery.Endpoint{RetrySchedule: []time.Duration{time.Minute}}})
	e.appendEvents(t, "h", "t", 1)
	e.waitItem(t, "hook", delivery.StatePending, 1)
	first := e.clock.Now()
	e.clock.Advance(time.Minute)
	e.waitItem(t, "hook", delivery.StateCompleted, 2)
	lib, err := standardwebhooks.NewWebhook(secretA)
	if err != nil {
		t.Fatal(err)
	}
	for i, at := range []time.Time{first, first.Add(time.Minute)} {
		h, body := tg.headers[i], []byte(tg.bodies[i])
		if err := verify(secretA, h, body, at); err != nil {
			t.Fatalf("attempt %d: %v (%v)", i+1, err, h)
		}
		// The library checks the timestamp against the real clock; the
		// test's is fixed in 2026.
		if err := lib.VerifyIgnoringTimestamp(body, h); err != nil {
			t.Fatalf("attempt %d: the standard-webhooks library: %v", i+1, err)
		}
		if got := h.Get("webhook-timestamp"); got != strconv.FormatInt(at.Unix(), 10) {
			t.Fatalf("attempt %d: webhook-timestamp %s, want %d", i+1, got, at.Unix())
		}
		if err := verify(secretB, h, body, at); err == nil {
			t.Fatal("another secret verifies")
		}
		if err := verify(secretA, h, []byte(`{"i":1}`), at); err == nil {
			t.Fatal("another body verifies")
		}
	}
	if a, b := tg.headers[0].Get("webhook-id"), tg.headers[1].Get("webhook-id"); a == "" || a != b {
		t.Fatalf("webhook-id %q then %q: want one id across retries", a, b)
	}
	if got := strings.Count(tg.headers[0].Get("webhook-signature"), "v1,"); got != 1 {
		t.Fatalf("%d signatures, want 1", got)
	}
	s, _ := e.d.Subscription(context.Background(), "hook")
	if len(s.Secrets) != 1 || !strings.HasPrefix(s.Secrets[0].Key, "whsec_MfKQ9r") {
		t.Fatalf("secrets %+v", s.Secrets)
	}
}

// TestEndpointRotation: a new secret signs beside the one it replaces
// for the overlap: a receiver that verifies with either accepts; after
// the overlap only the new one signs.
func TestEndpointRotation(t *testing.T) { eachStore(t, testEndpointRotation) }

func testEndpointRotation(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	tg := newTarget(t, 200)
	ctx := context.Background()
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL, Secrets: []delivery.Secret{{Key: secretA}}})
	b := secretB
	s, err := e.d.Update(ctx, "hook", delivery.Change{Secret: &b, SecretOverlap: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Secrets) != 2 || s.Secrets[0].Key != secretB || !s.Secrets[0].ExpiresAt.IsZero() ||
		!s.Secrets[1].ExpiresAt.Equal(e.clock.Now().Add(time.Hour)) {
		t.Fatalf("secrets after the rotation: %+v", s.Secrets)
	}
	e.appendEvents(t, "during", "t", 1)
	testenv.Eventually(t, 10*time.Second, "the first delivery", func() bool { return tg.calls() == 1 })
	// Acked before the clock jumps: an ack still in flight would find
	// its lease an hour past its end, and the item would go out again.
	e.waitCompleted(t, "hook", 1, 10*time.Second)
	for _, secret := range []string{secretA, secretB} {
		if err := verify(secret, tg.headers[0], []byte(tg.bodies[0]), e.clock.Now()); err != nil {
			t.Fatalf("during the overlap, %s…: %v", secret[:10], err)
		}
	}
	if got := strings.Count(tg.headers[0].Get("webhook-signature"), "v1,"); got != 2 {
		t.Fatalf("%d signatures during the overlap, want 2", got)
	}

	e.clock.Advance(time.Hour + time.Second)
	e.appendEvents(t, "after", "t", 1)
	testenv.Eventually(t, 10*time.Second, "the second delivery", func() bool { return tg.calls() == 2 })
	e.waitCompleted(t, "hook", 2, 10*time.Second)
	if err := verify(secretB, tg.headers[1], []byte(tg.bodies[1]), e.clock.Now()); err != nil {
		t.Fatalf("after the overlap, the new secret: %v", err)
	}
	if err := verify(secretA, tg.headers[1], []byte(tg.bodies[1]), e.clock.Now()); err == nil {
		t.Fatal("after the overlap, the old secret still verifies")
	}
	s, _ = e.d.Subscription(ctx, "hook")
	if len(s.Secrets) != 1 {
		t.Fatalf("secrets after the overlap: %+v", s.Secrets)
	}
	// Removing the secret stops signing.
	none := ""
	if _, err := e.d.Update(ctx, "hook", delivery.Change{Secret: &none}); err != nil {
		t.Fatal(err)
	}
	e.appendEvents(t, "unsigned", "t", 1)
	testenv.Eventually(t, 10*time.Second, "the third delivery", func() bool { return tg.calls() == 3 })
	if got := tg.headers[2].Get("webhook-signature"); got != "" {
		t.Fatalf("signed without a secret: %q", got)
	}
}

// TestEndpointHeaders: an endpoint's headers arrive with every request,
// beside postbox's own.
func TestEndpointHeaders(t *testing.T) { eachStore(t, testEndpointHeaders) }

func testEndpointHeaders(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	tg := newTarget(t, 200)
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL,
		Endpoint: delivery.Endpoint{Headers: map[string]string{"X-Team": "billing", "authorization": "Bearer t0k"}}})
	e.appendEvents(t, "h", "order.paid", 1)
	e.waitItem(t, "hook", delivery.StateCompleted, 1)
	h := tg.headers[0]
	if h.Get("X-Team") != "billing" || h.Get("Authorization") != "Bearer t0k" || h.Get("X-Event-Type") != "order.paid" {
		t.Fatalf("headers %v", h)
	}
}

// TestEndpointTimeout: an endpoint's timeout cuts a target that hangs;
// the attempt is logged with status 0 and the error.
func TestEndpointTimeout(t *testing.T) { eachStore(t, testEndpointTimeout) }

func testEndpointTimeout(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{HandlerTimeout: time.Minute})
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release); hang.Close() })
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: hang.URL,
		Endpoint: delivery.Endpoint{Timeout: 200 * time.Millisecond}})
	start := time.Now()
	e.appendEvents(t, "h", "t", 1)
	it := e.waitItem(t, "hook", delivery.StatePending, 1)
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("the attempt took %v: the endpoint's timeout did not cut it", took)
	}
	if it.LastError == nil || !strings.Contains(*it.LastError, "deadline exceeded") {
		t.Fatalf("last error %v", it.LastError)
	}
	log, err := e.d.Attempts(context.Background(), "hook", it.ID)
	if err != nil || len(log) != 1 {
		t.Fatalf("attempts %+v %v", log, err)
	}
	if a := log[0]; a.Status != 0 || !strings.Contains(a.Error, "deadline exceeded") || a.Latency < 200*time.Millisecond || a.URL != hang.URL {
		t.Fatalf("attempt %+v", a)
	}
}

// TestEndpointSchedule: an endpoint's schedule sets each next attempt
// exactly (the last wait repeats past its end), and its max attempts,
// beyond the schedule's length and the server's, make the item a dead
// letter. Its longest wait bounds a Retry-After.
func TestEndpointSchedule(t *testing.T) { eachStore(t, testEndpointSchedule) }

func testEndpointSchedule(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{MaxAttempts: 2})
	tg := newTarget(t, 500, 503, 500, 500)
	tg.header.Set("Retry-After", "31536000")
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL,
		Endpoint: delivery.Endpoint{RetrySchedule: []time.Duration{7 * time.Second, 90 * time.Second}, MaxAttempts: 4}})
	e.appendEvents(t, "h", "t", 1)
	// The Retry-After of a year waits the schedule's longest: 90s.
	for attempt, wait := range []time.Duration{90 * time.Second, 90 * time.Second, 90 * time.Second} {
		it := e.waitItem(t, "hook", delivery.StatePending, attempt+1)
		if got := it.NextAttemptAt.Sub(e.clock.Now()); got != wait {
			t.Fatalf("after attempt %d the item waits %v, want %v", attempt+1, got, wait)
		}
		if attempt == 0 {
			tg.mu.Lock()
			tg.header.Del("Retry-After")
			tg.mu.Unlock()
		}
		e.clock.Advance(wait)
		_ = attempt
	}
	it := e.waitItem(t, "hook", delivery.StateFailed, 4)
	if it.FailedAt == nil {
		t.Fatalf("dead letter %+v", it)
	}
}

// TestEndpointScheduleWaits: without Retry-After the n-th failed attempt
// waits the schedule's n-th wait, the last repeating.
func TestEndpointScheduleWaits(t *testing.T) { eachStore(t, testEndpointScheduleWaits) }

func testEndpointScheduleWaits(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	tg := newTarget(t, 500)
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL,
		Endpoint: delivery.Endpoint{RetrySchedule: []time.Duration{5 * time.Second, time.Minute, 10 * time.Minute}, MaxAttempts: 5}})
	e.appendEvents(t, "h", "t", 1)
	for attempt, wait := range []time.Duration{5 * time.Second, time.Minute, 10 * time.Minute, 10 * time.Minute} {
		it := e.waitItem(t, "hook", delivery.StatePending, attempt+1)
		if got := it.NextAttemptAt.Sub(e.clock.Now()); got != wait {
			t.Fatalf("after attempt %d the item waits %v, want %v", attempt+1, got, wait)
		}
		e.clock.Advance(wait)
	}
	e.waitItem(t, "hook", delivery.StateFailed, 5)
	if tg.calls() != 5 {
		t.Fatalf("%d calls, want 5", tg.calls())
	}
}

// TestAttemptLog: each attempt of a target is logged with its time,
// status, latency and the start of the answer (at most 1 KiB), and
// retention deletes the log with its item.
func TestAttemptLog(t *testing.T) { eachStore(t, testAttemptLog) }

func testAttemptLog(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{Retention: -1})
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if calls == 1 {
			w.WriteHeader(http.StatusBadGateway)
			w.Write([]byte("upstream down " + strings.Repeat("x", 3000)))
			return
		}
		w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(srv.Close)
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: srv.URL,
		Endpoint: delivery.Endpoint{RetrySchedule: []time.Duration{time.Second}}})
	e.appendEvents(t, "h", "t", 1)
	first := e.clock.Now()
	it := e.waitItem(t, "hook", delivery.StatePending, 1)
	e.clock.Advance(time.Second)
	e.waitItem(t, "hook", delivery.StateCompleted, 2)
	ctx := context.Background()
	log, err := e.d.Attempts(ctx, "hook", it.ID)
	if err != nil || len(log) != 2 {
		t.Fatalf("attempts %+v %v", log, err)
	}
	a, b := log[0], log[1]
	if a.Number != 1 || a.Status != 502 || !a.At.Equal(first) || a.URL != srv.URL || a.Latency <= 0 ||
		!strings.Contains(a.Error, "answered 502") || !strings.HasPrefix(a.Excerpt, "upstream down xx") || len(a.Excerpt) != 1024 {
		t.Fatalf("first attempt %+v (excerpt %d bytes)", a, len(a.Excerpt))
	}
	if b.Number != 2 || b.Status != 200 || !b.At.Equal(first.Add(time.Second)) || b.Error != "" || b.Excerpt != `{"ok":true}` {
		t.Fatalf("second attempt %+v", b)
	}
	if _, err := e.d.Attempts(ctx, "other", it.ID); !errors.Is(err, delivery.ErrNotFound) {
		t.Fatalf("attempts of an item of another inbox: %v", err)
	}
	// Retention of the item takes its attempts.
	e.clock.Advance(time.Hour)
	if c, err := e.d.Cleanup(ctx, e.clock.Now()); err != nil || c.Items != 1 {
		t.Fatalf("cleanup %+v %v", c, err)
	}
	if n := e.count(t, `SELECT count(*) FROM delivery_attempts`); n != 0 {
		t.Fatalf("%d attempts left after retention", n)
	}
}

// TestEndpointValidation: bad settings are refused as ErrInvalid naming
// the field.
func TestEndpointValidation(t *testing.T) {
	e := setup(t, sqliteStore, delivery.Config{})
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		sub   delivery.Subscription
		field string
	}{
		{"secret without prefix", delivery.Subscription{Secrets: []delivery.Secret{{Key: "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}}, "secret"},
		{"secret not base64", delivery.Subscription{Secrets: []delivery.Secret{{Key: "whsec_not base64!"}}}, "secret"},
		{"secret too short", delivery.Subscription{Secrets: []delivery.Secret{{Key: "whsec_c2hvcnQ="}}}, "secret"},
		{"hop-by-hop header", delivery.Subscription{Endpoint: delivery.Endpoint{Headers: map[string]string{"Connection": "close"}}}, "headers"},
		{"webhook header", delivery.Subscription{Endpoint: delivery.Endpoint{Headers: map[string]string{"Webhook-Id": "x"}}}, "headers"},
		{"header line break", delivery.Subscription{Endpoint: delivery.Endpoint{Headers: map[string]string{"X-A": "a\r\nB: c"}}}, "headers"},
		{"negative timeout", delivery.Subscription{Endpoint: delivery.Endpoint{Timeout: -time.Second}}, "timeout"},
		{"zero wait", delivery.Subscription{Endpoint: delivery.Endpoint{RetrySchedule: []time.Duration{time.Second, 0}}}, "retry_schedule"},
		{"schedule and base", delivery.Subscription{Endpoint: delivery.Endpoint{RetrySchedule: []time.Duration{time.Second}, RetryBaseDelay: time.Second}}, "retry_schedule"},
		{"negative max attempts", delivery.Subscription{Endpoint: delivery.Endpoint{MaxAttempts: -1}}, "max_attempts"},
	} {
		s := c.sub
		s.Name, s.Source, s.Target = "v", "devices", "http://127.0.0.1:9/"
		_, _, err := e.d.Create(ctx, s)
		if !errors.Is(err, delivery.ErrInvalid) || !strings.HasPrefix(err.Error(), c.field) {
			t.Errorf("%s: %v, want ErrInvalid naming %s", c.name, err, c.field)
		}
	}
	if _, _, err := e.d.Create(ctx, delivery.Subscription{Name: "v", Source: "devices", Secrets: []delivery.Secret{{Key: secretA}}}); !errors.Is(err, delivery.ErrInvalid) {
		t.Errorf("a secret without a target: %v", err)
	}
	if _, err := delivery.ParseSchedule("5s,soon"); !errors.Is(err, delivery.ErrInvalid) {
		t.Errorf("ParseSchedule: %v", err)
	}
	if got, err := delivery.ParseSchedule("5s, 5m,30m,2h,5h,10h,10h"); err != nil || len(got) != 7 || got[1] != 5*time.Minute ||
		delivery.FormatSchedule(got) != "5s,5m,30m,2h,5h,10h,10h" {
		t.Errorf("ParseSchedule: %v %v (%s)", got, err, delivery.FormatSchedule(got))
	}
}

// TestEndpointMaxAttemptsOnExpiry: an item whose lease expired is failed
// after its endpoint's max attempts, not the server's.
//
// The expired lease is ended by the reaper or taken by a worker's next
// lease, as in a running server; not by Recover, which at startup ends
// every lease and here would end a worker's live attempt too.
func TestEndpointMaxAttemptsOnExpiry(t *testing.T) { eachStore(t, testEndpointMaxAttemptsOnExpiry) }

func testEndpointMaxAttemptsOnExpiry(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{MaxAttempts: 2, ReapInterval: 10 * time.Millisecond})
	tg := newTarget(t, 500)
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL,
		Endpoint: delivery.Endpoint{RetrySchedule: []time.Duration{time.Hour}, MaxAttempts: 8}})
	e.appendEvents(t, "h", "t", 1)
	it := e.waitItem(t, "hook", delivery.StatePending, 1)
	ctx := context.Background()
	for _, c := range []struct {
		attempts int
		want     string
	}{{6, delivery.StatePending}, {8, delivery.StateFailed}} {
		e.exec(t, `UPDATE inbox_items SET state = 'processing', attempts = ?, lease_token = 'gone', lease_expires_at = '2000-01-01T00:00:00.000000Z'
			WHERE item_id = ?`, c.attempts, it.ID)
		// On attempt 6 the reaper makes it pending, or a worker leases it
		// again at once: then it fails its 7th attempt and is pending too.
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("the item %s after an expired lease on attempt %d", c.want, c.attempts), func() bool {
			got, err := e.d.Item(ctx, "hook", it.ID)
			if err == nil && got.State == delivery.StateFailed && c.want != delivery.StateFailed {
				t.Fatalf("failed after an expired lease on attempt %d: %+v", c.attempts, got)
			}
			return err == nil && got.State == c.want
		})
	}
}
