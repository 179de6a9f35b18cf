package delivery

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// Flow control of an endpoint: a rate and a concurrency limit, and a
// circuit breaker, so that one slow or failing endpoint cannot take every
// worker.
//
// The limits hold over every process sharing a store (see limits.go for
// how): the one process of a SQLite store keeps them in memory;
// processes sharing a PostgreSQL store take the rate from one token bucket in the store, a batch of
// tokens per statement, and hold the concurrency as numbered slots in
// the store that end with the lease of the process holding them. The
// breaker's state is stored, written at its transitions only, and
// followed by every process within a second (when it reads the endpoint
// again).
//
// The breaker counts consecutive failed attempts of the endpoint, in each
// process: a transport error, a timeout, or an answer of 5xx, 408 or 429.
// Another 4xx is the item's fault, not the endpoint's: it neither counts
// nor resets the count. A success resets it. After BreakerFailures of
// them the breaker opens: the workers lease no items of the inbox but one
// probe per BreakerProbe (over every process). A probe that succeeds
// closes the breaker; one that fails keeps it open, and once it has been
// open DisableAfter the endpoint is disabled: nothing is delivered until
// an operator enables it (Enable). Items wait pending meanwhile: none is
// leased, so none counts an attempt, and no wait burns an item's
// attempts.

// Defaults of an endpoint's breaker, and the BreakerFailures that turns
// it off.
const (
	DefaultBreakerFailures = 10
	DefaultBreakerProbe    = 30 * time.Second
	DefaultDisableAfter    = 24 * time.Hour
	BreakerOff             = -1
)

// States of a breaker.
const (
	BreakerClosed   = "closed"
	BreakerOpen     = "open"
	BreakerDisabled = "disabled"
)

// Bounds of the flow settings.
const (
	maxConcurrency     = 10000
	maxBreakerFailures = 10000
	maxRatePeriod      = 24 * time.Hour
	maxRateCount       = 1_000_000
)

// Rate is a number of attempts per period, such as 50/s.
type Rate struct {
	N   int
	Per time.Duration
}

// IsZero reports whether r sets no bound.
func (r Rate) IsZero() bool { return r.N == 0 }

// String writes r as ParseRate reads it: "50/s", "600/m", "5/h", or with
// another period "10/500ms".
func (r Rate) String() string {
	unit := shortDuration(r.Per)
	switch r.Per {
	case time.Second:
		unit = "s"
	case time.Minute:
		unit = "m"
	case time.Hour:
		unit = "h"
	}
	return strconv.Itoa(r.N) + "/" + unit
}

// ParseRate parses a rate: a count, a slash and a period, the period s,
// m, h or a duration ("50/s", "600/m", "10/500ms").
func ParseRate(s string) (Rate, error) {
	bad := errorf(ErrInvalid, "rate %q: want attempts per period, such as 50/s, 600/m or 10/500ms", s)
	count, period, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Rate{}, bad
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		return Rate{}, bad
	}
	r := Rate{N: n}
	switch period {
	case "s":
		r.Per = time.Second
	case "m":
		r.Per = time.Minute
	case "h":
		r.Per = time.Hour
	default:
		if r.Per, err = time.ParseDuration(period); err != nil || r.Per <= 0 {
			return Rate{}, bad
		}
	}
	return r, r.validate()
}

func (r Rate) validate() error {
	if r.IsZero() && r.Per == 0 {
		return nil
	}
	if r.N < 1 || r.N > maxRateCount || r.Per < time.Millisecond || r.Per > maxRatePeriod {
		return errorf(ErrInvalid, "rate %s: want 1 to %d attempts per period of 1ms to %s", r, maxRateCount, shortDuration(maxRatePeriod))
	}
	return nil
}

// perSecond is r in attempts per second.
func (r Rate) perSecond() float64 { return float64(r.N) / r.Per.Seconds() }

// burst is how many attempts may start at once after a quiet while: one
// second's worth, at least 1, at most N.
func (r Rate) burst() float64 { return max(1, min(float64(r.N), math.Ceil(r.perSecond()))) }

