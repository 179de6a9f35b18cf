package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/retry"
)

// Defaults of RelayConfig.
const (
	DefaultBatchSize     = 256
	DefaultBatchBytes    = 4 << 20
	DefaultMaxInFlight   = 4096
	DefaultMinInFlight   = 32
	DefaultPollInterval  = time.Second
	DefaultRetryBase     = time.Second
	DefaultRetryMax      = 5 * time.Minute
	DefaultReconnectBase = 100 * time.Millisecond
	DefaultReconnectMax  = 30 * time.Second
	DefaultSettleTimeout = 30 * time.Second
)

// RelayConfig configures a Relay. Zero fields take their defaults.
type RelayConfig struct {
	// BatchSize bounds the messages of one Publish. Defaults to 256.
	BatchSize int
	// BatchBytes bounds the bodies of one Publish, so that a batch of large
	// events still fits the receiver's frame limit. A message larger than
	// BatchBytes is published alone. Defaults to 4 MiB.
	BatchBytes int
	// MaxInFlight bounds the messages published and not yet answered
	// (the window). Defaults to 4096. Answered messages whose outcome
	// the store is recording do not count, up to another MaxInFlight of
	// them: the next batches are sent while the store writes.
	//
	// The window adapts to what the receiver achieves: it starts at
	// MinInFlight, grows by one message for every message answered
	// (doubling each round trip while whole windows are answered), up to
	// MaxInFlight; after an outage (a transport failure, or an outage
	// NACK) it starts again from the number of messages answered since
	// the previous outage, never below MinInFlight, and from there grows
	// by about MinInFlight per round trip (in steps of BatchSize, so that
	// the room it makes is sent as whole batches). On a good link it
	// reaches MaxInFlight within a few round trips; on a link cut every
	// few hundred milliseconds each connection is sent what the last one
	// managed, so the oldest rows are not resent on every connection.
	MaxInFlight int
	// MinInFlight is the window's floor and start. Defaults to 32; at
	// most MaxInFlight. While the window is under BatchSize, batches are
	// as large as the window.
	MinInFlight int
	// PollInterval is how often the store is polled when it does not
	// notify (or in case a notification was missed). Defaults to 1s.
	PollInterval time.Duration
	// Retry schedules a row refused with a retryable NACK. Defaults to
	// 1s doubling up to 5m, with full jitter.
	Retry retry.Backoff
	// Reconnect pauses publishing after a transport failure. Defaults to
	// 100ms doubling up to 30s, with full jitter.
	Reconnect retry.Backoff
	// MaxAttempts parks a row: one refused with a retryable NACK for the
	// MaxAttempts-th time is kept as rejected, with the last reason, until
	// an operator requeues it, instead of being retried for ever.
	// Transport failures (the receiver down or unreachable) never count
	// towards it: an outage does not park rows. 0 means no limit.
	MaxAttempts int
	Logger      *slog.Logger
	// Now returns the current time. Defaults to time.Now.
	Now func() time.Time
	// SettleTimeout bounds recording the outcome of one publish, also
	// after Run's context ended, so that a store that does not answer
	// cannot hold up a shutdown. Outcomes not recorded in time are lost,
	// and their rows are sent again. Defaults to 30s.
	SettleTimeout time.Duration
	// Observe, when set, is called after each publish is settled.
	Observe func(Stats)
}

// Stats counts what one settled publish did.
type Stats struct {
	// Unanswered counts messages the transport failed before a reply and
	// messages answered with an outage NACK (IsOutage).
	Delivered, Rejected, Retried, Unanswered int
	Err                                      error // the transport error or the outage, if any
	// Unrecorded counts the answered messages (Delivered, Rejected) whose
	// outcome the store could not record. The Relay keeps them in flight,
	// never resending them, and records them again every PollInterval
	// until the store takes them.
	Unrecorded int
	// Window is the relay's window after this publish.
	Window int
}

// IsOutage reports whether a reply says that the receiver, not the
// message, failed (postbox.CodeOutage: its commit failed, or it is shutting down). The Relay
// treats it as it treats a transport failure: the message is settled
// Unanswered (no attempt counted, no backoff of its own) and publishing
// pauses with the Reconnect backoff.
func IsOutage(r postbox.Reply) bool {
	return !r.OK() && r.Code == postbox.CodeOutage
}

