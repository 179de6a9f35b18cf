package delivery

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/stdwebhook"
)

// DefaultSecretOverlap is how long a signing secret replaced by another
// keeps signing beside it, so that receivers can move to the new one.
const DefaultSecretOverlap = 24 * time.Hour

// Endpoint is how the workers deliver to a subscription's target. A zero
// field takes the server's setting (Config) at each attempt. New settings
// are new fields, each with its own column.
type Endpoint struct {
	// Headers are sent with every request. Hop-by-hop headers, the
	// headers the workers set themselves and webhook-* are refused
	// (ErrInvalid).
	Headers map[string]string
	// Timeout bounds one attempt (Config.HandlerTimeout).
	Timeout time.Duration
	// RetrySchedule is the wait after each failed attempt: the n-th
	// failed attempt waits RetrySchedule[n-1], the last one repeating,
	// exactly (no jitter). It excludes RetryBaseDelay.
	RetrySchedule []time.Duration
	// RetryBaseDelay and RetryMaxDelay shape an exponential backoff as
	// Config's do. RetryMaxDelay (for a schedule: its longest wait) also
	// bounds what a Retry-After asks for.
	RetryBaseDelay, RetryMaxDelay time.Duration
	// MaxAttempts is how many attempts an item gets before it is a dead
	// letter (Config.MaxAttempts). It may exceed the schedule.
	MaxAttempts int
	// Rate bounds how many attempts start per period, over every
	// process sharing the store (see Rate and limits.go); zero: no bound.
	Rate Rate
	// Concurrency bounds the attempts in flight at once, over every
	// process sharing the store; zero: no bound but Config.Workers.
	Concurrency int
	// BreakerFailures is how many consecutive failed attempts open the
	// endpoint's circuit breaker (DefaultBreakerFailures); BreakerOff
	// turns the breaker off. See Breaker for what fails and what opens.
	BreakerFailures int
	// BreakerProbe is how long an open breaker waits between probes
	// (DefaultBreakerProbe).
	BreakerProbe time.Duration
	// DisableAfter is how long a breaker stays open, failing every probe,
	// before the endpoint is disabled until an operator enables it
	// (DefaultDisableAfter).
	DisableAfter time.Duration
	// Format is how each request carries the event: "" (FormatPostbox)
	// the payload with postbox's headers, FormatCloudEvents a CloudEvent
	// in binary mode besides them (ce-id, ce-source, ce-type,
	// ce-specversion, ce-time).
	Format string
}

// Delivery formats of an Endpoint.
const (
	FormatPostbox     = ""            // the payload, with postbox's X-Postbox-* and Idempotency-Key headers
	FormatCloudEvents = "cloudevents" // CloudEvents 1.0 over HTTP, binary mode
)

// ParseFormat returns the Format a name gives: "postbox" (or "") or
// "cloudevents"; anything else is ErrInvalid.
func ParseFormat(name string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "", "postbox":
		return FormatPostbox, nil
	case FormatCloudEvents:
		return FormatCloudEvents, nil
	}
	return "", errorf(ErrInvalid, "format %q: want postbox or cloudevents", name)
}

// Secret is a signing secret of an endpoint.
type Secret struct {
	// Key is "whsec_" and base64, as Standard Webhooks writes it. It is
	// never shown: the API shows a keyed fingerprint of it.
	Key       string
	CreatedAt time.Time
	// ExpiresAt is when a replaced secret stops signing; zero for the
	// current one.
	ExpiresAt time.Time
}

// validSecret refuses a key that is not "whsec_" and base64 of
// stdwebhook.MinKeyBytes to MaxKeyBytes bytes.
func validSecret(key string) error {
	if !strings.HasPrefix(key, "whsec_") {
		return errorf(ErrInvalid, "secret: want whsec_ and base64 (e.g. whsec_ and 32 random bytes in base64)")
	}
	if _, err := stdwebhook.CheckSecret(key); err != nil {
		return errorf(ErrInvalid, "secret: %s", strings.TrimPrefix(err.Error(), "webhook secret: "))
	}
	return nil
}

// refusedHeaders are headers an endpoint may not set, lower case: the
// hop-by-hop headers (RFC 9110 §7.6.1), what describes the request's body
// or asks of its sending (expect), and the ones the workers set
// themselves (the event's trace context among them).
var refusedHeaders = []string{
	"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer",
	"transfer-encoding", "upgrade", "host", "content-length", "content-type", "content-encoding", "expect",
	"idempotency-key", "user-agent", "x-event-type", "x-postbox-event", "x-postbox-subscription", "x-postbox-item",
	"x-postbox-attempt", "x-postbox-delivery-handle", "traceparent", "tracestate",
}