// validateFlow checks the flow settings of e, naming the field that is
// wrong.
func (e *Endpoint) validateFlow() error {
	if err := e.Rate.validate(); err != nil {
		return err
	}
	if e.Concurrency < 0 || e.Concurrency > maxConcurrency {
		return errorf(ErrInvalid, "concurrency %d: want 1 to %d", e.Concurrency, maxConcurrency)
	}
	if e.BreakerFailures < BreakerOff || e.BreakerFailures > maxBreakerFailures {
		return errorf(ErrInvalid, "breaker_failures %d: want 1 to %d, or %d for no breaker", e.BreakerFailures, maxBreakerFailures, BreakerOff)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"breaker_probe", e.BreakerProbe}, {"disable_after", e.DisableAfter}} {
		if f.d < 0 || f.d > maxEndpointWait {
			return errorf(ErrInvalid, "%s %s: want a positive duration up to %s", f.name, f.d, maxEndpointWait)
		}
	}
	return nil
}

// flow is the flow control of one inbox's endpoint in this process.
type flow struct {
	mu       sync.Mutex
	inflight int           // items leased and not yet attempted
	freed    chan struct{} // signalled when an attempt ends
	tokens   float64       // of the rate
	refilled time.Time     // when tokens were last refilled (monotonic)

	state     string
	since     time.Time // when it opened
	probeAt   time.Time // when an open breaker may probe
	failures  int       // consecutive failed attempts seen here
	lastError string
	probing   bool   // a probe is in flight here
	gen       uint64 // counts transitions here, so that a read of the store that began before one is not applied

	// On a shared store (see limits.go):
	trips     sync.Mutex // one trip to the store for the slots at a time
	slots     []int      // the endpoint's concurrency slots this process holds
	slotsTry  time.Time  // when taking slots may be tried again, after a try that found too few
	idleSince time.Time  // since when leases found nothing to take; zero: the last took items
	tokensAt  time.Time  // when the rate's next batch can be in the store's bucket
}

// flow returns the flow control of inbox, made closed on first use.
func (d *Delivery) flow(inbox string) *flow {
	d.endpoints.mu.Lock()
	defer d.endpoints.mu.Unlock()
	fl := d.endpoints.flows[inbox]
	if fl == nil {
		if d.endpoints.flows == nil {
			d.endpoints.flows = map[string]*flow{}
		}
		fl = &flow{freed: make(chan struct{}, 1), state: BreakerClosed}
		d.endpoints.flows[inbox] = fl
		d.cfg.Metrics.breakerState(inbox, BreakerClosed)
	}
	return fl
}

// release ends n attempts in flight.
func (fl *flow) release(n int) {
	if fl == nil || n == 0 {
		return
	}
	fl.mu.Lock()
	fl.inflight -= n
	fl.mu.Unlock()
	fl.signal()
}

func (fl *flow) signal() {
	select {
	case fl.freed <- struct{}{}:
	default:
	}
}

// admit returns how many items of ep's inbox the dispatcher may lease now
// (-1: as many as the workers take), whether the one it may lease is a
// probe of an open breaker, and, when none, how long to wait at most
// before asking again (an attempt's end signals fl.freed sooner). On a
// shared store the concurrency is counted in slots of the store (see
// shared), and the rate is taken later, by takeTokens, once the workers
// have room.
func (d *Delivery) admit(ctx context.Context, inbox string, ep *endpoint, fl *flow) (n int, probe bool, wait time.Duration) {
	now := d.now()
	fl.mu.Lock()
	if fl.state != BreakerClosed && ep.breaker == 0 { // the breaker was turned off
		fl.mu.Unlock()
		d.closeBreaker(ctx, inbox, ep, fl, "the breaker was turned off")
		fl.mu.Lock()
	}
	n = -1
	switch fl.state {
	case BreakerDisabled:
		fl.mu.Unlock()
		return 0, false, time.Second
	case BreakerOpen:
		if fl.probing {
			fl.mu.Unlock()
			return 0, false, time.Second
		}
		if now.Before(fl.probeAt) {
			fl.mu.Unlock()
			return 0, false, fl.probeAt.Sub(now)
		}
		n, probe = 1, true
	}
	if d.cluster != nil {
		fl.mu.Unlock()
		if n, wait = d.sharedRoom(ctx, inbox, ep, fl, n); n == 0 {
			return 0, false, wait
		}
		return n, probe, 0
	}
	defer fl.mu.Unlock()
	if ep.concurrency > 0 {
		room := ep.concurrency - fl.inflight
		if room <= 0 {
			return 0, false, time.Second
		}
		n = room
		if probe {
			n = 1
		}
	}
	if !ep.rate.IsZero() {
		mono := time.Now()
		if fl.refilled.IsZero() {
			fl.tokens = ep.rate.burst()
		} else {
			fl.tokens = min(ep.rate.burst(), fl.tokens+mono.Sub(fl.refilled).Seconds()*ep.rate.perSecond())
		}
		fl.refilled = mono
		if fl.tokens < 1 {
			return 0, false, time.Duration((1 - fl.tokens) / ep.rate.perSecond() * float64(time.Second))
		}
		if k := int(fl.tokens); n < 0 || k < n {
			n = k
		}
	}
	return n, probe, 0
}

