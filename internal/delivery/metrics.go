package delivery

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are delivery's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	events   *prometheus.CounterVec
	items    *prometheus.CounterVec
	leases   *prometheus.CounterVec
	settles  *prometheus.CounterVec
	replays  *prometheus.CounterVec
	attempts *prometheus.HistogramVec
	deleted  *prometheus.CounterVec
	replies  *prometheus.CounterVec
	breakers *prometheus.GaugeVec
	moves    *prometheus.CounterVec
}

// NewMetrics registers delivery's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_subscription_events_total",
			Help: "Stream events a subscription read and committed past.",
		}, []string{"subscription"}),
		items: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_subscription_items_total",
			Help: "Inbox items a subscription materialised (events that matched).",
		}, []string{"subscription"}),
		leases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_inbox_leased_total",
			Help: "Inbox items handed to runtimes and workers by lease (each lease is an attempt).",
		}, []string{"inbox"}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_inbox_settled_total",
			Help: "Inbox items that left processing, by the state they went to: completed (acked), pending (a failed attempt with a retry scheduled, or an expired lease) or failed (dead-lettered).",
		}, []string{"inbox", "state"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_inbox_replayed_total",
			Help: "Dead letters an operator returned to pending.",
		}, []string{"inbox"}),
		attempts: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "postbox_worker_attempt_seconds",
			Help:    "Time a worker's handler took for one attempt, by its result: completed, pending (retry scheduled) or failed (dead-lettered).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14),
		}, []string{"inbox", "result"}),
		replies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_reply_attempts_total",
			Help: "Attempts to send a reply to an event's delivery handle, by what the reply became: completed, pending (retried) or failed (a dead letter).",
		}, []string{"result"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_retention_deleted_total",
			Help: "Rows retention deleted: completed and failed items, and stream events every consumer had read.",
		}, []string{"kind"}),
	}
	m.breakers = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "postbox_endpoint_state",
		Help: "1 for the state of the circuit breaker of an inbox's endpoint (closed, open: paused and probed, disabled: until an operator enables it), 0 for the others, as this process sees it.",
	}, []string{"inbox", "state"})
	m.moves = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "postbox_endpoint_transitions_total",
		Help: "Transitions of the circuit breaker of an inbox's endpoint this process made, by the state it went to.",
	}, []string{"inbox", "state"})
	for _, state := range []string{ReplyCompleted, ReplyPending, ReplyFailed} {
		m.replies.WithLabelValues(state) // at 0 from the start
	}
	reg.MustRegister(m.events, m.items, m.leases, m.settles, m.replays, m.attempts, m.deleted, m.replies, m.breakers, m.moves)
	return m
}

// subscribed makes the series of s and of its inbox exist at 0 (a rule
// on rate() or absent() sees no gap before the first event), when s is
// created or loaded at the start.
func (m *Metrics) subscribed(s Subscription) {
	if m == nil {
		return
	}
	m.events.WithLabelValues(s.Name)
	m.items.WithLabelValues(s.Name)
	m.leases.WithLabelValues(s.Inbox)
	m.replays.WithLabelValues(s.Inbox)
	for _, state := range []string{StateCompleted, StatePending, StateFailed} {
		m.settles.WithLabelValues(s.Inbox, state)
	}
}

// unsubscribed removes the series of s, once deleted, and those of its
// inbox when inboxGone (no other subscription fills it).
func (m *Metrics) unsubscribed(s Subscription, inboxGone bool) {
	if m == nil {
		return
	}
	m.events.DeleteLabelValues(s.Name)
	m.items.DeleteLabelValues(s.Name)
	if !inboxGone {
		return
	}
	for _, v := range []*prometheus.CounterVec{m.leases, m.settles, m.replays, m.moves} {
		v.DeletePartialMatch(prometheus.Labels{"inbox": s.Inbox})
	}
	m.attempts.DeletePartialMatch(prometheus.Labels{"inbox": s.Inbox})
	m.breakers.DeletePartialMatch(prometheus.Labels{"inbox": s.Inbox})
}

func (m *Metrics) materialised(sub string, events, items int) {
	if m == nil {
		return
	}
	m.events.WithLabelValues(sub).Add(float64(events))
	m.items.WithLabelValues(sub).Add(float64(items))
}

func (m *Metrics) leased(inbox string, n int) {
	if m == nil || n == 0 {
		return
	}
	m.leases.WithLabelValues(inbox).Add(float64(n))
}

func (m *Metrics) settled(inbox, state string, n int) {
	if m == nil {
		return
	}
	m.settles.WithLabelValues(inbox, state).Add(float64(n))
}

