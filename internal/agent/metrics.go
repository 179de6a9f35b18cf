package agent

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

// metrics are the agent's Prometheus collectors, served on the intake's
// /metrics.
type metrics struct {
	reg      *prometheus.Registry
	intake   *prometheus.CounterVec
	relay    *prometheus.CounterVec
	failures prometheus.Counter
}

func newMetrics(store *outboxsqlite.Store) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		intake: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_agent_intake_events_total",
			Help: "Events handed to the agent's intake, by result (queued, duplicate, conflict, invalid).",
		}, []string{"result"}),
		relay: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_relay_events_total",
			Help: "Events the relay sent, by outcome (delivered, rejected, retried, unanswered).",
		}, []string{"result"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postbox_relay_publish_failures_total",
			Help: "Publishes that failed in transport (connection refused, broken, no replies in time).",
		}),
	}
	count := func(state string) func() float64 {
		return func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			pending, rejected, err := store.Counts(ctx)
			if err != nil {
				return -1
			}
			if state == outboxsqlite.StateRejected {
				return float64(rejected)
			}
			return float64(pending)
		}
	}
	for _, state := range []string{outboxsqlite.StatePending, outboxsqlite.StateRejected} {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "postbox_outbox_events",
			Help:        "Events in the outbox, by state: pending (not yet ACKed) or rejected (refused, kept for an operator).",
			ConstLabels: prometheus.Labels{"state": state},
		}, count(state)))
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
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
	m.reg.MustRegister(m.intake, m.relay, m.failures)
	return m
}

// observe counts one settled publish; it is the relay's Observe.
func (m *metrics) observe(st outbox.Stats) {
	m.relay.WithLabelValues("delivered").Add(float64(st.Delivered))
	m.relay.WithLabelValues("rejected").Add(float64(st.Rejected))
	m.relay.WithLabelValues("retried").Add(float64(st.Retried))
	m.relay.WithLabelValues("unanswered").Add(float64(st.Unanswered))
	if st.Err != nil {
		m.failures.Inc()
	}
}