// Bounds of an endpoint's settings.
const (
	maxEndpointHeaders = 32
	maxHeaderName      = 256
	maxHeaderValue     = 4096
	maxSchedule        = 50
	maxEndpointWait    = 30 * 24 * time.Hour
	maxEndpointTimeout = 15 * time.Minute
	maxEndpointTries   = 1000
)

// validate checks e, naming the field that is wrong.
func (e *Endpoint) validate() error {
	if len(e.Headers) > maxEndpointHeaders {
		return errorf(ErrInvalid, "headers: %d, at most %d", len(e.Headers), maxEndpointHeaders)
	}
	for name, value := range e.Headers {
		if len(name) > maxHeaderName {
			return errorf(ErrInvalid, "headers: a name of %d bytes, at most %d", len(name), maxHeaderName)
		}
		if name == "" || !validHeaderName(name) {
			return errorf(ErrInvalid, "headers: %q is not a header name", name)
		}
		lower := strings.ToLower(name)
		if slices.Contains(refusedHeaders, lower) || strings.HasPrefix(lower, "webhook-") {
			return errorf(ErrInvalid, "headers: %s is not allowed (hop-by-hop, set by postbox, or webhook-*)", name)
		}
		if len(value) > maxHeaderValue || strings.ContainsAny(value, "\r\n\x00") {
			return errorf(ErrInvalid, "headers: the value of %s: at most %d bytes, no line breaks", name, maxHeaderValue)
		}
	}
	if e.Format != FormatPostbox && e.Format != FormatCloudEvents {
		return errorf(ErrInvalid, "format %q: want postbox or cloudevents", e.Format)
	}
	if e.Timeout < 0 || e.Timeout > maxEndpointTimeout {
		return errorf(ErrInvalid, "timeout %s: want a positive duration up to %s", e.Timeout, maxEndpointTimeout)
	}
	if len(e.RetrySchedule) > maxSchedule {
		return errorf(ErrInvalid, "retry_schedule: %d waits, at most %d", len(e.RetrySchedule), maxSchedule)
	}
	for _, w := range e.RetrySchedule {
		if w <= 0 || w > maxEndpointWait {
			return errorf(ErrInvalid, "retry_schedule: wait %s: want a positive duration up to %s", w, maxEndpointWait)
		}
	}
	if len(e.RetrySchedule) > 0 && (e.RetryBaseDelay != 0 || e.RetryMaxDelay != 0) {
		return errorf(ErrInvalid, "retry_schedule: give a schedule or retry_base_delay/retry_max_delay, not both")
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"retry_base_delay", e.RetryBaseDelay}, {"retry_max_delay", e.RetryMaxDelay}} {
		if f.d < 0 || f.d > maxEndpointWait {
			return errorf(ErrInvalid, "%s %s: want a positive duration up to %s", f.name, f.d, maxEndpointWait)
		}
	}
	if e.RetryBaseDelay > 0 && e.RetryMaxDelay > 0 && e.RetryBaseDelay > e.RetryMaxDelay {
		return errorf(ErrInvalid, "retry_base_delay %s is above retry_max_delay %s: every wait would be the maximum", e.RetryBaseDelay, e.RetryMaxDelay)
	}
	if e.MaxAttempts < 0 || e.MaxAttempts > maxEndpointTries {
		return errorf(ErrInvalid, "max_attempts %d: want 1 to %d", e.MaxAttempts, maxEndpointTries)
	}
	return e.validateFlow()
}

func validHeaderName(name string) bool {
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// ParseSchedule parses a retry schedule: durations separated by commas,
// such as "5s,5m,30m,2h,5h,10h,10h".
func ParseSchedule(s string) ([]time.Duration, error) {
	var out []time.Duration
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		d, err := time.ParseDuration(part)
		if err != nil || d <= 0 {
			return nil, errorf(ErrInvalid, "retry_schedule %q: %q is not a positive duration (want e.g. 5s,5m,30m)", s, part)
		}
		out = append(out, d)
	}
	return out, nil
}

// FormatSchedule writes a schedule as ParseSchedule reads it.
func FormatSchedule(ws []time.Duration) string {
	parts := make([]string, len(ws))
	for i, w := range ws {
		parts[i] = shortDuration(w)
	}
	return strings.Join(parts, ",")
}

