// Package relaymetrics holds the Prometheus metrics of an outbox and its
// relay, shared by the edge agent and postbox relay.
package relaymetrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox/outbox"
)

// Outbox is what the gauges read from a store.
type Outbox interface {
	// Counts returns how many rows are pending (the backlog) and rejected.
	Counts(ctx context.Context) (pending, rejected int64, err error)
	// OldestPending returns when the oldest pending row was queued.
	OldestPending(ctx context.Context) (time.Time, bool, error)
}

// Metrics counts what a relay did.
type Metrics struct {
	events   *prometheus.CounterVec
	failures prometheus.Counter
}

// Register registers the relay's and store's metrics with reg:
//
//	postbox_relay_events_total{result}           delivered, rejected, retried, unanswered
//	postbox_relay_publish_failures_total         transport failures
//	postbox_outbox_events{state}                 pending (the backlog) and rejected
//	postbox_outbox_oldest_pending_age_seconds    0 when nothing is pending
//
// The publish rate is rate(postbox_relay_events_total{result="delivered"}).
func Register(reg prometheus.Registerer, store Outbox) *Metrics {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_relay_events_total",
			Help: "Events the relay sent, by outcome (delivered, rejected, retried, unanswered).",
		}, []string{"result"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postbox_relay_publish_failures_total",
			Help: "Publishes that failed in transport (connection refused, broken, no replies in time).",
		}),
	}
	for _, r := range []string{"delivered", "rejected", "retried", "unanswered"} {
		m.events.WithLabelValues(r)
	}
	count := func(state string) func() float64 {
		return func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			pending, rejected, err := store.Counts(ctx)
			if err != nil {
				return -1
			}
			if state == outbox.StateRejected {
				return float64(rejected)
			}
			return float64(pending)
		}
	}
	for _, state := range []string{outbox.StatePending, outbox.StateRejected} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "postbox_outbox_events",
			Help:        "Events in the outbox, by state: pending (not yet ACKed: the backlog) or rejected (refused or parked, kept for an operator).",
			ConstLabels: prometheus.Labels{"state": state},
		}, count(state)))
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "postbox_outbox_oldest_pending_age_seconds",
		Help: "Age of the oldest pending event in the outbox; 0 when there is none.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		t, ok, err := store.OldestPending(ctx)
		if err != nil || !ok {
			return 0
		}
		return time.Since(t).Seconds()
	}))
	reg.MustRegister(m.events, m.failures)
	return m
}

// Observe counts one settled publish; it is a RelayConfig.Observe.
func (m *Metrics) Observe(st outbox.Stats) {
	m.events.WithLabelValues("delivered").Add(float64(st.Delivered))
	m.events.WithLabelValues("rejected").Add(float64(st.Rejected))
	m.events.WithLabelValues("retried").Add(float64(st.Retried))
	m.events.WithLabelValues("unanswered").Add(float64(st.Unanswered))
	if st.Err != nil {
		m.failures.Inc()
	}
}