func (m *Metrics) replayed(inbox string, n int) {
	if m == nil {
		return
	}
	m.replays.WithLabelValues(inbox).Add(float64(n))
}

func (m *Metrics) attempted(inbox, result string, took time.Duration) {
	if m == nil {
		return
	}
	m.attempts.WithLabelValues(inbox, result).Observe(took.Seconds())
}

// breakerState sets the state of inbox's breaker.
func (m *Metrics) breakerState(inbox, state string) {
	if m == nil {
		return
	}
	for _, s := range []string{BreakerClosed, BreakerOpen, BreakerDisabled} {
		v := 0.0
		if s == state {
			v = 1
		}
		m.breakers.WithLabelValues(inbox, s).Set(v)
	}
}

// breakerMoved counts a transition of inbox's breaker to state.
func (m *Metrics) breakerMoved(inbox, state string) {
	if m == nil {
		return
	}
	m.moves.WithLabelValues(inbox, state).Inc()
	m.breakerState(inbox, state)
}

func (m *Metrics) replied(state string) {
	if m == nil {
		return
	}
	m.replies.WithLabelValues(state).Inc()
}

func (m *Metrics) cleaned(c Cleaned) {
	if m == nil {
		return
	}
	m.deleted.WithLabelValues("items").Add(float64(c.Items))
	m.deleted.WithLabelValues("events").Add(float64(c.Events))
}

// LagCollector returns a collector of every subscription's lag (see Lag)
// and whether it is paused, read at each scrape: one lookup per
// subscription and one per stream.
func (d *Delivery) LagCollector() prometheus.Collector { return lagCollector{d} }

var (
	lagDesc = prometheus.NewDesc("postbox_subscription_lag_events",
		"Events of its stream a subscription has not consumed yet.", []string{"subscription", "stream"}, nil)
	pausedDesc = prometheus.NewDesc("postbox_subscription_paused",
		"1 while an operator has paused a subscription's delivery, 0 while it delivers.", []string{"subscription"}, nil)
)

type lagCollector struct{ d *Delivery }

func (c lagCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- lagDesc
	ch <- pausedDesc
}

func (c lagCollector) Collect(ch chan<- prometheus.Metric) {
	ctx := context.Background()
	subs, err := c.d.Subscriptions(ctx)
	if err != nil {
		return
	}
	stats := map[string]int64{}
	leads := c.d.leads() // the leader of a shared store reports the pauses
	for _, s := range subs {
		if leads {
			paused := 0.0
			if !s.PausedAt.IsZero() {
				paused = 1
			}
			ch <- prometheus.MustNewConstMetric(pausedDesc, prometheus.GaugeValue, paused, s.Name)
		}
		if !c.d.runsHere(s.Name) { // reported by the process that runs its loop
			continue
		}
		if lag, err := c.d.lag(ctx, s, stats); err == nil {
			ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(lag.Events), s.Name, lag.StreamID)
		}
	}
}

// InboxCollector returns a collector of every inbox's items by state (the
// queue depth; failed is the dead-letter count) and the age of its oldest
// pending item, read at each scrape through Inboxes, which counts the
// queue and the dead letters in an index and reads the completed count
// the writes keep: a scrape costs no scan of the completed items.
func (d *Delivery) InboxCollector() prometheus.Collector { return inboxCollector{d} }

var (
	inboxItemsDesc = prometheus.NewDesc("postbox_inbox_items",
		"Items of an inbox by state: pending and processing are the queue, failed the dead letters, completed those delivered and not yet deleted by retention.", []string{"inbox", "state"}, nil)
	oldestPendingDesc = prometheus.NewDesc("postbox_inbox_oldest_pending_age_seconds",
		"Age of the oldest pending item of an inbox (0 when none).", []string{"inbox"}, nil)
)

type inboxCollector struct{ d *Delivery }

func (c inboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inboxItemsDesc
	ch <- oldestPendingDesc
}

func (c inboxCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.d.leads() { // the leader of a shared store reports them
		return
	}
	ctx := context.Background()
	inboxes, err := c.d.Inboxes(ctx)
	if err != nil {
		return
	}
	for _, in := range inboxes {
		for state, n := range map[string]int64{StatePending: in.Pending, StateProcessing: in.Processing,
			StateCompleted: in.Completed, StateFailed: in.Failed} {
			ch <- prometheus.MustNewConstMetric(inboxItemsDesc, prometheus.GaugeValue, float64(n), in.Inbox, state)
		}
		age := 0.0
		if !in.OldestPending.IsZero() {
			age = max(c.d.now().Sub(in.OldestPending).Seconds(), 0)
		}
		ch <- prometheus.MustNewConstMetric(oldestPendingDesc, prometheus.GaugeValue, age, in.Inbox)
	}
}