// shortDuration writes d without the zero units time.Duration.String
// adds ("5m", not "5m0s").
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

func sameEndpoint(a, b Endpoint) bool {
	return fmt.Sprint(a.Headers) == fmt.Sprint(b.Headers) && a.Timeout == b.Timeout && slices.Equal(a.RetrySchedule, b.RetrySchedule) &&
		a.RetryBaseDelay == b.RetryBaseDelay && a.RetryMaxDelay == b.RetryMaxDelay && a.MaxAttempts == b.MaxAttempts &&
		a.Rate == b.Rate && a.Concurrency == b.Concurrency && a.BreakerFailures == b.BreakerFailures &&
		a.BreakerProbe == b.BreakerProbe && a.DisableAfter == b.DisableAfter && a.Format == b.Format
}

// currentSecret is the key of the secret of secrets that does not expire,
// "" when none.
func currentSecret(secrets []Secret) string {
	for _, s := range secrets {
		if s.ExpiresAt.IsZero() {
			return s.Key
		}
	}
	return ""
}

// rotate returns secrets with key as the current secret: the current one
// before it signs for overlap more, and secrets that expired by now are
// dropped. An empty key removes every secret.
func rotate(secrets []Secret, key string, overlap time.Duration, now time.Time) []Secret {
	if key == "" {
		return nil
	}
	if currentSecret(secrets) == key {
		return live(secrets, now)
	}
	out := []Secret{{Key: key, CreatedAt: now}}
	for _, s := range live(secrets, now) {
		if s.Key == key {
			continue
		}
		if s.ExpiresAt.IsZero() || s.ExpiresAt.After(now.Add(overlap)) {
			s.ExpiresAt = now.Add(overlap)
		}
		out = append(out, s)
	}
	return out
}

// live returns the secrets that have not expired by now.
func live(secrets []Secret, now time.Time) []Secret {
	var out []Secret
	for _, s := range secrets {
		if s.ExpiresAt.IsZero() || s.ExpiresAt.After(now) {
			out = append(out, s)
		}
	}
	return out
}

// secretJSON is a secret as the store keeps it.
type secretJSON struct {
	Secret    string  `json:"secret"`
	CreatedAt string  `json:"created_at"`
	ExpiresAt *string `json:"expires_at"`
}

func secretsColumn(secrets []Secret) any {
	if len(secrets) == 0 {
		return nil
	}
	out := make([]secretJSON, len(secrets))
	for i, s := range secrets {
		out[i] = secretJSON{Secret: s.Key, CreatedAt: s.CreatedAt.UTC().Format(sqlitedb.Time)}
		if !s.ExpiresAt.IsZero() {
			t := s.ExpiresAt.UTC().Format(sqlitedb.Time)
			out[i].ExpiresAt = &t
		}
	}
	b, _ := json.Marshal(out)
	return string(b)
}

func scanSecrets(col sql.NullString) ([]Secret, error) {
	if !col.Valid {
		return nil, nil
	}
	var in []secretJSON
	if err := json.Unmarshal([]byte(col.String), &in); err != nil {
		return nil, err
	}
	out := make([]Secret, len(in))
	for i, s := range in {
		out[i].Key = s.Secret
		out[i].CreatedAt, _ = sqlitedb.ParseTime(s.CreatedAt)
		if s.ExpiresAt != nil {
			out[i].ExpiresAt, _ = sqlitedb.ParseTime(*s.ExpiresAt)
		}
	}
	return out, nil
}

// endpointColumns are the columns of Endpoint and the secrets, in the
// order of endpointValues.
const endpointColumns = `signing_secrets_json, endpoint_headers_json, endpoint_timeout_ms, retry_schedule, retry_base_delay_ms,
	retry_max_delay_ms, max_attempts, endpoint_rate, endpoint_concurrency, breaker_failures, breaker_probe_ms, disable_after_ms,
	endpoint_format`

// endpointMarks are the parameters of endpointColumns in an INSERT, and
// endpointSet their assignments in an UPDATE, in the same order.
const (
	endpointMarks = `?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?`
	endpointSet   = `signing_secrets_json = ?, endpoint_headers_json = ?, endpoint_timeout_ms = ?, retry_schedule = ?,
	retry_base_delay_ms = ?, retry_max_delay_ms = ?, max_attempts = ?, endpoint_rate = ?, endpoint_concurrency = ?,
	breaker_failures = ?, breaker_probe_ms = ?, disable_after_ms = ?, endpoint_format = ?`
)