// took counts n items leased for the workers.
func (fl *flow) took(n int, ep *endpoint) {
	fl.mu.Lock()
	fl.inflight += n
	if !ep.rate.IsZero() {
		fl.tokens -= float64(n)
	}
	fl.mu.Unlock()
}

// claimProbe takes the probe of inbox's open breaker, due by now, for
// this process: no other process probes before the next interval. It
// reports false when another process took it first or the breaker is no
// longer open.
func (d *Delivery) claimProbe(ctx context.Context, inbox string, ep *endpoint, fl *flow) bool {
	now := d.now().UTC()
	next := now.Add(ep.probe)
	var took int64
	err := d.update(ctx, func(tx conn) error {
		res, err := tx.ExecContext(ctx, `UPDATE endpoint_breakers SET probe_at = ?1, updated_at = ?2
			WHERE inbox_id = ?3 AND state = 'open' AND probe_at <= ?2`,
			next.Format(sqlitedb.Time), now.Format(sqlitedb.Time), inbox)
		if err != nil {
			return err
		}
		took, err = res.RowsAffected()
		return err
	})
	if err != nil {
		d.log.Warn("delivery: taking the probe of an open breaker failed; retrying", "inbox", inbox, "err", err)
		return false
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	fl.probeAt = next
	if took == 0 {
		return false
	}
	fl.probing = true
	return true
}

// endpointFailure reports whether an attempt that ended with rec and err
// is a failure of the endpoint, and whether it is a success: a 4xx answer
// other than 408 and 429 is neither (it is the item's fault).
func endpointFailure(rec *Attempt, err error) (failed, succeeded bool) {
	if err == nil {
		return false, true
	}
	if rec != nil && rec.Status >= 400 && rec.Status < 500 && rec.Status != 408 && rec.Status != 429 {
		return false, false
	}
	return true, false
}

// observe counts an attempt of j's endpoint for its breaker, and makes
// the transition it calls for.
func (d *Delivery) observe(ctx context.Context, j job, rec *Attempt, err error) {
	fl, ep := j.fl, j.ep
	failed, succeeded := endpointFailure(rec, err)
	now := d.now()
	fl.mu.Lock()
	if j.probe {
		fl.probing = false
		defer fl.signal()
	}
	switch {
	case succeeded:
		fl.failures = 0
		open := fl.state == BreakerOpen
		fl.mu.Unlock()
		if open {
			d.closeBreaker(ctx, j.inbox, ep, fl, "an attempt succeeded")
		}
	case failed:
		fl.failures++
		fl.lastError = truncate(err.Error(), 1000)
		failures, lastError := fl.failures, fl.lastError
		switch {
		case fl.state == BreakerClosed && ep.breaker > 0 && fl.failures >= ep.breaker:
			fl.state, fl.since, fl.probeAt = BreakerOpen, now, now.Add(ep.probe)
			fl.gen++
			fl.mu.Unlock()
			d.openBreaker(ctx, j.inbox, ep, failures, lastError, now)
		case fl.state == BreakerOpen && j.probe && now.Sub(fl.since) >= ep.disable:
			fl.state = BreakerDisabled
			fl.gen++
			since := fl.since
			fl.mu.Unlock()
			d.disableBreaker(ctx, j.inbox, ep, since, lastError, now)
		case fl.state == BreakerOpen && j.probe:
			fl.mu.Unlock()
			d.writeBreaker(ctx, j.inbox, "a failed probe", `UPDATE endpoint_breakers SET failures = failures + 1, last_error = ?1,
				updated_at = ?2 WHERE inbox_id = ?3 AND state = 'open'`, lastError, now.UTC().Format(sqlitedb.Time), j.inbox)
			d.log.Info("delivery: probe of an open breaker failed; the endpoint stays paused", "inbox", j.inbox, "target", ep.url,
				"err", lastError, "next_probe", ep.probe)
		default:
			fl.mu.Unlock()
		}
	default:
		fl.mu.Unlock()
	}
}

// openBreaker records that the breaker of inbox opened at now.
func (d *Delivery) openBreaker(ctx context.Context, inbox string, ep *endpoint, failures int, lastError string, now time.Time) {
	at := now.UTC().Format(sqlitedb.Time)
	d.writeBreaker(ctx, inbox, "its opening", `INSERT INTO endpoint_breakers (inbox_id, state, opened_at, probe_at, failures, last_error, updated_at)
		VALUES (?1, 'open', ?2, ?3, ?4, ?5, ?2) ON CONFLICT (inbox_id) DO NOTHING`,
		inbox, at, now.Add(ep.probe).UTC().Format(sqlitedb.Time), failures, lastError)
	d.cfg.Metrics.breakerMoved(inbox, BreakerOpen)
	d.log.Warn("delivery: endpoint breaker opened; its items wait, probed one at a time", "inbox", inbox, "target", ep.url,
		"failures", failures, "err", lastError, "probe_every", ep.probe, "disabled_after", ep.disable)
}

// disableBreaker records that the open breaker of inbox, open since
// since, disabled its endpoint.
func (d *Delivery) disableBreaker(ctx context.Context, inbox string, ep *endpoint, since time.Time, lastError string, now time.Time) {
	d.writeBreaker(ctx, inbox, "its disabling", `UPDATE endpoint_breakers SET state = 'disabled', failures = failures + 1,
		last_error = ?1, updated_at = ?2 WHERE inbox_id = ?3 AND state = 'open'`, lastError, now.UTC().Format(sqlitedb.Time), inbox)
	d.cfg.Metrics.breakerMoved(inbox, BreakerDisabled)
	d.log.Error("delivery: endpoint disabled after failing too long; nothing is delivered until an operator enables it", "inbox", inbox,
		"target", ep.url, "open_since", since, "err", lastError)
}

// closeBreaker closes the open breaker of inbox.
func (d *Delivery) closeBreaker(ctx context.Context, inbox string, ep *endpoint, fl *flow, why string) {
	fl.mu.Lock()
	if fl.state == BreakerClosed {
		fl.mu.Unlock()
		return
	}
	since := fl.since
	fl.state, fl.failures, fl.probing = BreakerClosed, 0, false
	fl.gen++
	fl.mu.Unlock()
	d.writeBreaker(ctx, inbox, "its closing", `DELETE FROM endpoint_breakers WHERE inbox_id = ?`, inbox)
	d.cfg.Metrics.breakerMoved(inbox, BreakerClosed)
	d.log.Info("delivery: endpoint breaker closed; delivering again", "inbox", inbox, "target", ep.url, "why", why,
		"open_for", d.now().Sub(since))
	d.inboxes.notify(inbox)
}

// writeBreaker runs a statement on the stored breaker of inbox, logging
// a failure (what says what it records): the state here holds, and the
// other processes follow it later or not at all.
func (d *Delivery) writeBreaker(ctx context.Context, inbox, what, query string, args ...any) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := d.update(ctx, func(tx conn) error {
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	}); err != nil {
		d.log.Error("delivery: recording an endpoint breaker's state failed; this process keeps it, the others may not", "inbox", inbox,
			"recording", what, "err", err)
	}
}

