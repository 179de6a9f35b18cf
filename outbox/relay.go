package outbox

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/postbox-events/postbox"
)

// Defaults of RelayConfig.
const (
	DefaultBatchSize     = 256
	DefaultBatchBytes    = 4 << 20
	DefaultMaxInFlight   = 4096
	DefaultPollInterval  = time.Second
	DefaultRetryBase     = time.Second
	DefaultRetryMax      = 5 * time.Minute
	DefaultReconnectBase = 100 * time.Millisecond
	DefaultReconnectMax  = 30 * time.Second
)

// RelayConfig configures a Relay. Zero fields take their defaults.
type RelayConfig struct {
	// BatchSize bounds the messages of one Publish. Defaults to 256.
	BatchSize int
	// BatchBytes bounds the bodies of one Publish, so that a batch of large
	// events still fits the receiver's frame limit. A message larger than
	// BatchBytes is published alone. Defaults to 4 MiB.
	BatchBytes int
	// MaxInFlight bounds the messages published and not yet answered.
	// Defaults to 4096.
	MaxInFlight int
	// PollInterval is how often the store is polled when it does not
	// notify (or in case a notification was missed). Defaults to 1s.
	PollInterval time.Duration
	// Retry schedules a row refused with a retryable NACK. Defaults to
	// 1s doubling up to 5m, with full jitter.
	Retry Backoff
	// Reconnect pauses publishing after a transport failure. Defaults to
	// 100ms doubling up to 30s, with full jitter.
	Reconnect Backoff
	Logger    *slog.Logger
	// Now returns the current time. Defaults to time.Now.
	Now func() time.Time
	// Observe, when set, is called after each publish is settled.
	Observe func(Stats)
}

// Stats counts what one settled publish did.
type Stats struct {
	Delivered, Rejected, Retried, Unanswered int
	Err                                      error // the transport error, if any
}

// Relay sends a Store's rows through a Publisher. It keeps up to
// MaxInFlight messages in flight, in batches published concurrently.
type Relay struct {
	store Store
	pub   Publisher
	cfg   RelayConfig
	log   *slog.Logger
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Relay{store: store, pub: pub, cfg: cfg, log: cfg.Logger}, nil
}

type published struct {
	msgs    []Message
	replies []postbox.Reply
	err     error
}

// Run relays until ctx ends. Publishes in progress at the end are
// cancelled; the replies that did arrive are settled, the rest stay due.
func (r *Relay) Run(ctx context.Context) error {
	var notify <-chan struct{}
	if n, ok := r.store.(Notifier); ok {
		notify = n.Notify()
	}
	pubCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	settleCtx := context.WithoutCancel(ctx)
	inFlight := map[string]bool{}
	var cursor int64 // rows up to here were handed out in this sweep
	running := 0
	results := make(chan published)
	failures := 0
	var pausedUntil time.Time
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
		room := r.cfg.MaxInFlight - len(inFlight)
		if ctx.Err() == nil && room > 0 && !now.Before(pausedUntil) {
			msgs, last, err := r.due(ctx, now, cursor, min(room, r.cfg.BatchSize), inFlight)
			cursor = max(cursor, last)
			if err != nil && ctx.Err() == nil {
				r.log.Error("outbox: reading due rows failed", "err", err)
			}
			if len(msgs) > 0 {
				for _, m := range msgs {
					inFlight[m.EventID] = true
				}
				running++
				go func() {
					replies, err := r.pub.Publish(pubCtx, msgs)
					if err == nil && len(replies) != len(msgs) {
						err = errors.New("outbox: publisher returned the wrong number of replies")
					}
					results <- published{msgs, replies, err}
				}()
				continue
			}
		}
		if ctx.Err() != nil && running == 0 {
			return nil
		}
		wait := r.cfg.PollInterval
		if now.Before(pausedUntil) {
			wait = pausedUntil.Sub(now)
		}
		timer.Reset(wait)
		select {
		case p := <-results:
			running--
			for _, m := range p.msgs {
				delete(inFlight, m.EventID)
			}
			st := r.settle(settleCtx, p)
			if st.Retried > 0 || st.Unanswered > 0 {
				cursor = 0 // rows behind the cursor are due again
			}
			switch {
			case p.err == nil:
				if failures > 0 {
					r.log.Info("outbox: publishing again", "after_failures", failures)
				}
				failures = 0
			case ctx.Err() != nil:
			case !r.cfg.Now().Before(pausedUntil): // one pause per outage, not one per batch in flight
				delay := r.cfg.Reconnect.Delay(failures)
				failures++
				pausedUntil = r.cfg.Now().Add(delay)
				r.log.Warn("outbox: publish failed; pausing before the next attempt", "err", p.err, "events", len(p.msgs), "pause", delay.Round(time.Millisecond), "failures", failures)
			}
			if r.cfg.Observe != nil {
				r.cfg.Observe(st)
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

// due returns up to n due messages after cursor that are not in flight,
// and the last Seq it looked at.
func (r *Relay) due(ctx context.Context, now time.Time, cursor int64, n int, inFlight map[string]bool) ([]Message, int64, error) {
	limit := n
	if cursor == 0 {
		limit += len(inFlight) // a new sweep passes the rows in flight again
	}
	rows, err := r.store.Due(ctx, now, cursor, limit)
	if err != nil {
		return nil, cursor, err
	}
	msgs := rows[:0]
	last, size := cursor, 0
	for _, m := range rows {
		if len(msgs) == n || (len(msgs) > 0 && size+len(m.Body) > r.cfg.BatchBytes) {
			break
		}
		last = m.Seq
		if !inFlight[m.EventID] {
			msgs = append(msgs, m)
			size += len(m.Body)
		}
	}
	return msgs, last, nil
}

// settle records the outcome of one publish.
func (r *Relay) settle(ctx context.Context, p published) Stats {
	st := Stats{Err: p.err}
	out := make([]Outcome, 0, len(p.msgs))
	now := r.cfg.Now()
	for i, m := range p.msgs {
		if p.err != nil {
			out = append(out, Outcome{EventID: m.EventID, Kind: Unanswered, Error: p.err.Error()})
			st.Unanswered++
			continue
		}
		rep := p.replies[i]
		if rep.EventID == "" {
			rep.EventID = m.EventID
		}
		o := ReplyOutcome(rep, now.Add(r.cfg.Retry.Delay(m.Attempts)))
		o.EventID = m.EventID
		switch o.Kind {
		case Delivered:
			st.Delivered++
		case Rejected:
			st.Rejected++
			r.log.Warn("outbox: event rejected by the receiver; kept as rejected", "event_id", m.EventID, "reason", o.Error)
		case Retry:
			st.Retried++
		}
		out = append(out, o)
	}
	if err := r.store.Settle(ctx, out); err != nil {
		// Nothing settled: delivered rows are sent again and acknowledged
		// as duplicates, which is safe.
		r.log.Error("outbox: recording results failed; the events will be sent again", "err", err, "events", len(out))
	}
	return st
}