func endpointValues(e Endpoint, secrets []Secret) []any {
	var headers, schedule any
	if len(e.Headers) > 0 {
		b, _ := json.Marshal(e.Headers)
		headers = string(b)
	}
	if len(e.RetrySchedule) > 0 {
		schedule = FormatSchedule(e.RetrySchedule)
	}
	ms := func(d time.Duration) any {
		if d == 0 {
			return nil
		}
		return d.Milliseconds()
	}
	count := func(n int) any {
		if n == 0 {
			return nil
		}
		return n
	}
	var rate any
	if !e.Rate.IsZero() {
		rate = e.Rate.String()
	}
	return []any{secretsColumn(secrets), headers, ms(e.Timeout), schedule, ms(e.RetryBaseDelay), ms(e.RetryMaxDelay),
		count(e.MaxAttempts), rate, count(e.Concurrency), count(e.BreakerFailures), ms(e.BreakerProbe), ms(e.DisableAfter),
		nullString(e.Format)}
}

// endpointScan scans endpointColumns.
type endpointScan struct {
	secrets, headers, schedule, rate, form sql.NullString
	timeout, base, most, attempts          sql.NullInt64
	concurrency, failures, probe, disabled sql.NullInt64
}

func (e *endpointScan) dest() []any {
	return []any{&e.secrets, &e.headers, &e.timeout, &e.schedule, &e.base, &e.most, &e.attempts,
		&e.rate, &e.concurrency, &e.failures, &e.probe, &e.disabled, &e.form}
}

func (e *endpointScan) into(s *Subscription) error {
	var err error
	if s.Secrets, err = scanSecrets(e.secrets); err != nil {
		return fmt.Errorf("signing secrets: %w", err)
	}
	ep := &s.Endpoint
	if e.headers.Valid {
		if err := json.Unmarshal([]byte(e.headers.String), &ep.Headers); err != nil {
			return fmt.Errorf("endpoint headers: %w", err)
		}
	}
	if e.schedule.Valid {
		if ep.RetrySchedule, err = ParseSchedule(e.schedule.String); err != nil {
			return err
		}
	}
	ep.Timeout = time.Duration(e.timeout.Int64) * time.Millisecond
	ep.RetryBaseDelay = time.Duration(e.base.Int64) * time.Millisecond
	ep.RetryMaxDelay = time.Duration(e.most.Int64) * time.Millisecond
	ep.MaxAttempts = int(e.attempts.Int64)
	if e.rate.Valid {
		if ep.Rate, err = ParseRate(e.rate.String); err != nil {
			return err
		}
	}
	ep.Concurrency, ep.BreakerFailures = int(e.concurrency.Int64), int(e.failures.Int64)
	ep.BreakerProbe = time.Duration(e.probe.Int64) * time.Millisecond
	ep.DisableAfter = time.Duration(e.disabled.Int64) * time.Millisecond
	ep.Format = e.form.String
	return nil
}

// endpoint is what the workers of an inbox use at an attempt: its
// target's settings with the server's defaults filled in.
type endpoint struct {
	url         string
	headers     http.Header
	keys        [][]byte // signing keys, current first
	timeout     time.Duration
	schedule    []time.Duration
	base, most  time.Duration
	maxAttempts int
	expires     time.Time // when a key expires: the endpoint is read again
	loaded      time.Time

	rate        Rate
	concurrency int
	breaker     int           // consecutive failures that open the breaker; 0: off
	probe       time.Duration // between probes of an open breaker
	disable     time.Duration // open this long: disabled
	format      string        // Endpoint.Format
}

// endpoints caches the endpoint of each inbox with a target.
type endpoints struct {
	mu    sync.Mutex
	by    map[string]*endpoint
	gen   uint64           // counts forgets, so that a read that began before one is not cached
	flows map[string]*flow // the limits and breaker of each inbox's endpoint, in this process
}

// endpointTTL is how long the workers use an endpoint read from a shared
// store before reading it again: another process may have changed it.
const endpointTTL = time.Second

// forgetEndpoint drops the cached endpoint of inbox after it changed here.
func (d *Delivery) forgetEndpoint(inbox string) {
	d.endpoints.mu.Lock()
	delete(d.endpoints.by, inbox)
	d.endpoints.gen++
	d.endpoints.mu.Unlock()
}