// storedBreaker is a row of endpoint_breakers.
type storedBreaker struct {
	found          bool
	state          string
	since, probeAt time.Time
	failures       int
	lastError      string
}

func (d *Delivery) readBreaker(ctx context.Context, inbox string) (storedBreaker, error) {
	var b storedBreaker
	var since, probe string
	var lastError sql.NullString
	err := d.db.QueryRowContext(ctx, `SELECT state, opened_at, probe_at, failures, last_error FROM endpoint_breakers WHERE inbox_id = ?`,
		inbox).Scan(&b.state, &since, &probe, &b.failures, &lastError)
	if errors.Is(err, sql.ErrNoRows) {
		return storedBreaker{state: BreakerClosed}, nil
	}
	if err != nil {
		return b, fmt.Errorf("breaker of %s: %w", inbox, err)
	}
	b.found, b.lastError = true, lastError.String
	b.since, _ = sqlitedb.ParseTime(since)
	b.probeAt, _ = sqlitedb.ParseTime(probe)
	return b, nil
}

// loadBreaker follows the stored state of inbox's breaker: it may have
// been set by another process, by an operator, or before a restart.
func (d *Delivery) loadBreaker(ctx context.Context, inbox string) error {
	fl := d.flow(inbox)
	fl.mu.Lock()
	gen := fl.gen
	fl.mu.Unlock()
	b, err := d.readBreaker(ctx, inbox)
	if err != nil {
		return err
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.gen != gen { // a transition here meanwhile: it holds
		return nil
	}
	if fl.state != b.state {
		d.cfg.Metrics.breakerState(inbox, b.state)
		if b.state == BreakerClosed {
			fl.failures = 0
		}
	}
	fl.state = b.state
	if b.found {
		fl.since, fl.probeAt, fl.lastError = b.since, b.probeAt, b.lastError
	}
	return nil
}

// Breaker is the state of an endpoint's circuit breaker.
type Breaker struct {
	State string // BreakerClosed, BreakerOpen or BreakerDisabled
	// Since is when it opened; zero when closed.
	Since time.Time
	// Failures counts consecutive failed attempts: while closed those
	// this process saw; open or disabled, those that opened it and the
	// failed probes since.
	Failures int
	// LastError is the error of the last failed attempt while it is the
	// endpoint's state: open, disabled, or closed with consecutive
	// failures; "" once an attempt succeeded.
	LastError string
	// NextProbe is when an open breaker may probe next.
	NextProbe time.Time
}

// Breaker returns the state of the breaker of inbox's endpoint.
func (d *Delivery) Breaker(ctx context.Context, inbox string) (Breaker, error) {
	b, err := d.readBreaker(ctx, inbox)
	if err != nil {
		return Breaker{}, err
	}
	out := Breaker{State: b.state, Since: b.since, Failures: b.failures, LastError: b.lastError}
	if b.state == BreakerOpen {
		out.NextProbe = b.probeAt
	}
	if !b.found {
		d.endpoints.mu.Lock()
		fl := d.endpoints.flows[inbox]
		d.endpoints.mu.Unlock()
		if fl != nil {
			fl.mu.Lock()
			out.Failures, out.LastError = fl.failures, fl.lastError
			fl.mu.Unlock()
		}
	}
	if out.State == BreakerClosed && out.Failures == 0 {
		out.LastError = "" // an attempt succeeded since: the error is no longer the endpoint's state
	}
	return out, nil
}

// Enable closes the breaker of subscription name's endpoint, open or
// disabled, so that its items are delivered again, and returns the
// breaker as it was. Other processes of a shared store follow within a
// second. A subscription without a target is ErrInvalid.
func (d *Delivery) Enable(ctx context.Context, name string) (Breaker, error) {
	s, err := d.Subscription(ctx, name)
	if err != nil {
		return Breaker{}, err
	}
	if s.Target == "" {
		return Breaker{}, errorf(ErrInvalid, "subscription %q has no target: nothing to enable", name)
	}
	was, err := d.Breaker(ctx, s.Inbox)
	if err != nil {
		return was, err
	}
	if err := d.update(ctx, func(tx conn) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM endpoint_breakers WHERE inbox_id = ?`, s.Inbox)
		return err
	}); err != nil {
		return was, fmt.Errorf("enable the endpoint of %s: %w", name, err)
	}
	fl := d.flow(s.Inbox)
	fl.mu.Lock()
	changed := fl.state != BreakerClosed
	fl.state, fl.failures, fl.probing = BreakerClosed, 0, false
	fl.gen++
	fl.mu.Unlock()
	if changed || was.State != BreakerClosed {
		d.cfg.Metrics.breakerMoved(s.Inbox, BreakerClosed)
		d.log.Info("delivery: endpoint enabled by an operator; delivering again", setAttrs("subscription", name, "inbox", s.Inbox,
			"target", s.Target, "was", was.State, "since", was.Since)...)
	}
	d.forgetEndpoint(s.Inbox)
	d.inboxes.notify(s.Inbox)
	d.broadcast(ctx, "inbox:"+s.Inbox)
	return was, nil
}