// Relay sends a Store's rows through a Publisher. It keeps up to
// MaxInFlight messages in flight, in batches published concurrently.
type Relay struct {
	claims  bool     // the store is a Claimer
	ext     Extender // the store's, when it is a Claimer that extends claims
	store   Store
	pub     Publisher
	cfg     RelayConfig
	log     *slog.Logger
	retries atomic.Int64 // events the receiver refused for now, for thinning their warnings
}

// thinned is the level of the nth line of a kind that would repeat: Warn
// for the first two, then the 4th, 8th, 16th..., Debug between them, so
// that a failure that lasts is not a wall of lines that say the same.
func thinned(n int64) slog.Level {
	if n > 2 && n&(n-1) != 0 {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// NewRelay returns a relay from store to pub.
func NewRelay(store Store, pub Publisher, cfg RelayConfig) (*Relay, error) {
	if store == nil || pub == nil {
		return nil, errors.New("outbox: relay needs a store and a publisher")
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.BatchBytes <= 0 {
		cfg.BatchBytes = DefaultBatchBytes
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	cfg.MaxInFlight = max(cfg.MaxInFlight, cfg.BatchSize)
	if cfg.MinInFlight <= 0 {
		cfg.MinInFlight = DefaultMinInFlight
	}
	cfg.MinInFlight = min(cfg.MinInFlight, cfg.MaxInFlight)
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.Retry.Base <= 0 {
		cfg.Retry.Base = DefaultRetryBase
	}
	if cfg.Retry.Max <= 0 {
		cfg.Retry.Max = DefaultRetryMax
	}
	if cfg.Reconnect.Base <= 0 {
		cfg.Reconnect.Base = DefaultReconnectBase
	}
	if cfg.Reconnect.Max <= 0 {
		cfg.Reconnect.Max = DefaultReconnectMax
	}
	if cfg.SettleTimeout <= 0 {
		cfg.SettleTimeout = DefaultSettleTimeout
	}
	if cfg.MaxAttempts < 0 {
		return nil, errors.New("outbox: MaxAttempts must not be negative")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c, ok := store.(Claimer)
	r := &Relay{store: store, pub: pub, cfg: cfg, log: cfg.Logger, claims: ok && c.Claims()}
	if e, ok := store.(Extender); ok && r.claims && e.ClaimPeriod() > 0 {
		r.ext = e
	}
	return r, nil
}

// claimKey names one claim the relay holds: a row may be claimed again
// (after its settle committed) before the loop heard of that settle.
type claimKey struct {
	eventID string
	lease   int64 // Lease in microseconds, as the store keeps it
}

func keyOf(m Message) claimKey { return claimKey{m.EventID, m.Lease.UnixMicro()} }

// heldClaim is a claim the relay holds, and when it last took or
// extended it.
type heldClaim struct {
	Claim
	at time.Time
}

// beat is the end of one heartbeat: the claims it extended, at when.
type beat struct {
	keys     []claimKey
	at       time.Time
	extended int64
	err      error
}

type settledBatch struct {
	released []Message // out of flight: settled, or due again
	held     []Outcome // answered outcomes the store could not record
	st       Stats
	again    bool // a retry of held outcomes
}

type published struct {
	msgs    []Message
	replies []postbox.Reply
	err     error
}

// Run relays until ctx ends. Publishes in progress at the end are
// cancelled; the replies that did arrive are settled (within
// RelayConfig.SettleTimeout), the rest stay due.
func (r *Relay) Run(ctx context.Context) error {
	var notify <-chan struct{}
	if n, ok := r.store.(Notifier); ok {
		notify = n.Notify()
	}
	pubCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	settleCtx := context.WithoutCancel(ctx)
	// inFlight counts each event's publishes not yet settled: more than one
	// only for a Claimer, whose row may be claimed again (after its settle
	// committed) before this loop heard of that settle.
	inFlight := map[string]int{}
	// The window (see RelayConfig.MaxInFlight) counts the messages
	// published and not yet answered. Those answered whose outcome is not
	// yet recorded stay in inFlight, so that they are not read again, but
	// leave the window, so that the next batches do not wait for the
	// store.
	win := newWindow(r.cfg)
	// Answered outcomes the store failed to record: their rows stay in
	// flight, not sent again, and are recorded again every PollInterval.
	held := heldOutcomes{every: r.cfg.PollInterval}
	var cursor int64 // rows up to here were handed out in this sweep
	running := 0     // batches published and not yet settled, and retries of held outcomes
	results := make(chan published)
	settled := make(chan settledBatch)
	failures := 0
	var readFailures int64 // reads of due rows failed in a row, for thinning their lines
	var pausedUntil time.Time
	// The heartbeat (an Extender's): every quarter of a claim period, the
	// claims held longer than that (rows published, settling, or held)
	// are extended, so that a relay that is alive never loses them,
	// however long the receiver or the store takes: each claim has at
	// least two beats to be extended in before it would run out.
	claimed := map[claimKey]heldClaim{}
	var beatC <-chan time.Time
	var every time.Duration
	beats := make(chan beat)
	beating := false
	var beatFailures int64
	if r.ext != nil {
		every = max(r.ext.ClaimPeriod()/4, time.Millisecond)
		t := time.NewTicker(every)
		defer t.Stop()
		beatC = t.C
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	// The timer above is reset on every turn of the loop, so under steady
	// traffic it never fires; the ticker makes a full sweep every
	// PollInterval regardless, for rows that came due behind the cursor.
	sweep := time.NewTicker(r.cfg.PollInterval)
	defer sweep.Stop()
	done := ctx.Done()

	for {
		now := r.cfg.Now()
		var outs []Outcome // held outcomes due to be recorded again
		if ctx.Err() == nil {
			outs = held.take(now)
		}
		if len(outs) > 0 {
			running++
			go func() {
				ctx, cancel := context.WithTimeout(settleCtx, r.cfg.SettleTimeout)
				defer cancel()
				settled <- r.settleAgain(ctx, outs)
			}()
		}
		room := win.room()
		if ctx.Err() == nil && room > 0 && !now.Before(pausedUntil) {
			msgs, last, err := r.due(ctx, now, cursor, min(room, r.cfg.BatchSize), inFlight)
			cursor = max(cursor, last)
			switch {
			case err != nil && ctx.Err() == nil:
				readFailures++
				level := slog.LevelError
				if thinned(readFailures) == slog.LevelDebug {
					level = slog.LevelDebug
				}
				r.log.Log(ctx, level, "outbox: reading due rows failed", "err", err, "failures", readFailures)
			case err == nil && readFailures > 0:
				r.log.Info("outbox: reading due rows again", "after_failures", readFailures)
				readFailures = 0
			}
			if len(msgs) > 0 {
				for _, m := range msgs {
					inFlight[m.EventID]++
					if r.ext != nil {
						claimed[keyOf(m)] = heldClaim{Claim{EventID: m.EventID, Seq: m.Seq, Lease: m.Lease}, now}
					}
				}
				win.publish(len(msgs))
				for _, batch := range r.split(msgs) {
					running++
					go func() {
						spans := startPublish(batch)
						replies, err := r.pub.Publish(pubCtx, batch)
						if err == nil && len(replies) != len(batch) {
							err = errors.New("outbox: publisher returned the wrong number of replies")
						}
						endPublish(spans, replies, err)
						results <- published{batch, replies, err}
					}()
				}
				continue
			}
		}
		if ctx.Err() != nil && running == 0 {
			if n := held.count(); n > 0 {
				r.log.Warn("outbox: stopping with answered events the store could not record; they will be sent again", "events", n)
			}
			return nil
		}
		wait := r.cfg.PollInterval
		if now.Before(pausedUntil) {
			wait = pausedUntil.Sub(now)
		}
		if ctx.Err() == nil {
			wait = held.wait(now, wait)
		}
		timer.Reset(wait)
		select {
		case p := <-results:
			win.reply(len(p.msgs))
			err := p.outage()
			switch {
			case err == nil:
				if failures > 0 {
					r.log.Info("outbox: publishing again", "after_failures", failures)
				}
				failures = 0
			case ctx.Err() != nil:
			case !r.cfg.Now().Before(pausedUntil): // one pause per outage, not one per batch in flight
				delay := r.cfg.Reconnect.Delay(failures)
				failures++
				pausedUntil = r.cfg.Now().Add(delay)
				win.outage()
				r.log.Log(ctx, thinned(int64(failures)), "outbox: publish failed; pausing before the next attempt", "err", err, "pause", delay.Round(time.Millisecond),
					"failures", failures, "batch_events", len(p.msgs), "next_window", win.size)
			}
			// Settling runs beside the next reads and publishes; the rows
			// stay in flight until it is done.
			go func() {
				ctx, cancel := context.WithTimeout(settleCtx, r.cfg.SettleTimeout)
				defer cancel()
				settled <- r.settle(ctx, p)
			}()
		case s := <-settled:
			running--
			win.release(len(s.released))
			for _, m := range s.released {
				if inFlight[m.EventID]--; inFlight[m.EventID] <= 0 {
					delete(inFlight, m.EventID)
				}
				delete(claimed, keyOf(m))
			}
			if s.again {
				held.retried()
			}
			if len(s.held) > 0 {
				held.hold(r.cfg.Now(), s.held)
			}
			if s.again {
				continue
			}
			if s.st.Err == nil {
				win.answer(s.st.Delivered + s.st.Rejected + s.st.Retried)
			}
			if s.st.Retried > 0 || s.st.Unanswered > 0 {
				cursor = 0 // rows behind the cursor are due again
			}
			if r.cfg.Observe != nil {
				s.st.Window = win.size
				r.cfg.Observe(s.st)
			}
		case now := <-beatC:
			if beating {
				continue // the last one has not returned; it is bounded by every
			}
			var keys []claimKey
			var claims []Claim
			for k, c := range claimed {
				if now.Sub(c.at) >= every {
					keys, claims = append(keys, k), append(claims, c.Claim)
				}
			}
			if len(claims) == 0 {
				continue
			}
			beating = true
			running++
			go func() {
				ctx, cancel := context.WithTimeout(settleCtx, every)
				defer cancel()
				at := r.cfg.Now()
				n, err := r.ext.Extend(ctx, at, claims)
				beats <- beat{keys: keys, at: at, extended: n, err: err}
			}()
		case b := <-beats:
			running--
			beating = false
			if b.err != nil {
				beatFailures++
				r.log.Log(ctx, thinned(beatFailures), "outbox: extending the claims of rows in flight failed; if it fails for a whole claim period, another relay may send them again",
					"err", b.err, "claims", len(b.keys), "failures", beatFailures)
				continue
			}
			if beatFailures > 0 {
				r.log.Info("outbox: extending claims again", "after_failures", beatFailures)
				beatFailures = 0
			}
			r.log.Debug("outbox: extended the claims of rows in flight", "claims", len(b.keys), "extended", b.extended)
			for _, k := range b.keys {
				if c, ok := claimed[k]; ok {
					c.at = b.at
					claimed[k] = c
				}
			}
		case <-notify:
		case <-timer.C:
			cursor = 0 // requeued rows and retries that came due
		case <-sweep.C:
			cursor = 0
		case <-done:
			cancel()
			done = nil // wait for the publishes in flight without spinning
		}
	}
}

// outage returns the transport error of a publish, or an error naming the
// first outage NACK among its replies, or nil.
func (p published) outage() error {
	if p.err != nil {
		return p.err
	}
	for _, rep := range p.replies {
		if IsOutage(rep) {
			return fmt.Errorf("the receiver could not store events: %s: %s", rep.Code, rep.Message)
		}
	}
	return nil
}

// due returns up to n due messages after cursor that are not in flight,
// and the last Seq it looked at.
func (r *Relay) due(ctx context.Context, now time.Time, cursor int64, n int, inFlight map[string]int) ([]Message, int64, error) {
	limit := n
	if cursor == 0 && !r.claims {
		limit += len(inFlight) // a new sweep passes the rows in flight again
	}
	rows, err := r.store.Due(ctx, now, cursor, limit)
	if err != nil {
		return nil, cursor, err
	}
	msgs := rows[:0]
	last := cursor
	for _, m := range rows {
		// A Claimer's rows are claimed for this relay: all of them are
		// sent, or they would wait for the claim to end.
		if len(msgs) == n && !r.claims {
			break
		}
		last = m.Seq
		if inFlight[m.EventID] == 0 || r.claims {
			msgs = append(msgs, m)
		}
	}
	return msgs, last, nil
}

// split cuts msgs into publishes of at most BatchSize messages and
// BatchBytes of bodies; a message larger than BatchBytes goes alone.
func (r *Relay) split(msgs []Message) [][]Message {
	var out [][]Message
	start, size := 0, 0
	for i, m := range msgs {
		if i > start && (i-start == r.cfg.BatchSize || size+len(m.Body) > r.cfg.BatchBytes) {
			out = append(out, msgs[start:i])
			start, size = i, 0
		}
		size += len(m.Body)
	}
	return append(out, msgs[start:])
}

// settle records the outcome of one publish.
func (r *Relay) settle(ctx context.Context, p published) settledBatch {
	st := Stats{Err: p.outage()}
	out := make([]Outcome, 0, len(p.msgs))
	now := r.cfg.Now()
	for i, m := range p.msgs {
		if p.err != nil {
			out = append(out, Outcome{EventID: m.EventID, Seq: m.Seq, Kind: Unanswered, Error: p.err.Error(), Lease: m.Lease})
			st.Unanswered++
			continue
		}
		rep := p.replies[i]
		if rep.EventID == "" {
			rep.EventID = m.EventID
		}
		if IsOutage(rep) {
			// The receiver failed, not the event: no attempt, no backoff
			// of its own; the pause after the outage spaces the next try.
			out = append(out, Outcome{EventID: m.EventID, Seq: m.Seq, Kind: Unanswered, Error: string(rep.Code) + ": " + rep.Message, Lease: m.Lease})
			st.Unanswered++
			continue
		}
		o := ReplyOutcome(rep, now.Add(r.cfg.Retry.Delay(m.Attempts)))
		o.EventID = m.EventID
		if o.Kind == Retry && r.cfg.MaxAttempts > 0 && m.Attempts+1 >= r.cfg.MaxAttempts {
			o = Outcome{EventID: m.EventID, Kind: Rejected, Error: fmt.Sprintf("parked after %d attempts; last: %s", m.Attempts+1, o.Error)}
		}
		o.Seq, o.Lease = m.Seq, m.Lease
		switch o.Kind {
		case Delivered:
			st.Delivered++
		case Rejected:
			st.Rejected++
			r.log.Warn("outbox: event kept as rejected for an operator (refused for good, or parked after its last attempt)", "event_id", m.EventID, "reason", o.Error)
		case Retry:
			st.Retried++
			r.log.Log(ctx, thinned(r.retries.Add(1)), "outbox: the receiver refused an event for now; it is sent again later",
				"event_id", m.EventID, "reason", o.Error, "attempt", m.Attempts+1, "next_attempt_at", o.RetryAt)
		}
		out = append(out, o)
	}
	if err := r.store.Settle(ctx, out); err != nil {
		// Nothing settled. The answered rows stay in flight, not sent
		// again, until the store records them; the others are due again
		// as they were, without an attempt counted.
		held := answeredOutcomes(out)
		r.log.Error("outbox: recording results failed; answered events are kept in memory and recorded again", "err", err, "events", len(out), "answered", len(held))
		st.Unrecorded = len(held)
		released := make([]Message, 0, len(p.msgs)-len(held))
		for i, m := range p.msgs {
			if k := out[i].Kind; k != Delivered && k != Rejected {
				released = append(released, m)
			}
		}
		return settledBatch{released: released, held: held, st: st}
	}
	return settledBatch{released: p.msgs, st: st}
}

// settleAgain records held outcomes again.
func (r *Relay) settleAgain(ctx context.Context, outs []Outcome) settledBatch {
	if err := r.store.Settle(ctx, outs); err != nil {
		r.log.Error("outbox: recording answered events failed again; retrying", "err", err, "events", len(outs))
		return settledBatch{held: outs, again: true}
	}
	r.log.Info("outbox: recorded answered events the store had refused", "events", len(outs))
	released := make([]Message, len(outs))
	for i, o := range outs {
		released[i] = Message{EventID: o.EventID, Seq: o.Seq, Lease: o.Lease}
	}
	return settledBatch{released: released, again: true}
}

// answeredOutcomes returns the Delivered and Rejected outcomes of out.
func answeredOutcomes(out []Outcome) []Outcome {
	var held []Outcome
	for _, o := range out {
		if o.Kind == Delivered || o.Kind == Rejected {
			held = append(held, o)
		}
	}
	return held
}