// endpoint returns the endpoint of inbox's target url, cached.
func (d *Delivery) endpoint(ctx context.Context, inbox, url string) (*endpoint, error) {
	now := d.now()
	d.endpoints.mu.Lock()
	ep, gen := d.endpoints.by[inbox], d.endpoints.gen
	d.endpoints.mu.Unlock()
	if ep != nil && ep.url == url && (ep.expires.IsZero() || now.Before(ep.expires)) &&
		(d.shared == nil || time.Since(ep.loaded) < endpointTTL) {
		return ep, nil
	}
	rows, err := d.db.QueryContext(ctx, `SELECT `+subscriptionColumns+` FROM subscriptions WHERE inbox_id = ? AND target_url = ?
		ORDER BY subscription_id LIMIT 1`, inbox, url)
	if err != nil {
		return nil, fmt.Errorf("endpoint of %s: %w", inbox, err)
	}
	subs, err := scanSubscriptions(rows)
	if err != nil {
		return nil, fmt.Errorf("endpoint of %s: %w", inbox, err)
	}
	var s Subscription
	if len(subs) > 0 {
		s = subs[0]
	}
	ep = d.compile(url, s.Endpoint, s.Secrets, now)
	if err := d.loadBreaker(ctx, inbox); err != nil {
		return nil, fmt.Errorf("endpoint of %s: %w", inbox, err)
	}
	d.endpoints.mu.Lock()
	if d.endpoints.by == nil {
		d.endpoints.by = map[string]*endpoint{}
	}
	if d.endpoints.gen == gen { // else it changed meanwhile: read it again next time
		d.endpoints.by[inbox] = ep
	}
	d.endpoints.mu.Unlock()
	return ep, nil
}

// defaultEndpoint is the endpoint of a target with no settings of its
// own: the server's.
func (d *Delivery) defaultEndpoint(url string) *endpoint {
	return d.compile(url, Endpoint{}, nil, d.now())
}

// compile fills e's zero settings with Config's.
func (d *Delivery) compile(url string, e Endpoint, secrets []Secret, now time.Time) *endpoint {
	ep := &endpoint{url: url, timeout: e.Timeout, schedule: e.RetrySchedule, base: e.RetryBaseDelay, most: e.RetryMaxDelay,
		maxAttempts: e.MaxAttempts, loaded: time.Now()}
	if len(e.Headers) > 0 {
		ep.headers = http.Header{}
		for k, v := range e.Headers {
			ep.headers.Set(k, v)
		}
	}
	for _, s := range live(secrets, now) {
		if key, err := stdwebhook.ParseSecret(s.Key); err == nil {
			ep.keys = append(ep.keys, key)
		}
		if !s.ExpiresAt.IsZero() && (ep.expires.IsZero() || s.ExpiresAt.Before(ep.expires)) {
			ep.expires = s.ExpiresAt
		}
	}
	if ep.timeout == 0 {
		ep.timeout = d.cfg.HandlerTimeout
	}
	if len(ep.schedule) > 0 {
		ep.most = slices.Max(ep.schedule)
	} else {
		setDefault(&ep.base, d.cfg.RetryBaseDelay)
		setDefault(&ep.most, d.cfg.RetryMaxDelay)
	}
	setDefault(&ep.maxAttempts, d.cfg.MaxAttempts)
	ep.rate, ep.concurrency = e.Rate, e.Concurrency
	switch {
	case e.BreakerFailures == BreakerOff:
	case e.BreakerFailures == 0:
		ep.breaker = DefaultBreakerFailures
	default:
		ep.breaker = e.BreakerFailures
	}
	ep.probe, ep.disable, ep.format = e.BreakerProbe, e.DisableAfter, e.Format
	setDefault(&ep.probe, DefaultBreakerProbe)
	setDefault(&ep.disable, DefaultDisableAfter)
	return ep
}

// delay returns the wait before the next attempt of an item that has had
// attempts attempts, at least atLeast (a Retry-After, already bounded by
// ep.most).
func (d *Delivery) delay(ep *endpoint, atLeast time.Duration) func(attempts int) time.Duration {
	if len(ep.schedule) == 0 {
		return d.backoff(ep.base, ep.most, atLeast)
	}
	return func(attempts int) time.Duration {
		i := min(max(attempts-1, 0), len(ep.schedule)-1)
		return max(ep.schedule[i], atLeast)
	}
}
